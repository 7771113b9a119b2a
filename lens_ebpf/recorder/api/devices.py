"""The nodes' devices: what a node holds, what changed, one device's history."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import devices
from lens_ebpf.recorder.api.envelope import PAGE, Ask, page, when

routes = RouteTable()


@routes.get("nodes/{name}/devices")
def node_devices(ask: Ask) -> Any:
    """A node's GPUs and RDMA ports as its agent last reported them."""
    return devices.node_devices(ask.conn, ask.c.tables, ask.arg("name"))


@routes.get(
    "nodes/{name}/devices/changelog", Param("since", "time", "unix seconds or RFC 3339"), PAGE
)
def changelog(ask: Ask) -> Any:
    """What changed on a node's devices, a row per field changed, oldest first."""
    num, size = page(ask.query)
    since = when(ask.query, "since")
    return devices.changelog(ask.conn, ask.c.tables, ask.arg("name"), since, num, size)


@routes.get("devices/{serial}/history")
def device_history(ask: Ask) -> Any:
    """A device's life (by serial, UUID or key): where it sat, its changes, the pods given
    it, the faults reported."""
    return devices.device_history(ask.conn, ask.c.tables, ask.arg("serial"))
