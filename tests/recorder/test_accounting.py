"""GPU accounting: hourly statistics per cluster, namespace, label, annotation and workload
from allocation snapshots, from the pods' lifetimes where there are none, utilization from a
real Prometheus (missing while it is down, filled in when it is back), and the Statistics
pages' requests as the web UI sends them; SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually, pod
from tests.recorder.conftest import rows
from tests.recorder.test_cluster_api import get, node

RFC = "%Y-%m-%dT%H:%M:%SZ"
GIB = 1 << 30


def gpu(name: str, ns: str, n: int, labels: dict[str, str],
        notes: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    limits = {"amd.com/gpu": str(n)}
    main = {"name": "main", "image": "t:1", "resources": {"limits": limits}}
    out = pod(name, "", ns, node="gpu-1", containers=[main])
    out["metadata"]["labels"] = labels
    out["metadata"]["annotations"] = notes
    return out


def series(hour: int) -> str:
    """Hour `hour`'s minutes: pod a's two GPUs at 40 and 60 %, pod c's one at 10 %; a's
    memory 2 GiB used of 8."""
    lines = ["# TYPE gpu_utilization gauge"]
    for m in range(60):
        at = hour + 60 * m
        lines += [f'gpu_utilization{{namespace="ml",pod="a",gpu_id="0"}} 40 {at}',
                  f'gpu_utilization{{namespace="ml",pod="a",gpu_id="1"}} 60 {at}',
                  f'gpu_utilization{{namespace="infer",pod="c",gpu_id="0"}} 10 {at}']  # fmt: skip
    lines.append("# TYPE gpu_memory_used_bytes gauge")
    lines += [f'gpu_memory_used_bytes{{namespace="ml",pod="a"}} {2 * GIB} {hour + 60 * m}'
              for m in range(60)]  # fmt: skip
    lines.append("# TYPE gpu_memory_total_bytes gauge")
    lines += [f'gpu_memory_total_bytes{{namespace="ml",pod="a"}} {8 * GIB} {hour + 60 * m}'
              for m in range(60)]  # fmt: skip
    return "\n".join(lines) + "\n# EOF\n"


def test_hourly_accounting_snapshots_backfill_prometheus_and_the_ui(
        api: FakeApiServer, recorder_app: Any, db_url: str) -> None:  # fmt: skip
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    hour = (int(datetime.now(UTC).timestamp()) // 3600 - 6) * 3600
    h = datetime.fromtimestamp(hour, UTC)
    prometheus = Prometheus([], openmetrics=series(hour))
    now = [h - timedelta(hours=1, minutes=30)]  # the pods start then
    try:
        api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
        api.put("nodes", node("gpu-2", "True", {"amd.com/gpu": "4"}, "10.0.0.12"))
        api.put("pods", gpu("a", "ml", 2, {"team": "research"}, {"project": "llm"}))
        api.put("pods", gpu("c", "infer", 1, {"team": "serving"}, {}))
        url = db_url
        app = recorder_app(url, clock=lambda: now[0], prometheus__url=prometheus.base,
                           jobs__allocation_seconds=3600)  # fmt: skip
        eventually(lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 2
                   and app.jobs.runs["hourly"] >= 1, timeout=15)  # fmt: skip
        for minute in (10, 40):  # hour h: from snapshots
            app.jobs.snapshot(h + timedelta(minutes=minute))
        now[0] = h + timedelta(hours=1, minutes=30)
        api.delete("pods", "infer", "c")  # c ends half way through hour h+1
        eventually(lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 1, timeout=15)
        later = h + timedelta(hours=2, minutes=5)
        now[0] = later
        assert app.writer.flush(10)
        assert app.jobs.hourly(later) == 4  # h-2 (the start's snapshot), h; h-1, h+1: lifetimes
        assert app.writer.flush(10)
        assert app.jobs.hourly(later) == 0  # a run again (a restart) writes no hour twice
        assert app.writer.flush(10)

        span = f"start_time={(h - timedelta(hours=1)).strftime(RFC)}&end_time={later.strftime(RFC)}"
        cl = get(app, f"/v1/gpu-aggregation/cluster/hourly-stats?{span}&order_by=time"
                      "&order_direction=asc")["data"]  # fmt: skip
        assert [(r["stat_hour"], r["total_gpu_capacity"], r["allocated_gpu_count"],
                 r["allocation_rate"], r["avg_utilization"], r["sample_count"]) for r in cl] == [
            ((h - timedelta(hours=1)).strftime(RFC), 12, 3.0, 25.0, None, 0),
            (h.strftime(RFC), 12, 3.0, 25.0, pytest.approx(110 / 3), 60),
            ((h + timedelta(hours=1)).strftime(RFC), 12, 2.5, pytest.approx(2.5 / 12 * 100),
             pytest.approx(110 / 3), 5)]  # Prometheus's 5 minutes of lookback  # fmt: skip

        ns = get(app, f"/v1/gpu-aggregation/namespaces/hourly-stats?{span}&order_by=time"
                      "&order_direction=asc&page=1&page_size=20")  # fmt: skip
        assert (ns["total"], ns["page"], ns["page_size"], ns["total_pages"]) == (6, 1, 10000, 1)
        got = {(r["stat_hour"], r["namespace"]): (r["allocated_gpu_count"], r["avg_utilization"],
                                                  r["max_utilization"], r["active_workload_count"])
               for r in ns["data"]}  # fmt: skip
        hs = h.strftime(RFC)
        assert got[(hs, "ml")] == (2.0, 50.0, 50.0, 1)
        assert got[(hs, "infer")] == (1.0, 10.0, 10.0, 1)
        assert got[((h + timedelta(hours=1)).strftime(RFC), "infer")] == (0.5, 10.0, 10.0, 1)
        assert get(app, f"/v1/gpu-aggregation/namespaces?{span}") == ["infer", "ml"]

        assert get(app, f"/v1/gpu-aggregation/dimension-keys?dimension_type=label&{span}") \
            == ["team"]  # fmt: skip
        assert get(app, "/v1/gpu-aggregation/dimension-values?dimension_type=annotation"
                        f"&dimension_key=project&{span}") == ["llm"]  # fmt: skip
        lab = get(app, "/v1/gpu-aggregation/labels/hourly-stats?dimension_type=label"
                       f"&dimension_key=team&{span}&order_by=allocated_gpu_count")  # fmt: skip
        lab = lab["data"]
        at_h = {r["dimension_value"]: (r["allocated_gpu_count"], r["avg_utilization"])
                for r in lab if r["stat_hour"] == hs}  # fmt: skip
        assert at_h == {"research": (2.0, 50.0), "serving": (1.0, 10.0)}

        wl = get(app, f"/v1/gpu-aggregation/workloads/hourly-stats?{span}&namespace=ml")["data"]
        (a,) = (r for r in wl if r["stat_hour"] == hs)
        assert {k: a[k] for k in ("workload_name", "workload_type", "owner_uid",
                                  "allocated_gpu_count", "avg_utilization", "p95_utilization",
                                  "avg_gpu_memory_used", "avg_gpu_memory_total",
                                  "avg_replica_count", "max_replica_count", "min_replica_count",
                                  "sample_count", "labels", "annotations")} == {
            "workload_name": "a", "workload_type": "Pod", "owner_uid": "uid-a",
            "allocated_gpu_count": 2.0, "avg_utilization": 50.0, "p95_utilization": 50.0,
            "avg_gpu_memory_used": 2.0, "avg_gpu_memory_total": 8.0, "avg_replica_count": 1.0,
            "max_replica_count": 1, "min_replica_count": 1, "sample_count": 60,
            "labels": {"team": "research"}, "annotations": {"project": "llm"}}  # fmt: skip

        # the Statistics pages, as the web UI asks on load
        ui = [f"gpu-aggregation/namespaces?{span}",
              f"gpu-aggregation/namespaces/hourly-stats?{span}&page=1&page_size=100",
              f"gpu-aggregation/dimension-keys?dimension_type=annotation&{span}",
              f"gpu-aggregation/dimension-keys?dimension_type=label&{span}",
              f"gpu-aggregation/labels/hourly-stats?dimension_type=label&dimension_key=team"
              f"&{span}&page=1&page_size=100",
              f"gpu-aggregation/workloads/hourly-stats?{span}&page=1&page_size=100",
              "workloads?page_num=1&page_size=10", "workloads/statistics",
              "workloads/statistic", f"gpu-aggregation/snapshots?{span}",
              "gpu-aggregation/snapshots/latest", "nodes/fragmentation-analysis",
              "nodes/load-balance-analysis"]  # fmt: skip
        for path in ui:
            sep = "&" if "?" in path else "?"
            r = requests.get(f"http://127.0.0.1:{app.http.port}/v1/{path}{sep}cluster=local",
                             timeout=hang_guard(5))  # fmt: skip
            assert r.status_code == 200 and r.json()["meta"]["code"] == 2000, (path, r.text)
        snaps = get(app, f"/v1/gpu-aggregation/snapshots?{span}")
        assert [(s["total_gpu_capacity"], s["allocated_gpu_count"]) for s in snaps
                if s["snapshot_time"].startswith(hs[:13])] == [(12, 3), (12, 3)]  # fmt: skip
        for path, word in (
            ("gpu-aggregation/labels/hourly-stats?dimension_type=x", "x"),
            (f"gpu-aggregation/namespaces/hourly-stats?{span}&order_by=size", "size"),
            ("gpu-aggregation/namespaces?start_time=yesterday", "start_time"),
        ):
            r = requests.get(f"http://127.0.0.1:{app.http.port}/v1/{path}", timeout=hang_guard(5))
            assert r.status_code == 400 and word in r.json()["meta"]["message"], r.text
    finally:
        prometheus.stop()


def test_utilization_missing_while_prometheus_is_down_then_filled(
        api: FakeApiServer, recorder_app: Any, db_url: str) -> None:  # fmt: skip
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    hour = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600
    h = datetime.fromtimestamp(hour, UTC)
    prometheus = Prometheus([], openmetrics=series(hour))
    try:
        api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
        api.put("pods", gpu("a", "ml", 2, {"team": "research"}, {}))
        later = h + timedelta(hours=1, minutes=1)
        now = [h - timedelta(minutes=10)]  # the start's snapshot in hour h-1
        app = recorder_app(db_url, clock=lambda: now[0], prometheus__url=prometheus.base,
                           jobs__allocation_seconds=3600)  # fmt: skip
        eventually(lambda: sum(r["running"] for r in rows(db_url, "gpu_pods")) == 1
                   and app.jobs.runs["hourly"] >= 1, timeout=15)  # fmt: skip
        app.jobs.snapshot(h + timedelta(minutes=30))
        now[0] = later
        (scope,) = app.jobs.scopes()
        base, scope.prom.url = scope.prom.url, "http://127.0.0.1:9"  # down
        assert app.writer.flush(10)
        assert app.jobs.hourly(later) == 2  # h-1 (the start's snapshot) and h
        assert app.writer.flush(10)
        q = f"start_time={h.strftime(RFC)}&end_time={later.strftime(RFC)}"
        (row,) = get(app, f"/v1/gpu-aggregation/namespaces/hourly-stats?{q}")["data"]
        assert (row["allocated_gpu_count"], row["avg_utilization"]) == (2.0, None)
        (c,) = get(app, f"/v1/gpu-aggregation/cluster/hourly-stats?{q}")["data"]
        assert (c["allocated_gpu_count"], c["avg_utilization"], c["sample_count"]) == (2.0, None, 0)
        scope.prom.url = base  # back
        assert app.jobs.hourly(later + timedelta(minutes=6)) == 0  # no hour twice; filled
        assert app.writer.flush(10)
        (row,) = get(app, f"/v1/gpu-aggregation/namespaces/hourly-stats?{q}")["data"]
        assert (row["allocated_gpu_count"], row["avg_utilization"]) == (2.0, 50.0)
        (c,) = get(app, f"/v1/gpu-aggregation/cluster/hourly-stats?{q}")["data"]
        assert (c["avg_utilization"], c["sample_count"]) == (pytest.approx(110 / 3), 60)
        (w,) = get(app, f"/v1/gpu-aggregation/workloads/hourly-stats?{q}")["data"]
        assert (w["avg_utilization"], w["avg_gpu_memory_used"]) == (50.0, 2.0)
    finally:
        prometheus.stop()
