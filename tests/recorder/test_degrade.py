"""Degrade, do not fail (issue 58): without `recorder.prometheus.url`, with a real
Prometheus stopped, and with one that accepts and never answers (past
`recorder.prometheus.timeout_seconds`), the routes that mix stored facts with Prometheus
figures answer 2000 with the stored facts exact, the Prometheus figures 0 (the original's
types: never null where its Go struct has a number or string; issue 70) and meta.message
saying why; the routes that are nothing but Prometheus figures answer 5003."""

from __future__ import annotations

import socket
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import NS, U, gpu_pod, state
from tests.recorder.test_cluster_api import gpu_pod as plain_gpu_pod
from tests.recorder.test_cluster_api import node, openmetrics, put_trainer

MISSING = "OK; figures unknown, answered as 0: "
# every query a request of these routes makes reads Prometheus at this time or before
T0 = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600


class Silent:
    """A TCP server that accepts every connection, reads its request and never answers:
    a hung Prometheus. `asked` holds each request's PromQL (`query`), in order."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.asked: list[str] = []
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.held.append(conn)
            conn.settimeout(5)
            try:
                line = conn.recv(65536).split(b"\r\n", 1)[0].decode()
            except OSError:
                continue
            query = urllib.parse.urlsplit(line.split(" ")[1] if " " in line else "").query
            self.asked += urllib.parse.parse_qs(query).get("query", [""])

    def read_all(self) -> list[str]:
        """`asked`, once every connection made before this call is read: a marker request
        sent now is read after them (the listen backlog is first in, first out)."""
        mark = f"mark-{len(self.held)}"
        with socket.create_connection(self.sock.getsockname()) as conn:
            conn.sendall(f"GET /api/v1/query?query={mark} HTTP/1.1\r\n\r\n".encode())
            eventually(lambda: mark in self.asked, timeout=hang_guard(10))
        return [q for q in self.asked if not q.startswith("mark-")]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.sock.close()


def cluster(api: FakeApiServer) -> None:
    """gpu-1 (8 AMD GPUs; the Deployment trainer's two pods, one GPU each) and gpu-2 (4
    NVIDIA; a pod of one GPU that no workload owns)."""
    put_trainer(api, datetime.fromtimestamp(T0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    api.put("nodes", node("gpu-2", "True", {"nvidia.com/gpu": "4"}, "10.0.0.12"))
    for name in ("trainer-5d9f-a", "trainer-5d9f-b"):
        p = gpu_pod(name, "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
        api.put("pods", p)
        api.put("pods", state(p, "Running", True))
    api.put("pods", plain_gpu_pod("c", "gpu-2", "nvidia.com/gpu", 1, "Running"))


def ask(app: Any, path: str) -> tuple[int, dict[str, Any]]:
    r = requests.get(f"http://127.0.0.1:{app.http.port}/v1/{path}", timeout=hang_guard(10))
    return r.status_code, r.json()


def degraded(app: Any, path: str, why: str) -> Any:
    """The route's data, having checked it answered 2000 saying exactly why figures are 0."""
    status, body = ask(app, path)
    assert (status, body["meta"]) == (200, {"code": 2000, "message": MISSING + why}), body
    return body["data"]


UNKNOWN_GPU = {"memory": "", "utilization": 0.0, "temperature": 0.0, "power": 0.0}
NODE = {"gpu_name": "AMD_Instinct_MI300X_OAM", "status": "Ready", "status_color": "green"}


