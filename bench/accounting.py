"""GPU accounting at the issue's size (1,000 nodes x 8 GPUs, 5,000 workloads, 200
namespaces, 10 values per label key, a week of hours): one completed hour's statistics
(`AccountingJobs.hourly`, from the hour's allocation snapshots and, for an hour without any,
from the pods' lifetimes), the allocation snapshot run, the week's report (content and HTML; PDF by
Chromium where it is installed) and each Statistics route through the real HTTP server.

The database (a SQLite file, or PostgreSQL with --postgres, root) is filled through the
recorder's own schema: the nodes by the recorder's Node watch of the API stand-in; the
workloads, their pods (lifetimes over two weeks: the report compares the week before),
one snapshot per pod (its labels and annotations, as the aggregation reads them), the
cluster's allocation snapshots every `--snapshot-seconds` over two weeks, the dimension
snapshots of the measured hour (the snapshot run's rows, at each of its times), and the
other hours' statistics (made by accounting/hours.py's hour_rows from the same lifetimes).

Without --prometheus, utilization is NULL. With it, a real Prometheus (Debian's) holds
every pod GPU's series, written by promtool before it starts: gpu_utilization,
gpu_memory_used_bytes and gpu_memory_total_bytes a minute apart over the two hours the
aggregation measures (the hourly job's four range queries read them at that step), and
gpu_utilization over the report's two weeks every --report-step seconds (300: at one a
minute two weeks of 8,000 GPUs are 160 M samples, about 12 minutes of promtool here; the
report's day queries read every sample, so their time scales with the step).

    .venv/bin/python -m bench.accounting [--nodes 1000] [--workloads 5000] [--namespaces 200]
        [--values 10] [--days 7] [--snapshot-seconds 30] [--requests 30] [--postgres]
        [--prometheus [--report-step 300]]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
import urllib.request
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, delete, func, select

from bench import service
from bench.cluster_api import GPUS, node_object, postgres_cpu
from lens_ebpf.recorder.accounting import hours as acc
from lens_ebpf.recorder.accounting.jobs import HOURLY
from lens_ebpf.recorder.reports import weekly
from lens_ebpf.recorder.reports.week import due
from lens_ebpf.recorder.store import schema as t
from tests.k8slab import FakeApiServer, eventually
from tests.promserver import Prometheus, create_blocks

HOUR = timedelta(hours=1)
RFC = "%Y-%m-%dT%H:%M:%SZ"
CLUSTER = "local"
LABELS = ("app.kubernetes.io/name", "team", "project")  # recorder.aggregation's defaults
ANNOTATIONS = ("team", "project")
CHUNK = 5_000


@dataclass
class Work:
    uid: str
    namespace: str
    name: str
    kind: str
    start: datetime
    end: datetime | None  # None: running now
    replicas: int
    gpus: int  # per pod
    labels: dict[str, str]
    annotations: dict[str, str]

    def pods(self) -> list[str]:
        return [f"{self.name}-{r}" for r in range(self.replicas)]

    def share(self, a: datetime, b: datetime, now: datetime) -> float:
        """The part of [a, b) it ran."""
        lo, hi = max(a, self.start), min(b, self.end or now)
        return max(0.0, (hi - lo) / (b - a))


def workloads(
    n: int, namespaces: int, values: int, since: datetime, now: datetime, seed: int = 57
) -> list[Work]:
    """n workloads starting over [since, now), each running 1 hour to 8 days."""
    rng = random.Random(seed)
    span = (now - since).total_seconds()
    out = []
    for i in range(n):
        start = since + timedelta(seconds=int(rng.uniform(0, span)))
        end = start + timedelta(seconds=int(rng.uniform(3600, 8 * 86400)))
        labels = {k: f"{k.rsplit('/', 1)[-1]}-{rng.randrange(values)}" for k in LABELS}
        notes = {k: f"{k}-{rng.randrange(values)}" for k in ANNOTATIONS}
        kind = rng.choice(("PyTorchJob", "Deployment", "Job"))
        out.append(
            Work(
                f"uid-w{i}",
                f"ns-{i % namespaces}",
                f"work-{i}",
                kind,
                start,
                end if end < now else None,
                rng.choice((1, 1, 1, 2, 2, 4)),
                rng.choice((1, 1, 1, 2, 2, 4, 8)),
                labels,
                notes,
            )
        )
    return out


def insert(conn: Any, table: Any, rows: list[dict[str, Any]]) -> None:
    for i in range(0, len(rows), CHUNK):
        conn.execute(table.insert(), rows[i : i + CHUNK])


def fill(
    url: str,
    works: list[Work],
    since: datetime,
    now: datetime,
    every: int,
    hours: list[datetime],
    nodes: int,
) -> dict[str, int]:
    """The workloads, pods, pod snapshots, cluster allocation snapshots and the given
    hours' statistics; the rows written per table."""
    eng = create_engine(url)
    res = {"amd.com/gpu": 0}
    wrows, prows, srows = [], [], []
    k = 0
    for w in works:
        ended = w.end is not None
        wrows.append(
            {
                "cluster": CLUSTER,
                "uid": w.uid,
                "api_version": "v1",
                "kind": w.kind,
                "namespace": w.namespace,
                "name": w.name,
                "parent_uid": None,
                "gpu_request": w.gpus * w.replicas,
                "gpu_resources": {"amd.com/gpu": w.gpus * w.replicas},
                "status": "Completed" if ended else "Running",
                "running": not ended,
                "deleted": ended,
                "finalizer": False,
                "labels": w.labels,
                "resource_version": "1",
                "created_at": w.start,
                "ended_at": w.end,
                "deleted_at": w.end,
                "updated_at": w.end or w.start,
            }
        )
        for name in w.pods():
            uid = f"uid-{name}"
            prows.append(
                {
                    "cluster": CLUSTER,
                    "uid": uid,
                    "namespace": w.namespace,
                    "name": name,
                    "node": f"gpu-{k % nodes}",
                    "gpus": w.gpus,
                    "gpu_resources": {**res, "amd.com/gpu": w.gpus},
                    "phase": "Succeeded" if ended else "Running",
                    "running": not ended,
                    "deleted": ended,
                    "workload_uid": w.uid,
                    "resource_version": "1",
                    "created_at": w.start,
                    "started_at": w.start,
                    "ended_at": w.end,
                    "deleted_at": w.end,
                    "updated_at": w.end or w.start,
                }
            )
            srows.append(
                {
                    "cluster": CLUSTER,
                    "pod_uid": uid,
                    "resource_version": "1",
                    "taken_at": w.start,
                    "spec": {},
                    "status": {},
                    "pod_metadata": {
                        "name": name,
                        "namespace": w.namespace,
                        "uid": uid,
                        "labels": w.labels,
                        "annotations": w.annotations,
                    },
                }
            )
            k += 1
    # the cluster's allocation (node "") every `every` seconds: GPUs held at each time
    times = []
    at = since
    while at < now:
        times.append(at)
        at += timedelta(seconds=every)
    held = [0] * (len(times) + 1)
    for w in works:  # + at the first time after start, - at the first after end
        a = -(-int((w.start - since).total_seconds()) // every)
        b = -(-int(((w.end or now) - since).total_seconds()) // every)
        held[min(a, len(times))] += w.gpus * w.replicas
        held[min(b, len(times))] -= w.gpus * w.replicas
    cap, run, arows = nodes * GPUS, 0, []
    for i, at in enumerate(times):
        run += held[i]
        arows.append(
            {
                "cluster": CLUSTER,
                "at": at,
                "node": "",
                "allocatable": cap,
                "requested": run,
                "rate": 100 * run / cap,
            }
        )
    # the cluster's dimension snapshots over the period (the snapshots route reads these)
    crows = [
        {
            "cluster_name": CLUSTER,
            "snapshot_time": a["at"],
            "dimension_type": "cluster",
            "dimension_key": "",
            "dimension_value": "",
            "total_gpu_capacity": cap,
            "allocated_gpu_count": a["requested"],
            "allocation_details": {"workloads": 0},
            "created_at": a["at"],
        }
        for a in arows
        if a["at"] < hours[-1] + HOUR
    ]
    counts = {
        "gpu_workloads": len(wrows),
        "gpu_pods": len(prows),
        "pod_snapshots": len(srows),
        "allocation_snapshots": len(arows),
        "gpu_allocation_snapshots": len(crows),
    }
    with eng.begin() as conn:
        for table, rows in (
            (t.gpu_workloads, wrows),
            (t.gpu_pods, prows),
            (t.pod_snapshots, srows),
            (t.allocation_snapshots, arows),
            (t.gpu_allocation_snapshots, crows),
        ):
            insert(conn, table, rows)
    keys = acc.Keys(LABELS, ANNOTATIONS, 50)
    for hour in hours:
        got = hour_rows(works, hour, cap, keys, now)
        with eng.begin() as conn:
            for name, rows in got.items():
                insert(conn, t.metadata.tables[name], rows)
                counts[name] = counts.get(name, 0) + len(rows)
    eng.dispose()
    return counts


def hour_rows(
    works: list[Work], hour: datetime, cap: int, keys: acc.Keys, now: datetime
) -> dict[str, list[dict[str, Any]]]:
    """The hour's statistics rows as the recorder makes them (accounting/hours.py's hour_rows), from
    the lifetimes."""
    got: dict[str, acc.WorkloadHour] = {}
    for w in works:
        part = w.share(hour, hour + HOUR, now)
        if part <= 0:
            continue
        whole = part >= 1
        got[w.uid] = acc.WorkloadHour(
            w.uid,
            w.namespace,
            w.name,
            w.kind,
            "Running",
            dict(w.labels),
            dict(w.annotations),
            set(w.pods()),
            w.gpus * w.replicas * part,
            w.replicas * part,
            w.replicas,
            w.replicas if whole else 0,
        )
    allocated = sum(x.allocated for x in got.values())
    return acc.hour_rows(CLUSTER, hour, cap, allocated, got, None, keys, now)


GIB = 1 << 30
HOUR_METRICS = ("gpu_utilization", "gpu_memory_used_bytes", "gpu_memory_total_bytes")


def pod_nodes(works: list[Work], nodes: int) -> list[tuple[Work, str, str]]:
    """(workload, pod, node) of every pod, on the nodes fill() gave them."""
    out, k = [], 0
    for w in works:
        for name in w.pods():
            out.append((w, name, f"gpu-{k % nodes}"))
            k += 1
    return out


def value_of(metric: str, pod: str) -> float:
    """A pod's GPUs' figure, fixed per pod: utilization 5-95 %, memory used of 192 GiB."""
    use = 5 + zlib.crc32(pod.encode()) % 91
    if metric == "gpu_utilization":
        return float(use)
    return float(192 * GIB if metric == "gpu_memory_total_bytes" else use * 192 * GIB // 100)


def write_series(
    path: Path,
    pods: list[tuple[Work, str, str]],
    a: datetime,
    b: datetime,
    step: int,
    metrics: tuple[str, ...],
    now: datetime,
) -> int:
    """OpenMetrics of each pod GPU's series, every step seconds (whole multiples) in [a, b)
    while its pod ran; the samples written."""
    n = 0
    with path.open("w") as f:
        for metric in metrics:
            f.write(f"# TYPE {metric} gauge\n")
            for w, pod, node in pods:
                lo, hi = max(a, w.start), min(b, w.end or now)
                if hi <= lo:
                    continue
                times = range(-(-int(lo.timestamp()) // step) * step, int(hi.timestamp()), step)
                v = value_of(metric, pod)
                for g in range(w.gpus):
                    head = (
                        f'{metric}{{namespace="{w.namespace}",pod="{pod}",node="{node}",'
                        f'gpu_id="{g}"}} {v} '
                    )
                    f.write("".join(f"{head}{t}\n" for t in times))
                    n += len(times)
        f.write("# EOF\n")
    return n


def prometheus_for(
    tmp: Path,
    works: list[Work],
    nodes: int,
    weeks: tuple[datetime, datetime],
    hours: tuple[datetime, datetime],
    step: int,
    now: datetime,
) -> Prometheus:
    """A Prometheus holding the pods' GPU series: gpu_utilization over the weeks (a day a
    file, every step seconds) and the three HOUR_METRICS over the hours a minute apart."""
    start = time.perf_counter()
    pods, tsdb, om, samples = pod_nodes(works, nodes), tmp / "tsdb", tmp / "part.om", 0
    day = weeks[0]
    while day < weeks[1]:
        samples += write_series(
            om, pods, day, day + timedelta(days=1), step, ("gpu_utilization",), now
        )
        create_blocks(om, tsdb)
        day += timedelta(days=1)
    samples += write_series(
        om, pods, hours[0] - timedelta(minutes=5), hours[1], 60, HOUR_METRICS, now
    )
    create_blocks(om, tsdb)
    om.unlink()
    prom = Prometheus([], tsdb=tsdb, flags=["--storage.tsdb.retention.time=90d"])
    print(f"Prometheus: {samples:,} samples written in {time.perf_counter() - start:.0f} s")
    return prom


def timed_get(url: str, n: int) -> tuple[float, float, int]:
    """(median, p95) ms of n GETs, and the body's bytes."""
    took, size = [], 0
    for _ in range(n):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as r:
            size = len(r.read())
            assert r.status == 200, url
        took.append((time.perf_counter() - start) * 1000)
    took.sort()
    return statistics.median(took), took[min(len(took) - 1, int(0.95 * len(took)))], size


class Clock:
    """Wall seconds, this process's CPU seconds and PostgreSQL's (with --postgres)."""

    def __init__(self, pg: bool) -> None:
        self.pg = pg
        self.wall, self.cpu, self.db = time.perf_counter(), time.process_time(), self._db()

    def _db(self) -> float:
        return postgres_cpu() if self.pg else 0.0

    def read(self) -> str:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        db = f", PostgreSQL {self._db() - self.db:.2f} s CPU" if self.pg else ""
        return f"{wall:.2f} s (this process {cpu:.2f} s CPU{db})"


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.accounting",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--workloads", type=int, default=5000)
    ap.add_argument("--namespaces", type=int, default=200)
    ap.add_argument("--values", type=int, default=10, help="values per label/annotation key")
    ap.add_argument("--days", type=int, default=7, help="the hours with statistics")
    ap.add_argument(
        "--snapshot-seconds",
        type=int,
        default=30,
        help="recorder.jobs.allocation_seconds (snapshots of the measured hour)",
    )
    ap.add_argument("--requests", type=int, default=30, help="GETs per route")
    ap.add_argument("--postgres", action="store_true", help="PostgreSQL (root), not SQLite")
    ap.add_argument("--no-pdf", action="store_true", help="the report without its PDF")
    ap.add_argument(
        "--prometheus",
        action="store_true",
        help="a real Prometheus holding the pods' GPU series (utilization measured)",
    )
    ap.add_argument(
        "--report-step",
        type=int,
        default=300,
        help="seconds between the report's samples (with --prometheus)",
    )
    args = ap.parse_args()

    real = datetime.now(UTC)
    monday = (real - timedelta(days=real.weekday())).replace(
        hour=10, minute=5, second=0, microsecond=0
    )
    now = monday if monday <= real else monday - timedelta(days=7)
    since = now - timedelta(days=15)  # the report's week and the one before it, and a day
    last = acc.floor_hour(now) - HOUR  # the measured hour
    hours = [last - HOUR * n for n in range(args.days * 24 - 1, 0, -1)]  # the others
    tmp = Path(tempfile.mkdtemp(prefix="lens-bench-accounting-"))
    works = workloads(args.workloads, args.namespaces, args.values, since, now)
    week = due(now, "monday", 9)
    prometheus = None
    if args.prometheus:  # the report's two weeks, and the measured hour with the one before
        prometheus = prometheus_for(
            tmp,
            works,
            args.nodes,
            (week.before().start, week.end),
            (hours[-1], last + HOUR),
            args.report_step,
            now,
        )
    url, pg = service.database(args.postgres, tmp, "accounting")
    api = FakeApiServer().start()
    for n in range(args.nodes):
        api.put("nodes", node_object(n))
    over = {
        ("recorder", "reports", "weekly"): False,
        # the jobs run at start only (on the empty database): the bench runs them
        ("recorder", "jobs", "allocation_seconds"): 10**6,
        ("recorder", "aggregation", "label_keys"): list(LABELS),
        ("recorder", "aggregation", "annotation_keys"): list(ANNOTATIONS),
        ("recorder", "reports", "pdf"): not args.no_pdf,
    }
    if prometheus is not None:
        over[("recorder", "prometheus", "url")] = prometheus.base
        over[("recorder", "prometheus", "timeout_seconds")] = 60
    app = service.start(url, tmp, api, over, lambda: now)
    try:
        eng = create_engine(url)

        def count(name: str, *cond: Any) -> int:
            tab = t.metadata.tables[name]
            with eng.connect() as conn:
                return int(
                    conn.execute(select(func.count()).select_from(tab).where(*cond)).scalar_one()
                )

        eventually(
            lambda: count("nodes") == args.nodes and app.jobs.runs["hourly"] >= 1, timeout=300
        )
        assert app.writer.flush(60)
        start = time.perf_counter()
        rows = fill(url, works, since, now, args.snapshot_seconds, hours, args.nodes)
        running = [w for w in works if w.end is None]
        print(
            f"{'PostgreSQL' if args.postgres else 'SQLite'}: {args.nodes} nodes x {GPUS} "
            f"GPUs, {len(works)} workloads in {args.namespaces} namespaces "
            f"({len(running)} running now, {sum(w.gpus * w.replicas for w in running)} "
            f"GPUs), {len(LABELS)} label and {len(ANNOTATIONS)} annotation keys of "
            f"{args.values} values; filled in {time.perf_counter() - start:.0f} s: "
            + ", ".join(f"{k} {v:,}" for k, v in rows.items())
        )

        # the snapshot run at now (per node and cluster, and per dimension), then its
        # dimension rows at each snapshot time of the measured hour
        clock = Clock(args.postgres)
        app.jobs.snapshot(now)
        assert app.writer.flush(600)
        print(f"snapshot run (AccountingJobs.snapshot and its write): {clock.read()}")
        s = t.gpu_allocation_snapshots
        with eng.begin() as conn:
            one = [
                {k: v for k, v in r._mapping.items() if k != "id"}
                for r in conn.execute(select(s).where(s.c.snapshot_time == now))
            ]
            n = 3600 // args.snapshot_seconds
            for i in range(n):
                at = last + timedelta(seconds=i * args.snapshot_seconds)
                insert(conn, s, [{**r, "snapshot_time": at, "created_at": at} for r in one])
        if args.postgres:  # the statistics autovacuum gathers after such inserts,
            # committed (in a transaction that rolls back, ANALYZE leaves none)
            with eng.begin() as conn:
                conn.exec_driver_sql("ANALYZE")
        print(
            f"the measured hour: {n} snapshots of {len(one)} rows each "
            f"({count('gpu_allocation_snapshots'):,} gpu_allocation_snapshots rows in all)"
        )

        clock = Clock(args.postgres)
        assert app.jobs.hourly(now) == 1
        assert app.writer.flush(600)
        made_rows = {n: count(n, t.metadata.tables[n].c.stat_hour == last) for n in HOURLY}
        print(
            "one hour from its snapshots (AccountingJobs.hourly, the write included): "
            f"{clock.read()}"
            " (goal <= 10 s): rows " + ", ".join(f"{k} {v}" for k, v in made_rows.items())
        )
        cl = t.cluster_gpu_hourly_stats
        with eng.connect() as conn:
            util = conn.execute(
                select(cl.c.avg_utilization, cl.c.sample_count).where(cl.c.stat_hour == last)
            ).one()
        print(
            f"  the hour's utilization: {util[0]} % mean, {util[1]} samples "
            f"({app.prom.queries} Prometheus queries so far)"
        )
        # an hour without snapshots (the service was down): from the pods' lifetimes
        with eng.begin() as conn:
            conn.execute(
                delete(s).where(
                    s.c.snapshot_time >= hours[-1], s.c.snapshot_time < hours[-1] + HOUR
                )
            )
            for name in HOURLY:
                tab = t.metadata.tables[name]
                conn.execute(delete(tab).where(tab.c.stat_hour == hours[-1]))
        clock = Clock(args.postgres)
        assert app.jobs.hourly(now) == 1
        assert app.writer.flush(600)
        print(
            f"one hour from the pods' lifetimes (AccountingJobs.hourly, the write included): "
            f"{clock.read()} (goal <= 10 s)"
        )

        c = app.clusters.scopes()[0]
        opts = weekly.options(app.cfg.recorder)
        clock = Clock(args.postgres)
        with eng.connect() as conn:
            made = weekly.make(conn, c, week, now, opts, None)
        summary = made.content["summary"]
        print(
            f"week {week.name}'s report, content and HTML (weekly.make): {clock.read()} "
            f"(goal <= 30 s): {summary['pods']} pods, {summary['total_gpu_hours']:,} "
            f"GPU-hours ({summary.get('used_gpu_hours')} used), {len(made.html):,} bytes "
            f"of HTML"
        )
        clock = Clock(args.postgres)
        assert app.reports.run(now) == [weekly.report_id(c.name, week)]
        assert app.writer.flush(600)
        what = "HTML" if args.no_pdf else "HTML, PDF by Chromium"
        print(f"the report job (content, {what}, stored): {clock.read()} (goal <= 30 s)")

        base = f"http://127.0.0.1:{app.http.port}/v1/"
        day = f"start_time={(now - timedelta(days=1)).strftime(RFC)}&end_time={now.strftime(RFC)}"
        wk = (
            f"start_time={(now - timedelta(days=args.days)).strftime(RFC)}"
            f"&end_time={now.strftime(RFC)}"
        )
        rid = weekly.report_id(c.name, week)
        ui = [
            f"gpu-aggregation/namespaces?{wk}",
            f"gpu-aggregation/dimension-keys?dimension_type=label&{wk}",
            f"gpu-aggregation/dimension-keys?dimension_type=annotation&{wk}",
            f"gpu-aggregation/dimension-values?dimension_type=label&dimension_key=team&{wk}",
            f"gpu-aggregation/cluster/hourly-stats?{wk}&page=1&page_size=200",
            f"gpu-aggregation/namespaces/hourly-stats?{day}&page=1&page_size=100",
            f"gpu-aggregation/namespaces/hourly-stats?{wk}&page=1&page_size=100",
            f"gpu-aggregation/namespaces/hourly-stats?{wk}&namespace=ns-7",
            f"gpu-aggregation/labels/hourly-stats?dimension_type=label&dimension_key=team"
            f"&{wk}&page=1&page_size=100",
            f"gpu-aggregation/workloads/hourly-stats?{day}&page=1&page_size=100",
            f"gpu-aggregation/workloads/hourly-stats?{wk}&page=1&page_size=100",
            f"gpu-aggregation/workloads/hourly-stats?{wk}&namespace=ns-7",
            f"gpu-aggregation/snapshots?{day}",
            "gpu-aggregation/snapshots/latest",
            "workloads/statistics",
            "workloads/statistic",
            "nodes/fragmentation-analysis",
            "nodes/load-balance-analysis",
            "weekly-reports/gpu_utilization",
            "weekly-reports/gpu_utilization/latest",
            f"weekly-reports/gpu_utilization/{rid}",
            f"weekly-reports/gpu_utilization/{rid}/html",
            f"weekly-reports/gpu_utilization/{rid}/json",
            *([] if args.no_pdf else [f"weekly-reports/gpu_utilization/{rid}/pdf"]),
        ]
        print(
            f"routes, {args.requests} GETs each (day: the last 24 h, week: the last "
            f"{args.days} days; goal <= 100 ms):"
        )
        for path in ui:
            med, p95, size = timed_get(base + path, args.requests)
            shown = path.replace(wk, "{week}").replace(day, "{day}")
            print(f"  {shown}: median {med:.1f} ms, p95 {p95:.1f} ms ({size:,} bytes)")
        eng.dispose()
    finally:
        app.stop()
        api.kill()
        if prometheus is not None:
            prometheus.stop()
        if pg:
            pg.destroy()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
