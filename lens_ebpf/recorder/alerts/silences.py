"""Silences: created through the API, stored, and created in Alertmanager too (its API v2)
so that notifications stop where they are sent; an alert that comes in while one matches
it is stored as silenced (and counted in silenced_alerts). Expiry is the silence's end
(null: permanent); disabling ends it here and expires it there.

Matching (the pages' kinds): alert_name (the alert's name is one of alert_names), label
(every matcher holds: =, !=, =~, !~, regular expressions matched whole), resource (any
filter holds: cluster, node, namespace, workload (uid or name), pod). A silence of a
cluster matches only that cluster's alerts; one of "" every cluster's.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, func, or_, select, update

from lens_ebpf.recorder.alerts import patterns
from lens_ebpf.recorder.alerts.model import need_name, paged, parse_time, row_dict
from lens_ebpf.recorder.alerts.notify import Alertmanager, SendError
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.store import schema as t

TYPES = ("alert_name", "label", "resource")
OPERATORS = ("=", "!=", "=~", "!~")
RESOURCES = ("cluster", "node", "namespace", "workload", "pod")
FOREVER = timedelta(days=3650)  # Alertmanager's silences end: a permanent one's end there


def _matches_value(op: str, have: str | None, want: str) -> bool:
    if op in ("=~", "!~"):  # RE2, anchored, as Alertmanager matches (patterns.py)
        hit = have is not None and patterns.full(want, have)
        return hit if op == "=~" else not hit
    if op == "!=":
        return have != want
    return have == want


def matches(s: dict[str, Any], alert: dict[str, Any], now: datetime) -> bool:
    """Whether silence s (a row as row_dict gives it) silences alert (alert_events' fields)
    now."""
    if not s["enabled"] or parse_time(s["starts_at"], "starts_at") > now:  # type: ignore[operator]
        return False
    ends = parse_time(s["ends_at"], "ends_at")
    if ends is not None and ends <= now:
        return False
    if s["cluster_name"] and s["cluster_name"] != alert.get("cluster_name", ""):
        return False
    kind = s["silence_type"]
    if kind == "alert_name":
        return alert.get("alert_name") in (s.get("alert_names") or [])
    if kind == "label":
        matchers = s.get("label_matchers") or []
        labels = alert.get("labels") or {}
        return bool(matchers) and all(
            _matches_value(
                m.get("operator", "="), labels.get(m.get("name", "")), str(m.get("value", ""))
            )
            for m in matchers
        )
    if kind == "resource":
        labels = alert.get("labels") or {}
        have = {
            "cluster": alert.get("cluster_name", ""),
            "node": alert.get("node_name", ""),
            "namespace": labels.get("namespace")
            or (alert.get("enriched_data") or {}).get("workload_namespace", ""),
            "pod": alert.get("pod_name", ""),
        }
        for f in s.get("resource_filters") or []:
            kind_of = f.get("resource_type", "")
            want = str(f.get("value") or f.get("resource_name") or "")
            op = f.get("operator", "=")
            if kind_of == "workload":
                if any(
                    _matches_value(op, v, want)
                    for v in (alert.get("workload_id", ""), alert.get("workload_name", ""))
                ):
                    return True
            elif kind_of in have and _matches_value(op, have[kind_of], want):
                return True
        return False
    return False


def alertmanager_matchers(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The silence as Alertmanager's matchers (what its alerts carry: alertname, their
    labels; a resource as the label our alerts and the agents' series give it)."""
    out: list[dict[str, Any]] = []

    def add(name: str, op: str, value: str) -> None:
        out.append(
            {
                "name": name,
                "value": value,
                "isRegex": op in ("=~", "!~"),
                "isEqual": op in ("=", "=~"),
            }
        )

    kind = s["silence_type"]
    if kind == "alert_name":
        names = sorted(s.get("alert_names") or [])
        if len(names) == 1:
            add("alertname", "=", names[0])
        elif names:
            add("alertname", "=~", "|".join(re.escape(n) for n in names))
    elif kind == "label":
        for m in s.get("label_matchers") or []:
            add(str(m.get("name", "")), m.get("operator", "="), str(m.get("value", "")))
    elif kind == "resource":
        filters = s.get("resource_filters") or []
        if len(filters) == 1:  # Alertmanager's matchers are all-of: one filter is exact
            f = filters[0]
            label = {"workload": "workload"}.get(
                f.get("resource_type", ""), f.get("resource_type", "")
            )
            add(label, f.get("operator", "="), str(f.get("value") or f.get("resource_name", "")))
    if out and s.get("cluster_name"):
        add("cluster", "=", s["cluster_name"])
    return out


def _check(body: dict[str, Any], partial: bool = False) -> dict[str, Any]:
    """The fields a silence's body sets, checked (partial: only those present)."""
    out: dict[str, Any] = {}
    if not partial or "name" in body:
        out["name"] = need_name(body)
    if not partial or "silence_type" in body:
        kind = str(body.get("silence_type") or "")
        if kind not in TYPES:
            raise BadRequest(f"silence_type={kind!r}: one of {', '.join(TYPES)}")
        out["silence_type"] = kind
    for key in ("resource_filters", "label_matchers", "alert_names"):
        if not partial or key in body:
            v = body.get(key) or []
            if not isinstance(v, list):
                raise BadRequest(f"{key}: a list is required")
            out[key] = v
    for i, m in enumerate(out.get("label_matchers", [])):
        if not isinstance(m, dict) or m.get("operator", "=") not in OPERATORS or not m.get("name"):
            raise BadRequest(
                f"label_matchers: {m!r}: name, operator ({', '.join(OPERATORS)}), " "value"
            )
        if m.get("operator") in ("=~", "!~"):
            patterns.check(str(m.get("value", "")), f"label_matchers[{i}].value")
    for i, f in enumerate(out.get("resource_filters", [])):
        if (
            not isinstance(f, dict)
            or f.get("resource_type") not in RESOURCES
            or f.get("operator", "=") not in OPERATORS
        ):
            raise BadRequest(
                f"resource_filters: {f!r}: resource_type one of "
                f"{', '.join(RESOURCES)}, operator one of "
                f"{', '.join(OPERATORS)}"
            )
        if f.get("operator") in ("=~", "!~"):
            patterns.check(
                str(f.get("value") or f.get("resource_name") or ""), f"resource_filters[{i}].value"
            )
    for key in ("description", "reason", "ticket_url", "match_expression", "cluster_name"):
        if not partial or key in body:
            out[key] = str(body.get(key) or "")
    if not partial or "enabled" in body:
        out["enabled"] = bool(body.get("enabled", True))
    if "starts_at" in body or not partial:
        out["starts_at"] = parse_time(body.get("starts_at"), "starts_at")
    if "ends_at" in body or not partial:  # absent in a full form: permanent
        out["ends_at"] = parse_time(body.get("ends_at"), "ends_at")
    of = out.get("silence_type")
    if of == "alert_name" and not out.get("alert_names"):
        raise BadRequest("silence_type alert_name needs alert_names")
    if of == "label" and not out.get("label_matchers"):
        raise BadRequest("silence_type label needs label_matchers")
    if of == "resource" and not out.get("resource_filters"):
        raise BadRequest("silence_type resource needs resource_filters")
    return out


def silenced(
    conn: Connection,
    silence_id: str,
    alert_name: str,
    cluster: str,
    offset: int,
    limit: int,
) -> dict[str, Any]:
    """The alerts silences held, newest first (those of silence_id, of alert_name, of
    cluster where each is given): {data, total, offset, limit}."""
    sa = t.silenced_alerts
    cond = [
        sa.c[k] == v
        for k, v in (
            ("silence_id", silence_id),
            ("alert_name", alert_name),
            ("cluster_name", cluster),
        )
        if v
    ]
    return paged(conn, sa, cond, (sa.c.silenced_at.desc(), sa.c.id), offset, limit)


class Silences:
    def __init__(self, alertmanager: Alertmanager | None) -> None:
        self.am = alertmanager  # None: silences are kept here only

    def json(self, conn: Connection, row: Any) -> dict[str, Any]:
        s = t.alert_silences
        out = row_dict(s, row)
        sa = t.silenced_alerts
        out["silenced_count"] = int(
            conn.execute(
                select(func.count()).select_from(sa).where(sa.c.silence_id == row.id)
            ).scalar_one()
        )
        return out

    def get(self, conn: Connection, sid: str) -> dict[str, Any]:
        s = t.alert_silences
        row = conn.execute(select(s).where(s.c.id == sid)).first()
        if row is None:
            raise NotFound(f"no silence {sid!r}")
        return self.json(conn, row)

    def page(
        self,
        conn: Connection,
        cluster: str,
        enabled: bool | None,
        kind: str,
        search: str,
        offset: int,
        limit: int,
    ) -> dict[str, Any]:
        s = t.alert_silences
        cond: list[Any] = []
        if cluster:
            cond.append(or_(s.c.cluster_name == cluster, s.c.cluster_name == ""))
        if enabled is not None:
            cond.append(s.c.enabled.is_(enabled))
        if kind:
            cond.append(s.c.silence_type == kind)
        if search:
            like = f"%{search.lower()}%"
            cond.append(or_(func.lower(s.c.name).like(like), func.lower(s.c.reason).like(like)))
        order = (s.c.created_at.desc(), s.c.id)
        return paged(conn, s, cond, order, offset, limit, lambda r: self.json(conn, r))

    def active(self, conn: Connection, now: datetime) -> list[dict[str, Any]]:
        s = t.alert_silences
        rows = conn.execute(
            select(s).where(
                s.c.enabled.is_(True),
                s.c.starts_at <= now,
                or_(s.c.ends_at.is_(None), s.c.ends_at > now),
            )
        )
        return [row_dict(s, r) for r in rows]

    def create(
        self, conn: Connection, body: dict[str, Any], now: datetime, who: str
    ) -> dict[str, Any]:
        fields = _check(body)
        fields["starts_at"] = fields["starts_at"] or now
        if fields["ends_at"] is not None and fields["ends_at"] <= fields["starts_at"]:
            raise BadRequest("ends_at must be after starts_at")
        sid = str(uuid.uuid4())
        row = {
            "id": sid,
            **fields,
            "created_by": who,
            "created_at": now,
            "updated_at": now,
            "alertmanager_id": "",
            "alertmanager_error": "",
        }
        row |= self._sync(row, now)
        conn.execute(t.alert_silences.insert().values(**row))
        return {
            "silence_id": sid,
            "message": "alert silence created successfully",
            "alertmanager_id": row["alertmanager_id"] or None,
            "alertmanager_error": row["alertmanager_error"] or None,
        }

    def update(
        self, conn: Connection, sid: str, body: dict[str, Any], now: datetime
    ) -> dict[str, Any]:
        s = t.alert_silences
        old = conn.execute(select(s).where(s.c.id == sid)).first()
        if old is None:
            raise NotFound(f"no silence {sid!r}")
        full = "name" in body and "silence_type" in body  # the form, whole: ends_at absent =
        fields = _check(body, partial=not full)  # permanent; else only what is there
        row = {**row_dict(s, old), **fields, "updated_at": now}
        row["starts_at"] = parse_time(row["starts_at"], "starts_at") or now
        row["ends_at"] = parse_time(row["ends_at"], "ends_at")
        row["created_at"] = parse_time(row["created_at"], "created_at")
        row |= self._sync(row, now)
        conn.execute(
            update(s).where(s.c.id == sid).values(**{k: v for k, v in row.items() if k != "id"})
        )
        return {"silence_id": sid, "message": "alert silence updated successfully"}

    def disable(self, conn: Connection, sid: str, now: datetime) -> dict[str, Any]:
        s = t.alert_silences
        old = conn.execute(select(s).where(s.c.id == sid)).first()
        if old is None:
            raise NotFound(f"no silence {sid!r}")
        row = {**row_dict(s, old), "enabled": False, "updated_at": now}
        row |= self._sync(row, now)
        conn.execute(
            update(s)
            .where(s.c.id == sid)
            .values(
                enabled=False,
                updated_at=now,
                alertmanager_id=row["alertmanager_id"],
                alertmanager_error=row["alertmanager_error"],
            )
        )
        return {"silence_id": sid, "message": "alert silence disabled successfully"}

    def delete(self, conn: Connection, sid: str, now: datetime) -> dict[str, Any]:
        s = t.alert_silences
        old = conn.execute(select(s).where(s.c.id == sid)).first()
        if old is not None:
            self._sync({**row_dict(s, old), "enabled": False}, now)
            conn.execute(delete(t.silenced_alerts).where(t.silenced_alerts.c.silence_id == sid))
            conn.execute(delete(s).where(s.c.id == sid))
        return {"message": "alert silence deleted successfully"}

    def _sync(self, row: dict[str, Any], now: datetime) -> dict[str, str]:
        """Alertmanager's copy of the silence: made (or updated) while it is on, expired
        when it is off; its id and the error of the last try, if any."""
        if self.am is None or not self.am.url:
            return {"alertmanager_id": row.get("alertmanager_id", ""), "alertmanager_error": ""}
        old = row.get("alertmanager_id", "") or ""
        ends = row.get("ends_at")
        ends_at = parse_time(ends, "ends_at") if ends is not None else None
        on = row["enabled"] and (ends_at is None or ends_at > now)
        matchers = alertmanager_matchers(row)
        try:
            if on and matchers:
                starts = parse_time(row["starts_at"], "starts_at") or now
                sid = self.am.create_silence(
                    matchers,
                    starts,
                    ends_at or now + FOREVER,
                    row.get("created_by", ""),
                    f"{row['name']}: {row.get('reason') or ''}".strip(),
                    old,
                )
                return {"alertmanager_id": sid, "alertmanager_error": ""}
            if old:
                self.am.expire_silence(old)
            why = "" if on or not matchers else ""
            if on and not matchers:
                why = "not expressible as Alertmanager matchers (several resource filters)"
            return {"alertmanager_id": "", "alertmanager_error": why}
        except SendError as exc:
            return {"alertmanager_id": old, "alertmanager_error": str(exc)}
