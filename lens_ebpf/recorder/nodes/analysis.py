"""The GPU nodes' fragmentation and load balance, as the original computes them
(Lens/modules/api/pkg/api/node_fragmentation.go): from each node's GPUs, the GPUs its
running pods hold, and its GPUs' mean utilization now (Prometheus; where it cannot
answer no part of a score rests on it, and the answer gives 0, said in meta.message)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from lens_ebpf.recorder import prom
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.nodes.gpus import gpu_nodes
from lens_ebpf.recorder.scope import Scope

LOW_UTILIZATION = 30.0  # percent


def _nodes(
    conn: Connection, c: Scope, now: datetime, only: str | None = None
) -> list[dict[str, Any]]:
    """The GPU nodes with their utilization now (None: Prometheus could not say)."""
    nodes = gpu_nodes(conn, c.tables, only)
    if not nodes:
        raise NotFound(f"node not found: {only!r}" if only else "no GPU nodes found")
    got = c.prom.maybe_instant(prom.utilization_by_node([n["name"] for n in nodes]), now)
    util = None if got is None else {lbl.get("node", ""): v for lbl, v in got}
    for n in nodes:
        n["gpu_utilization"] = None if util is None else util.get(n["name"], 0.0)
    return nodes


def _pods(conn: Connection, c: Scope, node: str | None = None) -> dict[str, list[Any]]:
    """node -> its running GPU pods (namespace, name, gpus)."""
    p = c.tables.gpu_pods
    cond = [p.c.running.is_(True), p.c.deleted.is_(False)] + ([p.c.node == node] if node else [])
    out: dict[str, list[Any]] = {}
    for r in conn.execute(
        select(p.c.node, p.c.namespace, p.c.name, p.c.gpus)
        .where(*cond)
        .order_by(p.c.namespace, p.c.name)
    ):
        out.setdefault(str(r.node), []).append(r)
    return out


def _partial_penalty(gpus: list[int], total: int) -> float:
    """Many small allocations make a node hard to schedule a large job on."""
    small = sum(1 for g in gpus if g == 1)
    penalty = (0.3 if total >= 8 and small > 2 else 0.0) + (0.4 if small > 4 else 0.0)
    return min(penalty, 1.0)


def status_of(score: float) -> str:
    return "healthy" if score < 30 else "fragmented" if score < 60 else "critical"


def node_fragmentation(node: dict[str, Any], gpus: list[int]) -> dict[str, Any]:
    """NodeFragmentation: 0 (none) to 100 (severe): up to 40 for unallocated GPUs, 40 for
    allocated ones left idle (only where the utilization is known), 20 for many small
    allocations."""
    total, allocated = int(node["gpu_count"]), int(node["gpu_allocation"])
    rate = allocated / total
    util = node["gpu_utilization"]
    gap = (rate * 100 - util) / 100 if util is not None and util < rate * 100 else 0.0
    score = min((1 - rate) * 40 + gap * 40 + _partial_penalty(gpus, total) * 20, 100.0)
    return {
        "node_name": node["name"],
        "total_gpus": total,
        "allocated_gpus": allocated,
        "available_gpus": total - allocated,
        "fragmentation_score": score,
        "status": status_of(score),
        "utilization": util,
    }


def fragmentation(conn: Connection, c: Scope, now: datetime) -> dict[str, Any]:
    """FragmentationAnalysisResponse."""
    nodes = _nodes(conn, c, now)
    pods = _pods(conn, c)
    frags = [node_fragmentation(n, [int(p.gpus) for p in pods.get(n["name"], [])]) for n in nodes]
    by = {
        s: sum(1 for f in frags if f["status"] == s) for s in ("healthy", "fragmented", "critical")
    }
    total = sum(f["total_gpus"] for f in frags)
    wasted = sum(f["available_gpus"] for f in frags if f["status"] != "healthy")
    advice = []
    if by["critical"]:
        advice.append(
            "Critical fragmentation detected on some nodes. Consider pod "
            "consolidation or rebalancing."
        )
    if any(
        f["allocated_gpus"] > 0
        and f["utilization"] is not None
        and f["utilization"] < LOW_UTILIZATION
        for f in frags
    ):
        advice.append(
            "Some nodes have allocated GPUs with low utilization. Check if pods " "are idle."
        )
    if any(f["status"] == "fragmented" and f["available_gpus"] > 0 for f in frags):
        advice.append(
            "Some nodes have fragmented GPU allocation. Consider using pod "
            "affinity/anti-affinity rules."
        )
    return {
        "cluster": c.name,
        "cluster_fragmentation_score": sum(f["fragmentation_score"] for f in frags) / len(frags),
        "total_nodes": len(frags),
        "node_fragmentations": [{**f, "utilization": f["utilization"] or 0.0} for f in frags],
        "recommendations": advice
        or ["Cluster GPU allocation is healthy. No immediate " "action needed."],
        "summary": {
            "healthy_nodes": by["healthy"],
            "fragmented_nodes": by["fragmented"],
            "critical_nodes": by["critical"],
            "total_wasted_gpus": wasted,
            "waste_percentage": 100 * wasted / total if total else 0.0,
        },
    }


def node_detail(conn: Connection, c: Scope, name: str, now: datetime) -> dict[str, Any]:
    """NodeFragmentationDetail: one node's score, its allocation pattern and pods."""
    node = _nodes(conn, c, now, name)[0]
    pods = _pods(conn, c, name).get(name, [])
    frag = node_fragmentation(node, [int(p.gpus) for p in pods])
    held = sum(int(p.gpus) for p in pods)
    pattern = {
        "fully_allocated_pods": sum(1 for p in pods if p.gpus >= 4),
        "partially_allocated_pods": sum(1 for p in pods if 0 < p.gpus < 4),
        "gpu_sharing_enabled": False,
        "largest_contiguous_gpu": frag["total_gpus"] - held,
    }
    advice = []
    if frag["status"] == "critical":
        advice.append("Critical fragmentation: Consider migrating some pods to other nodes")
    if pattern["partially_allocated_pods"] > 3 and frag["total_gpus"] >= 8:
        advice.append("Many small GPU allocations detected. Consider consolidating workloads")
    if 0 < frag["available_gpus"] < 4 and pattern["largest_contiguous_gpu"] < 4:
        advice.append("Limited contiguous GPU blocks. Difficult to schedule larger jobs")
    util = frag["utilization"]
    if util is not None and util < LOW_UTILIZATION and frag["allocated_gpus"] > 0:
        advice.append(
            "Low GPU utilization despite allocation. Check if pods are idle or " "waiting"
        )
    return {
        **{
            k: frag[k]
            for k in (
                "node_name",
                "total_gpus",
                "allocated_gpus",
                "available_gpus",
                "fragmentation_score",
                "status",
            )
        },
        "allocation_pattern": pattern,
        "running_pods": [
            {"pod_name": p.name, "namespace": p.namespace, "allocated_gpus": int(p.gpus)}
            for p in pods
        ],
        "recommendations": advice or ["Node GPU allocation is healthy"],
    }


