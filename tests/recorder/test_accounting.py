"""GPU accounting: hourly statistics per cluster, namespace, label, annotation and workload
from allocation snapshots, from the pods' lifetimes where there are none, utilization from a
real Prometheus (missing while it is down, filled in when it is back), and the Statistics
pages' requests as the web UI sends them; SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import requests

from lens_ebpf.core.times import aware
from lens_ebpf.recorder.accounting.jobs import HOURLY
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually, pod
from tests.recorder import objects
from tests.recorder.conftest import recorded, rows
from tests.recorder.objects import NS, state
from tests.recorder.test_cluster_api import (
    CONTRACTS,
    METRIC_CONTRACTS,
    conforms,
    get,
    node,
    put_trainer,
)
from tests.recorder.test_faults import metric

RFC = "%Y-%m-%dT%H:%M:%SZ"
GIB = 1 << 30


def unknown(app: Any, path: str, rows: int) -> Any:
    """A statistics page's data, having checked it says that many of its rows had no
    samples (their figures 0, the original's float64; issue 70)."""
    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))
    body = r.json()
    assert r.status_code == 200 and body["meta"]["code"] == 2000, body
    assert body["meta"]["message"].startswith(
        "OK; figures unknown, answered as 0: " f"{rows} of these hours' rows have no GPU " "samples"
    ), body["meta"]
    return body["data"]


def gpu(
    name: str, ns: str, n: int, labels: dict[str, str], notes: dict[str, str]
) -> dict[str, Any]:
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
        lines += [
            f'gpu_utilization{{namespace="ml",pod="a",gpu_id="0"}} 40 {at}',
            f'gpu_utilization{{namespace="ml",pod="a",gpu_id="1"}} 60 {at}',
            f'gpu_utilization{{namespace="infer",pod="c",gpu_id="0"}} 10 {at}',
        ]
    lines.append("# TYPE gpu_memory_used_bytes gauge")
    lines += [
        f'gpu_memory_used_bytes{{namespace="ml",pod="a"}} {2 * GIB} {hour + 60 * m}'
        for m in range(60)
    ]
    lines.append("# TYPE gpu_memory_total_bytes gauge")
    lines += [
        f'gpu_memory_total_bytes{{namespace="ml",pod="a"}} {8 * GIB} {hour + 60 * m}'
        for m in range(60)
    ]
    return "\n".join(lines) + "\n# EOF\n"


