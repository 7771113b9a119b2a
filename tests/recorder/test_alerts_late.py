"""Alerts enriched late (issue 70): an alert that names a pod the service does not know
yet is stored without its workload; once the pod is known, the leader's job enriches
it (workload, pod, node, enriched_data) and the workload's timeline lists it; the looks
at an alert are bounded. SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import requests

from lens_ebpf.recorder.alerts import late
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import NS, U, gpu_pod, state
from tests.recorder.test_cluster_api import node, put_trainer


def data(app: Any, path: str) -> Any:
    r = requests.get(f"http://127.0.0.1:{app.http.port}/v1/{path}", timeout=hang_guard(10))
    assert r.status_code == 200 and r.json()["meta"]["code"] == 2000, r.text
    return r.json()["data"]


def test_an_alert_before_its_pod_is_enriched_once_the_pod_is_known(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    app = recorder_app(db_url)
    eventually(lambda: len(rows(db_url, "nodes")) == 1, timeout=15)
    # the alert comes first: the pod it names is not known yet
    r = requests.post(
        f"http://127.0.0.1:{app.http.port}/v1/alerts/webhook",
        json={
            "alert_name": "GPUXid",
            "severity": "critical",
            "labels": {"namespace": NS, "pod": "trainer-5d9f-a", "node": "gpu-1"},
            "annotations": {"summary": "Xid 79 on gpu-1"},
        },
        timeout=hang_guard(10),
    )
    assert r.status_code == 200 and r.json()["data"]["new"] == 1, r.text
    (stored,) = rows(db_url, "alert_events")
    assert (stored["workload_id"], stored["pod_id"]) == ("", "")
    # then the pod: its Deployment's, running on gpu-1
    put_trainer(api, "2026-11-23T06:00:00Z")
    p = gpu_pod("trainer-5d9f-a", "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
    api.put("pods", p)
    api.put("pods", state(p, "Running", True))
    eventually(
        lambda: any(
            r["pod_uid"] == "uid-trainer-5d9f-a" for r in rows(db_url, "workload_pod_references")
        ),
        timeout=15,
    )
    # the leader's job (every few seconds) finds it
    eventually(lambda: rows(db_url, "alert_events")[0]["workload_id"] == U["trainer"], timeout=30)
    got = data(app, f"alerts/{stored['id']}")
    assert (got["workload_id"], got["workload_name"], got["pod_name"], got["node_name"]) == (
        U["trainer"],
        "trainer",
        "trainer-5d9f-a",
        "gpu-1",
    )
    assert got["enriched_data"]["workload_info"]["uid"] == U["trainer"]
    assert got["enriched_data"]["pod_info"]["name"] == "trainer-5d9f-a"
    assert app.alerts.jobs.enriched_late == 1
    # its timeline entry follows
    timeline = data(app, f"workloads/{U['trainer']}/timeline")
    alerts = [e for e in timeline["entries"] if e["type"] == "alert"]
    assert [(e["pod"], e["node"], e["detail"]["alert_id"]) for e in alerts] == [
        ("trainer-5d9f-a", "gpu-1", stored["id"])
    ]


def test_an_alert_is_looked_at_a_bounded_number_of_times() -> None:
    """Each look that does not find the workload waits twice the last; after TRIES, none."""
    retries = late.Retries()
    now = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)

    class Row:
        id = "a1"

    looks = []
    for second in range(0, 4000):
        at = now + timedelta(seconds=second)
        for r in retries.due([Row()], at):
            looks.append(second)
            retries.missed(r.id, at)
    assert looks == [0, 5, 15, 35, 75, 155, 315, 635][: late.TRIES]
    assert retries.given_up == 1
    # an alert gone from the pending ones (enriched, resolved, out of the window) is
    # forgotten
    assert retries.due([], now) == [] and retries.tries == {}
