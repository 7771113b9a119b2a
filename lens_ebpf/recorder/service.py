"""`lens-ebpf recorder`: the database, the watches, the collector protocol, REST and
metrics, wired together (its one-shot commands, --report and --remove-finalizers, are in
cli.py)."""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.core.http import HttpServer, front, tls_context
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.core.runner import Job, JobMetrics, Runner
from lens_ebpf.core.settings import split_listen
from lens_ebpf.k8s.reflector import watch_metrics
from lens_ebpf.recorder import api
from lens_ebpf.recorder.accounting.hours import Keys
from lens_ebpf.recorder.alerting import Alerts
from lens_ebpf.recorder.alerts import late
from lens_ebpf.recorder.api.assistants import Assistants
from lens_ebpf.recorder.api.envelope import AlertsApi, LensApi, Services
from lens_ebpf.recorder.api.front import FrontMetrics
from lens_ebpf.recorder.api.posts import Admitted
from lens_ebpf.recorder.api.seed import PlainJson
from lens_ebpf.recorder.clusters import Clusters, Shared, StorageConfigSync, own_namespace
from lens_ebpf.recorder.config import Config
from lens_ebpf.recorder.deepdive import DeepDive
from lens_ebpf.recorder.detection import Detection
from lens_ebpf.recorder.ingest.admission import Ingest, WriteGuard
from lens_ebpf.recorder.ingest.node_auth import node_guard
from lens_ebpf.recorder.ingest.node_events import NodeEvents, last_seqs
from lens_ebpf.recorder.job_history import JobHistory
from lens_ebpf.recorder.jobs import FAILURES
from lens_ebpf.recorder.jobs.allocation import Jobs
from lens_ebpf.recorder.kubelet_service import KubeletService
from lens_ebpf.recorder.leadership import Leadership, identity_of
from lens_ebpf.recorder.management.clusters import ClusterAdmin
from lens_ebpf.recorder.management.hub import Management
from lens_ebpf.recorder.management.releases import Releases
from lens_ebpf.recorder.management.settings import Settings
from lens_ebpf.recorder.management.tasks import Tasks
from lens_ebpf.recorder.profiler.files import Profiler
from lens_ebpf.recorder.prom import Prom
from lens_ebpf.recorder.remote_write.receiver import RemoteWrite
from lens_ebpf.recorder.reports import weekly
from lens_ebpf.recorder.store.writer import (
    DatabaseError,
    LeaderWriter,
    Writer,
    engine_for,
    redact,
    upgrade,
)
from lens_ebpf.recorder.training.outliers import Outliers
from lens_ebpf.recorder.training.progress import Training

log = logging.getLogger(__name__)


