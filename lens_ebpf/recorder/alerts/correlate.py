"""Correlations, on read: the alerts on the same workload, pod or node as an alert, begun
within WINDOW of it, each scored and given its reasons (the telemetry processor's
scores: time, entity, another source, and known causes: a GPU fault or Xid before a
training stall or slowdown on the workload it hit, out of memory before a crash ...).
Kept at a score of MIN_SCORE or more, best first; one group per related alert, as the
event detail page draws them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, or_, select

from lens_ebpf.core.times import utc
from lens_ebpf.recorder.alerts.model import alert_json
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.store import schema as t

WINDOW = timedelta(minutes=30)
MIN_SCORE = 0.3
# (cause, effect) alert names -> score: either order counts
CAUSAL = {
    ("GPUFault", "TrainingStalled"): 0.8,
    ("GPUFault", "TrainingSlowdown"): 0.7,
    ("GPUXid", "TrainingStalled"): 0.8,
    ("GPUECCError", "TrainingStalled"): 0.8,
    ("GPUFault", "NCCLWatchdogTimeout"): 0.7,
    ("GPUXid", "NCCLWatchdogTimeout"): 0.7,
    ("NCCLWatchdogTimeout", "TrainingStalled"): 0.8,
    ("NCCLError", "TrainingStalled"): 0.7,
    ("GPUOutOfMemory", "TrainingStalled"): 0.6,
    ("RDMAError", "NCCLWatchdogTimeout"): 0.7,
    ("RDMAError", "TrainingSlowdown"): 0.6,
    ("TrainingOutlierRank", "TrainingSlowdown"): 0.6,
    ("GPUMemoryHigh", "GPUOutOfMemory"): 0.8,
    ("NodeDown", "PodRestart"): 0.9,
    ("HighTemperature", "GPUThrottling"): 0.8,
    ("DiskFull", "CheckpointFailed"): 0.8,
}


def _score(a: Any, b: Any) -> tuple[float, str, list[str]]:
    score, kind, why = 0.0, "", []
    gap = abs((utc(a.starts_at) - utc(b.starts_at)).total_seconds())
    if gap < 60:
        score, kind = score + 0.4, "time"
        why.append("began within a minute")
    elif gap < 300:
        score, kind = score + 0.2, "time"
        why.append("began within 5 minutes")
    if a.workload_id and a.workload_id == b.workload_id:
        score, kind = score + 0.5, "entity"
        why.append(f"the same workload ({b.workload_name or b.workload_id})")
    elif a.pod_name and a.pod_name == b.pod_name:
        score, kind = score + 0.4, "entity"
        why.append(f"the same pod ({b.pod_name})")
    elif a.node_name and a.node_name == b.node_name:
        score, kind = score + 0.3, "entity"
        why.append(f"the same node ({b.node_name})")
    if a.source != b.source:
        score += 0.3
        kind = "cross_source"
        why.append(f"another source ({a.source}, {b.source})")
    cause = CAUSAL.get((a.alert_name, b.alert_name)) or CAUSAL.get((b.alert_name, a.alert_name))
    if cause:
        first, then = (a, b) if utc(a.starts_at) <= utc(b.starts_at) else (b, a)
        score, kind = score + cause, "causal"
        why.append(
            f"{first.alert_name} on {first.node_name or first.pod_name or '?'} "
            f"can cause {then.alert_name}"
        )
    return round(min(score, 1.0), 4), kind or "time", why


def correlations(conn: Connection, alert_id: str) -> dict[str, Any]:
    ae = t.alert_events
    me = conn.execute(select(ae).where(ae.c.id == alert_id)).first()
    if me is None:
        raise NotFound(f"no alert {alert_id!r}")
    starts: datetime = utc(me.starts_at)
    same = [
        c == v
        for c, v in (
            (ae.c.workload_id, me.workload_id),
            (ae.c.pod_name, me.pod_name),
            (ae.c.node_name, me.node_name),
        )
        if v
    ]
    if not same:
        return {"correlations": []}
    cond = or_(*same)
    rows = conn.execute(
        select(ae)
        .where(
            cond,
            ae.c.id != me.id,
            ae.c.starts_at >= starts - WINDOW,
            ae.c.starts_at <= starts + WINDOW,
        )
        .order_by(ae.c.starts_at)
        .limit(200)
    )
    out: list[dict[str, Any]] = []
    for r in rows:
        score, kind, why = _score(me, r)
        if score < MIN_SCORE:
            continue
        out.append(
            {
                "correlation_id": f"{me.id}:{r.id}",
                "alerts": [alert_json(r, ae)],
                "correlation_type": kind,
                "correlation_score": score,
                "reason": "; ".join(why),
            }
        )
    out.sort(key=lambda g: (-g["correlation_score"], g["correlation_id"]))
    return {"correlations": out}