def expected(figures: dict[str, Any] | None) -> dict[str, Any]:
    """Each mixed route's whole answer: the stored facts, and the Prometheus figures
    (None: every one unknown, 0)."""
    f = figures or {
        "tx": 0.0,
        "rx": 0.0,
        "util": 0.0,
        "gpu-1": 0.0,
        "gpu-2": 0.0,
        "trainer": 0.0,
        "stat": (0.0, 0),
    }
    return {
        "clusters/overview": {
            "total_space": 0.0,
            "used_space": 0.0,
            "usage_percentage": 0.0,
            "total_inodes": 0.0,
            "used_inodes": 0.0,
            "inodes_usage_percentage": 0.0,
            "read_bandwidth": 0.0,
            "write_bandwidth": 0.0,
            "total_tx": f.get("tx"),
            "total_rx": f.get("rx"),
            "totalNodes": 2,
            "healthyNodes": 2,
            "faultyNodes": 0,
            "fullyIdleNodes": 0,
            "partiallyIdleNodes": 2,
            "busyNodes": 0,
            "allocationRate": 25.0,
            "utilization": f.get("util"),
        },
        "nodes": {
            "total": 2,
            "cluster_name": "local",
            "data": [
                {
                    "name": "gpu-1",
                    **NODE,
                    "ip": "10.0.0.11",
                    "gpu_count": 8,
                    "gpu_allocation": 2,
                    "gpu_utilization": f.get("gpu-1"),
                },
                {
                    "name": "gpu-2",
                    **NODE,
                    "ip": "10.0.0.12",
                    "gpu_count": 4,
                    "gpu_allocation": 1,
                    "gpu_utilization": f.get("gpu-2"),
                },
            ],
        },
        "nodes/gpu-1": {
            "name": "gpu-1",
            "health": "Ready",
            "cpu": f"128 X {f['cpu']}" if "cpu" in f else "128",
            "memory": "2113474560Ki",
            "os": "Ubuntu 22.04.5 LTS",
            "gpu_driver_version": "6.7.0",
            "static_gpu_details": "8 X AMD_Instinct_MI300X_OAM",
            "kubelet_version": "v1.31.2",
            "containerd_version": "1.7.22",
            "cluster_name": "local",
        },
        "nodes/gpu-1/gpuDevices": {
            "node_name": "gpu-1",
            "cluster_name": "local",
            "devices": [
                {"deviceId": 0, "model": "AMD Instinct MI300X", **f.get("gpu0", UNKNOWN_GPU)},
                {"deviceId": 1, "model": "", **f.get("gpu1", UNKNOWN_GPU)},
            ],
        },
        "nodes/gpuUtilization": {"allocationRate": 25.0, "utilization": f.get("util")},
        "workloads/statistic": {
            "running_workloads_count": 1,
            "avg_gpu_allocated": 2.0,
            "avg_gpu_utilization": f.get("stat", (None, None))[0],
            "low_utilization_workloads_count": f.get("stat", (None, None))[1],
        },
        "clusters/consumers": {
            "total": 1,
            "data": [
                {
                    "kind": "Deployment",
                    "name": "trainer",
                    "namespace": NS,
                    "uid": U["trainer"],
                    "stat": {"gpu_request": 2, "gpu_utilization": f.get("trainer")},
                    "pods": [],
                    "source": "k8s",
                }
            ],
        },
        "workloads": {
            "total": 1,
            "data": [
                {
                    "kind": "Deployment",
                    "name": "trainer",
                    "namespace": NS,
                    "uid": U["trainer"],
                    "gpu_allocated": 2,
                    "gpu_allocation": {"AMD_Instinct_MI300X_OAM": 2.0},
                    "status": "Running",
                    "status_color": "green",
                    "start_at": T0,
                    "source": "k8s",
                    **{
                        f"{k}_gpu_utilization": f.get("trainer")
                        for k in ("instant", "avg", "p50", "p90", "p95")
                    },
                }
            ],
        },
    }


# the routes that are nothing but Prometheus figures: 503, 5003
PURE = (
    "clusters/gpuHeatmap",
    f"nodes/gpuUtilizationHistory?start={T0}&end={T0 + 240}",
    f"nodes/gpu-1/gpuMetrics?start={T0}&end={T0 + 240}",
    f"workloads/{U['trainer']}/metrics?start={T0}&end={T0 + 240}",
    f"workloads/gpuUtilizationHistory?kind=Deployment&name=trainer&start={T0}" f"&end={T0 + 240}",
)


def without_end(data: Any) -> Any:
    """The workload list without end_at (its last update's time, the watch's)."""
    return {**data, "data": [{k: v for k, v in w.items() if k != "end_at"} for w in data["data"]]}


def report_gpus(app: Any) -> None:
    """gpu-1's agent reports its two AMD GPUs (the sysfs fixture's)."""
    from lens_ebpf.agent.devices import inventory as records
    from lens_ebpf.agent.devices.gpu import amd
    from lens_ebpf.agent.inventory import DeviceWatch
    from tests.recorder.test_node_events import reporting

    sysfs = Path(__file__).parent.parent / "fixtures" / "gpu" / "sys"
    readings = sorted(amd.read_sysfs(sysfs), key=lambda r: r.bdf)
    for i, r in enumerate(readings):
        r.index = i
    with reporting(app) as (bus, reporter):
        DeviceWatch(bus.publish).update("gpu", records.gpu_records(readings, "gpu-1"))
        eventually(lambda: reporter.acked == 1, timeout=15)
        assert app.writer.flush(10)


def started(recorder_app: Any, api: FakeApiServer, url: str, **settings: Any) -> Any:
    cluster(api)
    app = recorder_app(url, clock=lambda: datetime.fromtimestamp(T0 + 300, UTC), **settings)
    eventually(
        lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 3
        and len(rows(url, "gpu_workloads")) == 2
        and len(rows(url, "nodes")) == 2,
        timeout=15,
    )
    report_gpus(app)
    return app


