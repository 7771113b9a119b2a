"""Device collectors; importing all_collectors() registers each by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lens_ebpf.devices.collector import REGISTRY, DeviceCollector


def all_collectors() -> dict[str, Callable[[Any], DeviceCollector]]:
    """name -> factory, after importing every collector module."""
    from lens_ebpf.devices import system  # noqa: F401
    from lens_ebpf.devices.gpu import collector as _gpu  # noqa: F401
    from lens_ebpf.devices.rdma import collector  # noqa: F401

    return dict(REGISTRY)


__all__ = ["DeviceCollector", "all_collectors"]
