"""Status from what runs, and one allocation figure (issue 70), on SQLite and PostgreSQL: a
CronJob and a Deployment whose own status does not (yet) say Running while their pods run
(the CronJob's Job's pod Running, the Deployment's Ready) are Running on every route and
in the accounting; the same moment's allocation is one figure on every route, a node
tainted for GPU work counted as the node list counts it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import recorded, rows
from tests.recorder.objects import NS, U, gpu_pod, state, template, workload
from tests.recorder.test_cluster_api import node

AMD = "amd.com/gpu"
RFC = "%Y-%m-%dT%H:%M:%SZ"


def get(app: Any, path: str) -> Any:
    """A route's data, answered 2000 (without Prometheus here: its figures unknown)."""
    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))
    assert r.status_code == 200 and r.json()["meta"]["code"] == 2000, r.text
    return r.json()["data"]


def cluster(api: FakeApiServer) -> dict[str, dict[str, Any]]:
    """gpu-1: 4 GPUs, tainted for GPU work alone; the CronJob nightly's Job's pod holds
    all 4. gpu-2: 4 GPUs; the Deployment trainer's pod holds 2. Neither owner says
    Running: the CronJob has no active Job listed yet, the Job no active count, the
    Deployment and its ReplicaSet no ready replicas. The pods, by name."""
    dedicated = node("gpu-1", "True", {AMD: "4"}, "10.0.0.11")
    dedicated["spec"] = {"taints": [{"key": AMD, "value": "present", "effect": "NoSchedule"}]}
    api.put("nodes", dedicated)
    api.put("nodes", node("gpu-2", "True", {AMD: "4"}, "10.0.0.12"))
    job_spec = {"parallelism": 1, "template": template(AMD, 4)}
    api.put(
        "cronjobs",
        workload(
            "nightly",
            {"schedule": "0 2 * * *", "jobTemplate": {"spec": job_spec}},
            {"lastScheduleTime": "2026-11-23T02:00:00Z"},
        ),
    )
    api.put("jobs", workload("nightly-29000", job_spec, {}, "nightly"))
    dep_spec = {"replicas": 1, "template": template(AMD, 2)}
    api.put("deployments", workload("trainer", dep_spec, {"replicas": 1}))
    api.put("replicasets", workload("trainer-5d9f", dep_spec, {"replicas": 1}, "trainer"))
    pods = {
        "nightly-29000-x": gpu_pod("nightly-29000-x", "nightly-29000", AMD, 4, "gpu-1"),
        "trainer-5d9f-a": gpu_pod("trainer-5d9f-a", "trainer-5d9f", AMD, 2, "gpu-2"),
    }
    for p in pods.values():
        api.put("pods", p)
        api.put("pods", state(p, "Running", True))
    return pods