class RecorderApp:
    """The recorder process's parts; start() and stop() in the right order."""

    def __init__(self, cfg: Config, api_client: Any,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:  # fmt: skip
        r, k = cfg.recorder, cfg.kubernetes
        self.cfg = cfg
        self.clock = clock
        if r.leader_election.enabled and r.database_url.startswith("sqlite"):
            raise DatabaseError(
                "recorder.leader_election.enabled needs a database the replicas share "
                f"(PostgreSQL): database_url is {redact(r.database_url)!r}, a file of one "
                "process (leader election off for one process on SQLite)"
            )
        self.engine = engine_for(r.database_url)
        self.revision = upgrade(self.engine, r.cluster_name)
        self.writer = Writer(self.engine, r.queue_max, r.db_retry_max_seconds)
        # what only the leader does writes through lead_writer: with replicas, each of its
        # writes is fenced by this replica's term (leadership.py); alone, it is the writer
        replicas = r.leader_election.enabled
        self.lead_writer: Writer = LeaderWriter(self.writer) if replicas else self.writer
        self.leadership: Leadership | None = None  # made once the REST port is bound
        p = r.prometheus
        self.prom = Prom(p.url, p.timeout_seconds, p.max_points)
        # every periodic job, leader-only or not: listed in start()
        self.runner = Runner(name="recorder", is_leader=self.leads)
        self.clusters = Clusters(Shared(cfg, self.engine, self.lead_writer, self.prom, clock,
                                        self.runner),
                                 api_client)  # fmt: skip
        home = self.clusters.home
        assert home.tracker is not None and home.nodes is not None and home.storage is not None
        self.api, self.tracker, self.nodes, self.storage = (home.api, home.tracker,
                                                             home.nodes, home.storage)  # fmt: skip
        if not replicas:  # a leader reads its state back when it comes to lead
            self.clusters.recover()
        with self.engine.connect() as conn:
            self.node_events = NodeEvents(self.writer, last_seqs(conn), r.cluster_name)
        self.node_events.max_seq_jump = cfg.grpc.max_seq_jump
        if r.collect_listen:
            self.node_events.guard = node_guard(cfg.grpc.auth, r.collect_listen,
                                                r.cluster_name, self._client_of,
                                                k.request_timeout_seconds)  # fmt: skip
        self.kubelet: KubeletService | None = None
        ks = r.kubelet_service
        if ks.enabled:
            self.kubelet = KubeletService(self.api.core, ks.namespace, ks.name, ks.ports,
                                          ks.interval_seconds,
                                          k.request_timeout_seconds)  # fmt: skip
        self.registry = CollectorRegistry()
        self.registry.register(RecorderMetrics(self))
        self.registry.register(JobMetrics(self.runner, "lens_recorder_job"))
        host, port = split_listen(r.listen)
        self.ingest = Ingest(r.ingest, host, r.cluster_name)
        self.training = Training(r.training, self.lead_writer, self.tracker.gpu_pod,
                                 self.tracker.running_workloads, clock,
                                 r.cluster_name)  # fmt: skip
        if not replicas:
            with self.engine.connect() as conn:
                self.training.recover(conn, clock())
        self.registry.register(self.ingest)
        self.registry.register(self.training)
        self.loop = EventLoopThread("aio")  # REST and the reporters' streams: one loop
        srv = cfg.server
        self.http = HttpServer(host, port, self.registry, srv.max_connections,
                               srv.request_timeout_seconds, srv.max_header_bytes, self.loop,
                               tls_context(srv.tls.cert, srv.tls.key, srv.tls.client_ca),
                               **front(srv))  # fmt: skip
        self.registry.register(FrontMetrics(self.http.counters))
        self.remote_write = RemoteWrite(r.remote_write, self.engine, clock, r.cluster_name)
        self.registry.register(self.remote_write)
        self.registry.register(self.storage)  # the home cluster's scans
        self.registry.register(self.clusters)
        self.storage_sync: StorageConfigSync | None = None
        if cfg.multicluster.storage_config_sync:
            self.storage_sync = StorageConfigSync(self.clusters)
            self.registry.register(self.storage_sync)
        if replicas:
            le, tls = r.leader_election, cfg.server.tls
            self.leadership = Leadership(le, le.namespace or own_namespace(), self.engine,
                                         api_client, k.request_timeout_seconds, self.http.port,
                                         (tls.cert, tls.key) if tls.cert else None,
                                         self._recover, self.clusters.watch,
                                         self._unlead)  # fmt: skip
            self.writer.fence = self.leadership.fence.check
            self.registry.register(self.leadership)
        self.alerts = Alerts(r.alerts, self.engine, self.lead_writer, self.remote_write,
                             api_client, own_namespace(), r.cluster_name, self.tracker.gpu_pod,
                             self.clusters.scopes, clock)  # fmt: skip
        self.registry.register(self.alerts)
        self.write_guard = WriteGuard(r.api, host)
        self.registry.register(self.write_guard)
        self.management = self._management(cfg, clock)
        self.detection = Detection(self.engine, self.lead_writer, self.clusters.scopes,
                                   r.detection, clock)  # fmt: skip
        # every run of every job, recorded by the leader (the Job Execution History page)
        self.job_history = JobHistory(self.engine, self.writer, r.cluster_name, self.leads,
                                      lambda: r.job_history.enabled,
                                      identity_of(r.leader_election))  # fmt: skip
        self.runner.observe(self.job_history.observe)
        self.deepdive = DeepDive(r.deepdive, self.engine, r.cluster_name, clock)
        self.training.on_stall = self.deepdive.stall  # each rank's stack at a stall
        self.alerts.on_hang = self.deepdive.hang  # and at a hang's log alert
        self.profiler = Profiler(r.profiler, self.engine, r.cluster_name, clock)  # traces
        self.assistants = self._mount(cfg, clock)
        self.outliers = Outliers(self.engine, self.lead_writer, self.prom,
                                 self.tracker.running_pods,
                                 r.jobs.outliers_seconds, clock, r.cluster_name)  # fmt: skip
        self.registry.register(self.outliers)
        ag = r.aggregation
        self.jobs = Jobs(self.engine, self.lead_writer, self.clusters.scopes,
                         r.jobs.allocation_seconds, r.retention.days, clock,
                         Keys(tuple(ag.label_keys), tuple(ag.annotation_keys), ag.max_values),
                         ag.backfill_days, r.reports.keep_weeks)  # fmt: skip
        self.reports = weekly.job_for(r, self.engine, self.lead_writer, self.clusters.scopes)
        self.grpc: Any = None
        self.collect_port = 0
        self._stop = threading.Event()

    def _mount(self, cfg: Config, clock: Callable[[], datetime]) -> Assistants:
        """The REST surfaces on the HTTP server, over the parts made before; the assistants'
        (MCP) handle that api.mount returns."""
        r = cfg.recorder
        parts = Services(r, self.clusters, self.remote_write, self.training, self.writer,
                         self.readiness, clock, self.leadership, self.alerts,
                         management=self.management, deepdive=self.deepdive,
                         profiler=self.profiler)  # fmt: skip
        e, guard = self.engine, self.write_guard
        return api.mount(self.http, {
            "lens": LensApi(parts, e.connect, self.clusters.scope, e.begin, guard),
            "alerts": AlertsApi(parts, e.connect, self.clusters.scope, e.begin, guard),
            "plain": PlainJson(parts, e.connect),
            "posts": Admitted(parts, self.ingest)})  # fmt: skip

    def _management(self, cfg: Config, clock: Callable[[], datetime]) -> Management:
        """The Management pages' parts: the settings that change at run time (told to the
        parts that hold a copy), cluster tasks, releases, the clusters' admin."""
        timeout = cfg.kubernetes.request_timeout_seconds

        def prom_timeout(v: float) -> None:
            for p in {id(p): p for p in [self.prom, *(w.prom for w in self.clusters.all())]
                      }.values():  # fmt: skip
                p.timeout = v

        settings = Settings(cfg, hooks={
            "recorder.retention.days": lambda v: setattr(self.jobs, "retention",
                                                         timedelta(days=v)),
            "recorder.prometheus.timeout_seconds": prom_timeout})  # fmt: skip
        tasks = Tasks(self.engine, self.lead_writer, self.clusters, timeout,
                      settings.agent_image, clock,
                      lambda cluster: releases.scan_one(cluster))  # fmt: skip
        releases = Releases(self.engine, self.lead_writer, self.clusters, tasks, timeout, clock)
        admin = ClusterAdmin(self.clusters, timeout, cfg.recorder.database_url,
                             releases.scanned)  # fmt: skip
        return Management(admin, tasks, releases, settings)

    def apply_stored(self) -> None:
        """The settings changed at run time and the default cluster, as the database holds
        them now (every replica)."""
        with self.engine.connect() as conn:
            self.management.settings.apply_stored(conn)
            self.management.admin.load_default(conn)

    def jobs_to_run(self) -> list[Job]:
        """The periodic jobs; leader-only ones write or act on the cluster, and one replica
        does that (each cluster's storage scan is added by its ClusterWatch, leader-only)."""
        r, mc, clock, alloc = self.cfg.recorder, self.cfg.multicluster, self.clock, self.jobs
        every = r.jobs.allocation_seconds
        jobs = [  # snapshot, hourly and prune share a thread: their first runs in this order
            Job("snapshot", every, lambda: alloc.snapshot(clock()), leader_only=True,
                at_start=True, lane="allocation", quiet=FAILURES),
            Job("hourly", every, lambda: alloc.hourly(clock()), leader_only=True,
                at_start=True, lane="allocation", quiet=FAILURES),
            Job("prune", 3600, lambda: alloc.prune(clock()), leader_only=True, at_start=True,
                lane="allocation", quiet=FAILURES),
            Job("training", r.training.check_seconds, lambda: self.training.check(clock()),
                leader_only=True),
            Job("outliers", r.jobs.outliers_seconds, self.outliers.run_counted,
                leader_only=True, quiet=FAILURES),
            # the shipped log templates and rules and metric rules, once (idempotent)
            Job("alerts_seed", 3600, self.alerts.seed, leader_only=True, at_start=True,
                quiet=FAILURES),
            Job("alerts_findings", r.alerts.findings_seconds, self.alerts.jobs.findings,
                leader_only=True, quiet=FAILURES),
            Job("alerts_notify", r.alerts.notify_seconds, self.alerts.jobs.notify,
                leader_only=True, quiet=FAILURES),
            # alerts stored before their pod or GPU was known, enriched once it is
            Job("alerts_enrich", late.SECONDS, self.alerts.jobs.enrich, leader_only=True,
                quiet=FAILURES),
            # the Management pages': settings changed at run time and the default cluster
            # (every replica), runs recorded, frameworks detected, tasks run on clusters,
            # each cluster's agent version read
            Job("settings", 10, self.apply_stored, leader_only=False, at_start=True,
                quiet=FAILURES),
            Job("job_history", 5, self.job_history.flush, leader_only=False, quiet=FAILURES),
            # py-spy tasks whose replica stopped while they ran: failed, saying so
            Job("pyspy_expire", 60, self.deepdive.expire, leader_only=False, at_start=True,
                quiet=FAILURES),
            # fetched profiler traces past recorder.profiler.retention_hours
            Job("profiler_prune", 3600, lambda: self.profiler.prune(clock()), leader_only=True,
                at_start=True, quiet=FAILURES),
            Job("job_history_prune", 3600, lambda: self.job_history.prune(
                clock(), r.job_history.retention_days), leader_only=True, at_start=True,
                quiet=FAILURES),
            Job("detection", r.detection.interval_seconds, self.detection.run,
                leader_only=True, quiet=FAILURES),
            Job("cluster_tasks", r.management.task_seconds, self.management.tasks.run,
                leader_only=True, quiet=FAILURES),
            Job("release_scan", r.management.release_scan_seconds,
                self.management.releases.scan, leader_only=True, at_start=True,
                quiet=FAILURES),
            # every replica answers remote writes from its own maps
            Job("remote_write_index", self.remote_write.indexer.interval,
                self.remote_write.indexer.refresh_counted, leader_only=False, at_start=True,
                quiet=FAILURES),
        ]  # fmt: skip
        # the last completed week's report, once, when due; first looked for one check after
        # start, not at it: a start (every replica's, every test's) does not wait on Chromium
        if r.reports.weekly:
            jobs.append(Job("weekly_report", r.reports.check_seconds,
                            lambda: self.reports.run(clock()), leader_only=True,
                            quiet=FAILURES))  # fmt: skip
        if self.storage_sync is not None:
            jobs.append(Job("storage_config_sync", self.storage_sync.interval,
                            self.storage_sync.run_once, leader_only=True,
                            at_start=True))  # fmt: skip
        if mc.secret:  # read once by clusters.start(); every replica knows the clusters
            # (?cluster= is served everywhere), the leader alone watches them
            jobs.append(Job("clusters_reload", mc.reload_seconds, self.clusters.reload,
                            leader_only=False))  # fmt: skip
        if self.kubelet is not None:
            jobs.append(Job("kubelet_service", self.kubelet.interval, self.kubelet.sync_counted,
                            leader_only=True, at_start=True))  # fmt: skip
        return jobs

    def leads(self) -> bool:
        """Whether this replica does what must be done once (the leader-only jobs' gate):
        always when alone; with replicas, while it holds the Lease and its term."""
        return self.leadership is None or self.leadership.leads()

    def _recover(self) -> None:
        """This replica leads (its term claimed): the trackers' and training's state from
        the database, before the jobs run and the watches start (leadership.py)."""
        for attempt in range(1, 1_000_000):
            try:
                self.clusters.recover()
                with self.engine.connect() as conn:
                    self.training.recover(conn, self.clock())
                break
            except SQLAlchemyError as exc:
                log.warning("recorder: leading, but the state cannot be read (%s, try %d)",
                            type(exc).__name__, attempt)  # fmt: skip
                if self._stop.wait(1):
                    return

    def _client_of(self, cluster: str) -> Any:
        """A followed cluster's API client (None: not followed, or its kubeconfig broken)."""
        watch = self.clusters.get(cluster)
        return watch.client if watch is not None else None

    def _unlead(self) -> None:
        """Leading ended: the watches and scans stop (the jobs' gate says no already)."""
        self.clusters.stop()

    def start(self) -> None:
        self.writer.start(self._stop)
        if self.leadership is None:
            self.clusters.start()
        else:  # the clusters are known to every replica, watched by the leader alone
            self.clusters.start(watch=False)
            self.leadership.start()
        for job in self.jobs_to_run():
            self.runner.add(job)
        self.runner.start()
        if self.cfg.recorder.collect_listen:
            from lens_ebpf.protocol.collector_server import CollectorServer
            from lens_ebpf.protocol.tls import server_credentials

            tls = self.cfg.grpc.tls
            creds = server_credentials(tls.cert, tls.key, tls.client_ca)
            listen = self.cfg.recorder.collect_listen
            self.grpc = CollectorServer(self.node_events, listen, creds, self.loop)
            self.collect_port = self.grpc.port
        self.http.start()

    def stop(self, flush_timeout: float = 10.0) -> None:
        """Stop the jobs, watching and serving; write what is queued (within
        flush_timeout); a leader then gives the Lease up, so another takes over at once."""
        self.runner.stop(timeout=3)
        try:
            self.job_history.flush()  # the last runs' records
        except SQLAlchemyError as exc:
            log.warning("recorder: %d job runs not recorded (%s)", self.job_history.held(),
                        type(exc).__name__)  # fmt: skip
        self.clusters.stop()
        self.deepdive.stop()
        self.profiler.close()
        if self.grpc is not None:
            self.grpc.stop(grace=1)
        if not self.writer.flush(flush_timeout):
            log.warning("recorder: stopping with %d writes not stored", self.writer.depth())
        if self.leadership is not None:
            self.leadership.stop()
        self._stop.set()
        self.writer.join(5)
        self.http.stop()
        self.assistants.close()
        self.loop.close()
        self.engine.dispose()

    # -- REST ----------------------------------------------------------------------
    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready while the home cluster's pods are listed and the database takes writes;
        the other clusters' state is said, and does not make the service unready. With
        replicas, a follower is ready while the database takes writes (it serves from it),
        and the body says which replica leads."""
        watching = self.tracker.pod_reflector.synced.is_set()
        following = self.leadership is not None and not self.leadership.leads()
        ok = (watching or following) and self.writer.up
        body: dict[str, Any] = {"pods_synced": watching, "database_up": self.writer.up,
                                "queued_writes": self.writer.depth(),
                                "clusters": self.clusters.listing()}  # fmt: skip
        if self.leadership is not None:
            body["leader"] = self.leadership.state()
        if self.clusters.reload_error:
            body["clusters_secret_error"] = self.clusters.reload_error
        if self.storage_sync is not None:
            body["storage_config_sync"] = self.storage_sync.state()
        return ok, body


class RecorderMetrics(Collector):
    """The recorder's own health: watches, database writes, queue, errors."""

    def __init__(self, app: RecorderApp) -> None:
        self.app = app

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        app, rec, w = self.app, self.app.tracker, self.app.writer

        reflectors = rec.reflectors()
        yield from watch_metrics(
            reflectors,
            "lens_recorder_watch_connected",
            "lens_recorder_watch_restarts",
            "lens_recorder_watch_events",
        )
        lag = Metric("lens_recorder_watch_lag_seconds",
                     "Seconds since the watch last heard from the API (events, bookmarks, "
                     "lists)", "gauge")  # fmt: skip
        now = time.monotonic()
        for r in reflectors:
            if r.last_heard:
                lag.add_sample("lens_recorder_watch_lag_seconds", {"resource": r.resource},
                               now - r.last_heard)  # fmt: skip
        yield lag
        yield self._gauge("lens_recorder_db_up", "1 while the database takes writes",
                          1 if w.up else 0)  # fmt: skip
        hist = HistogramMetricFamily("lens_recorder_db_write_seconds",
                                     "Time to commit one batch of writes")  # fmt: skip
        writes = w.writes.copy()
        hist.add_metric([], writes.cumulative(), writes.total)
        yield hist
        yield self._gauge("lens_recorder_queue_depth", "Writes waiting for the database",
                          w.depth())  # fmt: skip
        yield self._gauge("lens_recorder_queue_capacity", "The write queue's bound", w.queue_max)
        yield self._counter("lens_recorder_queue_dropped_total", "Writes dropped by a full queue",
                            w.dropped)  # fmt: skip
        yield self._counter("lens_recorder_db_writes_total", "Writes committed", w.committed)
        yield self._counter("lens_recorder_db_writes_fenced_total", "Leader writes dropped: "
                            "this replica no longer led when they came to be written "
                            "(replicas)", w.fenced)  # fmt: skip
        errs = Metric(
            "lens_recorder_db_errors",
            "Database errors: unavailable (the write "
            "waits and is retried), rejected (the write is dropped)",
            "counter",
        )
        for why, n in w.errors.items():
            errs.add_sample("lens_recorder_db_errors_total", {"reason": why}, n)
        yield errs
        bad = Metric("lens_recorder_malformed_objects", "API objects skipped as malformed",
                     "counter")  # fmt: skip
        for what, n in rec.malformed.items():
            bad.add_sample("lens_recorder_malformed_objects_total", {"resource": what}, n)
        yield bad
        yield self._gauge("lens_recorder_pods_tracked", "GPU pods followed now", len(rec.pods))
        yield self._gauge("lens_recorder_workloads_watched", "Workloads watched now",
                          len(rec.workloads))  # fmt: skip
        yield self._counter("lens_recorder_watchers_collected_total",
                            "Workload watchers ended (workload deleted and stored)",
                            rec.watchers_collected)  # fmt: skip
        owners = Metric("lens_recorder_owner_lookups", "Owner reference lookups", "counter")
        for result, n in rec.lookups.items():
            owners.add_sample("lens_recorder_owner_lookups_total", {"result": result}, n)
        yield owners
        fin = Metric("lens_recorder_finalizer_operations", "Finalizer adds and removals",
                     "counter")  # fmt: skip
        for (op, result), n in sorted(rec.finalizer_ops.items()):
            fin.add_sample("lens_recorder_finalizer_operations_total",
                           {"operation": op, "result": result}, n)  # fmt: skip
        yield fin
        ne = Metric("lens_recorder_node_events", "Node agents' events stored, by kind",
                    "counter")  # fmt: skip
        for kind, n in sorted(app.node_events.stored.items()):
            ne.add_sample("lens_recorder_node_events_total", {"kind": kind}, n)
        yield ne
        yield self._counter("lens_recorder_node_events_duplicate_total",
                            "Node events received again and dropped (node, agent instance, seq)",
                            app.node_events.duplicates)  # fmt: skip
        refused = Metric("lens_recorder_collect_refused", "Collector streams refused, by gRPC "
                         "code: unauthenticated (no or an invalid token), permission_denied "
                         "(a token that may not report for the stream's node), unavailable "
                         "(the API server did not answer its TokenReview), invalid_argument "
                         "(a seq beyond grpc.max_seq_jump, or a lens-agent-instance that is "
                         "not one)", "counter")  # fmt: skip
        guard = app.node_events.guard
        counts = dict(guard.refused) if guard is not None else {}
        counts["invalid_argument"] = app.node_events.seq_refused + \
            app.node_events.instance_refused  # fmt: skip
        for code in ("unauthenticated", "permission_denied", "unavailable", "invalid_argument"):
            refused.add_sample("lens_recorder_collect_refused_total", {"code": code},
                               counts.get(code, 0))  # fmt: skip
        yield refused
        # lens_recorder_job_* (runs, errors, last success, ...): JobMetrics, the runner's
        pruned = Metric("lens_recorder_pruned_rows", "Rows older than recorder.retention.days "
                        "removed, by table", "counter")  # fmt: skip
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
            ks = Metric("lens_recorder_kubelet_service_syncs",
                        "kubelet Service/Endpoints syncs, by result", "counter")  # fmt: skip
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


def settle_heap() -> None:
    """Once the process has started: what start-up made (modules, the schema, the API
    client's models, about 200,000 objects) moves out of the garbage collector's sight
    (gc.freeze). A full collection otherwise walks all of it, about 80 ms, every few
    10,000-row statistics pages: a request that meets one takes twice as long. Only for
    the service's own process (what is frozen is never collected)."""
    gc.collect()
    gc.freeze()
