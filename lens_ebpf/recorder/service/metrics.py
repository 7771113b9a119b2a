"""The recorder's own health as metrics (RecorderMetrics): its watches, the database's
writes and queue, the objects and owners it followed, the node agents' events and the
streams it refused, rows pruned and values folded, the kubelet Service's syncs. The jobs'
own are JobMetrics' (core/runner.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import counter, gauge, histogram
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
        lag = gauge(
            "lens_recorder_watch_lag_seconds",
            "Seconds since the watch last heard from the API (events, bookmarks, " "lists)",
        )
        now = time.monotonic()
        for r in reflectors:
            if r.last_heard:
                lag.add({"resource": r.resource}, now - r.last_heard)
        yield lag

    def _database(self) -> Iterator[Metric]:
        w = self.app.writer
        yield gauge("lens_recorder_db_up", "1 while the database takes writes", 1 if w.up else 0)
        hist = histogram("lens_recorder_db_write_seconds", "Time to commit one batch of writes")
        writes = w.writes.copy()
        hist.add_buckets({}, writes.cumulative(), writes.total)
        yield hist
        yield gauge("lens_recorder_queue_depth", "Writes waiting for the database", w.depth())
        yield gauge("lens_recorder_queue_capacity", "The write queue's bound", w.queue_max)
        yield counter("lens_recorder_queue_dropped", "Writes dropped by a full queue", w.dropped)
        yield counter("lens_recorder_db_writes", "Writes committed", w.committed)
        yield counter(
            "lens_recorder_db_writes_fenced",
            "Leader writes dropped: "
            "this replica no longer led when they came to be written "
            "(replicas)",
            w.fenced,
        )
        errs = counter(
            "lens_recorder_db_errors",
            "Database errors: unavailable (the write "
            "waits and is retried), rejected (the write is dropped)",
        )
        for why, n in w.errors.items():
            errs.add({"reason": why}, n)
        yield errs

    def _followed(self) -> Iterator[Metric]:
        """What the tracker follows: objects skipped, pods, workloads, owners, finalizers."""
        rec = self.app.tracker
        bad = counter("lens_recorder_malformed_objects", "API objects skipped as malformed")
        for what, n in rec.malformed.items():
            bad.add({"resource": what}, n)
        yield bad
        yield gauge("lens_recorder_pods_tracked", "GPU pods followed now", len(rec.pods))
        yield gauge("lens_recorder_workloads_watched", "Workloads watched now", len(rec.workloads))
        yield counter(
            "lens_recorder_watchers_collected",
            "Workload watchers ended (workload deleted and stored)",
            rec.watchers_collected,
        )
        owners = counter("lens_recorder_owner_lookups", "Owner reference lookups")
        for result, n in rec.lookups.items():
            owners.add({"result": result}, n)
        yield owners
        fin = counter("lens_recorder_finalizer_operations", "Finalizer adds and removals")
        for (op, result), n in sorted(rec.finalizer_ops.items()):
            fin.add({"operation": op, "result": result}, n)
        yield fin

    def _node_events(self) -> Iterator[Metric]:
        """The node agents' events stored and dropped, and the streams refused."""
        app = self.app
        ne = counter("lens_recorder_node_events", "Node agents' events stored, by kind")
        for kind, n in sorted(app.node_events.stored.items()):
            ne.add({"kind": kind}, n)
        yield ne
        yield counter(
            "lens_recorder_node_events_duplicate",
            "Node events received again and dropped (node, agent instance, seq)",
            app.node_events.duplicates,
        )
        refused = counter(
            "lens_recorder_collect_refused",
            "Collector streams refused, by gRPC "
            "code: unauthenticated (no or an invalid token), permission_denied "
            "(a token that may not report for the stream's node), unavailable "
            "(the API server did not answer its TokenReview), invalid_argument "
            "(a seq beyond grpc.max_seq_jump, or a lens-agent-instance that is "
            "not one)",
        )
        guard = app.node_events.guard
        counts = dict(guard.refused) if guard is not None else {}
        counts["invalid_argument"] = app.node_events.seq_refused + app.node_events.instance_refused
        for code in ("unauthenticated", "permission_denied", "unavailable", "invalid_argument"):
            refused.add({"code": code}, counts.get(code, 0))
        yield refused

    def _jobs(self) -> Iterator[Metric]:
        """What the jobs did (lens_recorder_job_*, their runs, errors, last success, ...:
        JobMetrics, the runner's)."""
        app = self.app
        pruned = counter(
            "lens_recorder_pruned_rows",
            "Rows older than recorder.retention.days " "removed, by table",
        )
        for table, n in sorted(app.jobs.pruned.items()):
            pruned.add({"table": table}, n)
        yield pruned
        yield counter(
            "lens_recorder_aggregation_folded_values",
            "Label and annotation values beyond recorder.aggregation.max_values "
            "folded into __other__, each hour's statistics",
            app.jobs.folded,
        )
        if app.kubelet is not None:
            ks = counter(
                "lens_recorder_kubelet_service_syncs", "kubelet Service/Endpoints syncs, by result"
            )
            for result, n in app.kubelet.syncs.items():
                ks.add({"result": result}, n)
            yield ks
