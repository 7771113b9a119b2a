"""The service's own findings as alerts (source "lens"): a training slowdown, a stall, the
rank that holds the others back (training_events, resolved when they end), and a GPU
fault an agent reported (node_events gpu_fault: an Xid, an uncorrectable ECC or RAS
error; resolved after FAULT_SECONDS). Each is an alert once (its id made from the row),
named with the workload, pod, node and GPU it concerns."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Connection, or_, select

from lens_ebpf.recorder.alerts.ingest import AlertIn
from lens_ebpf.recorder.store import schema as t

LOOK_BACK = timedelta(days=1)  # rows begun this long ago, or still open, are looked at
KINDS = {  # training_events kind -> (alertname, severity, summary)
    "training_slowdown": (
        "TrainingSlowdown",
        "warning",
        "{workload}: an iteration took {value:g} s, {ratio} x the median",
    ),
    "training_stalled": ("TrainingStalled", "critical", "{workload}: no progress for {value:g} s"),
    "outlier": (
        "TrainingOutlierRank",
        "warning",
        "{workload}: {pod} on {node} holds the others back ({signal})",
    ),
}
# a fault's severity by kind: uncorrectable ones are critical
FAULT_SEVERITY = {
    "xid": "critical",
    "ecc_uncorrectable": "critical",
    "ras_uncorrectable": "critical",
    "ras_correctable": "warning",
}


def training(conn: Connection, cluster: str, now: datetime) -> list[AlertIn]:
    """training_events of cluster begun within LOOK_BACK or still open, as alerts."""
    ev = t.training_events
    rows = conn.execute(
        select(ev).where(
            ev.c.cluster == cluster,
            ev.c.kind.in_(KINDS),
            or_(ev.c.at >= now - LOOK_BACK, ev.c.ended_at.is_(None)),
        )
    )
    out = []
    for r in rows:
        name, sev, summary = KINDS[r.kind]
        detail = r.detail or {}
        labels = {
            "alertname": name,
            "severity": sev,
            "source": "lens",
            "cluster": cluster,
            "namespace": r.namespace,
            "workload": r.workload,
            "workload_uid": r.workload_uid,
        }
        for k, v in (
            ("pod", r.pod),
            ("pod_uid", r.pod_uid),
            ("node", r.node),
            ("signal", r.signal),
        ):
            if v:
                labels[k] = str(v)
        text = summary.format(
            workload=r.workload,
            value=float(r.value or 0),
            ratio=detail.get("ratio", "?"),
            pod=r.pod or "?",
            node=r.node or "?",
            signal=r.signal or "?",
        )
        notes = {
            "summary": text,
            "description": f"{text} (iteration {r.iteration}, " f"baseline {r.baseline})"
            if r.iteration is not None
            else text,
        }
        starts = r.at if r.at.tzinfo else r.at.replace(tzinfo=now.tzinfo)
        ended = r.ended_at
        if ended is not None and ended.tzinfo is None:
            ended = ended.replace(tzinfo=now.tzinfo)
        out.append(
            AlertIn(
                id=f"lens-te-{cluster}-{r.id}",
                source="lens",
                alert_name=name,
                severity=sev,
                status="resolved" if ended else "firing",
                starts_at=starts,
                ends_at=ended,
                labels=labels,
                annotations=notes,
                cluster=cluster,
                raw={"training_event": r.id, "kind": r.kind, "detail": detail},
            )
        )
    return out


FAULT_SECONDS = 3600.0


def faults(conn: Connection, cluster: str, now: datetime) -> list[AlertIn]:
    """GPU faults agents reported within LOOK_BACK, as alerts (resolved FAULT_SECONDS
    after)."""
    ne = t.node_events
    rows = conn.execute(
        select(ne).where(
            ne.c.cluster == cluster, ne.c.kind == "gpu_fault", ne.c.at >= now - LOOK_BACK
        )
    )
    out = []
    for r in rows:
        pay = r.payload or {}
        at = r.at if r.at.tzinfo else r.at.replace(tzinfo=now.tzinfo)
        fault, code = str(pay.get("fault", "")), str(pay.get("code", ""))
        labels = {
            "alertname": "GPUFault",
            "severity": FAULT_SEVERITY.get(fault, "warning"),
            "source": "lens",
            "cluster": cluster,
            "node": r.node,
            "fault": fault,
            "code": code,
            "gpu_index": str(pay.get("gpu_index", "")),
        }
        if pay.get("uuid"):
            labels["gpu_uuid"] = str(pay["uuid"])
        if r.pod:
            labels |= {"pod": r.pod, "namespace": r.namespace, "pod_uid": r.pod_uid}
        what = f"{fault} {code}".strip()
        notes = {
            "summary": f"{r.node}: GPU {pay.get('gpu_index', '?')} {what}",
            "description": str(pay.get("message", ""))[:500],
        }
        end = at + timedelta(seconds=FAULT_SECONDS)
        over = end <= now
        # an agent's seq is its process's own (two instances both have a seq 5): the row's
        # id once an agent says its instance; a row of one that does not, its seq as before
        which = f"r{r.id}" if r.instance else r.seq or r.id
        out.append(
            AlertIn(
                id=f"lens-fault-{cluster}-{r.node}-{which}",
                source="lens",
                alert_name="GPUFault",
                severity=labels["severity"],
                status="resolved" if over else "firing",
                starts_at=at,
                ends_at=end if over else None,
                labels=labels,
                annotations=notes,
                cluster=cluster,
                raw={"node_event": r.id, "payload": pay},
            )
        )
    return out
