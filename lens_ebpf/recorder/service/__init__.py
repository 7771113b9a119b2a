"""`lens-ebpf recorder`: the database, the watches, the collector protocol, REST and
metrics, wired together (its one-shot commands, --report and --remove-finalizers, are in
cli.py); its periodic jobs are listed in schedule.py, its own metrics are metrics.py's."""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.core.http import HttpServer, front, tls_context
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.core.runner import Job, JobMetrics, Runner
from lens_ebpf.core.settings import split_listen
from lens_ebpf.recorder import api
from lens_ebpf.recorder.accounting.hours import Keys
from lens_ebpf.recorder.accounting.jobs import AccountingJobs
from lens_ebpf.recorder.alerts.service import Alerts
from lens_ebpf.recorder.api.assistants import Assistants
from lens_ebpf.recorder.api.envelope import AlertsApi, LensApi, Services
from lens_ebpf.recorder.api.front import FrontMetrics
from lens_ebpf.recorder.api.posts import Admitted
from lens_ebpf.recorder.api.stored import PlainJson
from lens_ebpf.recorder.config import Config
from lens_ebpf.recorder.deepdive import DeepDive
from lens_ebpf.recorder.detection import Detection
from lens_ebpf.recorder.ingest.admission import Ingest, WriteGuard
from lens_ebpf.recorder.ingest.leadership import Leadership, identity_of
from lens_ebpf.recorder.ingest.node_auth import node_guard
from lens_ebpf.recorder.ingest.node_events import NodeEvents, last_seqs
from lens_ebpf.recorder.management.clusters import ClusterAdmin
from lens_ebpf.recorder.management.hub import Management
from lens_ebpf.recorder.management.job_history import JobHistory
from lens_ebpf.recorder.management.releases import Releases
from lens_ebpf.recorder.management.settings import Settings
from lens_ebpf.recorder.management.tasks import Tasks
from lens_ebpf.recorder.profiler.files import Profiler
from lens_ebpf.recorder.prom import Prom
from lens_ebpf.recorder.remote_write.receiver import RemoteWrite
from lens_ebpf.recorder.reports import weekly
from lens_ebpf.recorder.service import schedule
from lens_ebpf.recorder.service.metrics import RecorderMetrics
from lens_ebpf.recorder.store.writer import (
    DatabaseError,
    LeaderWriter,
    Writer,
    engine_for,
    redact,
    upgrade,
)
from lens_ebpf.recorder.tracker.clusters import Clusters, Shared, StorageConfigSync, own_namespace
from lens_ebpf.recorder.tracker.kubelet_service import KubeletService
from lens_ebpf.recorder.training.outliers import Outliers
from lens_ebpf.recorder.training.progress import Training

log = logging.getLogger(__name__)