def check_degraded(app: Any, why: str, pure_why: str) -> None:
    """Every mixed route: 2000, the stored facts exact, its Prometheus figures 0, why
    said; every pure route: 5003, why said."""
    want = expected(None)
    for path, data in want.items():
        got = degraded(app, path, why)
        assert (without_end(got) if path == "workloads" else got) == data, path
    # ordered by a utilization nobody knows: in name order (desc: reversed)
    by_use = degraded(app, "nodes?order_by=gpu_utilization&desc=true", why)
    assert [n["name"] for n in by_use["data"]] == ["gpu-2", "gpu-1"]
    frag = degraded(app, "nodes/fragmentation-analysis", why)
    assert [(f["node_name"], f["utilization"]) for f in frag["node_fragmentations"]] == [
        ("gpu-1", 0.0),
        ("gpu-2", 0.0),
    ]
    timeline = degraded(
        app, f"workloads/{U['trainer']}/timeline", f"timeline entries from Prometheus: {pure_why}"
    )
    assert timeline["incomplete"] == [pure_why]
    for path in PURE:
        status, body = ask(app, path)
        assert (status, body["meta"]) == (503, {"code": 5003, "message": pure_why}), path
    # stored-only routes say nothing is missing
    status, body = ask(app, "nodes/gpuAllocation")
    assert (status, body["meta"]["message"]) == (200, "OK")


def test_without_prometheus_url(api: FakeApiServer, recorder_app: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    app = started(recorder_app, api, url)
    check_degraded(
        app,
        "recorder.prometheus.url is not set",
        "recorder.prometheus.url is not set: this route needs Prometheus",
    )


@pytest.fixture()
def prometheus() -> Iterator[Any]:
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    p = Prometheus([], openmetrics=openmetrics(T0))
    yield p
    p.stop()


def test_with_prometheus_stopped_then_back(
    api: FakeApiServer, recorder_app: Any, prometheus: Any, db_url: str
) -> None:
    app = started(recorder_app, api, db_url, prometheus__url=prometheus.base)
    prometheus.pause()
    why = (
        f"prometheus at {prometheus.base} is unavailable: <urlopen error [Errno 111] "
        "Connection refused>"
    )
    check_degraded(app, why, why)
    prometheus.start()
    # back: the same answers, with its figures (the series of openmetrics(T0)), and "OK"
    figures = {
        "tx": 100.0,
        "rx": 200.0,
        "util": 50.0,
        "gpu-1": 60.0,
        "gpu-2": 30.0,
        "cpu": "AMD EPYC 9654 96-Core Processor",
        "trainer": 0.0,
        "stat": (0.0, 0),  # the fixture's series name no pod: no workload's mean
        "gpu0": {"memory": "0GB", "utilization": 80.0, "temperature": 61.0, "power": 700.0},
        "gpu1": {"memory": "", "utilization": 40.0, "temperature": 55.0, "power": 0.0},
    }
    for path, data in expected(figures).items():
        status, body = ask(app, path)
        assert (status, body["meta"]["message"]) == (200, "OK"), body
        got = body["data"]
        assert (without_end(got) if path == "workloads" else got) == data, path


def test_with_prometheus_hung(api: FakeApiServer, recorder_app: Any, tmp_path: Path) -> None:
    """A Prometheus that never answers costs a request timeout_seconds once: its first
    query timed out, the request's other reads of it are unknown (0) at once."""
    silent = Silent()
    try:
        url = f"sqlite:///{tmp_path / 'r.db'}"
        # the hourly job backfills a week at start: its run waits for the timeout once
        # (the first hour's query), not once an hour
        app = started(
            recorder_app, api, url, prometheus__url=silent.url, prometheus__timeout_seconds=1
        )
        why = f"prometheus at {silent.url} is unavailable: timed out"
        check_degraded(app, why, why)
        # the overview reads three figures: only its first query went out
        from lens_ebpf.recorder import prom

        mine = (prom.RDMA_TX, prom.RDMA_RX, prom.UTILIZATION)
        before = [q for q in silent.read_all() if q in mine]
        degraded(app, "clusters/overview", why)
        assert [q for q in silent.read_all() if q in mine][len(before) :] == [prom.RDMA_TX]
        # the workload list: five figures, one query
        stats = ("avg_over_time(avg(gpu_utilization", "quantile_over_time(", "avg(gpu_utilization{")
        asked = len([q for q in silent.read_all() if q.startswith(stats)])
        degraded(app, "workloads", why)
        got = [q for q in silent.read_all() if q.startswith(stats)][asked:]
        assert len(got) == 1 and got[0].startswith(stats[0]), got
    finally:
        silent.close()