def test_hourly_accounting_snapshots_backfill_prometheus_and_the_ui(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
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
        app = recorder_app(
            url,
            clock=lambda: now[0],
            prometheus__url=prometheus.base,
            jobs__allocation_seconds=3600,
        )
        eventually(
            lambda: recorded(url, 2, 2) and app.jobs.runs["hourly"] >= 1,
            timeout=15,
        )
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
        cl = unknown(
            app,
            f"/v1/gpu-aggregation/cluster/hourly-stats?{span}&order_by=time" "&order_direction=asc",
            1,
        )["data"]
        assert [
            (
                r["stat_hour"],
                r["total_gpu_capacity"],
                r["allocated_gpu_count"],
                r["allocation_rate"],
                r["avg_utilization"],
                r["sample_count"],
            )
            for r in cl
        ] == [
            ((h - timedelta(hours=1)).strftime(RFC), 12, 3.0, 25.0, 0.0, 0),
            (h.strftime(RFC), 12, 3.0, 25.0, pytest.approx(110 / 3), 60),
            (
                (h + timedelta(hours=1)).strftime(RFC),
                12,
                2.5,
                pytest.approx(2.5 / 12 * 100),
                pytest.approx(110 / 3),
                5,
            ),
        ]  # Prometheus's 5 minutes of lookback

        ns = unknown(
            app,
            f"/v1/gpu-aggregation/namespaces/hourly-stats?{span}&order_by=time"
            "&order_direction=asc&page=1&page_size=20",
            2,
        )
        assert (ns["total"], ns["page"], ns["page_size"], ns["total_pages"]) == (6, 1, 10000, 1)
        got = {
            (r["stat_hour"], r["namespace"]): (
                r["allocated_gpu_count"],
                r["avg_utilization"],
                r["max_utilization"],
                r["active_workload_count"],
            )
            for r in ns["data"]
        }
        hs = h.strftime(RFC)
        assert got[(hs, "ml")] == (2.0, 50.0, 50.0, 1)
        assert got[(hs, "infer")] == (1.0, 10.0, 10.0, 1)
        assert got[((h + timedelta(hours=1)).strftime(RFC), "infer")] == (0.5, 10.0, 10.0, 1)
        assert get(app, f"/v1/gpu-aggregation/namespaces?{span}") == ["infer", "ml"]

        assert get(app, f"/v1/gpu-aggregation/dimension-keys?dimension_type=label&{span}") == [
            "team"
        ]
        assert get(
            app,
            "/v1/gpu-aggregation/dimension-values?dimension_type=annotation"
            f"&dimension_key=project&{span}",
        ) == ["llm"]
        lab = unknown(
            app,
            "/v1/gpu-aggregation/labels/hourly-stats?dimension_type=label"
            f"&dimension_key=team&{span}&order_by=allocated_gpu_count",
            2,
        )
        lab = lab["data"]
        at_h = {
            r["dimension_value"]: (r["allocated_gpu_count"], r["avg_utilization"])
            for r in lab
            if r["stat_hour"] == hs
        }
        assert at_h == {"research": (2.0, 50.0), "serving": (1.0, 10.0)}

        wl = unknown(app, f"/v1/gpu-aggregation/workloads/hourly-stats?{span}&namespace=ml", 1)[
            "data"
        ]
        (a,) = (r for r in wl if r["stat_hour"] == hs)
        assert {
            k: a[k]
            for k in (
                "workload_name",
                "workload_type",
                "owner_uid",
                "allocated_gpu_count",
                "avg_utilization",
                "p95_utilization",
                "avg_gpu_memory_used",
                "avg_gpu_memory_total",
                "avg_replica_count",
                "max_replica_count",
                "min_replica_count",
                "sample_count",
                "labels",
                "annotations",
            )
        } == {
            "workload_name": "a",
            "workload_type": "Pod",
            "owner_uid": "uid-a",
            "allocated_gpu_count": 2.0,
            "avg_utilization": 50.0,
            "p95_utilization": 50.0,
            "avg_gpu_memory_used": 2.0,
            "avg_gpu_memory_total": 8.0,
            "avg_replica_count": 1.0,
            "max_replica_count": 1,
            "min_replica_count": 1,
            "sample_count": 60,
            "labels": {"team": "research"},
            "annotations": {"project": "llm"},
        }

        # the Statistics pages, as the web UI asks on load
        ui = [
            f"gpu-aggregation/namespaces?{span}",
            f"gpu-aggregation/namespaces/hourly-stats?{span}&page=1&page_size=100",
            f"gpu-aggregation/dimension-keys?dimension_type=annotation&{span}",
            f"gpu-aggregation/dimension-keys?dimension_type=label&{span}",
            f"gpu-aggregation/labels/hourly-stats?dimension_type=label&dimension_key=team"
            f"&{span}&page=1&page_size=100",
            f"gpu-aggregation/workloads/hourly-stats?{span}&page=1&page_size=100",
            "workloads?page_num=1&page_size=10",
            "workloads/statistics",
            "workloads/statistic",
            f"gpu-aggregation/snapshots?{span}",
            "gpu-aggregation/snapshots/latest",
            "nodes/fragmentation-analysis",
            "nodes/load-balance-analysis",
        ]
        for path in ui:
            sep = "&" if "?" in path else "?"
            r = requests.get(
                f"http://127.0.0.1:{app.http.port}/v1/{path}{sep}cluster=local",
                timeout=hang_guard(5),
            )
            assert r.status_code == 200 and r.json()["meta"]["code"] == 2000, (path, r.text)
        snaps = get(app, f"/v1/gpu-aggregation/snapshots?{span}")
        assert [
            (s["total_gpu_capacity"], s["allocated_gpu_count"])
            for s in snaps
            if s["snapshot_time"].startswith(hs[:13])
        ] == [(12, 3), (12, 3)]
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
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
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
        app = recorder_app(
            db_url,
            clock=lambda: now[0],
            prometheus__url=prometheus.base,
            jobs__allocation_seconds=3600,
        )
        eventually(
            lambda: recorded(db_url, 1, 1) and app.jobs.runs["hourly"] >= 1,
            timeout=15,
        )
        app.jobs.snapshot(h + timedelta(minutes=30))
        now[0] = later
        (scope,) = app.jobs.scopes()
        base, scope.prom.url = scope.prom.url, "http://127.0.0.1:9"  # down
        assert app.writer.flush(10)
        assert app.jobs.hourly(later) == 2  # h-1 (the start's snapshot) and h
        assert app.writer.flush(10)
        q = f"start_time={h.strftime(RFC)}&end_time={later.strftime(RFC)}"
        (row,) = unknown(app, f"/v1/gpu-aggregation/namespaces/hourly-stats?{q}", 1)["data"]
        assert (row["allocated_gpu_count"], row["avg_utilization"]) == (2.0, 0.0)
        (c,) = unknown(app, f"/v1/gpu-aggregation/cluster/hourly-stats?{q}", 1)["data"]
        assert (c["allocated_gpu_count"], c["avg_utilization"], c["sample_count"]) == (2.0, 0.0, 0)
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


def trainer_series(hour: int) -> str:
    """Hour `hour`'s minutes of the Deployment trainer's two pods: a's GPU at 40 %, b's at
    10 %; each 2 GiB of GPU memory used of 8."""
    lines = ["# TYPE gpu_utilization gauge"]
    for m in range(60):
        lines += [
            f'gpu_utilization{{namespace="{NS}",pod="trainer-5d9f-{p}",gpu_id="0"}} '
            f"{v} {hour + 60 * m}"
            for p, v in (("a", 40), ("b", 10))
        ]
    for family, v in (("gpu_memory_used_bytes", 2 * GIB), ("gpu_memory_total_bytes", 8 * GIB)):
        lines.append(f"# TYPE {family} gauge")
        lines += [
            f'{family}{{namespace="{NS}",pod="trainer-5d9f-{p}"}} {v} {hour + 60 * m}'
            for m in range(60)
            for p in "ab"
        ]
    return "\n".join(lines) + "\n# EOF\n"


def trainer(api: FakeApiServer, started: str) -> None:
    """gpu-1 (8 GPUs); the Deployment trainer, its ReplicaSet and two running pods of one
    GPU each, labelled team=research."""
    put_trainer(api, started)
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    for name in ("trainer-5d9f-a", "trainer-5d9f-b"):
        p = objects.gpu_pod(name, "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
        p["metadata"]["labels"]["team"] = "research"
        api.put("pods", p)
        api.put("pods", state(p, "Running", True))


def test_statistics_routes_conform_to_the_original_and_their_figures(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """Every Statistics route's answer has the original's Go json tags (CONTRACTS), and
    workloads/statistic(s), gpuUtilizationHistory and snapshots/latest are exact."""
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    hour = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600
    h = datetime.fromtimestamp(hour, UTC)
    prometheus = Prometheus([], openmetrics=trainer_series(hour))
    try:
        trainer(api, h.strftime(RFC))
        now = [h - timedelta(minutes=10)]  # the start's snapshot falls in hour h-1
        app = recorder_app(db_url, clock=lambda: now[0], prometheus__url=prometheus.base)
        eventually(
            lambda: recorded(db_url, 2, 1)
            and len(rows(db_url, "gpu_workloads")) == 2
            and app.jobs.runs["hourly"] >= 1,
            timeout=15,
        )
        for minute in (10, 40):
            app.jobs.snapshot(h + timedelta(minutes=minute))
        now[0] = h + timedelta(hours=1, minutes=5)
        assert app.writer.flush(10)
        app.jobs.hourly(now[0])
        assert app.writer.flush(10)

        span = f"start_time={h.strftime(RFC)}&end_time={(h + timedelta(minutes=59)).strftime(RFC)}"
        t0 = int(hour)
        asks = {
            "gpu-aggregation/namespaces": span,
            "gpu-aggregation/dimension-keys": f"dimension_type=label&{span}",
            "gpu-aggregation/dimension-values": f"dimension_type=label&dimension_key=team&{span}",
            "gpu-aggregation/cluster/hourly-stats": span,
            "gpu-aggregation/namespaces/hourly-stats": span,
            "gpu-aggregation/labels/hourly-stats": (
                f"dimension_type=label&dimension_key=team&{span}"
            ),
            "gpu-aggregation/workloads/hourly-stats": span,
            "gpu-aggregation/snapshots": span,
            "gpu-aggregation/snapshots/latest": "",
            "workloads/statistic": "",
            "workloads/statistics": "",
            "workloads/gpuUtilizationHistory": (
                f"kind=Deployment&name=trainer&start={t0}&end={t0 + 300}&step=60"
            ),
            "nodes/fragmentation-analysis": "",
            "nodes/load-balance-analysis": "",
        }
        got = {route: get(app, f"/v1/{route}?{q}&cluster=local") for route, q in asks.items()}
        for route, answer in got.items():
            source, schema = {**CONTRACTS, **METRIC_CONTRACTS}[route]
            assert conforms(answer, schema), (route, source, answer)
        for route in ("cluster", "namespaces", "labels", "workloads"):  # every field checked
            assert len(got[f"gpu-aggregation/{route}/hourly-stats"]["data"]) == 1, route
        assert got["gpu-aggregation/namespaces"] == [NS]
        assert got["gpu-aggregation/dimension-keys"] == ["team"]
        assert got["gpu-aggregation/dimension-values"] == ["research"]

        # the trainer: 2 GPUs requested; its pods' mean over the last hour (40 and 10): 25 %,
        # under the original's 30 % bound
        assert (
            got["workloads/statistic"]
            == got["workloads/statistics"]
            == {
                "running_workloads_count": 1,
                "avg_gpu_allocated": 2.0,
                "avg_gpu_utilization": 25.0,
                "low_utilization_workloads_count": 1,
            }
        )
        assert got["workloads/gpuUtilizationHistory"] == {
            "serial": 1,
            "config": {"y_axis_unit": "%"},
            "series": [
                {
                    "labels": {},
                    "values": [{"timestamp": t0 + 60 * m, "value": 25.0} for m in range(6)],
                }
            ],
        }
        latest = got["gpu-aggregation/snapshots/latest"]
        assert {k: v for k, v in latest.items() if k != "id"} == {
            "cluster_name": "local",
            "snapshot_time": (h + timedelta(minutes=40)).strftime(RFC),
            "dimension_type": "cluster",
            "dimension_key": "",
            "dimension_value": "",
            "total_gpu_capacity": 8,
            "allocated_gpu_count": 2,
            "allocation_details": {"workloads": 1},
            "created_at": (h + timedelta(minutes=40)).strftime(RFC),
        }
        assert [s["snapshot_time"] for s in got["gpu-aggregation/snapshots"]] == [
            (h + timedelta(minutes=m)).strftime(RFC) for m in (40, 10)
        ]
        (w,) = got["gpu-aggregation/workloads/hourly-stats"]["data"]
        assert (
            w["workload_name"],
            w["workload_type"],
            w["allocated_gpu_count"],
            w["avg_utilization"],
            w["avg_gpu_memory_used"],
            w["avg_gpu_memory_total"],
        ) == ("trainer", "Deployment", 2.0, 25.0, 4.0, 16.0)
        # without Prometheus the counts still draw; its figures are 0 (the original's
        # float64 and int), and it says why
        (scope,) = app.jobs.scopes()
        scope.prom.url = "http://127.0.0.1:9"
        r = requests.get(
            f"http://127.0.0.1:{app.http.port}/v1/workloads/statistic", timeout=hang_guard(5)
        )
        assert r.status_code == 200 and r.json()["meta"]["code"] == 2000
        assert (
            "figures unknown, answered as 0: prometheus at http://127.0.0.1:9"
            in r.json()["meta"]["message"]
        )
        assert r.json()["data"] == {
            "running_workloads_count": 1,
            "avg_gpu_allocated": 2.0,
            "avg_gpu_utilization": 0.0,
            "low_utilization_workloads_count": 0,
        }
        for q, word in (
            ("name=trainer", "kind"),
            ("kind=Deployment&name=nobody&start=0&end=60", "nobody"),
            ("kind=Deployment&name=trainer&start=x&end=60", "start"),
        ):
            r = requests.get(
                f"http://127.0.0.1:{app.http.port}/v1/workloads/" f"gpuUtilizationHistory?{q}",
                timeout=hang_guard(5),
            )
            assert r.status_code in (400, 404) and word in r.json()["meta"]["message"], r.text
    finally:
        prometheus.stop()


def hours_written(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each hourly table's (stat_hour, its other key columns but the cluster) per row,
    sorted."""

    out = {}
    for name, keys in HOURLY.items():
        rest = [k for k in keys if k not in ("stat_hour", "cluster_name")]
        out[name] = sorted(
            (aware_hour(r["stat_hour"]), *(str(r[k]) for k in rest)) for r in rows(url, name)
        )
    return out


def test_a_restart_across_an_hour_boundary_writes_each_hour_once(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """Stopped during hour H, started again after H+1 ended: H (its snapshots) and H+1
    (the pods' lifetimes) each written once in every hourly table, none skipped."""
    h = datetime.fromtimestamp((int(datetime.now(UTC).timestamp()) // 3600 - 5) * 3600, UTC)
    now = [h - timedelta(minutes=10)]  # the start's snapshot: hour H-1, before any pod
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    first = recorder_app(db_url, clock=lambda: now[0])
    api.put("pods", gpu("a", "ml", 2, {"team": "research"}, {}))
    api.put("pods", gpu("c", "infer", 1, {"team": "serving"}, {}))
    eventually(lambda: recorded(db_url, 2, 1), timeout=15)
    for minute in (10, 30):
        first.jobs.snapshot(h + timedelta(minutes=minute))
    now[0] = h + timedelta(minutes=40)
    first.stop()
    assert hours_written(db_url)["cluster_gpu_hourly_stats"] == []

    now[0] = h + timedelta(hours=2, minutes=10)
    second = recorder_app(db_url, clock=lambda: now[0])
    eventually(lambda: second.jobs.runs["hourly"] >= 1, timeout=15)
    assert second.writer.flush(10)
    assert second.jobs.hourly(now[0]) == 0  # a second run (another restart) adds nothing
    assert second.writer.flush(10)
    got = hours_written(db_url)
    for name, written in got.items():
        assert len(written) == len(set(written)), (name, written)
    hours = [h - timedelta(hours=1), h, h + timedelta(hours=1)]
    assert [r[0] for r in got["cluster_gpu_hourly_stats"]] == hours
    for at in hours[1:]:  # both pods all through H (snapshots) and H+1 (lifetimes)
        assert [r[1] for r in got["namespace_gpu_hourly_stats"] if r[0] == at] == ["infer", "ml"]
        assert [r[2:] for r in got["label_gpu_hourly_stats"] if r[0] == at] == [
            ("team", "research"),
            ("team", "serving"),
        ]
        assert [r[1] for r in got["workload_gpu_hourly_stats"] if r[0] == at] == ["uid-a", "uid-c"]
    cluster = {
        aware_hour(r["stat_hour"]): r["allocated_gpu_count"]
        for r in rows(db_url, "cluster_gpu_hourly_stats")
    }
    assert cluster == {hours[0]: 0.0, hours[1]: 3.0, hours[2]: 3.0}


def aware_hour(value: Any) -> datetime:
    """A stored time as an aware datetime (SQLite's come back naive)."""
    got: datetime = aware(value)  # type: ignore[assignment]
    return got


def test_values_beyond_max_values_fold_into_other_and_retention_prunes(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """max_values 1: team x (3 GPUs) kept, y (2) and z (1) one __other__ of 3 GPUs and two
    workloads, counted; retention.days 1 prunes every new table by its time, exactly."""
    h = datetime.fromtimestamp((int(datetime.now(UTC).timestamp()) // 3600 - 5) * 3600, UTC)
    now = [h - timedelta(minutes=10)]  # the start's snapshot: hour H-1, before any pod
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    app = recorder_app(db_url, clock=lambda: now[0], aggregation__max_values=1, retention__days=1)
    for name, team, n in (("x1", "x", 3), ("y1", "y", 2), ("z1", "z", 1)):
        api.put("pods", gpu(name, "ml", n, {"team": team}, {}))
    eventually(lambda: recorded(db_url, 3, 1), timeout=15)
    for minute in (10, 40):
        app.jobs.snapshot(h + timedelta(minutes=minute))
    assert app.writer.flush(10)
    folded = app.jobs.folded
    assert app.jobs.hourly(h + timedelta(hours=1, minutes=5)) == 2  # H-1 (no pod) and H
    assert app.writer.flush(10)
    assert app.jobs.folded - folded == 2  # y and z, in hour H
    assert metric(app, "lens_recorder_aggregation_folded_values_total") == app.jobs.folded
    snap = [
        (r["dimension_value"], r["allocated_gpu_count"], r["allocation_details"])
        for r in rows(db_url, "gpu_allocation_snapshots")
        if r["dimension_type"] == "label"
        and aware_hour(r["snapshot_time"]) == h + timedelta(minutes=10)
    ]
    assert sorted(snap) == [("__other__", 3, {"workloads": 2}), ("x", 3, {"workloads": 1})]
    labels = [
        (r["dimension_value"], r["allocated_gpu_count"], r["active_workload_count"])
        for r in rows(db_url, "label_gpu_hourly_stats")
    ]
    assert sorted(labels) == [("__other__", 3.0, 2), ("x", 3.0, 1)]

    before = dict(app.jobs.pruned)
    # the start's per-node snapshot (hour H-1) holds gpu-1 or not, as the node's row was
    # committed before it read or after: what it holds is pruned, whichever it was
    old_nodes = sum(aware_hour(r["at"]) < h for r in rows(db_url, "allocation_snapshots"))
    assert old_nodes in (1, 2)
    app.jobs.prune(h + timedelta(days=1))  # the cutoff: hour H's start
    assert app.writer.flush(10)
    pruned = {k: app.jobs.pruned[k] - before[k] for k in before if app.jobs.pruned[k] > before[k]}
    # H-1's cluster row and its one snapshot row (no pod then); H's rows kept
    assert pruned == {
        "cluster_gpu_hourly_stats": 1,
        "gpu_allocation_snapshots": 1,
        "allocation_snapshots": old_nodes,
    }
    left = {
        name: len(rows(db_url, name))
        for name in (
            "gpu_allocation_snapshots",
            "cluster_gpu_hourly_stats",
            "namespace_gpu_hourly_stats",
            "label_gpu_hourly_stats",
            "workload_gpu_hourly_stats",
        )
    }
    # two snapshots of 7 rows: the cluster, ml, team x and __other__, three workloads
    assert left == {
        "gpu_allocation_snapshots": 14,
        "cluster_gpu_hourly_stats": 1,
        "namespace_gpu_hourly_stats": 1,
        "label_gpu_hourly_stats": 2,
        "workload_gpu_hourly_stats": 3,
    }
