"""The recorder's periodic jobs: GPU allocation snapshots (every
`recorder.jobs.allocation_seconds`; per node, and per namespace, label, annotation and
workload), the hourly GPU statistics (each completed hour, from the snapshots or the pods'
lifetimes, and Prometheus: see accounting/hours.py), and pruning what is older than
`recorder.retention.days` (counted)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, delete, select, update

from lens_ebpf.core.times import utc
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.accounting import hours as acc
from lens_ebpf.recorder.nodes.allocation import gpu_allocation
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer, insert_new

HOUR = timedelta(hours=1)
BACKFILL_HOURS = 24  # completed hours looked at for a missing row, and for utilization
FILL_SECONDS = 300  # how often hours without utilization are asked for again
# what retention.days prunes, by its time
PRUNED = ("allocation_snapshots", "device_changelog", "training_points", "training_events")
PRUNED_BY = {
    "gpu_allocation_snapshots": "snapshot_time",
    "cluster_gpu_hourly_stats": "stat_hour",
    "namespace_gpu_hourly_stats": "stat_hour",
    "label_gpu_hourly_stats": "stat_hour",
    "workload_gpu_hourly_stats": "stat_hour",
}
REPORTS = "gpu_usage_weekly_reports"  # pruned after recorder.reports.keep_weeks
# an hour's tables and each one's key, the cluster's last (its row marks the hour done)
HOURLY = {
    "namespace_gpu_hourly_stats": ["cluster_name", "namespace", "stat_hour"],
    "label_gpu_hourly_stats": [
        "cluster_name",
        "dimension_type",
        "dimension_key",
        "dimension_value",
        "stat_hour",
    ],
    "workload_gpu_hourly_stats": ["cluster_name", "owner_uid", "stat_hour"],
    "cluster_gpu_hourly_stats": ["cluster_name", "stat_hour"],
}
FILLED = (
    "avg_utilization",
    "max_utilization",
    "min_utilization",
    "p50_utilization",
    "p95_utilization",
    "avg_gpu_memory_used",
    "max_gpu_memory_used",
    "avg_gpu_memory_total",
    "sample_count",
)
floor_hour = acc.floor_hour


class AccountingJobs:
    def __init__(
        self,
        engine: Engine,
        writer: Writer,
        scopes: Callable[[], list[Scope]],
        allocation_seconds: float,
        retention_days: float,
        clock: Callable[[], datetime],
        keys: acc.Keys | None = None,
        backfill_days: float = 7.0,
        report_weeks: int = 104,
    ) -> None:
        self.engine, self.writer, self.scopes = engine, writer, scopes  # the clusters now
        self.interval = allocation_seconds
        self.retention = timedelta(days=retention_days)
        self.report_retention = timedelta(weeks=report_weeks)
        self.clock = clock
        self.keys = keys or acc.Keys()
        self.backfill = timedelta(days=backfill_days)
        self._filled_at: datetime | None = None
        self.folded = 0  # label/annotation values folded into acc.OTHER, every hour
        self.filled = 0  # hours whose utilization came later
        # runs that did their work (the runner counts every run and the failures)
        self.runs: dict[str, int] = {"snapshot": 0, "hourly": 0, "prune": 0}
        self.pruned: dict[str, int] = dict.fromkeys((*PRUNED, *PRUNED_BY, REPORTS), 0)

    def snapshot(self, now: datetime) -> None:
        """Per cluster, per node and for the cluster (node ""): GPUs allocatable, requested
        by running pods, and the rate (percent)."""
        rows, dims = [], []
        for c in self.scopes():
            rows += self._snapshot(c, now)
            with self.engine.connect() as conn:
                dims += acc.snapshot(conn, c.tables, c.name, self.keys, now)

        def write(conn: Connection) -> None:
            conn.execute(t.allocation_snapshots.insert(), rows)
            if dims:
                conn.execute(t.gpu_allocation_snapshots.insert(), dims)

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
        return [
            {
                "cluster": c.name,
                "at": now,
                "node": node,
                "allocatable": cap,
                "requested": r,
                "rate": 100 * r / cap if cap else 0.0,
            }
            for node, (cap, r) in sorted({**per_node, "": total}.items())
        ]

    def hourly(self, now: datetime) -> int:
        """_hourly, with Prometheus asked no more in this run once it did not answer at all
        (each hour's four range queries would wait for its timeout)."""
        with prom.missing_figures():
            return self._hourly(now)

    def _hourly(self, now: datetime) -> int:
        """Per cluster, each completed hour of the window (backfill_days, at least a day)
        without a statistics row: its cluster, namespace, label/annotation and workload
        rows, from its snapshots or else (within backfill_days, from the first pod's start)
        the pods' lifetimes; then utilization missing in the last day filled in. The
        cluster rows written."""
        last = floor_hour(now)
        span = max(BACKFILL_HOURS, int(self.backfill.total_seconds() // 3600))
        span = min(span, int(self.retention.total_seconds() // 3600))  # no prune and redo
        hours = [last - HOUR * n for n in range(span, 0, -1)]
        work: list[dict[str, list[dict[str, Any]]]] = []
        for c in self.scopes():
            with self.engine.connect() as conn:
                done = self._hours_done(conn, c.name, hours[0] if hours else last)
                first = acc.first_start(conn, c.tables)
                for hour in hours:
                    if hour not in done:
                        rows = self._hour(conn, c, hour, now, first)
                        if rows is not None:
                            work.append(rows)
        written = self._write_hours(work)
        self._fill(now)
        self.runs["hourly"] += 1
        return written

    def _hours_done(self, conn: Connection, cluster: str, since: datetime) -> set[datetime]:
        hs = t.cluster_gpu_hourly_stats
        got = conn.execute(
            select(hs.c.stat_hour).where(hs.c.cluster_name == cluster, hs.c.stat_hour >= since)
        )
        return {utc(r.stat_hour) for r in got}

    def _hour(
        self, conn: Connection, c: Scope, hour: datetime, now: datetime, first: datetime | None
    ) -> dict[str, list[dict[str, Any]]] | None:
        """Every statistics row of the hour, or None when it cannot be computed (no
        snapshots, and before backfill_days or the first pod)."""
        got = acc.hour_from_snapshots(conn, c.tables, hour)
        if got is None:
            if first is None or hour + HOUR <= first or hour < floor_hour(now) - self.backfill:
                return None
            got = acc.hour_from_lifetimes(conn, c.tables, hour, self.keys, now)
        cap, allocated, works = got
        self.folded += acc.folded(works.values(), self.keys)
        return acc.hour_rows(
            c.name, hour, cap, allocated, works, acc.hour_series(c, hour), self.keys, now
        )

    def _write_hours(self, work: list[dict[str, list[dict[str, Any]]]]) -> int:
        if not work:
            return 0

        def write(conn: Connection) -> None:  # a run that overlapped writes nothing twice
            for rows in work:
                for name in HOURLY:  # the cluster's row last: it marks the hour done
                    for row in rows[name]:
                        insert_new(conn, t.metadata.tables[name], row, HOURLY[name])

        self.writer.submit(Op("gpu_hourly_stats", write))
        return len(work)

    def _fill(self, now: datetime) -> int:
        """Hours of the last day whose utilization Prometheus could not give: asked again,
        at most every FILL_SECONDS; the hours filled."""
        if self._filled_at is not None and (now - self._filled_at).total_seconds() < FILL_SECONDS:
            return 0
        self._filled_at = now
        hs = t.cluster_gpu_hourly_stats
        since = floor_hour(now) - HOUR * BACKFILL_HOURS
        updates: list[tuple[str, dict[str, list[dict[str, Any]]]]] = []
        for c in self.scopes():
            if not c.prom.url:
                continue
            with self.engine.connect() as conn:
                missing = [
                    utc(r.stat_hour)
                    for r in conn.execute(
                        select(hs.c.stat_hour).where(
                            hs.c.cluster_name == c.name,
                            hs.c.stat_hour >= since,
                            hs.c.avg_utilization.is_(None),
                        )
                    )
                ]
                for hour in missing:
                    series = acc.hour_series(c, hour)
                    if series is None or not any(series.util_sum.values()):
                        continue
                    got = acc.hour_from_snapshots(conn, c.tables, hour)
                    if got is None:
                        got = acc.hour_from_lifetimes(
                            conn,
                            c.tables,
                            hour,
                            self.keys,
                            now,
                        )
                    updates.append(
                        (
                            c.name,
                            acc.hour_rows(
                                c.name,
                                hour,
                                *got,
                                series,
                                self.keys,
                                now,
                            ),
                        )
                    )
        if updates:

            def write(conn: Connection) -> None:
                for _, rows in updates:
                    for name, keys in HOURLY.items():
                        table = t.metadata.tables[name]
                        for row in rows[name]:
                            cond = [table.c[k] == row[k] for k in keys]
                            vals = {k: v for k, v in row.items() if k in FILLED}
                            conn.execute(update(table).where(*cond).values(**vals))

            self.writer.submit(Op("gpu_hourly_stats_fill", write))
        self.filled += len(updates)
        return len(updates)

    def prune(self, now: datetime) -> None:
        """Snapshots, changelog rows, training points and events, hourly statistics older
        than the retention, and weekly reports of weeks that ended before
        recorder.reports.keep_weeks, counted."""
        cutoff = now - self.retention
        counts: dict[str, int] = {}

        def write(conn: Connection) -> None:
            for name, col in (*((n, "at") for n in PRUNED), *PRUNED_BY.items()):
                table = t.metadata.tables[name]
                counts[name] = conn.execute(delete(table).where(table.c[col] < cutoff)).rowcount
            reports = t.gpu_usage_weekly_reports
            counts[REPORTS] = conn.execute(
                delete(reports).where(reports.c.period_end < now - self.report_retention)
            ).rowcount

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
