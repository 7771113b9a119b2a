"""A workload's training: its performance from its pods' logs, and its timeline."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import RouteTable
from lens_ebpf.recorder.api.envelope import Ask, when
from lens_ebpf.recorder.training.performance import training_performance
from lens_ebpf.recorder.training.timeline import Timeline

routes = RouteTable()


@routes.get("workloads/{uid}/trainingPerformance")
def performance(ask: Ask) -> Any:
    """?start=&end= (unix seconds, milliseconds or RFC 3339)."""
    return training_performance(ask.conn, ask.c.tables, ask.arg("uid"),
                                when(ask.query, "start"), when(ask.query, "end"))  # fmt: skip


@routes.get("workloads/{uid}/timeline")
def timeline(ask: Ask) -> Any:
    """?start=&end= (unix seconds or RFC 3339; default the workload's life up to now)."""
    c = ask.c
    return Timeline(c.prom, ask.app.cfg.timeline, c.tables)(
        ask.conn, ask.arg("uid"), when(ask.query, "start"), when(ask.query, "end"),
        ask.now())  # fmt: skip
