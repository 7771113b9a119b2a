"""The recorder's own health as metrics (RecorderMetrics): its watches, the database's
writes and queue, the objects and owners it followed, the node agents' events and the
streams it refused, rows pruned and values folded, the kubelet Service's syncs. The jobs'
own are JobMetrics' (core/runner.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from lens_ebpf.k8s.reflector import watch_metrics

if TYPE_CHECKING:
    from lens_ebpf.recorder.service import RecorderApp


class RecorderMetrics(Collector):
    """The recorder's own health: watches, database writes, queue, errors."""

    def __init__(self, app: RecorderApp) -> None:
        self.app = app

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        yield from self._watches()
        yield from self._database()
        yield from self._followed()
        yield from self._node_events()
        yield from self._jobs()

    def _watches(self) -> Iterator[Metric]:
        reflectors = self.app.tracker.reflectors()
        yield from watch_metrics(
            reflectors,
            "lens_recorder_watch_connected",
            "lens_recorder_watch_restarts",
            "lens_recorder_watch_events",
        )
        lag = Metric(
            "lens_recorder_watch_lag_seconds",
            "Seconds since the watch last heard from the API (events, bookmarks, " "lists)",
            "gauge",
        )
        now = time.monotonic()
        for r in reflectors:
            if r.last_heard:
                lag.add_sample(
                    "lens_recorder_watch_lag_seconds", {"resource": r.resource}, now - r.last_heard
                )
        yield lag

    def _database(self) -> Iterator[Metric]:
        w = self.app.writer
        yield self._gauge(
            "lens_recorder_db_up", "1 while the database takes writes", 1 if w.up else 0
        )
        hist = HistogramMetricFamily(
            "lens_recorder_db_write_seconds", "Time to commit one batch of writes"
        )
        writes = w.writes.copy()
        hist.add_metric([], writes.cumulative(), writes.total)
        yield hist
        yield self._gauge("lens_recorder_queue_depth", "Writes waiting for the database", w.depth())
        yield self._gauge("lens_recorder_queue_capacity", "The write queue's bound", w.queue_max)
        yield self._counter(
            "lens_recorder_queue_dropped_total", "Writes dropped by a full queue", w.dropped
        )
        yield self._counter("lens_recorder_db_writes_total", "Writes committed", w.committed)
        yield self._counter(
            "lens_recorder_db_writes_fenced_total",
            "Leader writes dropped: "
            "this replica no longer led when they came to be written "
            "(replicas)",
            w.fenced,
        )
        errs = Metric(
            "lens_recorder_db_errors",
            "Database errors: unavailable (the write "
            "waits and is retried), rejected (the write is dropped)",
            "counter",
        )
        for why, n in w.errors.items():
            errs.add_sample("lens_recorder_db_errors_total", {"reason": why}, n)
        yield errs

    def _followed(self) -> Iterator[Metric]:
        """What the tracker follows: objects skipped, pods, workloads, owners, finalizers."""
        rec = self.app.tracker
        bad = Metric(
            "lens_recorder_malformed_objects", "API objects skipped as malformed", "counter"
        )
        for what, n in rec.malformed.items():
            bad.add_sample("lens_recorder_malformed_objects_total", {"resource": what}, n)
        yield bad
        yield self._gauge("lens_recorder_pods_tracked", "GPU pods followed now", len(rec.pods))
        yield self._gauge(
            "lens_recorder_workloads_watched", "Workloads watched now", len(rec.workloads)
        )
        yield self._counter(
            "lens_recorder_watchers_collected_total",
            "Workload watchers ended (workload deleted and stored)",
            rec.watchers_collected,
        )
        owners = Metric("lens_recorder_owner_lookups", "Owner reference lookups", "counter")
        for result, n in rec.lookups.items():
            owners.add_sample("lens_recorder_owner_lookups_total", {"result": result}, n)
        yield owners
        fin = Metric("lens_recorder_finalizer_operations", "Finalizer adds and removals", "counter")
        for (op, result), n in sorted(rec.finalizer_ops.items()):
            fin.add_sample(
                "lens_recorder_finalizer_operations_total", {"operation": op, "result": result}, n
            )
        yield fin

    def _node_events(self) -> Iterator[Metric]:
        """The node agents' events stored and dropped, and the streams refused."""
        app = self.app
        ne = Metric("lens_recorder_node_events", "Node agents' events stored, by kind", "counter")
        for kind, n in sorted(app.node_events.stored.items()):
            ne.add_sample("lens_recorder_node_events_total", {"kind": kind}, n)
        yield ne
        yield self._counter(
            "lens_recorder_node_events_duplicate_total",
            "Node events received again and dropped (node, agent instance, seq)",
            app.node_events.duplicates,
        )
        refused = Metric(
            "lens_recorder_collect_refused",
            "Collector streams refused, by gRPC "
            "code: unauthenticated (no or an invalid token), permission_denied "
            "(a token that may not report for the stream's node), unavailable "
            "(the API server did not answer its TokenReview), invalid_argument "
            "(a seq beyond grpc.max_seq_jump, or a lens-agent-instance that is "
            "not one)",
            "counter",
        )
        guard = app.node_events.guard
        counts = dict(guard.refused) if guard is not None else {}
        counts["invalid_argument"] = app.node_events.seq_refused + app.node_events.instance_refused
        for code in ("unauthenticated", "permission_denied", "unavailable", "invalid_argument"):
            refused.add_sample(
                "lens_recorder_collect_refused_total", {"code": code}, counts.get(code, 0)
            )
        yield refused

    def _jobs(self) -> Iterator[Metric]:
        """What the jobs did (lens_recorder_job_*, their runs, errors, last success, ...:
        JobMetrics, the runner's)."""
        app = self.app
        pruned = Metric(
            "lens_recorder_pruned_rows",
            "Rows older than recorder.retention.days " "removed, by table",
            "counter",
        )
        for table, n in sorted(app.jobs.pruned.items()):
            pruned.add_sample("lens_recorder_pruned_rows_total", {"table": table}, n)
        yield pruned
        yield self._counter(
            "lens_recorder_aggregation_folded_values_total",
            "Label and annotation values beyond recorder.aggregation.max_values "
            "folded into __other__, each hour's statistics",
            app.jobs.folded,
        )
        if app.kubelet is not None:
            ks = Metric(
                "lens_recorder_kubelet_service_syncs",
                "kubelet Service/Endpoints syncs, by result",
                "counter",
            )
            for result, n in app.kubelet.syncs.items():
                ks.add_sample("lens_recorder_kubelet_service_syncs_total", {"result": result}, n)
            yield ks

    @staticmethod
    def _gauge(name: str, help_text: str, value: float) -> Metric:
        m = Metric(name, help_text, "gauge")
        m.add_sample(name, {}, value)
        return m

    @staticmethod
    def _counter(sample: str, help_text: str, value: float) -> Metric:
        """A counter family with one sample, named as it is exported (..._total)."""
        m = Metric(sample.removesuffix("_total"), help_text, "counter")
        m.add_sample(sample, {}, value)
        return m
