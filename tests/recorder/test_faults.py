"""The recorder under faults: a database outage (nothing lost within the queue's bound,
the rest counted), an API server that dies, a finalizer that could not come off before a
crash, workloads deleted while nobody watched."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import requests

from tests import pglab
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import (
    GPU1,
    NS,
    U,
    gone,
    gpu_pod,
    has_finalizer,
    state,
    template,
    workload,
)

NV = "nvidia.com/gpu"
SPEC = {"replicas": 1, "template": template(NV, 1)}


def deployment(api: FakeApiServer) -> dict[str, Any]:
    """A Deployment, its ReplicaSet and one running GPU pod."""
    api.put("deployments", workload("trainer", SPEC, {"replicas": 1, "readyReplicas": 1}))
    api.put(
        "replicasets",
        workload("trainer-5d9f", SPEC, {"replicas": 1, "readyReplicas": 1}, "trainer"),
    )
    p = gpu_pod("trainer-5d9f-a", "trainer-5d9f", NV, 1, GPU1)
    api.put("pods", p)
    api.put("pods", state(p, "Running", True))
    return p


def metric(app: Any, line: str) -> float | None:
    text = requests.get(f"http://127.0.0.1:{app.http.port}/metrics", timeout=hang_guard(5)).text
    for got in text.splitlines():
        if got.startswith(line + " "):
            return float(got.rsplit(" ", 1)[1])
    return None


def restarts(url: str) -> list[str]:
    return [e["new_value"] for e in rows(url, "gpu_pods_events") if e["type"] == "restart"]


@pytest.fixture()
def pg(postgres: pglab.Postgres) -> pglab.Postgres:
    return postgres


def test_a_database_outage_loses_nothing_within_the_bound(
    api: FakeApiServer, recorder_app: Any, pg: pglab.Postgres
) -> None:
    url = pg.create_database("outage")
    p = deployment(api)
    app = recorder_app(url, queue_max=30)
    eventually(lambda: len(rows(url, "gpu_pods")) == 1, timeout=10)
    eventually(lambda: all(r["finalizer"] for r in rows(url, "gpu_workloads")), timeout=10)
    assert app.writer.flush(10)
    pg.stop()
    try:
        for n in range(1, 21):  # 20 restarts while the database is down
            api.put("pods", state(p, "Running", True, restarts=n))
        eventually(lambda: app.writer.depth() == 20, timeout=10)
        eventually(lambda: metric(app, "lens_recorder_db_up") == 0, timeout=10)
        assert metric(app, "lens_recorder_queue_depth") == 20
        assert metric(app, 'lens_recorder_db_errors_total{reason="unavailable"}') >= 1
        ready = requests.get(f"http://127.0.0.1:{app.http.port}/readyz", timeout=hang_guard(5))
        assert ready.status_code == 503 and ready.json()["database_up"] is False
        down = requests.get(f"http://127.0.0.1:{app.http.port}/workloads", timeout=hang_guard(15))
        assert down.status_code == 503 and "database unavailable" in down.json()["error"]
    finally:
        pg.start()
    assert app.writer.flush(30)
    assert restarts(url) == [str(n) for n in range(1, 21)]
    assert Counter(r["pod_uid"] for r in rows(url, "pod_snapshots")) == {
        "uid-trainer-5d9f-a": 21
    }  # as first listed (Running), and each restart
    assert metric(app, "lens_recorder_queue_dropped_total") == 0
    assert metric(app, "lens_recorder_db_up") == 1


def test_beyond_the_bound_writes_are_dropped_and_counted(
    api: FakeApiServer, recorder_app: Any, pg: pglab.Postgres
) -> None:
    url = pg.create_database("overflow")
    p = deployment(api)
    app = recorder_app(url, queue_max=5, finalizers=False)  # only the pod's writes queue
    eventually(lambda: len(rows(url, "gpu_pods")) == 1, timeout=10)
    assert app.writer.flush(10)
    # a start-up write may already have found the 5 places taken (a slow first commit)
    before = app.writer.dropped
    pg.stop()
    try:
        for n in range(1, 9):  # 8 changes, room for 5
            api.put("pods", state(p, "Running", True, restarts=n))
        eventually(lambda: app.writer.dropped == before + 3, timeout=10)
    finally:
        pg.start()
    assert app.writer.flush(30)
    assert restarts(url) == ["1", "2", "3", "4", "5"]  # the first five, in order
    assert metric(app, "lens_recorder_queue_dropped_total") == before + 3


def test_the_api_server_dies_and_comes_back(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    p = deployment(api)
    app = recorder_app(db_url)
    eventually(
        lambda: has_finalizer(api, "trainer") and has_finalizer(api, "trainer-5d9f"), timeout=10
    )
    api.kill()
    eventually(
        lambda: metric(app, 'lens_recorder_watch_connected{resource="pods"}') == 0, timeout=15
    )
    # what happens while it is away is stored once it is back (etcd kept it)
    api.put("pods", state(p, "Running", True, restarts=1))
    api.put("pods", state(p, "Succeeded", False, restarts=1))
    api.start()
    eventually(lambda: [r["phase"] for r in rows(db_url, "gpu_pods")] == ["Succeeded"], timeout=20)
    assert restarts(db_url) == ["1"]
    assert metric(app, 'lens_recorder_watch_restarts_total{resource="pods",reason="error"}') >= 1


def test_a_finalizer_left_on_by_a_crash_comes_off_at_the_next_start(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    deployment(api)
    app = recorder_app(db_url)
    eventually(lambda: has_finalizer(api, "trainer"), timeout=10)
    eventually(lambda: all(r["finalizer"] for r in rows(db_url, "gpu_workloads")), timeout=10)
    api.fail_writes.add("deployments")  # the finalizer cannot come off
    api.request_delete("deployments", NS, "trainer")
    eventually(lambda: any(r["deleted"] for r in rows(db_url, "gpu_workloads")), timeout=10)
    eventually(lambda: app.tracker.finalizer_ops.get(("remove", "error"), 0) >= 1, timeout=10)
    app.stop()  # the recorder goes away with the finalizer still on
    assert has_finalizer(api, "trainer") and not gone(api, "trainer")
    (row,) = (r for r in rows(db_url, "gpu_workloads") if r["name"] == "trainer")
    assert row["deleted"] and row["finalizer"]
    api.fail_writes.clear()
    recorder_app(db_url)
    eventually(lambda: gone(api, "trainer"), timeout=15)
    eventually(
        lambda: not [
            r for r in rows(db_url, "gpu_workloads") if r["name"] == "trainer" and r["finalizer"]
        ],
        timeout=10,
    )


def test_without_finalizers_a_workload_deleted_while_down_is_still_recorded(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    p = deployment(api)
    app = recorder_app(db_url, finalizers=False)
    eventually(lambda: len(rows(db_url, "gpu_workloads")) == 2, timeout=10)
    assert app.writer.flush(10)
    assert not has_finalizer(api, "trainer")
    app.stop()
    api.request_delete("deployments", NS, "trainer")  # nothing holds it: gone at once
    api.request_delete("replicasets", NS, "trainer-5d9f")
    api.delete("pods", NS, p["metadata"]["name"])
    app = recorder_app(db_url, finalizers=False)
    eventually(
        lambda: all(r["deleted"] for r in rows(db_url, "gpu_workloads") + rows(db_url, "gpu_pods")),
        timeout=10,
    )
    events = [(e["type"], e["old_value"]) for e in rows(db_url, "gpu_pods_events")]
    assert events[-1] == ("deleted", "Running")
    assert app.tracker.workloads == {} and app.tracker.kinds == {}
    assert U["trainer"] in {r["uid"] for r in rows(db_url, "gpu_workloads")}


def test_a_workload_with_an_unreadable_gpu_request_is_recorded_and_counted(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    bad = {"pytorchReplicaSpecs": {"Worker": {"replicas": 2, "template": template(NV, 1)}}}
    bad["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {NV: "lots"}
    }
    api.put("pytorchjobs", workload("bert", bad, {}))
    p = gpu_pod("bert-worker-0", "bert", NV, 1, GPU1)
    api.put("pods", state(p, "Running", True))
    app = recorder_app(db_url)
    eventually(lambda: len(rows(db_url, "gpu_pods")) == 1, timeout=10)
    assert app.writer.flush(10)
    (wl,) = rows(db_url, "gpu_workloads")
    assert (wl["name"], wl["gpu_request"], wl["gpu_resources"]) == ("bert", 0, {})
    assert rows(db_url, "gpu_pods")[0]["workload_uid"] == U["bert"]
    assert metric(app, 'lens_recorder_malformed_objects_total{resource="workloads"}') >= 1
    assert metric(app, 'lens_recorder_malformed_objects_total{resource="pods"}') == 0


def test_an_owner_the_api_could_not_tell_about_is_looked_up_again(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    api.fail_gets.add("replicasets")  # 500 on GET: the ReplicaSet is unknown for now
    p = deployment(api)
    app = recorder_app(db_url)
    eventually(lambda: len(rows(db_url, "gpu_pods")) == 1, timeout=10)
    assert app.writer.flush(10)
    assert rows(db_url, "gpu_pods")[0]["workload_uid"] is None
    assert rows(db_url, "workload_pod_references") == []
    assert app.tracker.lookups["error"] == 1
    api.fail_gets.clear()
    api.put("pods", state(p, "Running", True, restarts=1))  # the pod's next change
    eventually(lambda: len(rows(db_url, "workload_pod_references")) == 2, timeout=10)
    assert app.writer.flush(10)
    assert rows(db_url, "gpu_pods")[0]["workload_uid"] == U["trainer"]
    assert {r["name"] for r in rows(db_url, "gpu_workloads")} == {"trainer", "trainer-5d9f"}
