"""The weekly GPU utilization reports: listed, shown, and downloaded (HTML, PDF, JSON).

The downloads answer the file itself (as the original's web UI links to them); their
errors, and every other route, the Primus-Lens envelope."""

from __future__ import annotations

import dataclasses
from typing import Any

from lens_ebpf.core.routes import Answer, Param, Request, Route, RouteTable, Surface
from lens_ebpf.recorder.api.envelope import PAGE_MAX, Ask, bad, integer, param
from lens_ebpf.recorder.reports import weekly

routes = RouteTable()  # the envelope
files = RouteTable()  # the file, or an error in the envelope
BASE = "weekly-reports/gpu_utilization"
TYPES = {"html": "text/html; charset=utf-8", "pdf": "application/pdf", "json": "application/json"}
SIZE_MAX = 100  # the original's page size bound


@routes.get(
    BASE,
    Param("cluster_name", doc="the reports of this cluster (cluster= too)"),
    Param("status", doc="generated or failed"),
    Param("page", "integer", "the page, from 1", default=1, minimum=1),
    Param("page_size", "integer", f"reports a page (at most {SIZE_MAX})", default=20),
    Param("size", "integer", "as page_size"),
)
def listing(ask: Ask) -> Any:
    """The weekly GPU utilization reports, newest period first, one page."""
    q = ask.query
    num = integer(q, "page", 1)
    size = integer(q, "size", 0) or integer(q, "page_size", 20)
    if num < 1 or not 1 <= size <= PAGE_MAX:
        raise bad(
            f"page={num}, page_size={size}: page must be 1 or more, page_size from 1 "
            f"to {PAGE_MAX}"
        )
    cluster = param(q, "cluster_name") or param(q, "cluster") or ""
    return weekly.listing(ask.conn, cluster, param(q, "status") or "", num, min(size, SIZE_MAX))


@routes.get(f"{BASE}/latest")
def latest(ask: Ask) -> Any:
    """The newest weekly GPU utilization report of the cluster asked about (its summary,
    workloads and figures)."""
    return weekly.latest(ask.conn, ask.c.name)


@routes.get(f"{BASE}/{{id}}")
def detail(ask: Ask) -> Any:
    """One weekly GPU utilization report by id (its summary, workloads and figures)."""
    return weekly.detail(ask.conn, ask.arg("id"))


def _download(fmt: str) -> Any:
    def handler(ask: Ask) -> Answer:
        """The report as a file to download."""
        name, body = weekly.download(ask.conn, ask.arg("id"), fmt)
        how = "inline" if fmt == "html" else "attachment"
        return 200, TYPES[fmt], body, {"Content-Disposition": f"{how}; filename={name}"}

    return handler


for _fmt in weekly.FORMATS:  # a download, not a tool: the report's detail is its JSON
    files.get(f"{BASE}/{{id}}/{_fmt}", tool=False)(_download(_fmt))


class LensFiles(Surface):
    """The Primus-Lens surface for routes that answer a file: the handler's answer as it
    is, its errors in the envelope."""

    def __init__(self, lens: Surface) -> None:
        self.lens = lens

    def call(self, route: Route, req: Request) -> Answer:
        got: list[Answer] = []

        def keep(ask: Ask) -> None:
            got.append(route.handler(ask))

        answer = self.lens.call(dataclasses.replace(route, handler=keep), req)
        return got[0] if got else answer

    def admit(self, route: Route, head: Request) -> Answer | None:
        return self.lens.admit(route, head)  # a write's credentials: the API's

    def refuse(self, route: Route, status: int, message: str) -> Answer:
        return self.lens.refuse(route, status, message)

    def missing(self, req: Request) -> Answer | None:
        return self.lens.missing(req)
