"""Alerts in: Alertmanager's webhook (and VMAlert's, the same), the v2 list of postable
alerts (what Prometheus and vmalert's notifier post), a generic JSON alert, and our own.
Each stored once by its id (Alertmanager's fingerprint, else one made from its name and
labels), its history kept: firing, then resolved (with its end); fired again after it
was resolved, it is open again (counted in `fired`). A new firing alert is enriched with
what it concerns (enrich.py) and checked against the active silences."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.alerts import model
from lens_ebpf.recorder.alerts.enrich import Concern
from lens_ebpf.recorder.alerts.silences import matches
from lens_ebpf.recorder.errors import BadRequest
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import insert_new

ZERO = "0001-01-01T00:00:00Z"  # Go's zero time: Alertmanager's "no end"
ID_MAX = 64  # alert_events.id


@dataclass
class AlertIn:
    id: str
    source: str
    alert_name: str
    severity: str
    status: str  # firing or resolved
    starts_at: datetime
    ends_at: datetime | None
    labels: dict[str, str]
    annotations: dict[str, str]
    cluster: str
    raw: dict[str, Any] = field(default_factory=dict)
    route_key: str = ""


def fingerprint(name: str, labels: dict[str, str]) -> str:
    text = ",".join(f"{k}={v}" for k, v in sorted({**labels, "alertname": name}.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _strings(v: Any, what: str) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise BadRequest(f"{what}: an object is required")
    inputs.checked(v, what, nul=True)
    clean: dict[str, str] = inputs.without_nul({str(k): str(x) for k, x in v.items()})
    return clean


def _one(
    item: Any,
    common_labels: dict[str, str],
    common_notes: dict[str, str],
    source: str,
    home: str,
    now: datetime,
    status: str | None,
) -> AlertIn:
    """One alert, its NUL characters made U+FFFD (storable: the alert kept, not refused);
    BadRequest naming the field (within the alert) that makes it none."""
    if not isinstance(item, dict):
        raise BadRequest("an alert is an object")
    inputs.checked(item, nul=True)
    item = inputs.without_nul(item)
    labels = {**common_labels, **_strings(item.get("labels"), "labels")}
    notes = {**common_notes, **_strings(item.get("annotations"), "annotations")}
    name = labels.get("alertname", "")
    if not name:
        raise BadRequest("labels.alertname is required")
    for key, value in (("labels.alertname", name), ("labels.cluster", labels.get("cluster", ""))):
        if len(value) > t.NAME:
            raise BadRequest(f"{key}: longer than {t.NAME} characters")
    starts = model.parse_time(item.get("startsAt"), "startsAt") or now
    ends_raw = item.get("endsAt")
    ends = None if ends_raw in (None, "", ZERO) else model.parse_time(ends_raw, "endsAt")
    said = str(item.get("status") or status or "").lower()
    resolved = said == "resolved" or (not said and ends is not None and ends <= now)
    given = str(item.get("fingerprint") or "")
    if len(given) > ID_MAX:
        raise BadRequest(f"fingerprint: longer than {ID_MAX} characters")
    return AlertIn(
        id=given or fingerprint(name, labels),
        source=source,
        alert_name=name,
        severity=model.severity(labels.get("severity")),
        status="resolved" if resolved else "firing",
        starts_at=starts,
        ends_at=(ends or now) if resolved else None,
        labels=labels,
        annotations=notes,
        cluster=labels.get("cluster", "") or home,
        raw=item,
    )


def parse_alertmanager(body: Any, home: str, now: datetime) -> tuple[list[AlertIn], list[str]]:
    """Alertmanager's (and VMAlert's) webhook object, or a list of postable alerts: the
    alerts, and why each that is not one was left out (naming it; the others are kept:
    Alertmanager does not send a 4xx again, so a batch refused whole would be lost)."""
    if isinstance(body, list):
        items, common, notes, where = body, {}, {}, "alerts"
    elif isinstance(body, dict) and isinstance(body.get("alerts"), list):
        items, where = body["alerts"], "alerts"
        common = _strings(body.get("commonLabels"), "commonLabels")
        notes = _strings(body.get("commonAnnotations"), "commonAnnotations")
    else:
        raise BadRequest(
            'an Alertmanager webhook body ({"alerts": [...]}) or a list of alerts ' "is required"
        )
    good, bad = [], []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        try:
            good.append(_one(item, common, notes, "metric", home, now, None))
        except BadRequest as exc:
            labels = item.get("labels") if isinstance(item, dict) else None
            name = labels.get("alertname") if isinstance(labels, dict) else None
            said = f" (alertname={inputs.shown(str(name))})" if name else ""
            bad.append(f"{at}{said}: {exc}")
    return good, bad


def parse_generic(body: Any, home: str, now: datetime) -> AlertIn:
    """{alert_name, severity, status, labels, annotations, starts_at, ends_at, id}."""
    if not isinstance(body, dict):
        raise BadRequest("a JSON object is required")
    inputs.checked(body, nul=True)
    body = inputs.without_nul(body)
    labels = _strings(body.get("labels"), "labels")
    name = str(body.get("alert_name") or labels.get("alertname") or "generic_webhook_alert")
    labels["alertname"] = name
    if body.get("severity"):
        labels.setdefault("severity", str(body["severity"]))
    item = {
        "labels": labels,
        "annotations": body.get("annotations") or {},
        "startsAt": body.get("starts_at"),
        "endsAt": body.get("ends_at"),
        "status": body.get("status"),
        "fingerprint": body.get("id"),
    }
    got = _one(item, {}, {}, "webhook", home, now, None)
    got.raw = body
    return got


class Outcome:
    def __init__(self) -> None:
        self.new, self.resolved, self.reopened, self.unchanged, self.silenced = 0, 0, 0, 0, 0

    def as_dict(self) -> dict[str, int]:
        return {
            "new": self.new,
            "resolved": self.resolved,
            "reopened": self.reopened,
            "unchanged": self.unchanged,
            "silenced": self.silenced,
        }


def store(
    conn: Connection,
    alerts: list[AlertIn],
    now: datetime,
    concern: Any,
    silences: list[dict[str, Any]],
) -> Outcome:
    """Each alert stored once (a row per id, its status moved), in conn's transaction;
    concern(labels, at) -> Concern for a new or reopened one."""
    ae = t.alert_events
    out = Outcome()
    for a in alerts:
        q = select(ae).where(ae.c.id == a.id)
        if conn.dialect.name == "postgresql":
            q = q.with_for_update()  # replicas: one request moves it at a time
        old = conn.execute(q).first()
        if old is not None and a.status == "resolved":
            if old.status == "resolved":
                out.unchanged += 1
                continue
            conn.execute(
                update(ae)
                .where(ae.c.id == a.id)
                .values(status="resolved", ends_at=a.ends_at or now, updated_at=now)
            )
            out.resolved += 1
            continue
        if old is not None and old.status != "resolved":  # firing (or silenced) again: same
            conn.execute(update(ae).where(ae.c.id == a.id).values(updated_at=now))
            out.unchanged += 1
            continue
        c: Concern = concern(a.labels, a.starts_at)
        fields = {
            "source": a.source,
            "alert_name": a.alert_name,
            "severity": a.severity,
            "status": a.status,
            "starts_at": a.starts_at,
            "ends_at": a.ends_at,
            "labels": a.labels,
            "annotations": a.annotations,
            "workload_id": c.workload_uid,
            "workload_name": c.workload_name,
            "pod_name": c.pod,
            "pod_id": c.pod_uid,
            "node_name": c.node,
            "cluster_name": a.cluster,
            "raw_data": json.loads(json.dumps(a.raw, default=str)),
            "enriched_data": c.enriched(conn, a.cluster),
            "route_key": a.route_key,
            "updated_at": now,
        }
        for k, v in fields.items():  # what a label names, cut to its column (storable)
            most = getattr(ae.c[k].type, "length", None)
            if isinstance(v, str) and most and len(v) > most:
                fields[k] = v[:most]
        if a.status == "firing":
            view = {**fields, "id": a.id}
            hit = next((s for s in silences if matches(s, view, now)), None)
            if hit is not None:
                fields["status"] = "silenced"
                out.silenced += 1
                insert_new(
                    conn,
                    t.silenced_alerts,
                    {
                        "silence_id": hit["id"],
                        "alert_id": a.id,
                        "alert_name": a.alert_name,
                        "cluster_name": a.cluster,
                        "silenced_at": now,
                    },
                    ["silence_id", "alert_id"],
                )
        if old is None:
            conn.execute(
                ae.insert().values(
                    id=a.id, created_at=now, fired=1, notification_status="", **fields
                )
            )
            out.new += 1
        else:  # resolved before, firing again: open again
            conn.execute(
                update(ae)
                .where(ae.c.id == a.id)
                .values(fired=ae.c.fired + 1, notified_at=None, notification_status="", **fields)
            )
            out.reopened += 1
    return out
