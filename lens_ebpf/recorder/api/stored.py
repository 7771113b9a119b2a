"""The workloads and pods as stored, and the probes: the seed's own REST, in plain JSON
at the root: /healthz, /readyz, /workloads[/{uid}], /pods (paged with limit and
continue; errors `{"error": ...}`: 400, 404, 503)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lens_ebpf.core.http import json_response
from lens_ebpf.core.routes import Answer, Param, Request, Route, RouteTable, Surface
from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.api.envelope import Ask, Connect, Services, check, down, failure
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.store import queries

routes = RouteTable()
CLUSTER = Param("cluster", doc="a followed cluster's name; none: the home cluster")
PAGE = (
    Param("limit", "integer", "rows a page (1 to recorder.page_max; default 100 or it)"),
    Param("continue", doc="the token of the previous page's answer"),
)


class PlainJson(Surface):
    """handler(ask) -> data as JSON; a (status, data) pair where it says its own status."""

    def __init__(self, app: Services, connect: Connect) -> None:
        self.app, self.connect = app, connect

    def call(self, route: Route, req: Request) -> Answer:
        ask = Ask(req, self.app, None, self.connect)
        try:
            inputs.parameters(req.params, req.query)
            check(self.declared(route), req)
            got = route.handler(ask)
            if ask._conn is not None:
                self.app.outage.answered()
        except Exception as exc:  # as the API answers it: status and message
            e = failure(exc)
            if e is None:
                raise
            if down(exc):
                self.app.outage.failed(exc)
            return json_response(e.status, {"error": e.message})
        finally:
            ask.close()
        if isinstance(got, Status):
            return json_response(got.code, got.data)
        return json_response(200, got)


@dataclass(frozen=True)
class Status:
    """A handler's data with a status of its own."""

    code: int
    data: Any


def cluster(ask: Ask) -> str:
    """The cluster ?cluster= names (a name not followed reads nothing); the home one."""
    return ask.query.get("cluster") or ask.app.cfg.cluster_name


@routes.get("healthz", probe=True)
def healthz(ask: Ask) -> Any:
    """The service is up: {status: ok}."""
    return {"status": "ok"}


@routes.get("readyz", probe=True)
def readyz(ask: Ask) -> Any:
    """Ready while the home cluster's pods are listed and the database takes writes."""
    ready, body = ask.app.readiness()
    return Status(200 if ready else 503, body)


@routes.get(
    "workloads",
    CLUSTER,
    PAGE,
    Param("namespace"),
    Param("kind"),
    Param("running", "boolean", "running ones (true) or not (false)"),
    Param("deleted", "boolean", "deleted ones (true) or not (false)"),
    Param("top", "boolean", "true: only workloads without a parent"),
)
def workloads(ask: Ask) -> Any:
    """A cluster's workloads as stored, oldest first, one page: {items, continue}."""
    page = queries.page_of(ask.query, ask.app.cfg.page_max)
    return queries.workloads(ask.conn, ask.query, page, cluster=cluster(ask))


@routes.get("workloads/{uid}", CLUSTER)
def workload(ask: Ask) -> Any:
    """One workload as stored, with its children, its pods (with their GPUs) and their
    events."""
    uid, name = ask.arg("uid"), cluster(ask)
    found = queries.workload(ask.conn, uid, name)
    if found is None:
        raise NotFound(f"no workload {uid} in cluster {name}")
    return found


@routes.get(
    "pods",
    CLUSTER,
    PAGE,
    Param("node"),
    Param("namespace"),
    Param(
        "since",
        doc="alive at any time since: RFC 3339, unix seconds, or an age " "(90s, 30m, 12h, 7d)",
    ),
)
def pods(ask: Ask) -> Any:
    """A cluster's GPU pods as stored, oldest first, one page: {items, continue}."""
    page = queries.page_of(ask.query, ask.app.cfg.page_max)
    return queries.pods(ask.conn, ask.query, page, now=ask.now(), cluster=cluster(ask))
