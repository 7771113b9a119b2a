"""workloads/{uid}/timeline: one time-ordered list of what happened to a workload's pods
and the devices they held, from the service's tables and Prometheus.

From the tables: training slowdowns and stalls and outliers (training_events), GPU
faults (the agents' gpu_fault events naming one of its pods, or a GPU one of its pods
held), device changes of those GPUs (device_changelog), OOM kills and container exits
(node_events), pod events (gpu_pods_events). From Prometheus: GPU throttling starts
(lens_gpu_clock_event_active, idle and settings left out), and regressions: a node's
median TCP RTT to the workload's own pods, or its RDMA ports' error rate, above
`regression_factor` x its own baseline (the median over `baseline_seconds` before) for
at least `regression_minutes`. Each entry names its pod (the pods on that node, for
the per-node figures), node and device.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, or_, select

from lens_ebpf.core.times import aware, utc
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.config import TimelineConfig
from lens_ebpf.recorder.errors import BadRequest, NotFound
from lens_ebpf.recorder.store import schema
from lens_ebpf.recorder.store.schema import Scoped
from lens_ebpf.recorder.workloads import workload_pods

MAX_RANGE = timedelta(days=31)
# entries at the same second: causes before what they cause
ORDER = (
    "device_change",
    "gpu_throttling",
    "gpu_fault",
    "rdma_error_regression",
    "tcp_rtt_regression",
    "oom_kill",
    "container_exit",
    "training_stalled",
    "stall_stacks",
    "training_slowdown",
    "outlier",
    "alert",
)


@dataclass(frozen=True)
class Regression:
    start: float  # the first point above the bound
    end: float  # the last
    value: float  # at the start
    peak: float
    baseline: float


def regressions(
    points: list[tuple[float, float]],
    factor: float,
    minutes: float,
    baseline_seconds: float,
    step: float,
    since: float,
) -> list[Regression]:
    """Runs of points (time, value; sorted; NaN skipped) from `since` on whose value is
    above factor x the baseline (the median of the values in the baseline_seconds before
    the run's first point) for at least `minutes` (a point stands for `step` seconds)."""
    out: list[Regression] = []
    recent: deque[tuple[float, float]] = deque()
    ordered: list[float] = []
    run: list[Any] | None = None  # [first time, last time, value, peak, baseline]

    def close() -> None:
        if run is not None and run[1] - run[0] + step >= minutes * 60:
            out.append(Regression(run[0], run[1], run[2], run[3], run[4]))

    for ts, v in points:
        if math.isnan(v):
            continue
        while recent and recent[0][0] < ts - baseline_seconds:
            ordered.pop(bisect.bisect_left(ordered, recent.popleft()[1]))
        if run is not None:
            if v > factor * run[4]:
                run[1], run[3] = ts, max(run[3], v)
            else:
                close()
                run = None
        elif ts >= since and ordered:
            n = len(ordered)
            base = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
            if v > factor * base and v > 0:
                run = [ts, ts, v, v, base]
        recent.append((ts, v))
        bisect.insort(ordered, v)
    close()
    return out


def _entry(
    at: datetime | float,
    kind: str,
    pod: str,
    node: str,
    device: str,
    message: str,
    detail: dict[str, Any],
) -> dict[str, Any]:
    ts = at if isinstance(at, float | int) else utc(at).timestamp()
    return {
        "time": round(float(ts), 3),
        "type": kind,
        "pod": pod,
        "node": node,
        "device": device,
        "message": message,
        "detail": detail,
    }


def _ts(value: Any) -> int | None:
    return int(utc(value).timestamp()) if value is not None else None


class Timeline:
    def __init__(self, metrics: prom.Prom, cfg: TimelineConfig, tables: Scoped) -> None:
        self.metrics, self.cfg, self.t = metrics, cfg, tables  # one cluster's

    def __call__(
        self,
        conn: Connection,
        uid: str,
        start: datetime | None,
        end: datetime | None,
        now: datetime,
    ) -> dict[str, Any]:
        """The workload's timeline from start (default: its creation) to end (now)."""
        w = conn.execute(
            select(self.t.gpu_workloads).where(self.t.gpu_workloads.c.uid == uid)
        ).first()
        if w is None:
            raise NotFound(f"workload not found: {uid!r}")
        pods = workload_pods(conn, self.t, uid)
        start = start or aware(w.created_at) or now - timedelta(days=1)
        end = end or now
        if end < start:
            raise BadRequest("end is before start")
        if end - start > MAX_RANGE:
            raise BadRequest(f"start, end: at most {MAX_RANGE.days} days")
        ctx = _Pods(conn, self.t, pods)
        entries = [
            *self._training(conn, ctx, start, end),
            *self._faults(conn, ctx, start, end),
            *self._devices(conn, ctx, start, end),
            *self._containers(conn, ctx, start, end),
            *self._pod_events(conn, ctx, start, end),
            *self._alerts(conn, ctx, uid, start, end),
        ]
        incomplete: list[str] = []
        if pods:
            try:
                entries += self._from_prometheus(conn, ctx, start, end)
            except prom.PromError as exc:  # all its entries or none, said in meta.message too
                incomplete.append(str(exc))
                prom.missed(f"timeline entries from Prometheus: {exc}")
        entries.sort(
            key=lambda e: (
                e["time"],
                ORDER.index(e["type"]) if e["type"] in ORDER else len(ORDER),
                e["pod"],
                e["device"],
            )
        )
        return {
            "uid": w.uid,
            "kind": w.kind,
            "name": w.name,
            "namespace": w.namespace,
            "start": int(start.timestamp()),
            "end": int(end.timestamp()),
            "pods": sorted(p.name for p in pods),
            "entries": entries,
            "incomplete": incomplete,
        }

    # -- the tables ------------------------------------------------------------------
    def _training(
        self, conn: Connection, ctx: _Pods, start: datetime, end: datetime
    ) -> Iterable[dict[str, Any]]:
        ev = self.t.training_events
        mine = or_(
            ev.c.pod_uid.in_(ctx.uids), (ev.c.pod_uid == "") & ev.c.workload_uid.in_(ctx.tops)
        )
        for r in _rows(conn, ev, start, end, mine):
            d = dict(r.detail or {})
            d["ended_at"] = _ts(r.ended_at)
            if r.kind == "training_slowdown":
                d.update(
                    iteration=r.iteration, iteration_seconds=r.value, median_seconds=r.baseline
                )
                msg = (
                    f"iteration {r.iteration} took {r.value:g} s, {d.get('ratio', 0):g}x "
                    f"the median {r.baseline:g} s"
                )
            elif r.kind == "training_stalled":
                d.update(
                    last_iteration=r.iteration,
                    median_seconds=r.baseline,
                    seconds_without_progress=r.value,
                )
                msg = f"no progress after iteration {r.iteration} (median {r.baseline:g} s)"
            elif r.kind == "stall_stacks":  # each rank's stack (recorder/deepdive/)
                odd = ", ".join(d.get("different") or []) or "none"
                msg = f"each rank's stack at the stall ({d.get('reason')}); differing: {odd}"
            else:
                d.update(signal=r.signal, value=r.value, median=r.baseline)
                msg = (
                    f"{r.pod} apart from the others on {r.signal}: {r.value:g} (median "
                    f"{r.baseline:g})"
                )
            yield _entry(r.at, r.kind, r.pod, r.node, "", msg, d)

    def _faults(
        self, conn: Connection, ctx: _Pods, start: datetime, end: datetime
    ) -> Iterable[dict[str, Any]]:
        ne = self.t.node_events
        for r in _rows(conn, ne, start, end, ne.c.kind == "gpu_fault", ne.c.node.in_(ctx.nodes)):
            p = r.payload or {}
            bdf = str(p.get("bdf", ""))
            pod = r.pod if (r.namespace, r.pod) in ctx.names else ctx.held.get((r.node, bdf), "")
            if not pod:
                continue
            yield _entry(
                r.at,
                "gpu_fault",
                pod,
                r.node,
                bdf,
                f"{p.get('fault', '')} {p.get('code', '')}: {p.get('message', '')}",
                {k: p.get(k) for k in ("fault", "code", "message", "gpu_index", "uuid", "vendor")},
            )

    def _devices(
        self, conn: Connection, ctx: _Pods, start: datetime, end: datetime
    ) -> Iterable[dict[str, Any]]:
        cl = self.t.device_changelog
        for r in _rows(conn, cl, start, end, cl.c.node.in_(ctx.nodes)):
            pod = ctx.held.get((r.node, r.slot))
            if pod:
                yield _entry(
                    r.at,
                    "device_change",
                    pod,
                    r.node,
                    r.slot,
                    f"{r.field}: {r.old_value!r} -> {r.new_value!r}",
                    {
                        "kind": r.kind,
                        "device_key": r.device_key,
                        "field": r.field,
                        "old": r.old_value,
                        "new": r.new_value,
                    },
                )

    def _containers(
        self, conn: Connection, ctx: _Pods, start: datetime, end: datetime
    ) -> Iterable[dict[str, Any]]:
        ne = self.t.node_events
        kinds = ne.c.kind.in_(("oom_kill", "container_exit"))
        for r in _rows(conn, ne, start, end, kinds, ne.c.pod_uid.in_(ctx.uids)):
            p = r.payload or {}
            what = (
                f"{p.get('comm', '')} (pid {p.get('pid', 0)})"
                if r.kind == "oom_kill"
                else f"container {r.container}"
            )
            yield _entry(
                r.at,
                r.kind,
                r.pod,
                r.node,
                "",
                f"{r.kind}: {what}",
                {"container": r.container, "pid": p.get("pid"), "comm": p.get("comm")},
            )

    def _pod_events(
        self, conn: Connection, ctx: _Pods, start: datetime, end: datetime
    ) -> Iterable[dict[str, Any]]:
        pe = self.t.gpu_pods_events
        for r in _rows(conn, pe, start, end, pe.c.pod_uid.in_(ctx.uids)):
            pod = ctx.by_uid[r.pod_uid]
            what = " ".join(x for x in (r.type, r.subject) if x)
            yield _entry(
                r.at,
                f"pod_{r.type}",
                pod.name,
                pod.node,
                "",
                f"{what}: {r.old_value!r} -> {r.new_value!r}",
                {"subject": r.subject, "old": r.old_value, "new": r.new_value},
            )

    def _alerts(
        self, conn: Connection, ctx: _Pods, uid: str, start: datetime, end: datetime
    ) -> Iterable[dict[str, Any]]:
        """The alerts that concern the workload or its pods (alert_events: docs/recorder/
        alerts.md), where they began."""
        ae = schema.alert_events
        mine = or_(ae.c.workload_id.in_([uid, *ctx.tops]), ae.c.pod_id.in_(ctx.uids))
        rows = conn.execute(
            select(ae)
            .where(mine, ae.c.starts_at >= start, ae.c.starts_at <= end)
            .order_by(ae.c.starts_at, ae.c.id)
        )
        for r in rows:
            notes = r.annotations or {}
            text = notes.get("summary") or notes.get("description") or ""
            yield _entry(
                r.starts_at,
                "alert",
                r.pod_name,
                r.node_name,
                "",
                f"{r.alert_name} ({r.severity}, {r.status})" + (f": {text}" if text else ""),
                {
                    "alert_id": r.id,
                    "alert_name": r.alert_name,
                    "source": r.source,
                    "severity": r.severity,
                    "status": r.status,
                    "ends_at": _ts(r.ends_at),
                },
            )

    # -- Prometheus ------------------------------------------------------------------
    def _from_prometheus(
        self, conn: Connection, ctx: _Pods, start: datetime, end: datetime
    ) -> list[dict[str, Any]]:
        cfg, out = self.cfg, []
        since, until = int(start.timestamp()), int(end.timestamp())
        first = since - int(cfg.baseline_seconds)
        step = 60
        while (until - first) // step + 1 > self.metrics.max_points:
            step *= 2
        window = max(2 * step, 120)
        nodes = sorted(ctx.nodes)
        for ns, top in sorted(ctx.top_names):
            expr = prom.rtt_p50_by_node(ns, top, nodes, window)
            for s in self.metrics.graph(expr, first, until, step):
                node = s["labels"].get("node", "")
                pts = [(float(v["timestamp"]), v["value"]) for v in s["values"]]
                for r in regressions(
                    pts,
                    cfg.regression_factor,
                    cfg.regression_minutes,
                    cfg.baseline_seconds,
                    step,
                    since,
                ):
                    out.append(
                        _entry(
                            r.start,
                            "tcp_rtt_regression",
                            ctx.on_node(node),
                            node,
                            "",
                            f"median TCP RTT to the workload's pods "
                            f"{r.value * 1000:g} ms, {r.value / r.baseline:.2f}x its "
                            f"baseline {r.baseline * 1000:g} ms",
                            _regression(r),
                        )
                    )
        expr = prom.rdma_errors(
            nodes, rdma_devices(conn, self.t, ctx.uids), window, "node, device, port"
        )
        for s in self.metrics.graph(expr, first, until, step):
            lbl = s["labels"]
            node, port = lbl.get("node", ""), f"{lbl.get('device', '')}/{lbl.get('port', '')}"
            pts = [(float(v["timestamp"]), v["value"]) for v in s["values"]]
            for r in regressions(
                pts,
                cfg.regression_factor,
                cfg.regression_minutes,
                cfg.baseline_seconds,
                step,
                since,
            ):
                out.append(
                    _entry(
                        r.start,
                        "rdma_error_regression",
                        ctx.on_node(node),
                        node,
                        port,
                        f"RDMA port errors {r.value:g}/s, baseline " f"{r.baseline:g}/s",
                        _regression(r),
                    )
                )
        for ns in sorted({n for n, _ in ctx.names}):
            names = sorted(p for n, p in ctx.names if n == ns)
            for s in self.metrics.graph(prom.throttling(ns, names), since, until, step):
                lbl = s["labels"]
                before = 0.0
                for v in s["values"]:
                    if v["value"] >= 1 > before:
                        out.append(
                            _entry(
                                float(v["timestamp"]),
                                "gpu_throttling",
                                lbl.get("pod", ""),
                                lbl.get("node", ""),
                                f"gpu{lbl.get('gpu_index', '')}",
                                f"clocks held down: {lbl.get('reason', '')}",
                                {"reason": lbl.get("reason", "")},
                            )
                        )
                    before = v["value"]
        return out


def _rows(conn: Connection, table: Any, start: datetime, end: datetime, *cond: Any) -> Any:
    """A table's rows between start and end that meet cond, oldest first."""
    c = table.c
    return conn.execute(select(table).where(*cond, c.at >= start, c.at <= end).order_by(c.at, c.id))


def _regression(r: Regression) -> dict[str, Any]:
    return {
        "value": r.value,
        "baseline": r.baseline,
        "ratio": round(r.value / r.baseline, 6) if r.baseline else None,
        "peak": r.peak,
        "until": int(r.end),
    }


class _Pods:
    """A workload's pods, and where they were: nodes, names, the GPUs they held."""

    def __init__(self, conn: Connection, t: Scoped, pods: list[Any]) -> None:
        self.by_uid = {p.uid: p for p in pods}
        self.uids = sorted(self.by_uid)
        self.names = {(p.namespace, p.name) for p in pods}
        self.nodes = {p.node for p in pods if p.node}
        self.tops = sorted({p.workload_uid for p in pods if p.workload_uid})
        w = t.gpu_workloads
        self.top_names = {
            (r.namespace, r.name)
            for r in conn.execute(select(w.c.namespace, w.c.name).where(w.c.uid.in_(self.tops)))
        }
        # (node, slot) -> the pod the kubelet gave that GPU (now, or at some time)
        holders = {f"{ns}/{name}": name for ns, name in self.names}
        self.held: dict[tuple[str, str], str] = {}
        nd, cl = t.node_devices, t.device_changelog
        for r in conn.execute(
            select(cl.c.node, cl.c.slot, cl.c.new_value).where(
                cl.c.field == "holder", cl.c.new_value.in_(holders)
            )
        ):
            self.held[(r.node, r.slot)] = holders[r.new_value]
        for r in conn.execute(
            select(nd.c.node, nd.c.slot, nd.c.holder).where(nd.c.holder.in_(holders))
        ):
            self.held[(r.node, r.slot)] = holders[r.holder]

    def on_node(self, node: str) -> str:
        return ",".join(sorted(p.name for p in self.by_uid.values() if p.node == node))


def rdma_devices(conn: Connection, t: Scoped, pod_uids: list[str]) -> list[str]:
    """The RDMA devices these pods' queue pairs opened (the agents' rdma_open)."""
    ne = t.node_events
    rows = conn.execute(
        select(ne.c.payload).where(ne.c.kind == "rdma_open", ne.c.pod_uid.in_(pod_uids))
    )
    return sorted({str((r.payload or {}).get("device", "")) for r in rows} - {""})
