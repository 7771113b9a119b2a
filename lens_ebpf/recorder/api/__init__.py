"""The recorder's HTTP API: every route table, listed once here with where it is served.

A route goes in the module of its resource (`nodes.py`: `@routes.get("nodes/{name}")`),
its handler thin: parameters parsed and checked (envelope.py), a domain function of
`lens_ebpf.recorder` called, its data returned; the surface puts it in its envelope.
A new resource's module adds its table to ROUTES.
"""

from __future__ import annotations

from lens_ebpf.core.http import HttpServer
from lens_ebpf.core.routes import RouteTable, Surface
from lens_ebpf.recorder.api import (
    aggregation,
    alerts,
    clusters,
    devices,
    nodes,
    posts,
    remote_write,
    reports,
    seed,
    storage,
    training,
    workloads,
)
from lens_ebpf.recorder.api.envelope import PREFIXES

ROOT = ("",)
# (the table, the prefixes it is served under, its surface: "lens" the Primus-Lens API's
# envelope, "alerts" the same with ?cluster= read by the handlers, "plain" the seed's
# JSON, "posts" the POST routes' token check and envelope)
ROUTES: list[tuple[RouteTable, tuple[str, ...], str]] = [
    (clusters.routes, PREFIXES, "lens"),
    (nodes.routes, PREFIXES, "lens"),
    (workloads.routes, PREFIXES, "lens"),
    (devices.routes, PREFIXES, "lens"),
    (storage.routes, PREFIXES, "lens"),
    (aggregation.routes, PREFIXES, "lens"),
    (training.routes, PREFIXES, "lens"),
    (reports.routes, PREFIXES, "lens"),
    (reports.files, PREFIXES, "lens-files"),  # the report's HTML, PDF and JSON files
    (alerts.routes, PREFIXES, "alerts"),  # the Alert pages': ?cluster= any alert's cluster
    (alerts.files, PREFIXES, "alerts-files"),  # the metric rules as one rules file
    (remote_write.routes, (*PREFIXES, *ROOT), "lens"),  # /pods/cache as the original serves it
    (seed.routes, ROOT, "plain"),
    (posts.routes, (*ROOT, "/v1", "/api"), "posts"),
]


def mount(http: HttpServer, surfaces: dict[str, Surface]) -> None:
    """Every table of ROUTES on http, each through its surface."""
    surfaces = {**surfaces, "lens-files": reports.LensFiles(surfaces["lens"]),
                "alerts-files": reports.LensFiles(surfaces["alerts"])}  # fmt: skip
    for table, prefixes, surface in ROUTES:
        for prefix in prefixes:
            http.mount(prefix, surfaces[surface], table)
