"""The route table (core/routes.py): declared with a decorator, mounted under prefixes,
literal segments before parameters, served by HttpServer through a surface."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from lens_ebpf.core.http import HttpServer, json_response
from lens_ebpf.core.routes import Answer, Request, Route, Routes, RouteTable, Surface


class Echo(Surface):
    """handler(req) -> data, as {"data": ...}; a path no route holds: 404 of its own."""

    def call(self, route: Route, req: Request) -> Answer:
        return json_response(200, {"data": route.handler(req)})

    def missing(self, req: Request) -> Answer:
        return json_response(404, {"missing": req.path})


def table() -> RouteTable:
    routes = RouteTable()

    @routes.get("nodes/{name}")
    def node(req: Request) -> str:
        return f"node {req.params['name']}"

    @routes.get("nodes/fragmentation-analysis")
    def fragmentation(req: Request) -> str:
        return "fragmentation"

    @routes.get("workloads/{uid}/{what}")
    def part(req: Request) -> str:
        return f"{req.params['uid']} {req.params['what']}"

    @routes.get("workloads/statistics/{what}")
    def statistics(req: Request) -> str:
        return f"statistics {req.params['what']}"

    @routes.post("logs", max_body=10)
    def logs(req: Request) -> int:
        return len(req.body)

    return routes


def test_literal_segments_win_over_parameters_in_any_order() -> None:
    for order in (1, -1):
        t = table()
        t.routes = t.routes[::order]
        r = Routes()
        r.mount("/v1", Echo(), t)
        assert (found := r.find("GET", "/v1/nodes/fragmentation-analysis"))
        assert found[0].route.path == "nodes/fragmentation-analysis" and found[1] == {}
        assert (found := r.find("GET", "/v1/nodes/gpu-7"))
        assert found[0].route.path == "nodes/{name}" and found[1] == {"name": "gpu-7"}
        assert (found := r.find("GET", "/v1/workloads/statistics/gpu"))
        assert found[0].route.path == "workloads/statistics/{what}"
        assert (found := r.find("GET", "/v1/workloads/u1/gpu"))
        assert found[1] == {"uid": "u1", "what": "gpu"}
        assert r.find("GET", "/v1/nodes") is None and r.find("GET", "/nodes/x") is None
        assert r.find("POST", "/v1/nodes/x") is None and r.find("POST", "/v1/logs")


def test_a_route_declared_or_mounted_twice_is_an_error() -> None:
    t = table()
    with pytest.raises(ValueError, match="declared twice"):
        t.get("/nodes/{name}/")(lambda req: None)
    r = Routes()
    r.mount("/v1", Echo(), t)
    with pytest.raises(ValueError, match="mounted twice"):
        r.mount("v1/", Echo(), t)


def get(
    port: int, path: str, data: bytes | None = None, ctype: str = "application/json"
) -> tuple[int, object]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        headers={"Content-Type": ctype} if data is not None else {},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_server_serves_mounted_tables_through_their_surface() -> None:
    http = HttpServer("127.0.0.1", 0, CollectorRegistry(auto_describe=False))
    http.mount("/v1", Echo(), table())
    http.mount("/api", Echo(), table())
    http.start()
    try:
        port = http.port
        assert get(port, "/v1/nodes/fragmentation-analysis/") == (200, {"data": "fragmentation"})
        assert get(port, "/api/nodes/gpu%2D7") == (200, {"data": "node gpu-7"})
        assert get(port, "/v1/nothing/here?x=1") == (404, {"missing": "nothing/here"})
        assert get(port, "/elsewhere") == (404, {"error": "no route /elsewhere"})
        assert get(port, "/v1/logs", b"12345") == (200, {"data": 5})
        assert get(port, "/v1/logs", b"x" * 11) == (413, {"error": "body of 11 bytes: over 10"})
        # a body of a type the route does not take (a browser's form): 415, before it is read
        for ctype in ("application/x-www-form-urlencoded", "text/plain", ""):
            said = f"Content-Type {ctype}" if ctype else "no Content-Type"
            assert get(port, "/v1/logs", b"12345", ctype) == (
                415,
                {"error": f"{said}: this route takes application/json"},
            )
        assert get(port, "/v1/logs", b"12345", "application/merge-patch+json")[0] == 200
        assert get(port, "/v1/nodes/a", b"x") == (405, {"error": "POST not allowed here (GET is)"})
        assert get(port, "/x", b"x") == (405, {"error": "POST not allowed here (nothing is)"})
    finally:
        http.stop()
