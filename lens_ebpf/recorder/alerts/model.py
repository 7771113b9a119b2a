"""The alert tables' rows as the Alert pages read them (snake_case, times RFC 3339 or
null, lists as lists), the values a field may take, and the parameters the pages send."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, Table, func, select

from lens_ebpf.core.times import aware
from lens_ebpf.recorder.errors import BadRequest

SEVERITIES = ("critical", "high", "warning", "info")
# what other alerting stacks call their levels, as the pages know them
SEVERITY_ALIASES = {
    "error": "high",
    "page": "critical",
    "major": "high",
    "minor": "warning",
    "warn": "warning",
    "notice": "info",
    "none": "info",
    "informational": "info",
}
STATUSES = ("firing", "resolved", "silenced")
SOURCES = ("metric", "log", "lens", "webhook")
OWN_LABEL = "lens_alert_id"  # on the alerts we send Alertmanager: the id they have here


def severity(value: Any) -> str:
    """A label's severity as one of SEVERITIES (an unknown one, or none: warning)."""
    v = str(value or "").strip().lower()
    v = SEVERITY_ALIASES.get(v, v)
    return v if v in SEVERITIES else "warning"


def when(value: Any) -> str | None:
    """A stored time as RFC 3339 (UTC, Z), None for none."""
    at = aware(value)
    if at is None:
        return None
    text = at.strftime("%Y-%m-%dT%H:%M:%S")
    if at.microsecond:
        text += f".{at.microsecond:06d}".rstrip("0")
    return text + "Z"


def parse_time(raw: Any, name: str) -> datetime | None:
    """An RFC 3339 time a body or query gives ("...Z" or an offset); None when empty;
    BadRequest naming the field otherwise."""
    if raw in (None, ""):
        return None
    if isinstance(raw, datetime):
        return aware(raw)
    text = str(raw).strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(f"{name}={raw!r}: an RFC 3339 time is required") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def row_dict(table: Table, row: Row[Any]) -> dict[str, Any]:
    """Every column of a row, times as when() writes them, JSON as stored."""
    out = {}
    for col in table.c:
        v = getattr(row, col.name)
        out[col.name] = when(v) if isinstance(v, datetime) else v
    return out


def paged(
    conn: Connection,
    table: Table,
    cond: Sequence[Any],
    order: Sequence[Any],
    offset: int,
    limit: int,
    row: Callable[[Row[Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One page of a table's rows where every cond holds, in order, and how many hold:
    {data, total, offset, limit}, each row as row gives it (row_dict by default)."""
    total = int(conn.execute(select(func.count()).select_from(table).where(*cond)).scalar_one())
    rows = conn.execute(select(table).where(*cond).order_by(*order).offset(offset).limit(limit))
    make = row or (lambda r: row_dict(table, r))
    return {"data": [make(r) for r in rows], "total": total, "offset": offset, "limit": limit}


def alert_json(row: Row[Any], table: Table) -> dict[str, Any]:
    """An alert as the pages read it: its columns (ends_at null while it fires) and the
    enrichment both flat and as workload_info, pod_info, node_info, gpu_info."""
    out = row_dict(table, row)
    out["labels"] = dict(out.get("labels") or {})
    out["annotations"] = dict(out.get("annotations") or {})
    out["raw_data"] = out.get("raw_data") or {}
    out["enriched_data"] = dict(out.get("enriched_data") or {})
    return out


NAME_OK = re.compile(r"^[^\x00-\x1f]{1,253}$")


def need_name(body: dict[str, Any], key: str = "name") -> str:
    name = str(body.get(key) or "").strip()
    if not NAME_OK.match(name):
        raise BadRequest(f"{key} is required (1 to 253 characters)")
    return name


def new_id(result: Any) -> int:
    """The id an insert of one row made."""
    key = result.inserted_primary_key
    if key is None or key[0] is None:
        raise RuntimeError("the insert made no id")
    return int(key[0])


def clone_target(
    conn: Connection, table: Table, old: Any, body: dict[str, Any], sep: str
) -> tuple[str, str]:
    """(name, cluster) of a rule's copy: body's target_cluster_name (or target_cluster;
    else the rule's cluster) and new_name (or name; else `<name><sep>copy`, then
    `<sep>copy<sep>2`, ... the first free in that cluster)."""
    cluster = str(body.get("target_cluster_name") or body.get("target_cluster") or old.cluster_name)
    name = str(body.get("new_name") or body.get("name") or "")
    if not name:
        name, n = f"{old.name}{sep}copy", 2
        while conn.execute(
            select(table.c.id).where(table.c.name == name, table.c.cluster_name == cluster)
        ).first():
            name, n = f"{old.name}{sep}copy{sep}{n}", n + 1
    return name, cluster
