"""The alerts' periodic work, on the leader: the service's findings stored as alerts
(alerts/findings.py), our own alerts sent on to Alertmanager (recorder.alerts.
alertmanager_url: the firing ones each run, as Prometheus does, so Alertmanager keeps
them; an ended one once, with its end), every alert sent once per state to each enabled
webhook channel, log alerts ended after their rule's repeat_interval, and alerts stored
before what they concern was known enriched once it is (alerts/late.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, select, update

from lens_ebpf.core.times import aware
from lens_ebpf.recorder.alerts import findings, ingest, late
from lens_ebpf.recorder.alerts.model import OWN_LABEL
from lens_ebpf.recorder.alerts.notify import Alertmanager, SendError, webhook
from lens_ebpf.recorder.alerts.silences import Silences
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer

log = logging.getLogger(__name__)

OURS = ("log", "lens", "webhook")  # alerts made here or sent here directly: Alertmanager's
# own (source metric) are not sent back to it
RECENT = timedelta(days=1)  # the alerts a run looks at: updated this recently
SENT_MAX = 5000  # at most this many alerts in one post to Alertmanager
STORE_WAIT = 30.0  # the most the findings job waits for its alerts' commit


class AlertJobs:
    def __init__(
        self,
        engine: Engine,
        scopes: Callable[[], list[Scope]],
        concern: Callable[..., Any],
        silences: Silences,
        am: Alertmanager,
        clock: Callable[[], datetime],
        external_url: str = "",
        writer: Writer | None = None,
    ) -> None:
        self.engine, self.scopes, self.concern = engine, scopes, concern
        self.writer = writer  # the leader's (fenced); None: written here at once
        self.silences, self.am, self.clock = silences, am, clock
        self.external_url = external_url.rstrip("/")
        self.stored: dict[str, int] = {}  # findings stored, by outcome
        self.late = late.Retries()  # the pending alerts' looks
        self.enriched_late = 0  # alerts enriched after they were stored
        self.sent: dict[str, int] = {
            "alertmanager": 0,
            "alertmanager_failed": 0,
            "webhook": 0,
            "webhook_failed": 0,
        }

    def store(self, alerts: list[ingest.AlertIn], now: datetime) -> dict[str, int]:
        """Alerts stored (deduplicated, enriched, silenced), in one transaction: the
        leader's write, waited for ({} when it was not written: the queue full, the
        database down, or this replica no longer leads)."""
        if not alerts:
            return {}
        got: list[dict[str, int]] = []

        def write(conn: Connection) -> None:
            got.append(
                ingest.store(
                    conn, alerts, now, self.concern, self.silences.active(conn, now)
                ).as_dict()
            )

        return got[-1] if self._write(write) else {}  # the try that was committed

    def _write(self, write: Callable[[Connection], None]) -> bool:
        """write in one transaction: the leader's write, waited for; whether it was
        committed (not: the queue full, the database down, this replica no longer
        leading)."""
        if self.writer is None:
            with self.engine.begin() as conn:
                write(conn)
            return True
        done = threading.Event()
        if self.writer.submit(Op("alert_events", write, done=done.set)):
            done.wait(STORE_WAIT)
        return done.is_set()

    def enrich(self) -> None:
        """The alerts stored without their workload (late.py): those due looked at again
        through what the maps and tables know now, the ones that name it enriched."""
        now = self.clock()
        with self.engine.connect() as conn:
            rows = late.pending(conn, now - late.WINDOW)
        found: dict[str, Any] = {}
        for r in self.late.due(rows, now):
            c = self.concern(dict(r.labels or {}), aware(r.starts_at))
            if c.workload_uid or (c.pod_uid and c.pod_uid != r.pod_id):
                found[r.id] = c
            if not c.workload_uid:
                self.late.missed(r.id, now)
        if not found:
            return
        got: list[int] = []

        def write(conn: Connection) -> None:
            got.append(late.enrich(conn, found, now, self.silences.active(conn, now)))

        if self._write(write) and got:
            self.enriched_late += got[-1]

    def findings(self) -> None:
        now = self.clock()
        for c in self.scopes():
            with self.engine.connect() as conn:
                made = findings.training(conn, c.name, now) + findings.faults(conn, c.name, now)
            for k, n in self.store(made, now).items():
                self.stored[k] = self.stored.get(k, 0) + n
        self._end_log_alerts(now)

    def _end_log_alerts(self, now: datetime) -> None:
        """A log alert has no end of its own: it ends its rule's repeat_interval after it
        began (a line again after that is a new one)."""
        ae, r = t.alert_events, t.log_alert_rules
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(ae.c.id, ae.c.starts_at, ae.c.raw_data).where(
                    ae.c.source == "log", ae.c.status.in_(("firing", "silenced"))
                )
            )
            repeat = {
                int(x.id): int(x.repeat_interval)
                for x in conn.execute(select(r.c.id, r.c.repeat_interval))
            }
            for row in rows:
                rid = int((row.raw_data or {}).get("rule_id", 0))
                starts = (
                    row.starts_at
                    if row.starts_at.tzinfo
                    else row.starts_at.replace(tzinfo=now.tzinfo)
                )
                end = starts + timedelta(seconds=repeat.get(rid, 3600))
                if end <= now:
                    conn.execute(
                        update(ae)
                        .where(ae.c.id == row.id)
                        .values(status="resolved", ends_at=end, updated_at=now)
                    )

    # -- sending ---------------------------------------------------------------------------
    def notify(self) -> None:
        now = self.clock()
        if self.am.url:
            self._alertmanager(now)
        self._channels(now)

    def _postable(self, row: Any, ended: bool) -> dict[str, Any]:
        labels = {k: str(v) for k, v in (row.labels or {}).items()}
        labels.setdefault("alertname", row.alert_name)
        labels[OWN_LABEL] = row.id  # ours: when Alertmanager sends it back, not stored again
        labels.setdefault("severity", row.severity)
        if row.cluster_name:
            labels.setdefault("cluster", row.cluster_name)
        for key, value in (
            ("workload", row.workload_name),
            ("workload_uid", row.workload_id),
            ("pod", row.pod_name),
            ("node", row.node_name),
        ):
            if value:
                labels.setdefault(key, value)
        starts = (
            row.starts_at
            if row.starts_at.tzinfo
            else row.starts_at.replace(tzinfo=self.clock().tzinfo)
        )
        ends = None
        if ended:
            ends = row.ends_at or self.clock()
            ends = ends if ends.tzinfo else ends.replace(tzinfo=starts.tzinfo)
        url = f"{self.external_url}/lens/alerts/events/{row.id}" if self.external_url else ""
        return {
            "labels": labels,
            "annotations": dict(row.annotations or {}),
            "starts_at": starts,
            "ends_at": ends,
            "generator_url": url,
        }

    def _alertmanager(self, now: datetime) -> None:
        ae = t.alert_events
        with self.engine.connect() as conn:
            live = list(
                conn.execute(
                    select(ae)
                    .where(
                        ae.c.source.in_(OURS),
                        ae.c.status.in_(("firing", "silenced")),
                        ae.c.updated_at >= now - RECENT,
                    )
                    .limit(SENT_MAX)
                )
            )
            ended = list(
                conn.execute(
                    select(ae)
                    .where(
                        ae.c.source.in_(OURS),
                        ae.c.status == "resolved",
                        ae.c.notification_status != "resolved",
                        ae.c.notified_at.is_not(None),
                        ae.c.updated_at >= now - RECENT,
                    )
                    .limit(SENT_MAX)
                )
            )
        body = [self._postable(r, False) for r in live] + [self._postable(r, True) for r in ended]
        if not body:
            return
        try:
            self.am.post_alerts(body)
            ok, status = True, ""
            self.sent["alertmanager"] += len(body)
        except SendError as exc:
            ok, status = False, str(exc)
            self.sent["alertmanager_failed"] += len(body)
            log.warning("alerts: Alertmanager: %s", exc)
        with self.engine.begin() as conn:
            for rows, state in ((live, "sent"), (ended, "resolved")):
                ids = [r.id for r in rows]
                if ids:
                    conn.execute(
                        update(ae)
                        .where(ae.c.id.in_(ids))
                        .values(notified_at=now, notification_status=state if ok else "failed")
                    )
                    conn.execute(
                        t.alert_notifications.insert(),
                        [
                            {
                                "alert_id": i,
                                "channel": "alertmanager",
                                "status": "firing" if state == "sent" else "resolved",
                                "sent_at": now,
                                "ok": ok,
                                "error_message": status,
                            }
                            for i in ids
                        ],
                    )

    def _channels(self, now: datetime) -> None:
        """Each enabled webhook channel: every alert of the last day once per state
        (firing, resolved) it reached."""
        ch, ae, an = t.notification_channels, t.alert_events, t.alert_notifications
        with self.engine.connect() as conn:
            channels = list(
                conn.execute(select(ch).where(ch.c.enabled.is_(True), ch.c.type == "webhook"))
            )
            if not channels:
                return
            alerts = list(
                conn.execute(
                    select(ae).where(ae.c.updated_at >= now - RECENT, ae.c.status != "silenced")
                )
            )
            done = {
                (r.alert_id, r.channel, r.status)
                for r in conn.execute(
                    select(an.c.alert_id, an.c.channel, an.c.status).where(
                        and_(an.c.sent_at >= now - RECENT - RECENT, an.c.ok.is_(True))
                    )
                )
            }
        for channel in channels:
            cfg = channel.config or {}
            for a in alerts:
                state = "resolved" if a.status == "resolved" else "firing"
                if (a.id, channel.name, state) in done:
                    continue
                payload = {
                    "alert_id": a.id,
                    "source": a.source,
                    "alert_name": a.alert_name,
                    "severity": a.severity,
                    "status": state,
                    "starts_at": a.starts_at.isoformat(),
                    "ends_at": a.ends_at.isoformat() if a.ends_at else None,
                    "labels": a.labels,
                    "annotations": a.annotations,
                    "workload_id": a.workload_id,
                    "workload_name": a.workload_name,
                    "pod_name": a.pod_name,
                    "node_name": a.node_name,
                    "cluster_name": a.cluster_name,
                }
                try:
                    webhook(
                        str(cfg.get("url", "")),
                        payload,
                        str(cfg.get("method") or "POST"),
                        {str(k): str(v) for k, v in (cfg.get("headers") or {}).items()},
                        float(cfg.get("timeout") or 10),
                    )
                    ok, err = True, ""
                    self.sent["webhook"] += 1
                except SendError as exc:
                    ok, err = False, str(exc)
                    self.sent["webhook_failed"] += 1
                with self.engine.begin() as conn:
                    conn.execute(
                        an.insert().values(
                            alert_id=a.id,
                            channel=channel.name,
                            status=state,
                            sent_at=now,
                            ok=ok,
                            error_message=err,
                        )
                    )
