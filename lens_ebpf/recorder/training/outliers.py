"""The rank that holds the others back: every `jobs.outliers_seconds` each running
workload with at least MIN_PODS running pods has its pods compared on the same signals,
over the last WINDOW seconds, from Prometheus:

- gpu_utilization: the mean utilization of the GPUs a pod holds (the agents' pod labels);
- tcp_rtt: its node's median TCP RTT to the workload's own pods;
- tcp_retransmits: its node's retransmitted segments per second to them;
- rdma_bytes: its node's RDMA bytes per second, both ways, on the devices the workload's
  queue pairs opened (all the node's ports when none is known);
- rdma_errors: the error counters of those ports, per second.

A pod is an outlier on a signal when its modified z-score (0.6745 (x - median) / MAD,
MAD the median absolute deviation) passes Z (3.5, Iglewicz and Hoaglin) in the signal's
bad direction and it is at least REL (10%) of the median away from it; with MAD 0 (the
others agree exactly), any value that far. The per-node signals give each pod its
node's figure: pods of the workload that share a node share it. A pod that becomes an
outlier is a timeline entry (training_events, kind outlier) and the gauge
lens_workload_outlier{namespace,workload,pod,node,signal} 1 while it stays one.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, and_, select, update
from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.schema import scoped
from lens_ebpf.recorder.store.writer import Op, Writer
from lens_ebpf.recorder.tracker import TrackedPod
from lens_ebpf.recorder.training.timeline import rdma_devices

log = logging.getLogger(__name__)

MIN_PODS = 3
WINDOW = 300
Z = 3.5
REL = 0.1
# signal -> the direction that is bad: high, low, or both
SIGNALS = {
    "gpu_utilization": "both",
    "tcp_rtt": "high",
    "tcp_retransmits": "high",
    "rdma_bytes": "both",
    "rdma_errors": "high",
}


@dataclass(frozen=True)
class Flag:
    value: float
    median: float
    score: float | None  # None: MAD 0


def robust_outliers(values: dict[str, float], direction: str) -> dict[str, Flag]:
    """The keys whose values are robust outliers among at least MIN_PODS values."""
    if len(values) < MIN_PODS:
        return {}
    m = statistics.median(values.values())
    mad = statistics.median(abs(v - m) for v in values.values())
    out = {}
    for key, v in values.items():
        d = v - m
        if direction == "high" and d <= 0 or direction == "low" and d >= 0:
            continue
        if abs(d) < REL * abs(m) or d == 0:
            continue
        if mad > 0:
            score = 0.6745 * d / mad
            if abs(score) > Z:
                out[key] = Flag(v, m, round(score, 6))
        else:
            out[key] = Flag(v, m, None)
    return out


class Outliers(Collector):
    def __init__(
        self,
        engine: Engine,
        writer: Writer,
        metrics: prom.Prom,
        running_pods: Callable[[], dict[str, list[TrackedPod]]],
        interval: float,
        clock: Callable[[], datetime],
        cluster: str = "local",
    ) -> None:
        self.engine, self.writer, self.metrics = engine, writer, metrics
        self.cluster = cluster  # running_pods' cluster
        self.running_pods, self.interval, self.clock = running_pods, interval, clock
        # (workload uid, pod uid, signal) -> (since, flag, namespace, workload, pod, node)
        self.flagged: dict[tuple[str, str, str], tuple[datetime, Flag, str, str, str, str]] = {}
        self.runs: dict[str, int] = {"ok": 0, "error": 0}
        self.found = 0
        self._lock = threading.Lock()

    def signals(
        self, conn: Connection, namespace: str, workload: str, pods: list[TrackedPod], at: datetime
    ) -> dict[str, dict[str, float]]:
        """signal -> pod uid -> value, for the pods that have one."""
        nodes = sorted({p.node for p in pods if p.node})
        devices = rdma_devices(conn, scoped(self.cluster), [p.uid for p in pods])
        by_name = {p.name: p.uid for p in pods}
        util = {
            by_name[lbl["pod"]]: v
            for lbl, v in self.metrics.instant(
                prom.gpu_utilization_by_pod(namespace, sorted(by_name), WINDOW), at
            )
            if lbl.get("pod") in by_name
        }
        out = {"gpu_utilization": util}
        per_node = {
            "tcp_rtt": prom.rtt_p50_by_node(namespace, workload, nodes, WINDOW),
            "tcp_retransmits": prom.retransmits_by_node(namespace, workload, nodes, WINDOW),
            "rdma_bytes": prom.rdma_bytes_by_node(nodes, devices, WINDOW),
            "rdma_errors": prom.rdma_errors(nodes, devices, WINDOW, "node"),
        }
        for signal, expr in per_node.items():
            got = {lbl.get("node", ""): v for lbl, v in self.metrics.instant(expr, at)}
            out[signal] = {  # NaN: no traffic on the node in the window
                p.uid: got[p.node] for p in pods if p.node in got and not math.isnan(got[p.node])
            }
        return out

    def run_once(self, now: datetime) -> int:
        """Compare every running workload's pods; the outliers found anew."""
        found: dict[tuple[str, str, str], tuple[Flag, str, str, str, str]] = {}
        w = scoped(self.cluster).gpu_workloads
        with self.engine.connect() as conn:
            for uid, pods in sorted(self.running_pods().items()):
                if len(pods) < MIN_PODS:
                    continue
                row = conn.execute(select(w.c.namespace, w.c.name).where(w.c.uid == uid)).first()
                if row is None:
                    continue
                by_uid = {p.uid: p for p in pods}
                for signal, values in self.signals(
                    conn, row.namespace, row.name, pods, now
                ).items():
                    for pod_uid, flag in robust_outliers(values, SIGNALS[signal]).items():
                        p = by_uid[pod_uid]
                        found[(uid, pod_uid, signal)] = (
                            flag,
                            row.namespace,
                            row.name,
                            p.name,
                            p.node,
                        )
        new, ends = [], []
        with self._lock:
            for key, (flag, ns, name, pod, node) in found.items():
                if key not in self.flagged:
                    new.append(
                        {
                            "cluster": self.cluster,
                            "workload_uid": key[0],
                            "namespace": ns,
                            "workload": name,
                            "pod_uid": key[1],
                            "pod": pod,
                            "node": node,
                            "kind": "outlier",
                            "signal": key[2],
                            "at": now,
                            "ended_at": None,
                            "iteration": None,
                            "value": flag.value,
                            "baseline": flag.median,
                            "detail": {
                                "score": flag.score,
                                "direction": SIGNALS[key[2]],
                                "window_seconds": WINDOW,
                            },
                        }
                    )
                    self.flagged[key] = (now, flag, ns, name, pod, node)
                else:
                    since = self.flagged[key][0]
                    self.flagged[key] = (since, flag, ns, name, pod, node)
            for key in [k for k in self.flagged if k not in found]:
                ends.append((*key, self.flagged.pop(key)[0]))
            self.found += len(new)
        if new or ends:
            self.writer.submit(
                Op("training_events", lambda conn: _write(conn, self.cluster, new, ends, now))
            )
        return len(new)

    def run_counted(self) -> None:
        """run_once now, counted by result (the runner's job; it logs a failure)."""
        try:
            self.run_once(self.clock())
        except (prom.PromError, SQLAlchemyError):  # Prometheus or the database down
            self.runs["error"] += 1
            raise
        self.runs["ok"] += 1

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        fam = gauge(
            "lens_workload_outlier",
            "1 while this pod is a robust outlier among its " "workload's pods on this signal",
        )
        with self._lock:
            flagged = sorted(self.flagged.items())
        for (_, _, signal), (_, _, ns, name, pod, node) in flagged:
            fam.add(
                {"namespace": ns, "workload": name, "pod": pod, "node": node, "signal": signal}, 1
            )
        yield fam
        runs = counter("lens_recorder_outlier_runs", "Outlier comparisons, by result")
        for result, n in self.runs.items():
            runs.add({"result": result}, n)
        yield runs


def _write(
    conn: Connection,
    cluster: str,
    new: list[dict[str, Any]],
    ends: list[tuple[str, str, str, datetime]],
    now: datetime,
) -> None:
    if new:
        conn.execute(t.training_events.insert(), new)
    ev = t.training_events
    for uid, pod_uid, signal, since in ends:
        conn.execute(
            update(ev)
            .where(
                and_(
                    ev.c.cluster == cluster,
                    ev.c.workload_uid == uid,
                    ev.c.kind == "outlier",
                    ev.c.pod_uid == pod_uid,
                    ev.c.signal == signal,
                    ev.c.at == since,
                    ev.c.ended_at.is_(None),
                )
            )
            .values(ended_at=now)
        )
