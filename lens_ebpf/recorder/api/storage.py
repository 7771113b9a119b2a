"""The storage scan of the cluster asked about: its backends, its volumes."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import RouteTable
from lens_ebpf.recorder.api.envelope import PAGE, Ask, page
from lens_ebpf.recorder.errors import Unavailable
from lens_ebpf.recorder.storage import StorageScan

routes = RouteTable()


def scan(ask: Ask) -> StorageScan:
    w = ask.app.clusters.get(ask.c.name)
    if w is None or w.storage is None:
        raise Unavailable(f"cluster {ask.c.name!r} is not watched: {w.error if w else 'gone'}")
    return w.storage


@routes.get("storage/overview")
def overview(ask: Ask) -> Any:
    """Per storage backend: its class, volumes, capacity requested and used, the pods using
    it, whether it is healthy."""
    return scan(ask).overview()


@routes.get("storage/volumes", PAGE)
def volumes(ask: Ask) -> Any:
    """One page of the volume claims: capacity, usage, the pods and nodes mounting each."""
    num, size = page(ask.query)
    return scan(ask).volumes(num, size)
