"""The alerts' parts as the service holds them (recorder.alerts): Alertmanager, the
silences, the metric rules, the log rules' engine and the periodic jobs, the alerts that
come in (counted by source and outcome), and the shipped rules and templates seeded once.

Alerts that come in (POST alerts/metric, api/v2/alerts, alerts/webhook) are stored by the
replica that takes them, in one transaction, before it answers. Our own (log rules on
the lines POST /logs brings the leader, the findings job) are the leader's writes:
fenced, as every leader write is (ingest/leadership.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from lens_ebpf.core.exposition import counter
from lens_ebpf.recorder.alerts import enrich, ingest, logtemplates, rules
from lens_ebpf.recorder.alerts.jobs import AlertJobs
from lens_ebpf.recorder.alerts.logrules import Line, LogRules
from lens_ebpf.recorder.alerts.notify import Alertmanager
from lens_ebpf.recorder.alerts.rules import MetricRules
from lens_ebpf.recorder.alerts.silences import Silences
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store.writer import Op, Writer

if TYPE_CHECKING:
    from lens_ebpf.recorder.config import AlertsConfig
    from lens_ebpf.recorder.remote_write.receiver import RemoteWrite
    from lens_ebpf.recorder.tracker import TrackedPod
    from lens_ebpf.recorder.training.logs import LogLine

log = logging.getLogger(__name__)
# log alerts that mean the job hangs: the shipped NCCL/RCCL watchdog template's (a
# collective that timed out; alerts/logtemplates.py TEMPLATES)
HANGS = frozenset({"NCCLWatchdogTimeout"})

OUTCOMES = ("new", "resolved", "reopened", "unchanged", "silenced")


class Alerts(Collector):
    def __init__(
        self,
        cfg: AlertsConfig,
        engine: Engine,
        lead_writer: Writer,
        remote_write: RemoteWrite | None,
        api_client: Any,
        namespace: str,
        home: str,
        pods: Callable[[str, str, str], TrackedPod | None],
        scopes: Callable[[], list[Scope]],
        clock: Callable[[], datetime],
    ) -> None:
        self.cfg, self.engine, self.writer, self.home = cfg, engine, lead_writer, home
        self.remote_write, self.pods, self.clock = remote_write, pods, clock
        self.am = Alertmanager(cfg.alertmanager_url, cfg.timeout_seconds)
        self.silences = Silences(self.am)
        self.metric_rules = MetricRules(
            api_client, cfg.rules_namespace or namespace, cfg.rule_labels, cfg.rules_file, home
        )
        self.log_rules = LogRules(engine, cfg.log_rules_reload_seconds, clock)
        self.jobs = AlertJobs(
            engine,
            scopes,
            self.concern,
            self.silences,
            self.am,
            clock,
            cfg.external_url,
            lead_writer,
        )
        self._lock = threading.Lock()
        self.received: dict[tuple[str, str], int] = {}  # (source, outcome) -> alerts
        self.log_errors = 0  # log rule evaluations that failed (the lines were still taken)
        # a hang's log alert fired for a workload: (its uid, the alert's id, its name); the
        # deep dive's stacks (HANGS: the alert names that mean a hang)
        self.on_hang: Callable[[str, str, str], object] = lambda uid, aid, name: None
        self.log_dropped = 0  # log alerts the write queue refused

    def concern(self, labels: dict[str, str], at: datetime) -> enrich.Concern:
        return enrich.concern(labels, at, self.remote_write)

    # -- the shipped rules -----------------------------------------------------------------
    def seed(self) -> None:
        """The shipped templates (and, with default_log_rules, the GPU training ones as
        rules of every cluster) and deploy/prometheus-operator/prometheusrule.yaml's groups as
        built-in metric rules, once; a replica that finds another did it first leaves it."""
        now = self.clock()
        try:
            with self.engine.begin() as conn:
                logtemplates.seed(conn, now, "", self.cfg.default_log_rules)
            with self.engine.begin() as conn:
                rules.seed(conn, now, self.home)
        except IntegrityError:
            log.info("alerts: the shipped rules were seeded by another replica")

    # -- alerts in ---------------------------------------------------------------------------
    def count(self, source: str, got: dict[str, int]) -> None:
        with self._lock:
            for outcome, n in got.items():
                if n:
                    key = (source, outcome)
                    self.received[key] = self.received.get(key, 0) + n

    def take(self, alerts: list[ingest.AlertIn], source: str) -> dict[str, int]:
        """Alerts a route received, stored (deduplicated, enriched, silenced) before the
        route answers: {received, new, resolved, ...}."""
        now = self.clock()
        with self.engine.begin() as conn:
            got = ingest.store(
                conn, alerts, now, self.concern, self.silences.active(conn, now)
            ).as_dict()
        self.count(source, got)
        return {"received": len(alerts), **got}

    def lines(self, lines: list[LogLine], received: datetime) -> None:
        """POST /logs's lines through the log rules (on the leader); the alerts they fire
        queued as the leader's write. A failure is logged and counted: the lines are the
        training progress's all the same."""
        try:
            fired = self.log_rules.evaluate([self._line(x, received) for x in lines])
        except Exception:
            log.exception("alerts: log rules on %d lines", len(lines))
            with self._lock:
                self.log_errors += 1
            return
        if not fired:
            return
        for a in fired:
            if a.alert_name in HANGS and a.labels.get("workload_uid"):
                self.on_hang(a.labels["workload_uid"], a.id, a.alert_name)

        got: list[dict[str, int]] = []

        def write(conn: Any) -> None:  # (a batch the database refused is tried again)
            now = self.clock()
            got.append(
                ingest.store(
                    conn, fired, now, self.concern, self.silences.active(conn, now)
                ).as_dict()
            )

        if not self.writer.submit(
            Op("alert_events", write, done=lambda: self.count("log", got[-1]))
        ):
            with self._lock:
                self.log_dropped += len(fired)

    def _line(self, x: LogLine, received: datetime) -> Line:
        pod = self.pods(x.namespace, x.pod, x.pod_uid)
        at = x.at or received
        if pod is None:
            return Line(at, x.text, x.namespace, x.pod, x.pod_uid, x.container, cluster=self.home)
        return Line(
            at,
            x.text,
            x.namespace,
            x.pod,
            pod.uid,
            x.container,
            pod.node,
            pod.workload_uid,
            pod.workload_name,
            pod.workload_kind,
            self.home,
        )

    # -- metrics -------------------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            received = dict(self.received)
            errors, dropped = self.log_errors, self.log_dropped
        for outcome, n in self.jobs.stored.items():  # the findings job's
            received[("lens", outcome)] = received.get(("lens", outcome), 0) + n
        got = counter(
            "lens_recorder_alerts_received",
            "Alerts received or made, by source "
            "(metric, webhook, log, lens) and what storing them did (new, resolved, "
            "reopened, unchanged, silenced; own: ours, routed back by Alertmanager, "
            "not stored again; refused: not an alert, named in the answer, the rest "
            "of its batch stored)",
        )
        for (source, outcome), n in sorted(received.items()):
            got.add({"source": source, "outcome": outcome}, n)
        yield got
        c = self.log_rules.counts
        lines = counter(
            "lens_recorder_log_rule_lines",
            "Log lines against the log rules: "
            "evaluated (line x rule), matched, fired (an alert), suppressed "
            "(matched within the rule's repeat_interval)",
        )
        for what in ("evaluated", "matched", "fired", "suppressed"):
            lines.add({"result": what}, getattr(c, what))
        yield lines
        yield counter(
            "lens_recorder_log_rule_errors",
            "Log rule evaluations that " "failed (the lines were taken all the same)",
            errors,
        )
        yield counter(
            "lens_recorder_log_alerts_dropped",
            "Log alerts not stored: " "the write queue was full",
            dropped,
        )
        sent = counter(
            "lens_recorder_alert_notifications",
            "Alerts sent on, by receiver " "(alertmanager, webhook) and result",
        )
        for key, n in sorted(self.jobs.sent.items()):
            receiver, _, failed = key.partition("_")
            sent.add({"receiver": receiver, "result": "failed" if failed else "ok"}, n)
        yield sent
