"""The workload page's remaining calls: its events, GPU graphs and utilization figures,
and the workload list's batch of figures."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import workloads
from lens_ebpf.recorder.api.envelope import SPAN, Ask, bad, param, span, when
from lens_ebpf.recorder.training.timeline import Timeline
from lens_ebpf.recorder.workloads import stats as workload_stats

routes = RouteTable()
START = Param("start", "time", "unix seconds, milliseconds or RFC 3339; none: the workload's start")
END = Param("end", "time", "unix seconds, milliseconds or RFC 3339; none: its end or now")
METRICS = Param(
    "metrics",
    "list",
    "only these figures (instant_, avg_, p50_, p90_, p95_, " "max_gpu_utilization); none: all",
)


def figures(raw: Any) -> list[str] | None:
    """The metrics asked for: a list or a comma-separated string; None: all."""
    if raw is None or raw == "" or raw == []:
        return None
    if isinstance(raw, str):
        return [m.strip() for m in raw.split(",") if m.strip()]
    if isinstance(raw, list) and all(isinstance(m, str) for m in raw):
        return raw
    raise bad(f"metrics={raw!r}: a list of figure names")


@routes.get("workloads/{uid}/events", START, END)
def events(ask: Ask) -> Any:
    """A workload's events, oldest first (its timeline: training slowdowns and stalls, GPU
    faults, device changes, OOM kills and exits, pod events, alerts), each naming its pod,
    node and device."""
    c = ask.c
    return Timeline(c.prom, ask.app.cfg.timeline, c.tables)(
        ask.conn, ask.arg("uid"), when(ask.query, "start"), when(ask.query, "end"), ask.now()
    )


@routes.get("workloads/{uid}/gpuMetrics", SPAN)
def gpu_metrics(ask: Ask) -> Any:
    """A workload's GPU graphs over a span (map of model.MetricsGraph, as
    workloads/{uid}/metrics): utilization, memory and power per node and pod."""
    return workloads.graphs(ask.conn, ask.c, ask.arg("uid"), *span(ask.query))


@routes.get("workloads/{uid}/stats", START, END, METRICS)
def stats(ask: Ask) -> Any:
    """A workload's pods' mean GPU utilization over its life or a span: instant, average,
    p50, p90, p95 and max (0 where Prometheus cannot answer, said in meta.message)."""
    q = ask.query
    return workload_stats.stats(
        ask.conn,
        ask.c,
        ask.arg("uid"),
        ask.now(),
        when(q, "start"),
        when(q, "end"),
        figures(param(q, "metrics")),
    )


@routes.post(
    "workloads/batchStats",
    Param("uids", "list", "the workloads' uids", required=True, body=True),
    Param("metrics", "list", METRICS.doc, body=True),
    Param(
        "cluster",
        doc="the cluster asked about, as ?cluster= may name it " "(refused where they differ)",
        body=True,
    ),
    tool="lens_workloads_batch_stats",
)
def batch_stats(ask: Ask) -> Any:
    """{uids, metrics}: each workload's figures over its life as workloads/{uid}/stats
    answers them, by uid ({stats: {uid: ...}, missing: [uids not known]})."""
    b = ask.body()
    uids = b.get("uids")
    if not isinstance(uids, list) or not all(isinstance(u, str) and u for u in uids):
        raise bad(f"uids={uids!r}: a list of workload uids")
    named = b.get("cluster")
    if named and named != ask.c.name:  # the query named another
        raise bad(f"cluster={named!r} in the body, ?cluster={ask.c.name} in the query: which?")
    return workload_stats.batch(ask.conn, ask.c, uids, ask.now(), figures(b.get("metrics")))