def _spread(rates: list[float]) -> tuple[float, float]:
    """Mean and population variance."""
    mean = sum(rates) / len(rates)
    return mean, sum((r - mean) ** 2 for r in rates) / len(rates)


def load_balance(conn: Connection, c: Scope, now: datetime) -> dict[str, Any]:
    """LoadBalanceAnalysisResponse: each node's load (allocation 60%, utilization 40%; by
    allocation alone where the utilization is not known), the spread of the allocation
    rates (a score of 100 when even, 0 at a coefficient of variation of 1), the nodes 20
    points of load above or below the mean."""
    loads = []
    for n in _nodes(conn, c, now):
        rate = n["gpu_allocation"] / n["gpu_count"] * 100
        util = n["gpu_utilization"]
        loads.append(
            {
                "node_name": n["name"],
                "allocation_rate": rate,
                "utilization_rate": util if util is not None else 0.0,
                "load_score": rate if util is None else rate * 0.6 + util * 0.4,
            }
        )
    rates = [x["allocation_rate"] for x in loads]
    mean, variance = _spread(rates)
    stddev = math.sqrt(variance)
    cv = stddev / mean if mean > 0 else 0.0
    mean_load = sum(x["load_score"] for x in loads) / len(loads)
    hot = [x["node_name"] for x in loads if x["load_score"] > mean_load + 20]
    idle = [x["node_name"] for x in loads if x["load_score"] < mean_load - 20]
    advice = []
    if hot:
        advice.append(
            "Hotspot nodes detected with high GPU load. Consider rebalancing " "workloads."
        )
    if idle:
        advice.append(
            "Idle nodes detected with low GPU utilization. Consider consolidating "
            "workloads or draining nodes."
        )
    if stddev > 20:
        advice.append(
            "High variance in node allocation. Consider implementing pod " "scheduling strategies."
        )
    if mean < 40:
        advice.append(
            "Overall cluster GPU allocation is low. Consider optimizing resource " "requests."
        )
    return {
        "cluster": c.name,
        "load_balance_score": 100 * (1 - min(cv, 1.0)),
        "node_load_distribution": loads,
        "hotspot_nodes": hot,
        "idle_nodes": idle,
        "recommendations": advice
        or ["Cluster load is well balanced. No immediate action " "needed."],
        "statistics": {
            "avg_allocation_rate": mean,
            "stddev_allocation": stddev,
            "max_allocation": max(rates),
            "min_allocation": min(rates),
            "variance": variance,
        },
    }