class RecorderApp:
    """The recorder process's parts; start() and stop() in the right order."""

    def __init__(
        self,
        cfg: Config,
        api_client: Any,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        self._store(cfg, api_client, clock)
        self._serving(cfg, api_client, clock)
        self._domains(cfg, api_client, clock)
        self.grpc: Any = None
        self.collect_port = 0
        self._stop = threading.Event()

    def _store(self, cfg: Config, api_client: Any, clock: Callable[[], datetime]) -> None:
        """The database, its writers, Prometheus, the runner, the clusters followed, the
        node agents' events, the kubelet Service."""
        r, k = cfg.recorder, cfg.kubernetes
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
        # writes is fenced by this replica's term (ingest/leadership.py); alone, it is the writer
        replicas = r.leader_election.enabled
        self.lead_writer: Writer = LeaderWriter(self.writer) if replicas else self.writer
        self.leadership: Leadership | None = None  # made once the REST port is bound
        p = r.prometheus
        self.prom = Prom(p.url, p.timeout_seconds, p.max_points)
        # every periodic job, leader-only or not: listed in start()
        self.runner = Runner(name="recorder", is_leader=self.leads)
        self.clusters = Clusters(
            Shared(cfg, self.engine, self.lead_writer, self.prom, clock, self.runner), api_client
        )
        home = self.clusters.home
        assert home.tracker is not None and home.nodes is not None and home.storage is not None
        self.api, self.tracker, self.nodes, self.storage = (
            home.api,
            home.tracker,
            home.nodes,
            home.storage,
        )
        if not replicas:  # a leader reads its state back when it comes to lead
            self.clusters.recover()
        with self.engine.connect() as conn:
            self.node_events = NodeEvents(self.writer, last_seqs(conn), r.cluster_name)
        self.node_events.max_seq_jump = cfg.grpc.max_seq_jump
        if r.collect_listen:
            self.node_events.guard = node_guard(
                cfg.grpc.auth,
                r.collect_listen,
                r.cluster_name,
                self._client_of,
                k.request_timeout_seconds,
            )
        self.kubelet: KubeletService | None = None
        ks = r.kubelet_service
        if ks.enabled:
            self.kubelet = KubeletService(
                self.api.core,
                ks.namespace,
                ks.name,
                ks.ports,
                ks.interval_seconds,
                k.request_timeout_seconds,
            )

    def _serving(self, cfg: Config, api_client: Any, clock: Callable[[], datetime]) -> None:
        """The metrics registry, ingest, training, the HTTP server, remote write, the
        storage config sync, leader election."""
        r, k = cfg.recorder, cfg.kubernetes
        replicas = r.leader_election.enabled
        self.registry = CollectorRegistry()
        self.registry.register(RecorderMetrics(self))
        self.registry.register(JobMetrics(self.runner, "lens_recorder_job"))
        host, port = split_listen(r.listen)
        self.ingest = Ingest(r.ingest, host, r.cluster_name)
        self.training = Training(
            r.training,
            self.lead_writer,
            self.tracker.gpu_pod,
            self.tracker.running_workloads,
            clock,
            r.cluster_name,
        )
        if not replicas:
            with self.engine.connect() as conn:
                self.training.recover(conn, clock())
        self.registry.register(self.ingest)
        self.registry.register(self.training)
        self.loop = EventLoopThread("aio")  # REST and the reporters' streams: one loop
        srv = cfg.server
        self.http = HttpServer(
            host,
            port,
            self.registry,
            srv.max_connections,
            srv.request_timeout_seconds,
            srv.max_header_bytes,
            self.loop,
            tls_context(srv.tls.cert, srv.tls.key, srv.tls.client_ca),
            **front(srv),
        )
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
            self.leadership = Leadership(
                le,
                le.namespace or own_namespace(),
                self.engine,
                api_client,
                k.request_timeout_seconds,
                self.http.port,
                (tls.cert, tls.key) if tls.cert else None,
                self._recover,
                self.clusters.watch,
                self._unlead,
            )
            self.writer.fence = self.leadership.fence.check
            self.registry.register(self.leadership)

    def _domains(self, cfg: Config, api_client: Any, clock: Callable[[], datetime]) -> None:
        """Alerts, the Management pages' parts, detection, the job history, the deep dive,
        the profiler, the REST surfaces, outliers, the allocation jobs, the weekly report."""
        r = cfg.recorder
        host, _ = split_listen(r.listen)
        self.alerts = Alerts(
            r.alerts,
            self.engine,
            self.lead_writer,
            self.remote_write,
            api_client,
            own_namespace(),
            r.cluster_name,
            self.tracker.gpu_pod,
            self.clusters.scopes,
            clock,
        )
        self.registry.register(self.alerts)
        self.write_guard = WriteGuard(r.api, host)
        self.registry.register(self.write_guard)
        self.management = self._management(cfg, clock)
        self.detection = Detection(
            self.engine, self.lead_writer, self.clusters.scopes, r.detection, clock
        )
        # every run of every job, recorded by the leader (the Job Execution History page)
        self.job_history = JobHistory(
            self.engine,
            self.writer,
            r.cluster_name,
            self.leads,
            lambda: r.job_history.enabled,
            identity_of(r.leader_election),
        )
        self.runner.observe(self.job_history.observe)
        self.deepdive = DeepDive(r.deepdive, self.engine, r.cluster_name, clock)
        self.training.on_stall = self.deepdive.stall  # each rank's stack at a stall
        self.alerts.on_hang = self.deepdive.hang  # and at a hang's log alert
        self.profiler = Profiler(r.profiler, self.engine, r.cluster_name, clock)  # traces
        self.assistants = self._mount(cfg, clock)
        self.outliers = Outliers(
            self.engine,
            self.lead_writer,
            self.prom,
            self.tracker.running_pods,
            r.jobs.outliers_seconds,
            clock,
            r.cluster_name,
        )
        self.registry.register(self.outliers)
        ag = r.aggregation
        self.jobs = AccountingJobs(
            self.engine,
            self.lead_writer,
            self.clusters.scopes,
            r.jobs.allocation_seconds,
            r.retention.days,
            clock,
            Keys(tuple(ag.label_keys), tuple(ag.annotation_keys), ag.max_values),
            ag.backfill_days,
            r.reports.keep_weeks,
        )
        self.reports = weekly.job_for(r, self.engine, self.lead_writer, self.clusters.scopes)

    def _mount(self, cfg: Config, clock: Callable[[], datetime]) -> Assistants:
        """The REST surfaces on the HTTP server, over the parts made before; the assistants'
        (MCP) handle that api.mount returns."""
        r = cfg.recorder
        parts = Services(
            r,
            self.clusters,
            self.remote_write,
            self.training,
            self.writer,
            self.readiness,
            clock,
            self.leadership,
            self.alerts,
            management=self.management,
            deepdive=self.deepdive,
            profiler=self.profiler,
        )
        e, guard = self.engine, self.write_guard
        return api.mount(
            self.http,
            {
                "lens": LensApi(parts, e.connect, self.clusters.scope, e.begin, guard),
                "alerts": AlertsApi(parts, e.connect, self.clusters.scope, e.begin, guard),
                "plain": PlainJson(parts, e.connect),
                "posts": Admitted(parts, self.ingest, e.connect),
            },
        )

    def _management(self, cfg: Config, clock: Callable[[], datetime]) -> Management:
        """The Management pages' parts: the settings that change at run time (told to the
        parts that hold a copy), cluster tasks, releases, the clusters' admin."""
        timeout = cfg.kubernetes.request_timeout_seconds

        def prom_timeout(v: float) -> None:
            for p in {
                id(p): p for p in [self.prom, *(w.prom for w in self.clusters.all())]
            }.values():
                p.timeout = v

        settings = Settings(
            cfg,
            hooks={
                "recorder.retention.days": lambda v: setattr(
                    self.jobs, "retention", timedelta(days=v)
                ),
                "recorder.prometheus.timeout_seconds": prom_timeout,
            },
        )
        tasks = Tasks(
            self.engine,
            self.lead_writer,
            self.clusters,
            timeout,
            settings.agent_image,
            clock,
            lambda cluster: releases.scan_one(cluster),
        )
        releases = Releases(self.engine, self.lead_writer, self.clusters, tasks, timeout, clock)
        admin = ClusterAdmin(self.clusters, timeout, cfg.recorder.database_url, releases.scanned)
        return Management(admin, tasks, releases, settings)

    def apply_stored(self) -> None:
        """The settings changed at run time and the default cluster, as the database holds
        them now (every replica)."""
        with self.engine.connect() as conn:
            self.management.settings.apply_stored(conn)
            self.management.admin.load_default(conn)

    def jobs_to_run(self) -> list[Job]:
        """The periodic jobs (service/schedule.py's lists, one by domain)."""
        return [
            *schedule.allocation(self),
            *schedule.alerts(self),
            *schedule.management(self),
            *schedule.added(self),
        ]

    def leads(self) -> bool:
        """Whether this replica does what must be done once (the leader-only jobs' gate):
        always when alone; with replicas, while it holds the Lease and its term."""
        return self.leadership is None or self.leadership.leads()

    def _recover(self) -> None:
        """This replica leads (its term claimed): the trackers' and training's state from
        the database, before the jobs run and the watches start (ingest/leadership.py)."""
        for attempt in range(1, 1_000_000):
            try:
                self.clusters.recover()
                with self.engine.connect() as conn:
                    self.training.recover(conn, self.clock())
                break
            except SQLAlchemyError as exc:
                log.warning(
                    "recorder: leading, but the state cannot be read (%s, try %d)",
                    type(exc).__name__,
                    attempt,
                )
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
            log.warning(
                "recorder: %d job runs not recorded (%s)",
                self.job_history.held(),
                type(exc).__name__,
            )
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
        body: dict[str, Any] = {
            "pods_synced": watching,
            "database_up": self.writer.up,
            "queued_writes": self.writer.depth(),
            "clusters": self.clusters.listing(),
        }
        if self.leadership is not None:
            body["leader"] = self.leadership.state()
        if self.clusters.reload_error:
            body["clusters_secret_error"] = self.clusters.reload_error
        if self.storage_sync is not None:
            body["storage_config_sync"] = self.storage_sync.state()
        return ok, body


def settle_heap() -> None:
    """Once the process has started: what start-up made (modules, the schema, the API
    client's models, about 200,000 objects) moves out of the garbage collector's sight
    (gc.freeze). A full collection otherwise walks all of it, about 80 ms, every few
    10,000-row statistics pages: a request that meets one takes twice as long. Only for
    the service's own process (what is frozen is never collected)."""
    gc.collect()
    gc.freeze()
