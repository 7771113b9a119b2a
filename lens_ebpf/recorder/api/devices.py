"""The nodes' devices: what a node holds, what changed, one device's history."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import RouteTable
from lens_ebpf.recorder import devices
from lens_ebpf.recorder.api.envelope import Ask, page, when

routes = RouteTable()


@routes.get("nodes/{name}/devices")
def node_devices(ask: Ask) -> Any:
    return devices.node_devices(ask.conn, ask.c.tables, ask.arg("name"))


@routes.get("nodes/{name}/devices/changelog")
def changelog(ask: Ask) -> Any:
    """?since=&page_num=&page_size="""
    num, size = page(ask.query)
    since = when(ask.query, "since")
    return devices.changelog(ask.conn, ask.c.tables, ask.arg("name"), since, num, size)


@routes.get("devices/{serial}/history")
def device_history(ask: Ask) -> Any:
    return devices.device_history(ask.conn, ask.c.tables, ask.arg("serial"))
