"""The recorder's HTTP API: every route table, listed once here with where it is served.

A route goes in the module of its resource (`nodes.py`: `@routes.get("nodes/{name}")`),
its handler thin: parameters parsed and checked (envelope.py), a domain function of
`lens_ebpf.recorder` called, its data returned; the surface puts it in its envelope.
A new resource's module adds its table to ROUTES. Each route declares its parameters
(core/routes.py's Param), checked by its surface; the same declaration makes it an MCP
tool at /mcp (tools.py, assistants.py).
"""

from __future__ import annotations

from lens_ebpf.core.http import HttpServer
from lens_ebpf.core.routes import RouteTable, Surface
from lens_ebpf.recorder.api import (
    aggregation,
    alert_silences,
    alerts,
    assistants,
    clusters,
    detection,
    devices,
    job_history,
    log_rules,
    management,
    metric_rules,
    nodes,
    posts,
    profiler,
    pyspy,
    releases,
    remote_write,
    reports,
    storage,
    stored,
    system_config,
    training,
    workload_page,
    workloads,
)
from lens_ebpf.recorder.api.envelope import PREFIXES, LensApi
from lens_ebpf.recorder.api.tools import tools

ROOT = ("",)
# (the table, the prefixes it is served under, its surface: "lens" the Primus-Lens API's
# envelope, "alerts" the same with ?cluster= read by the handlers, "plain" the seed's
# JSON, "posts" the POST routes' token check and envelope, "mcp" the routes as MCP tools)
ROUTES: list[tuple[RouteTable, tuple[str, ...], str]] = [
    (clusters.routes, PREFIXES, "lens"),
    (nodes.routes, PREFIXES, "lens"),
    (workloads.routes, PREFIXES, "lens"),
    (workload_page.routes, PREFIXES, "lens"),  # events, gpuMetrics, stats, batchStats
    (devices.routes, PREFIXES, "lens"),
    (storage.routes, PREFIXES, "lens"),
    (aggregation.routes, PREFIXES, "lens"),
    (training.routes, PREFIXES, "lens"),
    (reports.routes, PREFIXES, "lens"),
    (reports.files, PREFIXES, "lens-files"),  # the report's HTML, PDF and JSON files
    (alerts.routes, PREFIXES, "alerts"),  # the Alert pages': ?cluster= any alert's cluster
    (alert_silences.routes, PREFIXES, "alerts"),
    (metric_rules.routes, PREFIXES, "alerts"),
    (metric_rules.files, PREFIXES, "alerts-files"),  # the metric rules as one rules file
    (log_rules.routes, PREFIXES, "alerts"),  # log rules and their templates
    (job_history.routes, PREFIXES, "lens"),  # the Management pages'
    (detection.routes, PREFIXES, "lens"),
    (system_config.routes, PREFIXES, "lens"),
    (releases.routes, PREFIXES, "lens"),
    (management.routes, PREFIXES, "management"),  # the original's: no envelope
    (remote_write.routes, (*PREFIXES, *ROOT), "lens"),  # /pods/cache as the original serves it
    (stored.routes, ROOT, "plain"),
    (pyspy.routes, PREFIXES, "lens"),  # the Py-Spy Profiler tab: process trees, py-spy
    (pyspy.files, PREFIXES, "lens-files"),  # a py-spy task's file
    (profiler.routes, PREFIXES, "lens"),  # profiler traces, TraceLens and viewer sessions
    (profiler.files, PREFIXES, "lens-files"),  # a trace's bytes, the analysis, the viewer
    (posts.routes, (*ROOT, "/v1", "/api"), "posts"),
    (assistants.routes, ROOT, "mcp"),  # /mcp: the tables above as MCP tools
]


def mount(http: HttpServer, surfaces: dict[str, Surface]) -> assistants.Assistants:
    """Every table of ROUTES on http, each through its surface; the MCP tools' surface
    (its close() stops the SDK's session manager)."""
    surfaces = {
        **surfaces,
        "lens-files": reports.LensFiles(surfaces["lens"]),
        "alerts-files": reports.LensFiles(surfaces["alerts"]),
        "management": management.ManagementApi(surfaces["lens"]),
    }
    lens = surfaces["lens"]
    assert isinstance(lens, LensApi)
    mcp = assistants.Assistants(
        tools([(t.routes, p, s) for t, p, s in ROUTES if s != "mcp"], surfaces),
        lens.app,
        lens.connect,
    )
    surfaces["mcp"] = mcp
    for table, prefixes, surface in ROUTES:
        for prefix in prefixes:
            http.mount(prefix, surfaces[surface], table)
    return mcp
