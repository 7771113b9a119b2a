"""The maps remote write copies are made by, at Primus-Lens's paths (served at the root
too, as the telemetry processor serves them)."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder.api.envelope import Ask

routes = RouteTable()


@routes.get("pods/cache", Param("node", doc="one node's; none: every node's"))
def pods_cache(ask: Ask) -> Any:
    """Which pod holds each GPU: node -> device label -> device -> [pod name, pod uid]."""
    return ask.app.remote_write.pods_cache(ask.c.name, ask.query.get("node", ""))


@routes.get("pods/workload/cache")
def workload_cache(ask: Ask) -> Any:
    """Each GPU pod's workloads: pod name -> [[workload name, workload uid], ...]."""
    return ask.app.remote_write.workload_cache(ask.c.name)
