"""The workload page's remaining calls (issue 71, item 7): workloads/{uid}/events,
/gpuMetrics, /stats and POST workloads/batchStats, against a real Prometheus."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import NS, gpu_pod, state
from tests.recorder.test_cluster_api import get, node, put_trainer


def test_events_graphs_and_figures_as_the_page_asks_them(
    api: FakeApiServer, recorder_app: Any, tmp_path: Any
) -> None:
    """Two GPU pods of a Deployment; per minute pod a's GPU at 10, 20, ... 100, pod b's at
    50: the workload's per-minute means 30 .. 75, so average 52.5, p50 52.5, p90 70.5, p95
    72.75 (Prometheus's interpolation), max and instant 75."""
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    t0 = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600
    lines = ["# TYPE gpu_utilization gauge\n"]
    for m in range(10):
        for pod, gpu, v in (("trainer-5d9f-a", 0, 10 * (m + 1)), ("trainer-5d9f-b", 1, 50)):
            lines.append(
                f'gpu_utilization{{node="gpu-1",gpu_id="{gpu}",namespace="{NS}",'
                f'pod="{pod}"}} {v} {t0 + 60 * m}\n'
            )
    prometheus = Prometheus([], openmetrics="".join(lines) + "# EOF\n")
    try:
        put_trainer(api, datetime.fromtimestamp(t0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
        for name in ("trainer-5d9f-a", "trainer-5d9f-b"):
            p = gpu_pod(name, "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
            api.put("pods", p)
            api.put("pods", state(p, "Running", True))
        url = f"sqlite:///{tmp_path / 'r.db'}"
        at = datetime.fromtimestamp(t0 + 540, UTC)
        app = recorder_app(url, clock=lambda: at, prometheus__url=prometheus.base)
        eventually(
            lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 2
            and len(rows(url, "gpu_workloads")) == 2,
            timeout=15,
        )
        uid = "uid-dep-trainer"
        figures = {
            "instant_gpu_utilization": 75.0,
            "avg_gpu_utilization": 52.5,
            "p50_gpu_utilization": 52.5,
            "p90_gpu_utilization": 70.5,
            "p95_gpu_utilization": 72.75,
            "max_gpu_utilization": 75.0,
        }
        got = get(app, f"/v1/workloads/{uid}/stats")
        assert {k: got[k] for k in figures} == figures
        assert (got["uid"], got["name"], got["start"], got["end"]) == (uid, "trainer", t0, t0 + 540)
        assert (
            get(
                app, f"/v1/workloads/{uid}/stats?metrics=max_gpu_utilization," "p50_gpu_utilization"
            )["max_gpu_utilization"]
            == 75.0
        )
        # the first five minutes only: means 30..50, ended, so no instant figure
        first = get(app, f"/v1/workloads/{uid}/stats?start={t0}&end={t0 + 240}")
        assert (
            first["avg_gpu_utilization"],
            first["max_gpu_utilization"],
            first["instant_gpu_utilization"],
        ) == (40.0, 50.0, 0.0)
        g = f"start={t0}&end={t0 + 540}&step=60"
        assert get(app, f"/v1/workloads/{uid}/gpuMetrics?{g}") == get(
            app, f"/v1/workloads/{uid}/metrics?{g}"
        )
        assert get(app, f"/v1/workloads/{uid}/events") == get(app, f"/v1/workloads/{uid}/timeline")
        base = f"http://127.0.0.1:{app.http.port}"
        r = requests.post(
            base + "/v1/workloads/batchStats",
            json={"uids": [uid, "uid-none"], "metrics": ["avg_gpu_utilization"]},
            timeout=hang_guard(10),
        )
        body = r.json()
        assert r.status_code == 200 and body["meta"]["code"] == 2000, body
        assert body["data"]["missing"] == ["uid-none"]
        assert body["data"]["stats"][uid]["avg_gpu_utilization"] == 52.5
        assert "max_gpu_utilization" not in body["data"]["stats"][uid]
        for path, query, code in (
            (f"workloads/{uid}/stats", "metrics=gpu_temperature", 4001),
            (f"workloads/{uid}/stats", f"start={t0 + 300}&end={t0}", 4001),
            ("workloads/uid-none/stats", "", 4004),
            ("workloads/uid-none/events", "", 4004),
        ):
            r = requests.get(f"{base}/v1/{path}?{query}", timeout=hang_guard(5))
            assert r.json()["meta"]["code"] == code, (path, r.text)
        # the body's cluster is the cluster asked about, as the UI's POSTs name it
        for query, bad, code in (
            ("", {"uids": "x"}, 4001),
            ("", {"uids": [uid], "cluster": "elsewhere"}, 4004),  # followed: none such
            ("?cluster=local", {"uids": [uid], "cluster": "elsewhere"}, 4001),  # which?
            ("?cluster=elsewhere", {"uids": [uid], "cluster": "local"}, 4004),
        ):
            r = requests.post(
                base + "/v1/workloads/batchStats" + query, json=bad, timeout=hang_guard(5)
            )
            assert (r.status_code // 100, r.json()["meta"]["code"]) == (4, code), r.text
        r = requests.post(
            base + "/v1/workloads/batchStats",
            json={"uids": [uid], "cluster": "local"},
            timeout=hang_guard(5),
        )
        assert r.json()["data"]["stats"][uid]["avg_gpu_utilization"] == 52.5, r.text
    finally:
        prometheus.stop()


@pytest.mark.parametrize(
    "method, path, allow",
    [
        ("PUT", "/pods/cache", "GET"),
        ("DELETE", "/pods/workload/cache", "GET"),
        ("GET", "/logs", "POST"),
        ("GET", "/alerts/webhook", "POST"),
        ("PATCH", "/v1/alerts/webhook", "POST"),
        ("PUT", "/v1/workloads/batchStats", "POST"),
    ],
)
def test_a_root_route_answers_an_unserved_method_in_the_envelope(
    recorder_app: Any, tmp_path: Any, method: str, path: str, allow: str
) -> None:
    """The Primus-Lens routes served at the root too (no prefix) answer 405 in the envelope
    (4016), as those under /v1 do, not the server's plain {"error"}."""
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}")
    r = requests.request(
        method, f"http://127.0.0.1:{app.http.port}{path}", json={}, timeout=hang_guard(5)
    )
    body = r.json()
    assert (r.status_code, set(body), body["meta"]["code"]) == (405, {"meta", "data"}, 4016)
    assert allow in r.headers["Allow"] and f"{method} /" in body["meta"]["message"]
