"""A workload's training: its performance from its pods' logs, and its timeline."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder.api.envelope import Ask, when
from lens_ebpf.recorder.training.performance import training_performance
from lens_ebpf.recorder.training.timeline import Timeline

routes = RouteTable()


@routes.get(
    "workloads/{uid}/trainingPerformance",
    Param("start", "time", "unix seconds, milliseconds or RFC 3339"),
    Param("end", "time", "unix seconds, milliseconds or RFC 3339"),
)
def performance(ask: Ask) -> Any:
    """A training workload's performance points as its pods' logs give them (oldest
    first), and their summary."""
    return training_performance(
        ask.conn, ask.c.tables, ask.arg("uid"), when(ask.query, "start"), when(ask.query, "end")
    )


@routes.get(
    "workloads/{uid}/timeline",
    Param("start", "time", "unix seconds or RFC 3339; none: the workload's start"),
    Param("end", "time", "unix seconds or RFC 3339; none: now"),
)
def timeline(ask: Ask) -> Any:
    """A workload's timeline, oldest first: training slowdowns, stalls and outliers, GPU
    faults and throttling, device changes, OOM kills and exits, pod events, network
    regressions; each naming its pod, node and device."""
    c = ask.c
    return Timeline(c.prom, ask.app.cfg.timeline, c.tables)(
        ask.conn, ask.arg("uid"), when(ask.query, "start"), when(ask.query, "end"), ask.now()
    )
