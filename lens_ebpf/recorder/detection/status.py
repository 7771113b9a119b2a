"""The Detection Status page's questions, answered from what detection/__init__.py stores:
each workload's verdict, its coverage by evidence source, its detection task and evidence, the
summary, and the page's Trigger and Initialize (a workload's detection made due, its
coverage started), in the original's shapes (DetectionStatusResponse,
DetectionCoverageItem, DetectionTaskItem, DetectionEvidenceItem).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from lens_ebpf.recorder.alerts.model import when
from lens_ebpf.recorder.detection import DETECTION, EVIDENCE, TASK
from lens_ebpf.recorder.detection import frameworks as fw
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.lifecycle import parse_time
from lens_ebpf.recorder.store import schema as t

STATUSES = ("unknown", "suspected", "confirmed", "verified", "conflict")
STATES = ("pending", "in_progress", "completed", "failed")


def _times(item: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """Optional times (the original's *time.Time, omitempty): left out when none."""
    return {k: v for k, v in item.items() if k not in names or v is not None}


def status_json(r: Any, full: bool = False) -> dict[str, Any]:
    """DetectionStatusResponse; coverage and tasks only in full (the list has them empty)."""
    base = r.base_framework or ""
    out: dict[str, Any] = {
        "workload_uid": r.workload_uid,
        "status": r.status,
        "detection_state": r.detection_state,
        "framework": r.framework,
        "frameworks": list(r.frameworks or []),
        "workload_type": r.workload_type,
        "confidence": float(r.confidence),
        "framework_layer": r.framework_layer,
        "wrapper_framework": r.wrapper_framework,
        "orchestration_framework": base
        if fw.FRAMEWORKS.get(base, None) is not None
        and fw.FRAMEWORKS[base].layer == "orchestration"
        else "",
        "runtime_framework": "pytorch" if "pytorch" in (r.frameworks or []) else "",
        "base_framework": base,
        "evidence_count": int(r.evidence_count),
        "evidence_sources": list(r.evidence_sources or []),
        "attempt_count": int(r.attempt_count),
        "max_attempts": int(r.max_attempts),
        "last_attempt_at": when(r.last_attempt_at),
        "next_attempt_at": when(r.next_attempt_at),
        "confirmed_at": when(r.confirmed_at),
        "created_at": when(r.created_at),
        "updated_at": when(r.updated_at),
        "coverage": [coverage_json(c) for c in r.coverage or []] if full else [],
        "tasks": tasks_json(r) if full else [],
        "has_conflicts": bool(r.conflicts),
        "conflicts": list(r.conflicts or []),
        "cluster_name": r.cluster,
    }
    return _times(out, ("last_attempt_at", "next_attempt_at", "confirmed_at"))


def coverage_json(c: dict[str, Any]) -> dict[str, Any]:
    item = {
        "source": c.get("source", ""),
        "status": c.get("status", "pending"),
        "attempt_count": int(c.get("attempt_count") or 0),
        "last_attempt_at": c.get("last_attempt_at"),
        "last_success_at": c.get("last_success_at"),
        "last_error": c.get("last_error", ""),
        "evidence_count": int(c.get("evidence_count") or 0),
    }
    if item["source"] == "log":
        item |= {
            k: c.get(k)
            for k in ("covered_from", "covered_to", "log_available_from", "log_available_to")
        }
        item["has_gap"] = bool(c.get("has_gap"))
    return _times(
        item,
        (
            "last_attempt_at",
            "last_success_at",
            "covered_from",
            "covered_to",
            "log_available_from",
            "log_available_to",
        ),
    )


def tasks_json(r: Any) -> list[dict[str, Any]]:
    task = r.task if isinstance(r.task, dict) else {}
    if not task:
        return []
    item = {
        "task_type": task.get("task_type", TASK),
        "status": task.get("status", ""),
        "lock_owner": "",
        "created_at": task.get("created_at") or when(r.created_at),
        "updated_at": task.get("updated_at") or when(r.updated_at),
        "attempt_count": int(task.get("attempt_count") or r.attempt_count),
        "next_attempt_at": when(r.next_attempt_at),
        "coordinator_state": task.get("coordinator_state", r.detection_state),
        "ext": {k: v for k, v in task.items() if k.startswith("triggered")},
    }
    return [_times(item, ("next_attempt_at",))]


def _row(conn: Connection, cluster: str, uid: str) -> Any:
    r = conn.execute(
        select(DETECTION).where(DETECTION.c.cluster == cluster, DETECTION.c.workload_uid == uid)
    ).first()
    if r is None:
        raise NotFound(f"detection not found: workload {uid!r} has none in cluster {cluster!r}")
    return r


def one(conn: Connection, cluster: str, uid: str) -> dict[str, Any]:
    return status_json(_row(conn, cluster, uid), full=True)


def listing(
    conn: Connection, cluster: str, status: str, state: str, num: int, size: int
) -> dict[str, Any]:
    """{data, total, page, page_size}: newest first."""
    if status and status not in STATUSES:
        raise BadRequest(f"status={status!r}: one of {', '.join(STATUSES)}")
    if state and state not in STATES:
        raise BadRequest(f"state={state!r}: one of {', '.join(STATES)}")
    d = DETECTION
    where = [d.c.cluster == cluster]
    if status:
        where.append(d.c.status == status)
    if state:
        where.append(d.c.detection_state == state)
    total = conn.execute(select(func.count()).select_from(d).where(*where)).scalar_one()
    q = (
        select(d)
        .where(*where)
        .order_by(d.c.updated_at.desc(), d.c.workload_uid)
        .offset((num - 1) * size)
        .limit(size)
    )
    return {
        "data": [status_json(r) for r in conn.execute(q)],
        "total": int(total),
        "page": num,
        "page_size": size,
    }


def summary(conn: Connection, cluster: str) -> dict[str, Any]:
    d = DETECTION
    where = d.c.cluster == cluster
    total = conn.execute(select(func.count()).select_from(d).where(where)).scalar_one()
    by_status = dict.fromkeys(STATUSES, 0) | {
        str(s): int(str(n))
        for s, n in conn.execute(select(d.c.status, func.count()).where(where).group_by(d.c.status))
    }
    by_state = dict.fromkeys(STATES, 0) | {
        str(s): int(str(n))
        for s, n in conn.execute(
            select(d.c.detection_state, func.count()).where(where).group_by(d.c.detection_state)
        )
    }
    recent = conn.execute(select(d).where(where).order_by(d.c.updated_at.desc()).limit(10))
    return {
        "total_workloads": int(total),
        "status_counts": by_status,
        "detection_state_counts": by_state,
        "recent_detections": [status_json(r) for r in recent],
    }


def coverage_of(conn: Connection, cluster: str, uid: str) -> dict[str, Any]:
    items = [coverage_json(c) for c in _row(conn, cluster, uid).coverage or []]
    return {"workload_uid": uid, "coverage": items, "total": len(items)}


def log_gap(conn: Connection, cluster: str, uid: str) -> dict[str, Any]:
    """The log window received but not read: none here (lines are read as they come)."""
    log_item = next(
        (
            c
            for c in _row(conn, cluster, uid).coverage or []
            if isinstance(c, dict) and c.get("source") == "log"
        ),
        {},
    )
    have, read = (
        parse_time(log_item.get("log_available_to")),
        parse_time(log_item.get("covered_to")),
    )
    out: dict[str, Any] = {"workload_uid": uid, "has_gap": False}
    if have is not None and (read is None or have > read):
        start = read or parse_time(log_item.get("log_available_from")) or have
        out |= {
            "has_gap": True,
            "gap_from": when(start),
            "gap_to": when(have),
            "gap_duration_seconds": (have - start).total_seconds(),
        }
    return out


def tasks_of(conn: Connection, cluster: str, uid: str) -> dict[str, Any]:
    items = tasks_json(_row(conn, cluster, uid))
    return {"workload_uid": uid, "tasks": items, "total": len(items)}


def evidence_of(conn: Connection, cluster: str, uid: str, source: str) -> dict[str, Any]:
    e = EVIDENCE
    if source and source not in fw.SOURCES:
        raise BadRequest(f"source={source!r}: one of {', '.join(fw.SOURCES)}")
    where = [e.c.cluster == cluster, e.c.workload_uid == uid]
    if source:
        where.append(e.c.source == source)
    items = []
    for r in conn.execute(select(e).where(*where).order_by(e.c.detected_at.desc(), e.c.id)):
        info = fw.FRAMEWORKS.get(r.framework)
        items.append(
            {
                "id": int(r.id),
                "workload_uid": r.workload_uid,
                "source": r.source,
                "source_type": r.source_type,
                "framework": r.framework,
                "workload_type": r.workload_type,
                "confidence": float(r.confidence),
                "framework_layer": r.framework_layer,
                "wrapper_framework": r.wrapper_framework,
                "orchestration_framework": r.base_framework
                if info is not None and info.layer == "orchestration"
                else "",
                "runtime_framework": r.framework if r.framework_layer == "runtime" else "",
                "base_framework": r.base_framework,
                "evidence": r.evidence or {},
                "detected_at": when(r.detected_at),
                "created_at": when(r.created_at),
            }
        )
    return {"workload_uid": uid, "evidence": items, "total": len(items)}


def _known(conn: Connection, cluster: str, uid: str) -> Any:
    wl = t.gpu_workloads
    return conn.execute(select(wl.c.uid).where(wl.c.cluster == cluster, wl.c.uid == uid)).first()


def _pending(cluster: str, uid: str, now: datetime, who: str) -> dict[str, Any]:
    task = {
        "task_type": TASK,
        "status": "pending",
        "created_at": when(now),
        "updated_at": when(now),
        "attempt_count": 0,
        "coordinator_state": "pending",
        "triggered_by": who,
        "triggered_at": when(now),
    }
    return {
        "cluster": cluster,
        "workload_uid": uid,
        "status": "unknown",
        "detection_state": "pending",
        "framework": "",
        "frameworks": [],
        "workload_type": "",
        "confidence": 0.0,
        "framework_layer": "",
        "wrapper_framework": "",
        "base_framework": "",
        "evidence_count": 0,
        "evidence_sources": [],
        "attempt_count": 0,
        "max_attempts": 0,
        "last_attempt_at": None,
        "next_attempt_at": now,
        "confirmed_at": None,
        "conflicts": [],
        "task": task,
        "created_at": now,
        "updated_at": now,
        "coverage": [
            {
                "source": s,
                "status": "pending",
                "attempt_count": 0,
                "evidence_count": 0,
                "last_error": "",
            }
            for s in fw.SOURCES
        ],
    }


def trigger(conn: Connection, cluster: str, uid: str, now: datetime, who: str) -> dict[str, Any]:
    """The page's Trigger: the workload's detection runs at the leader's next look (its
    attempts counted anew)."""
    d = DETECTION
    r = conn.execute(select(d).where(d.c.cluster == cluster, d.c.workload_uid == uid)).first()
    if r is None:
        if _known(conn, cluster, uid) is None:
            raise NotFound(f"no workload {uid!r} in cluster {cluster!r}")
        conn.execute(d.insert(), _pending(cluster, uid, now, who))
    else:
        task = dict(r.task or {}) | {
            "status": "pending",
            "updated_at": when(now),
            "coordinator_state": "pending",
            "triggered_by": who,
            "triggered_at": when(now),
        }
        conn.execute(
            d.update()
            .where(d.c.cluster == cluster, d.c.workload_uid == uid)
            .values(
                detection_state="pending",
                next_attempt_at=now,
                attempt_count=0,
                task=task,
                updated_at=now,
            )
        )
    return {
        "message": f"detection triggered for workload {uid}",
        "workload_uid": uid,
        "task_type": TASK,
        "status": "pending",
    }


def initialize(conn: Connection, cluster: str, uid: str, now: datetime, who: str) -> dict[str, Any]:
    """Coverage for a workload not looked at yet (pending for each source); what it has
    when it has some."""
    d = DETECTION
    r = conn.execute(select(d).where(d.c.cluster == cluster, d.c.workload_uid == uid)).first()
    if r is not None and r.coverage:
        return {
            "message": "coverage already initialized",
            "count": len(r.coverage),
            "coverage": [coverage_json(c) for c in r.coverage],
        }
    if _known(conn, cluster, uid) is None:
        raise NotFound(f"no workload {uid!r} in cluster {cluster!r}")
    row = _pending(cluster, uid, now, who)
    if r is None:
        conn.execute(d.insert(), row)
    else:
        conn.execute(
            d.update()
            .where(d.c.cluster == cluster, d.c.workload_uid == uid)
            .values(coverage=row["coverage"], updated_at=now)
        )
    items = [coverage_json(c) for c in row["coverage"]]
    return {"message": "coverage initialized", "coverage": items, "count": len(items)}
