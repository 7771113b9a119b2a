"""Framework detection (the Management pages' Detection Status): the leader looks, every
recorder.detection.interval_seconds, for workloads with new evidence (training progress
lines, pod snapshots, programs the agents saw start) or none looked at yet, gathers each
one's evidence (frameworks.py) and stores its verdict and the evidence; a workload's
detection runs again whenever new evidence of it arrives, and when the page asks
(status.trigger), whose questions status.py answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, func, select

from lens_ebpf.recorder.alerts.model import when
from lens_ebpf.recorder.detection import frameworks as fw
from lens_ebpf.recorder.lifecycle import parse_time
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import Op, Writer, insert_rows

log = logging.getLogger(__name__)

TASK = "detection_coordinator"
PODS_MAX = 200  # a workload's pods looked at
EXECS_MAX = 500  # the newest programs seen starting in them
DETECTION = t.workload_detections
EVIDENCE = t.workload_detection_evidence


@dataclass
class Marks:
    """The newest row of each evidence table a run has looked at, per cluster."""

    points: int = 0
    snapshots: int = 0
    execs: int = 0


@dataclass
class Gathered:
    """What one workload shows, read from the database."""

    evidence: list[fw.Evidence] = field(default_factory=list)
    pods: int = 0
    snapshots: int = 0
    log_lines: int = 0
    log_from: datetime | None = None
    log_to: datetime | None = None
    labelled: bool = False


def gather(conn: Connection, cluster: str, uid: str) -> Gathered:
    """Every piece of evidence of one workload (its pods', its own)."""
    g = Gathered()
    gp, ps, tp, ne, wl = (
        t.gpu_pods,
        t.pod_snapshots,
        t.training_points,
        t.node_events,
        t.gpu_workloads,
    )
    pods = [
        r.uid
        for r in conn.execute(
            select(gp.c.uid)
            .where(gp.c.cluster == cluster, gp.c.workload_uid == uid)
            .order_by(gp.c.updated_at.desc())
            .limit(PODS_MAX)
        )
    ]
    g.pods = len(pods)
    if pods:
        newest = (
            select(func.max(ps.c.id))
            .where(ps.c.cluster == cluster, ps.c.pod_uid.in_(pods))
            .group_by(ps.c.pod_uid)
        )
        for r in conn.execute(select(ps.c.spec, ps.c.pod_metadata).where(ps.c.id.in_(newest))):
            g.snapshots += 1
            spec = r.spec if isinstance(r.spec, dict) else {}
            for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
                if not isinstance(c, dict):
                    continue
                name = str(c.get("name") or "")
                g.evidence += fw.from_image(str(c.get("image") or ""), name)
                argv = [*(c.get("command") or []), *(c.get("args") or [])]
                g.evidence += fw.from_command([str(a) for a in argv], name)
                g.evidence += fw.from_env(
                    [str(e.get("name") or "") for e in c.get("env") or [] if isinstance(e, dict)],
                    name,
                )
            meta = r.pod_metadata if isinstance(r.pod_metadata, dict) else {}
            g.evidence += fw.from_labels(meta.get("labels") or {}, "pod")
        q = (
            select(ne.c.payload)
            .where(ne.c.cluster == cluster, ne.c.kind == "process_exec", ne.c.pod_uid.in_(pods))
            .order_by(ne.c.id.desc())
            .limit(EXECS_MAX)
        )
        for (payload,) in conn.execute(q):
            p = payload if isinstance(payload, dict) else {}
            g.evidence += fw.from_exec(str(p.get("comm") or ""), str(p.get("filename") or ""))
    q = (
        select(tp.c.format, func.count(), func.min(tp.c.at), func.max(tp.c.at), func.max(tp.c.id))
        .where(tp.c.cluster == cluster, tp.c.workload_uid == uid)
        .group_by(tp.c.format)
    )
    for fmt, n, first, last, newest_id in conn.execute(q):
        line = conn.execute(select(tp).where(tp.c.id == newest_id)).first()
        sample = {
            k: getattr(line, k)
            for k in (
                "iteration",
                "target_iterations",
                "loss",
                "iteration_seconds",
                "tflops_per_gpu",
            )
            if line is not None and getattr(line, k) is not None
        }
        detail = {
            "first_line_at": when(first),
            "last_line_at": when(last),
            "last_line": sample,
            "pod": line.pod if line is not None else "",
        }
        n = int(str(n))
        got = fw.from_log_format(str(fmt), n, detail)
        if got is not None:
            g.evidence.append(got)
        g.log_lines += n
        first, last = parse_time(when(first)), parse_time(when(last))
        g.log_from = min(x for x in (g.log_from, first) if x is not None) if first else g.log_from
        g.log_to = max(x for x in (g.log_to, last) if x is not None) if last else g.log_to
    row = conn.execute(
        select(wl.c.labels, wl.c.kind).where(wl.c.cluster == cluster, wl.c.uid == uid)
    ).first()
    if row is not None:
        g.labelled = True
        g.evidence += fw.from_labels(row.labels or {}, "workload")
    seen: dict[str, fw.Evidence] = {}
    for e in g.evidence:  # one per key (the same image in two pods: once)
        seen.setdefault(e.key, e)
    g.evidence = list(seen.values())
    return g


def coverage(
    g: Gathered, now: datetime, old: list[dict[str, Any]], attempt: int
) -> list[dict[str, Any]]:
    """DetectionCoverageItem per source: whether its input exists yet, its evidence."""
    before = {c.get("source"): c for c in old if isinstance(c, dict)}
    have = {
        "process": g.snapshots > 0,
        "image": g.snapshots > 0,
        "log": g.log_lines > 0,
        "label": g.labelled,
    }
    out = []
    for source in fw.SOURCES:
        prev = before.get(source, {})
        n = sum(1 for e in g.evidence if e.source == source)
        item: dict[str, Any] = {
            "source": source,
            "status": "collected" if have[source] else "pending",
            "attempt_count": attempt,
            "last_attempt_at": when(now),
            "last_success_at": when(now) if have[source] else prev.get("last_success_at"),
            "last_error": "",
            "evidence_count": n,
        }
        if source == "log":
            item |= {
                "covered_from": when(g.log_from),
                "covered_to": when(g.log_to),
                "log_available_from": when(g.log_from),
                "log_available_to": when(g.log_to),
                "has_gap": False,
            }
        out.append(item)
    return out


def evidence_rows(
    cluster: str, uid: str, evidence: list[fw.Evidence], now: datetime, made: dict[str, datetime]
) -> list[dict[str, Any]]:
    out = []
    for e in evidence:
        f = e.info
        out.append(
            {
                "cluster": cluster,
                "workload_uid": uid,
                "key": e.key,
                "source": e.source,
                "source_type": "passive",
                "framework": e.framework,
                "workload_type": f.workload_type,
                "confidence": e.confidence,
                "framework_layer": f.layer,
                "wrapper_framework": e.framework if f.layer == "wrapper" else "",
                "base_framework": e.framework if f.layer in ("orchestration", "inference") else "",
                "evidence": {**e.detail, "framework_name": f.title},
                "detected_at": now,
                "created_at": made.get(e.key, now),
            }
        )
    return out


class Detection:
    """The leader's job: every cluster's workloads with new evidence detected again."""

    def __init__(
        self,
        engine: Any,
        writer: Writer,
        scopes: Callable[[], list[Scope]],
        cfg: Any,
        clock: Callable[[], datetime],
    ) -> None:
        self.engine, self.writer, self.scopes, self.cfg, self.clock = (
            engine,
            writer,
            scopes,
            cfg,
            clock,
        )
        self.marks: dict[str, Marks] = {}
        self.detected = 0  # workloads detected (again)

    def run(self) -> int:
        """One run over every cluster; the workloads detected."""
        now, n = self.clock(), 0
        for scope in self.scopes():
            with self.engine.connect() as conn:
                n += self.run_cluster(conn, scope.name, now)
        return n

    def due(self, conn: Connection, cluster: str, now: datetime) -> list[str]:
        """The workloads to detect now: new evidence since the last run, none detected yet,
        asked for (trigger) or due again."""
        m = self.marks.setdefault(cluster, Marks())
        gp, ps, tp, ne, wl = (
            t.gpu_pods,
            t.pod_snapshots,
            t.training_points,
            t.node_events,
            t.gpu_workloads,
        )
        wanted: dict[str, None] = {}

        def add(rows: Any) -> None:
            for (uid,) in rows:
                if uid:
                    wanted.setdefault(str(uid), None)

        top = {
            "points": conn.execute(select(func.max(tp.c.id)).where(tp.c.cluster == cluster)),
            "snapshots": conn.execute(select(func.max(ps.c.id)).where(ps.c.cluster == cluster)),
            "execs": conn.execute(select(func.max(ne.c.id)).where(ne.c.cluster == cluster)),
        }
        newest = {k: int(v.scalar() or 0) for k, v in top.items()}
        add(
            conn.execute(
                select(tp.c.workload_uid)
                .distinct()
                .where(tp.c.cluster == cluster, tp.c.id > m.points)
            )
        )
        on_pod = and_(gp.c.cluster == cluster, gp.c.uid == ps.c.pod_uid)
        add(
            conn.execute(
                select(gp.c.workload_uid)
                .distinct()
                .select_from(ps.join(gp, on_pod))
                .where(ps.c.cluster == cluster, ps.c.id > m.snapshots)
            )
        )
        on_exec = and_(gp.c.cluster == cluster, gp.c.uid == ne.c.pod_uid)
        add(
            conn.execute(
                select(gp.c.workload_uid)
                .distinct()
                .select_from(ne.join(gp, on_exec))
                .where(ne.c.cluster == cluster, ne.c.kind == "process_exec", ne.c.id > m.execs)
            )
        )
        known = select(DETECTION.c.workload_uid).where(DETECTION.c.cluster == cluster)
        add(
            conn.execute(
                select(wl.c.uid).where(
                    wl.c.cluster == cluster, wl.c.parent_uid.is_(None), wl.c.uid.not_in(known)
                )
            )
        )
        add(
            conn.execute(
                select(DETECTION.c.workload_uid).where(
                    DETECTION.c.cluster == cluster,
                    DETECTION.c.detection_state == "pending",
                    (DETECTION.c.next_attempt_at.is_(None)) | (DETECTION.c.next_attempt_at <= now),
                )
            )
        )
        m.points, m.snapshots, m.execs = newest["points"], newest["snapshots"], newest["execs"]
        return list(wanted)[: self.cfg.batch]

    def run_cluster(self, conn: Connection, cluster: str, now: datetime) -> int:
        uids = self.due(conn, cluster, now)
        if not uids:
            return 0
        old = {
            r.workload_uid: r
            for r in conn.execute(
                select(DETECTION).where(
                    DETECTION.c.cluster == cluster, DETECTION.c.workload_uid.in_(uids)
                )
            )
        }
        rows, evidence = [], []
        for uid in uids:
            g = gather(conn, cluster, uid)
            made = {
                r.key: r.created_at
                for r in conn.execute(
                    select(EVIDENCE.c.key, EVIDENCE.c.created_at).where(
                        EVIDENCE.c.cluster == cluster, EVIDENCE.c.workload_uid == uid
                    )
                )
            }
            evidence += evidence_rows(cluster, uid, g.evidence, now, made)
            rows.append(
                self.detection_row(
                    cluster, uid, g, old.get(uid), now, len(made | {e.key: now for e in g.evidence})
                )
            )
        self.writer.submit(Op("workload_detections", lambda c: self._write(c, rows, evidence)))
        self.detected += len(rows)
        return len(rows)

    def detection_row(
        self, cluster: str, uid: str, g: Gathered, old: Any, now: datetime, stored: int
    ) -> dict[str, Any]:
        v = fw.verdict(g.evidence)
        attempt = (int(old.attempt_count) if old is not None else 0) + 1
        most = self.cfg.max_attempts
        found = v.status != "unknown"
        state = "completed" if found else ("failed" if attempt >= most else "pending")
        confirmed = old.confirmed_at if old is not None else None
        if confirmed is None and v.status in ("confirmed", "verified"):
            confirmed = now
        task = dict(old.task) if old is not None and isinstance(old.task, dict) else {}
        task |= {
            "task_type": TASK,
            "status": state,
            "updated_at": when(now),
            "attempt_count": attempt,
            "coordinator_state": state,
        }
        task.setdefault("created_at", when(now))
        nxt = (
            now + timedelta(seconds=self.cfg.interval_seconds * 2 ** min(attempt, 6))
            if state == "pending"
            else None
        )
        return {
            "cluster": cluster,
            "workload_uid": uid,
            "status": v.status,
            "detection_state": state,
            "framework": v.framework,
            "frameworks": v.frameworks,
            "workload_type": v.workload_type,
            "confidence": v.confidence,
            "framework_layer": v.framework_layer,
            "wrapper_framework": v.wrapper_framework,
            "base_framework": v.base_framework,
            "evidence_count": stored,
            "evidence_sources": v.sources,
            "attempt_count": attempt,
            "max_attempts": most,
            "last_attempt_at": now,
            "next_attempt_at": nxt,
            "confirmed_at": confirmed,
            "conflicts": v.conflicts,
            "coverage": coverage(
                g, now, list(old.coverage or []) if old is not None else [], attempt
            ),
            "task": task,
            "created_at": old.created_at if old is not None else now,
            "updated_at": now,
        }

    @staticmethod
    def _write(
        conn: Connection, rows: list[dict[str, Any]], evidence: list[dict[str, Any]]
    ) -> None:
        insert_rows(conn, DETECTION, rows, keys=["cluster", "workload_uid"], update=True)
        if evidence:
            insert_rows(
                conn, EVIDENCE, evidence, keys=["cluster", "workload_uid", "key"], update=True
            )
