"""What a log rule was and what it did: its versions (the rule's fields after each change,
the newest active; a rollback applies an older one's fields as a change of its own) and
its statistics (the alerts it raised, by day and hour, from alert_events); and a metric
rule's sync status as the original's status route answers it."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, select, update

from lens_ebpf.recorder.alerts import logstore
from lens_ebpf.recorder.alerts.model import row_dict, when
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.store import schema as t

V = t.log_alert_rule_versions
# a version holds what a change may set (not its name, cluster, counters or times)
CONFIG = (
    "description",
    "enabled",
    "priority",
    "label_selectors",
    "match_type",
    "match_config",
    "severity",
    "alert_template",
    "group_by",
    "group_wait",
    "repeat_interval",
)
STATS_DAYS = 7


def config_of(row: Any) -> dict[str, Any]:
    full = row_dict(t.log_alert_rules, row)
    return {k: full[k] for k in CONFIG}


def record(conn: Connection, rid: int, now: datetime, who: str, change_log: str = "") -> int:
    """The rule's fields now as its newest version (the others superseded); its number."""
    rule = logstore.get(conn, rid)
    last = conn.execute(select(func.max(V.c.version)).where(V.c.rule_id == rid)).scalar()
    n = int(last or 0) + 1
    conn.execute(
        update(V).where(V.c.rule_id == rid, V.c.status == "active").values(status="superseded")
    )
    cfg = config_of(rule) | ({"change_log": change_log} if change_log else {})
    row = {
        "rule_id": rid,
        "version": n,
        "config": cfg,
        "status": "active",
        "deployed_at": now,
        "created_by": who,
        "created_at": now,
    }
    conn.execute(V.insert(), row)
    return n


def version_json(r: Any) -> dict[str, Any]:
    """dbmodel.LogAlertRuleVersions."""
    cfg = dict(r.config or {})
    return {
        "id": int(r.id),
        "rule_id": int(r.rule_id),
        "version": int(r.version),
        "config": {k: v for k, v in cfg.items() if k != "change_log"},
        "status": r.status,
        "deployed_at": when(r.deployed_at),
        "created_by": r.created_by,
        "created_at": when(r.created_at),
        "change_log": cfg.get("change_log", ""),
    }


def versions(conn: Connection, rid: int) -> dict[str, Any]:
    """{versions, total}, newest first; a rule never changed since versions were kept has
    one: what it is now (not stored until it changes)."""
    row = logstore.get(conn, rid)
    got = [
        version_json(r)
        for r in conn.execute(select(V).where(V.c.rule_id == rid).order_by(V.c.version.desc()))
    ]
    if not got:
        got = [
            {
                "id": 0,
                "rule_id": rid,
                "version": 1,
                "config": config_of(row),
                "status": "active",
                "deployed_at": when(row.updated_at),
                "created_by": row.created_by,
                "created_at": when(row.created_at),
                "change_log": "as it is (no change since versions are kept)",
            }
        ]
    return {"versions": got, "total": len(got)}


def rollback(conn: Connection, rid: int, version: int, now: datetime, who: str) -> dict[str, Any]:
    """The version's fields applied (checked as any change is), a new version of its own."""
    logstore.get(conn, rid)
    r = conn.execute(select(V).where(V.c.rule_id == rid, V.c.version == version)).first()
    if r is None:
        raise NotFound(f"version not found: rule {rid} has no version {version}")
    cfg = {k: v for k, v in dict(r.config or {}).items() if k in CONFIG}
    logstore.change(conn, rid, cfg, now)
    n = record(conn, rid, now, who, f"rollback to version {version}")
    return {
        "message": "rule rolled back successfully",
        "rule_id": rid,
        "version": n,
        "restored_version": version,
    }


def _day(raw: str, name: str) -> datetime | None:
    if not raw:
        return None
    try:
        return datetime.strptime(raw, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise BadRequest(f"{name}={raw!r}: a date, YYYY-MM-DD") from None


def statistics(
    conn: Connection, rid: int, date_from: str, date_to: str, now: datetime
) -> dict[str, Any]:
    """{summary, statistics}: the alerts the rule raised from date_from to date_to (the
    last 7 days), per day and hour and cluster (dbmodel.LogAlertRuleStatistics' fields)."""
    rule = logstore.get(conn, rid)
    start = _day(date_from, "date_from") or now - timedelta(days=STATS_DAYS)
    end = (_day(date_to, "date_to") or now) + (timedelta(days=1) if date_to else timedelta())
    a = t.alert_events
    q = select(a.c.starts_at, a.c.cluster_name, a.c.fired, a.c.labels).where(
        a.c.source == "log", a.c.starts_at >= start, a.c.starts_at < end
    )
    # (day, hour, cluster) -> alerts that started, and how often they fired
    alerts: Counter[tuple[str, int, str]] = Counter()
    fired: Counter[tuple[str, int, str]] = Counter()
    for r in conn.execute(q):
        if str((r.labels or {}).get("rule_id", "")) != str(rid):
            continue
        at = r.starts_at if r.starts_at.tzinfo else r.starts_at.replace(tzinfo=UTC)
        at = at.astimezone(UTC)
        key = (at.strftime("%Y-%m-%d"), at.hour, r.cluster_name)
        alerts[key] += 1
        fired[key] += int(r.fired or 1)
    rows = [
        {
            "id": 0,
            "rule_id": rid,
            "date": f"{day}T00:00:00Z",
            "hour": hour,
            "cluster_name": cluster,
            "evaluated_count": 0,
            "matched_count": fired[k],
            "fired_count": alerts[k],
            "avg_eval_time_ms": 0.0,
            "max_eval_time_ms": 0.0,
            "error_count": 0,
            "created_at": f"{day}T{hour:02d}:00:00Z",
            "updated_at": f"{day}T{hour:02d}:00:00Z",
        }
        for k in sorted(alerts, reverse=True)
        for day, hour, cluster in [k]
    ][:100]
    summary = {
        "rule_id": rid,
        "rule_name": rule.name,
        "date_from": when(start),
        "date_to": when(end),
        "total_fired": sum(alerts.values()),
        "total_matched": sum(fired.values()),
        "trigger_count": int(rule.trigger_count),
        "last_triggered_at": when(rule.last_triggered_at),
    }
    return {"summary": summary, "statistics": rows}


def metric_status(conn: Connection, rid: int, object_name: str) -> dict[str, Any]:
    """MetricRuleStatusResponse: whether the rule is in the cluster as written (its
    PrometheusRule, or the rules file), when it was last synced and why it failed."""
    r = t.metric_alert_rules
    row = conn.execute(select(r).where(r.c.id == rid)).first()
    if row is None:
        raise NotFound(f"no metric alert rule {rid}")
    out: dict[str, Any] = {
        "status": row.sync_status,
        "rule_id": rid,
        "object_name": object_name,
        "message": row.sync_message,
    }
    if row.last_sync_at is not None:
        out["last_sync_time"] = when(row.last_sync_at)
    if row.sync_status == "failed":
        out["error"] = row.sync_message
    return out


def multi_cluster(
    conn: Connection, clusters: list[str], filters: dict[str, Any], offset: int, limit: int
) -> dict[str, Any]:
    """{clusters: [{cluster_name, rules, total}]}: each cluster's rules (its own and those
    of every cluster)."""
    out = []
    for name in clusters:
        got = logstore.page(conn, {**filters, "cluster": name}, offset, limit)
        out.append({"cluster_name": name, "rules": got["data"], "total": got["total"]})
    return {"clusters": out}