def started(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> tuple[Any, dict[str, dict[str, Any]], datetime, datetime]:
    """The cluster, the service on it (its clock two hours past hour h): the app, the
    pods, h and the service's now."""
    hour = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600
    h = datetime.fromtimestamp(hour, UTC)
    later = h + timedelta(hours=2)
    pods = cluster(api)
    app = recorder_app(db_url, clock=lambda: later)
    eventually(
        lambda: recorded(db_url, 2, 2) and len(rows(db_url, "gpu_workloads")) == 4,
        timeout=15,
    )
    return app, pods, h, later


def accounted(app: Any, h: datetime, later: datetime) -> str:
    """Snapshots at h:10 and now (the newest), hour h's statistics from them: the query
    of hour h's rows."""
    app.jobs.snapshot(h + timedelta(minutes=10))
    app.jobs.snapshot(later)  # the newest (the start's found nothing yet)
    assert app.writer.flush(10)
    app.jobs.hourly(later)
    assert app.writer.flush(10)
    return f"start_time={h.strftime(RFC)}&end_time={h.strftime(RFC)}"


def test_a_workload_runs_when_its_pods_do_on_every_route(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    app, pods, h, later = started(api, recorder_app, db_url)
    assert {r["name"]: r["status"] for r in rows(db_url, "gpu_workloads")} == {
        "nightly": "Pending",
        "nightly-29000": "Pending",
        "trainer": "Pending",
        "trainer-5d9f": "Pending",
    }  # the owners' own: silent or behind

    on_1 = get(app, "/v1/nodes/gpu-1/workloads?page_num=1&page_size=10")
    assert on_1 == {
        "total": 1,
        "data": [
            {
                "kind": "CronJob",
                "name": "nightly",
                "namespace": NS,
                "uid": U["nightly"],
                "gpu_allocated": 4,
                "gpu_allocated_node": 4,
                "node_name": "gpu-1",
                "status": "Running",
            }
        ],
    }
    assert [w["name"] for w in get(app, "/v1/nodes/gpu-2/workloads")["data"]] == ["trainer"]
    consumers = get(app, "/v1/clusters/consumers?page_num=1&page_size=10")
    assert consumers["total"] == 2
    assert sorted((w["name"], w["stat"]["gpu_request"]) for w in consumers["data"]) == [
        ("nightly", 4),
        ("trainer", 2),
    ]
    listed = get(app, "/v1/workloads?page_num=1&page_size=10")
    assert sorted(
        (w["name"], w["status"], w["status_color"], w["gpu_allocated"]) for w in listed["data"]
    ) == [("nightly", "Running", "green", 4), ("trainer", "Running", "green", 2)]
    assert get(app, "/v1/workloads?status=Running")["total"] == 2
    assert get(app, "/v1/workloads/statistic")["running_workloads_count"] == 2
    # the accounting: the snapshots' workloads and the hour's rows, Running
    span = accounted(app, h, later)
    details = {
        r["dimension_value"]: r["allocation_details"]["status"]
        for r in rows(db_url, "gpu_allocation_snapshots")
        if r["dimension_type"] == "workload"
    }
    assert details == {"nightly": "Running", "trainer": "Running"}
    works = get(app, f"/v1/gpu-aggregation/workloads/hourly-stats?{span}")["data"]
    assert sorted((w["workload_name"], w["workload_status"]) for w in works) == [
        ("nightly", "Running"),
        ("trainer", "Running"),
    ]

    # the Deployment's pod runs but is not Ready: its owner's Pending stands, everywhere
    api.put("pods", state(pods["trainer-5d9f-a"], "Running", False))
    eventually(lambda: get(app, "/v1/clusters/consumers")["total"] == 1, timeout=15)
    assert [w["name"] for w in get(app, "/v1/clusters/consumers")["data"]] == ["nightly"]
    assert get(app, "/v1/nodes/gpu-2/workloads")["data"] == []
    assert {w["name"]: w["status"] for w in get(app, "/v1/workloads")["data"]} == {
        "nightly": "Running",
        "trainer": "Pending",
    }
    assert get(app, "/v1/workloads/statistic")["running_workloads_count"] == 1
    # its owner catches up: Running by its own word
    spec = {"replicas": 1, "template": template(AMD, 2)}
    api.put("deployments", workload("trainer", spec, {"replicas": 1, "readyReplicas": 1}))
    eventually(lambda: get(app, "/v1/clusters/consumers")["total"] == 2, timeout=15)


def test_one_allocation_figure_for_the_moment_on_every_route(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """6 of 8 GPUs held, 4 of them on the node tainted for GPU work: 75 % on the overview
    and the dashboard as in the node list, the snapshots and the hour's statistics."""
    app, _, h, later = started(api, recorder_app, db_url)
    assert get(app, "/v1/clusters/overview")["allocationRate"] == 75.0
    assert get(app, "/v1/nodes/gpuUtilization")["allocationRate"] == 75.0
    nodes = get(app, "/v1/nodes")["data"]
    assert [(n["name"], n["gpu_allocation"], n["gpu_count"]) for n in nodes] == [
        ("gpu-1", 4, 4),
        ("gpu-2", 2, 4),
    ]
    assert [
        (a["node"], a["allocated"], a["capacity"]) for a in get(app, "/v1/nodes/gpuAllocation")
    ] == [("gpu-1", 4, 4), ("gpu-2", 2, 4)]
    span = accounted(app, h, later)
    latest = get(app, "/v1/gpu-aggregation/snapshots/latest")
    assert (latest["allocated_gpu_count"], latest["total_gpu_capacity"]) == (6, 8)
    hour = int(h.timestamp())
    points = get(app, f"/v1/clusters/allocation?start={hour}&end={hour + 3600}")["points"]
    assert [(p["requested"], p["allocatable"], p["rate"]) for p in points] == [(6, 8, 75.0)]
    (hourly,) = get(app, f"/v1/gpu-aggregation/cluster/hourly-stats?{span}")["data"]
    assert (
        hourly["allocated_gpu_count"],
        hourly["total_gpu_capacity"],
        hourly["allocation_rate"],
    ) == (6.0, 8, 75.0)
