"""The recorder's periodic jobs: GPU allocation snapshots (every
`recorder.jobs.allocation_seconds`), the cluster's hourly GPU statistics (each completed
hour, from the snapshots and Prometheus), and pruning what is older than
`recorder.retention.days` (counted)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, select

from lens_ebpf.core.times import aware
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.allocation import gpu_allocation
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer, insert_new

HOUR = timedelta(hours=1)
BACKFILL_HOURS = 24  # completed hours looked at for a missing statistics row
# what retention.days prunes, by its time
PRUNED = ("allocation_snapshots", "device_changelog", "training_points", "training_events")


def floor_hour(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


class Jobs:
    def __init__(self, engine: Engine, writer: Writer, scopes: Callable[[], list[Scope]],
                 allocation_seconds: float, retention_days: float,
                 clock: Callable[[], datetime]) -> None:  # fmt: skip
        self.engine, self.writer, self.scopes = engine, writer, scopes  # the clusters now
        self.interval = allocation_seconds
        self.retention = timedelta(days=retention_days)
        self.clock = clock
        # runs that did their work (the runner counts every run and the failures)
        self.runs: dict[str, int] = {"snapshot": 0, "hourly": 0, "prune": 0}
        self.pruned: dict[str, int] = dict.fromkeys(PRUNED, 0)

    def snapshot(self, now: datetime) -> None:
        """Per cluster, per node and for the cluster (node ""): GPUs allocatable, requested
        by running pods, and the rate (percent)."""
        rows = []
        for c in self.scopes():
            rows += self._snapshot(c, now)

        def write(conn: Connection) -> None:
            conn.execute(t.allocation_snapshots.insert(), rows)

        if rows:
            self.writer.submit(Op("allocation_snapshots", write))
        self.runs["snapshot"] += 1

    def _snapshot(self, c: Scope, now: datetime) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            per_node: dict[str, list[int]] = {}
            for a in gpu_allocation(conn, c.tables):
                pair = per_node.setdefault(a["node"], [0, 0])
                pair[0] += a["capacity"]
                pair[1] += a["allocated"]
        total = [sum(c for c, _ in per_node.values()), sum(r for _, r in per_node.values())]
        return [{"cluster": c.name, "at": now, "node": node, "allocatable": cap,
                 "requested": r, "rate": 100 * r / cap if cap else 0.0}
                for node, (cap, r) in sorted({**per_node, "": total}.items())]  # fmt: skip

    def hourly(self, now: datetime) -> int:
        """Per cluster, a statistics row for each completed hour of the last day that has
        snapshots and none yet; the rows written."""
        hs = t.cluster_gpu_hourly_stats
        last = floor_hour(now)
        hours = [last - HOUR * n for n in range(1, BACKFILL_HOURS + 1)]
        rows = []
        with self.engine.connect() as conn:
            for c in self.scopes():
                done = {aware(r.stat_hour) for r in conn.execute(select(hs.c.stat_hour).where(
                    hs.c.cluster_name == c.name, hs.c.stat_hour >= hours[-1]))}  # fmt: skip
                for hour in sorted(hours):
                    if hour in done:
                        continue
                    row = self._hour(conn, c, hour, now)
                    if row is not None:
                        rows.append(row)
        if rows:

            def write(conn: Connection) -> None:  # a run that overlapped writes nothing twice
                for row in rows:
                    insert_new(conn, hs, row, ["cluster_name", "stat_hour"])

            self.writer.submit(Op("cluster_gpu_hourly_stats", write))
        self.runs["hourly"] += 1
        return len(rows)

    def _hour(self, conn: Connection, c: Scope, hour: datetime,
              now: datetime) -> dict[str, Any] | None:  # fmt: skip
        s = c.tables.allocation_snapshots
        got = conn.execute(
            select(func.max(s.c.allocatable), func.avg(s.c.requested), func.avg(s.c.rate))
            .where(s.c.node == "", s.c.at >= hour, s.c.at < hour + HOUR)).one()  # fmt: skip
        capacity, requested, rate = got[0], got[1], got[2]
        if capacity is None:
            return None  # the service was not running that hour
        util = {"avg": 0.0, "max": 0.0, "min": 0.0, "p50": 0.0, "p95": 0.0, "count": 0.0}
        if c.prom.url:
            series = f"{prom.UTILIZATION}[3600s:60s]"
            end = hour + HOUR - timedelta(seconds=1)  # the hour's own minutes
            for key, fn in (("avg", "avg_over_time"), ("max", "max_over_time"),
                            ("min", "min_over_time"), ("count", "count_over_time")):  # fmt: skip
                util[key] = c.prom.scalar(f"{fn}({series})", end)
            for key, q in (("p50", 0.5), ("p95", 0.95)):
                util[key] = c.prom.scalar(f"quantile_over_time({q}, {series})", end)
        return {"cluster_name": c.name, "stat_hour": hour,
                "total_gpu_capacity": int(capacity), "allocated_gpu_count": float(requested),
                "allocation_rate": float(rate), "avg_utilization": util["avg"],
                "max_utilization": util["max"], "min_utilization": util["min"],
                "p50_utilization": util["p50"], "p95_utilization": util["p95"],
                "sample_count": int(util["count"]),
                "created_at": now, "updated_at": now}  # fmt: skip

    def prune(self, now: datetime) -> None:
        """Snapshots, changelog rows, training points and events older than the retention,
        counted."""
        cutoff = now - self.retention
        counts: dict[str, int] = {}

        def write(conn: Connection) -> None:
            for name in PRUNED:
                table = t.metadata.tables[name]
                counts[name] = conn.execute(delete(table).where(table.c.at < cutoff)).rowcount

        def done() -> None:
            for name, n in counts.items():
                self.pruned[name] = self.pruned.get(name, 0) + max(0, n)

        self.writer.submit(Op("prune", write, done))
        self.runs["prune"] += 1

    def run_once(self, now: datetime) -> None:
        """The three once, in the order of their first runs under the runner."""
        self.snapshot(now)
        self.hourly(now)
        self.prune(now)
