"""The log rules and their templates as the pages list and change them (the engine that
evaluates the rules is logrules.py): a rule's fields checked there, a change partial (the
pages' switch sends `{enabled}` alone), a clone named `<name>_copy` where no name is
given, a shipped template read-only (403 on delete)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, delete, func, or_, select, update

from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.alerts.logrules import check_rule
from lens_ebpf.recorder.alerts.model import clone_target, need_name, new_id, paged, row_dict
from lens_ebpf.recorder.errors import BadRequest, Conflict, Forbidden, NotFound
from lens_ebpf.recorder.store import schema as t


def page(conn: Connection, filters: dict[str, Any], offset: int, limit: int) -> dict[str, Any]:
    """Rules by cluster ("" also: those of every cluster), enabled, match_type, severity
    and a search of name and description; highest priority first."""
    r = t.log_alert_rules
    cond: list[Any] = []
    if filters.get("cluster"):
        cond.append(or_(r.c.cluster_name == filters["cluster"], r.c.cluster_name == ""))
    if filters.get("enabled") is not None:
        cond.append(r.c.enabled.is_(filters["enabled"]))
    for key in ("match_type", "severity"):
        if filters.get(key):
            cond.append(r.c[key] == filters[key])
    if filters.get("search"):
        like = f"%{str(filters['search']).lower()}%"
        cond.append(or_(func.lower(r.c.name).like(like), func.lower(r.c.description).like(like)))
    got = paged(conn, r, cond, (r.c.priority.desc(), r.c.created_at.desc(), r.c.id), offset, limit)
    return {**got, "rules": got["data"], "cluster_name": filters.get("cluster") or ""}


def get(conn: Connection, rid: int) -> Any:
    r = t.log_alert_rules
    row = conn.execute(select(r).where(r.c.id == rid)).first()
    if row is None:
        raise NotFound(f"no log alert rule {rid}")
    return row


def one(conn: Connection, rid: int) -> dict[str, Any]:
    return row_dict(t.log_alert_rules, get(conn, rid))


def _free(conn: Connection, name: str, cluster: str, other: int = 0) -> None:
    r = t.log_alert_rules
    if conn.execute(
        select(r.c.id).where(r.c.name == name, r.c.cluster_name == cluster, r.c.id != other)
    ).first():
        raise Conflict(f"a log rule {name!r} exists in cluster {cluster or '(every cluster)'!r}")


def change(conn: Connection, rid: int, body: dict[str, Any], now: datetime) -> dict[str, Any]:
    """Only the fields body holds (the pages' switch sends {enabled} alone)."""
    old = get(conn, rid)
    fields = check_rule(body, partial=True)
    name = fields.get("name", old.name)
    cluster = fields.get("cluster_name", old.cluster_name)
    if (name, cluster) != (old.name, old.cluster_name):
        _free(conn, name, cluster, rid)
    conn.execute(
        update(t.log_alert_rules)
        .where(t.log_alert_rules.c.id == rid)
        .values(**fields, updated_at=now)
    )
    return {"rule_id": rid, "message": "rule updated successfully"}


def remove(conn: Connection, rid: int) -> dict[str, Any]:
    get(conn, rid)
    conn.execute(delete(t.log_alert_rules).where(t.log_alert_rules.c.id == rid))
    return {"message": "rule deleted successfully"}


def clone(
    conn: Connection, rid: int, body: dict[str, Any], now: datetime, who: str
) -> dict[str, Any]:
    """A copy: named new_name or name (else `<name>_copy`, `_copy_2`, ...), in
    target_cluster_name (else the rule's cluster), enabled as said (else as the rule)."""
    r = t.log_alert_rules
    old = get(conn, rid)
    name, cluster = clone_target(conn, r, old, body, "_")
    _free(conn, name, cluster)
    fields = {
        k: v
        for k, v in row_dict(r, old).items()
        if k
        not in (
            "id",
            "created_at",
            "updated_at",
            "last_triggered_at",
            "trigger_count",
            "created_by",
            "name",
            "cluster_name",
            "enabled",
        )
    }
    enabled = bool(body["enabled"]) if "enabled" in body else bool(old.enabled)
    new = new_id(
        conn.execute(
            r.insert().values(
                **fields,
                name=name,
                cluster_name=cluster,
                enabled=enabled,
                created_by=who,
                trigger_count=0,
                created_at=now,
                updated_at=now,
            )
        )
    )
    return {"rule_id": new, "cluster_name": cluster}


def batch_enable(conn: Connection, body: dict[str, Any], now: datetime) -> dict[str, Any]:
    """{rule_ids, enabled} (the original's) or {rule_ids, updates: {enabled}} (the pages')."""
    ids = body.get("rule_ids")
    said = (body.get("updates") or {}).get("enabled", body.get("enabled"))
    if not isinstance(ids, list) or not ids or said is None:
        raise BadRequest("rule_ids (a list) and enabled are required")
    wanted = [inputs.whole(i, f"rule_ids[{n}]") for n, i in enumerate(ids)]
    r = t.log_alert_rules
    n = conn.execute(
        update(r).where(r.c.id.in_(wanted)).values(enabled=bool(said), updated_at=now)
    ).rowcount
    return {"updated": int(n), "updated_count": int(n)}


# -- templates ---------------------------------------------------------------------------
def template_json(row: Any) -> dict[str, Any]:
    """A template flattened as the page reads it (its rule fields at the top), the stored
    template_config kept too."""
    cfg = dict(row.template_config or {})
    out = row_dict(t.log_alert_rule_templates, row)
    out |= {
        "match_type": cfg.get("match_type", "pattern"),
        "match_config": cfg.get("match_config") or {},
        "severity": cfg.get("severity", "warning"),
        "alert_template": cfg.get("alert_template") or {},
        "label_selectors": cfg.get("label_selectors") or [],
        "group_by": cfg.get("group_by") or ["workload"],
        "built_in": bool(row.is_builtin),
    }
    return out


def templates(conn: Connection, category: str, built_in: bool | None) -> list[dict[str, Any]]:
    """Every template (the page takes an array), most used first."""
    tp = t.log_alert_rule_templates
    cond: list[Any] = []
    if category:
        cond.append(tp.c.category == category)
    if built_in is not None:
        cond.append(tp.c.is_builtin.is_(built_in))
    rows = conn.execute(select(tp).where(*cond).order_by(tp.c.usage_count.desc(), tp.c.name))
    return [template_json(x) for x in rows]


def template(conn: Connection, tid: int) -> Any:
    tp = t.log_alert_rule_templates
    row = conn.execute(select(tp).where(tp.c.id == tid)).first()
    if row is None:
        raise NotFound(f"no template {tid}")
    return row


def create_template(
    conn: Connection, body: dict[str, Any], now: datetime, who: str
) -> dict[str, Any]:
    """{name, category, description, template_config (a rule's fields), tags}."""
    name = need_name(body)
    category = str(body.get("category") or "")
    if not category:
        raise BadRequest("category is required")
    cfg = body.get("template_config")
    if not isinstance(cfg, dict):
        raise BadRequest("template_config (a log rule's fields) is required")
    check_rule({"name": name, **cfg})
    tp = t.log_alert_rule_templates
    if conn.execute(select(tp.c.id).where(tp.c.name == name)).first():
        raise Conflict(f"a template {name!r} exists")
    tags = body.get("tags") or []
    tid = new_id(
        conn.execute(
            tp.insert().values(
                name=name,
                category=category,
                description=str(body.get("description") or ""),
                template_config=cfg,
                tags=[str(x) for x in tags] if isinstance(tags, list) else [],
                is_builtin=False,
                usage_count=0,
                created_by=who,
                created_at=now,
                updated_at=now,
            )
        )
    )
    return {"template_id": tid}


def remove_template(conn: Connection, tid: int) -> dict[str, Any]:
    row = template(conn, tid)
    if row.is_builtin:
        raise Forbidden(f"template {row.name!r} is shipped with lens-ebpf: it cannot be deleted")
    conn.execute(delete(t.log_alert_rule_templates).where(t.log_alert_rule_templates.c.id == tid))
    return {"message": "template deleted successfully"}
