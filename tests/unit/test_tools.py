"""A route's declaration (core/routes.py's Param), both ways: the HTTP surface checks a
request against it (recorder/api/envelope.py's check), and it makes the route's MCP tool
(recorder/api/tools.py): name, description, input schema, and the request a call makes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lens_ebpf.core.http import json_response
from lens_ebpf.core.routes import Answer, Param, Request, Route, RouteTable, Surface
from lens_ebpf.recorder.api import ROUTES
from lens_ebpf.recorder.api.envelope import PAGE, check
from lens_ebpf.recorder.api.tools import Result, Tool, ToolError, description, is_tool, tools
from lens_ebpf.recorder.errors import BadRequest


class Echo(Surface):
    """handler(req) -> data; every route takes ?cluster=."""

    params = (Param("cluster", doc="the cluster"),)

    def call(self, route: Route, req: Request) -> Answer:
        check(self.declared(route), req)
        return json_response(200, {"data": route.handler(req)})


def table() -> RouteTable:
    routes = RouteTable()

    @routes.get(
        "nodes/{name}/gpuMetrics",
        Param("start", "integer", "unix seconds", required=True),
        Param("step", "integer", default=60, minimum=1),
        PAGE,
    )
    def metrics(req: Request) -> Any:
        """A node's GPU graphs."""
        return {"params": req.params, "query": req.query}

    @routes.get("reports/{id}/pdf", tool=False)
    def pdf(req: Request) -> Any:
        """A file."""

    @routes.post(
        "alert-silences/{id}/note",
        Param("id", "integer", "its id"),
        Param("text", required=True, body=True),
        Param("tags", "list", body=True),
        tool="lens_note",
    )
    def note(req: Request) -> Any:
        """Adds a note."""
        return json.loads(req.body)

    @routes.delete("alert-silences/{id}")
    def delete(req: Request) -> Any:
        """Not a tool."""

    return routes


def test_a_tool_is_named_described_and_typed_from_its_route() -> None:
    made = tools([(table().routes, ("/v1",), "x")], {"x": Echo()})
    assert sorted(made) == ["lens_nodes_name_gpu_metrics", "lens_note"]
    t = made["lens_nodes_name_gpu_metrics"]
    assert (t.description, t.served, t.write) == (
        "A node's GPU graphs.",
        "/v1/nodes/{name}/gpuMetrics",
        False,
    )
    assert t.schema == {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "start"],
        "properties": {
            "name": {"type": "string", "description": "{name} in nodes/{name}/gpuMetrics"},
            "start": {"type": "integer", "description": "unix seconds"},
            "step": {"type": "integer", "default": 60, "minimum": 1},
            "page_num": {
                "type": "integer",
                "description": "the page, from 1",
                "default": 1,
                "minimum": 1,
                "maximum": 9223372036854775,
            },
            "page_size": {
                "type": "integer",
                "description": "rows a page",
                "default": 10,
                "minimum": 1,
                "maximum": 1000,
            },
            "cluster": {"type": "string", "description": "the cluster"},
        },
    }
    note = made["lens_note"].schema
    assert note["required"] == ["id", "text"]
    assert note["properties"]["id"] == {"type": "integer", "description": "its id"}
    assert note["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}


def test_a_call_is_the_request_http_would_make() -> None:
    t = tools([(table().routes, ("/v1",), "x")], {"x": Echo()})
    head = Request(
        "mcp",
        {},
        {},
        {
            "authorization": "Bearer t",
            "content-type": "application/json",
            "content-length": "99",
            "mcp-protocol-version": "x",
        },
        b"{...}",
        "10.0.0.1",
        True,
        "alice",
    )
    req = t["lens_nodes_name_gpu_metrics"].request(
        {"name": "gpu 1", "start": 5, "page_size": 20, "cluster": None}, head
    )
    assert (req.path, req.params, req.query, req.body) == (
        "nodes/gpu 1/gpuMetrics",
        {"name": "gpu 1"},
        {"start": "5", "page_size": "20"},
        b"",
    )
    assert req.headers == {"authorization": "Bearer t"}
    assert (req.peer, req.certified, req.subject) == ("10.0.0.1", True, "alice")
    write = t["lens_note"].request({"id": 7, "text": "hi", "tags": ["a", "b"]}, head)
    assert (write.path, write.query, json.loads(write.body)) == (
        "alert-silences/7/note",
        {},
        {"text": "hi", "tags": ["a", "b"]},
    )
    assert write.headers["content-type"] == "application/json"
    assert write.headers["content-length"] == str(len(write.body))
    with pytest.raises(
        ToolError,
        match="^pagesize: not an argument of lens_nodes_name_gpu_"
        "metrics .it takes name, start, step, page_num, "
        "page_size, cluster.$",
    ):
        t["lens_nodes_name_gpu_metrics"].request({"name": "x", "pagesize": 1}, head)
    with pytest.raises(ToolError, match="^name is required$"):
        t["lens_nodes_name_gpu_metrics"].request({"start": 1}, head)
    # called: checked as HTTP checks it, answered as the route answers
    got = t["lens_nodes_name_gpu_metrics"].call({"name": "n", "start": 5}, head)
    assert (got.status, got.error, got.data["data"]["query"]) == (200, None, {"start": "5"})
    with pytest.raises(BadRequest, match="^step=0: must be 1 or more$"):
        t["lens_nodes_name_gpu_metrics"].call({"name": "n", "start": 5, "step": 0}, head)


def test_a_route_answer_is_a_tool_result() -> None:
    ok = Result.of(json_response(200, {"meta": {"code": 2000, "message": "OK"}, "data": [1]}))
    assert (ok.status, ok.error, ok.data["data"]) == (200, None, [1])
    lens = Result.of(
        json_response(400, {"meta": {"code": 4001, "message": "limit=0: no"}, "data": None})
    )
    plain = Result.of(json_response(404, {"error": "no workload x"}))
    text = Result.of((503, "text/plain", b"down\n"))
    assert (lens.error, plain.error, text.error) == ("limit=0: no", "no workload x", "down")


def at(**query: str) -> Request:
    return Request("x", {}, query)


KINDS = (
    Param("n", "integer", minimum=1, maximum=10),
    Param("f", "number"),
    Param("b", "boolean"),
    Param("t", "time"),
    Param("d", "date-time"),
    Param("s", choices=("hour", "day")),
    Param("l", "list", choices=("a", "b")),
    Param("page_num", "integer", minimum=1),
    Param("must", required=True),
)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"n": "x"}, "n='x': not a whole number"),
        ({"n": "11"}, "n=11: must be from 1 to 10"),
        ({"n": "9" * 30}, f"n='{'9' * 30}': out of range"),
        ({"f": "inf"}, "f='inf': not a finite number"),
        ({"b": "maybe"}, "b='maybe': true or false"),
        ({"t": "yesterday"}, "t='yesterday': not unix seconds, unix milliseconds or RFC 3339"),
        ({"d": "1700000000"}, "d='1700000000': an RFC 3339 time is required"),
        ({"s": "week"}, "s='week': one of hour, day"),
        ({"l": "a,c"}, "l='c': one of a, b"),
        ({"pageNum": "0"}, "pageNum=0: must be 1 or more"),  # named as the client spelled it
        ({}, "must is required"),
    ],
)
def test_http_checks_each_kind(query: dict[str, str], said: str) -> None:
    with pytest.raises(BadRequest) as got:
        check(KINDS, at(must="y", **query) if query else at())
    assert str(got.value).startswith(said)


def test_what_the_declaration_takes_passes() -> None:
    check(
        KINDS,
        at(
            n="10",
            f="1.5",
            b="Yes",
            t="2026-11-23T07:00:00Z",
            d="2026-11-23T07:00:00Z",
            s="DAY",
            l="a,b",
            pageNum="3",
            must="y",
            other="anything",
        ),
    )
    check(KINDS, at(n="", must="y"))  # "" is absent, as the handlers read it
    body = (
        Param("name", required=True, body=True),
        Param("ids", "array", body=True),
        Param("kind", choices=("x",), body=True),
    )
    check(body, Request("x", {}, {}, body=b'{"name": "n", "ids": [1], "kind": "x"}'))
    for doc, said in (
        ({"ids": [1]}, "name is required"),
        ({"name": "n", "ids": 1}, "ids: a list is required"),
        ({"name": "n", "kind": "y"}, "kind='y': one of x"),
        ({"name": 5}, "name: a string is required"),
    ):
        with pytest.raises(BadRequest, match=f"^{said}$"):
            check(body, Request("x", {}, {}, body=json.dumps(doc).encode()))


def test_a_declaration_is_checked_when_it_is_made() -> None:
    with pytest.raises(ValueError, match="kind 'int' is not one of"):
        Param("n", "int")
    with pytest.raises(ValueError, match="declared twice"):
        RouteTable().get("x", PAGE, Param("page_num"))


def test_every_route_of_the_recorder_is_described_and_named_once() -> None:
    """A route without a docstring has no tool description (this fails); every tool's
    name is made once."""
    missing = [
        f"{r.method} {r.path}" for t, _, _ in ROUTES for r in t.routes if not description(r.handler)
    ]
    assert missing == []
    surfaces: dict[str, Surface] = {s: Echo() for _, _, s in ROUTES}
    made = tools([(t.routes, p, s) for t, p, s in ROUTES if s != "mcp"], surfaces)
    routes = [r for t, _, s in ROUTES if s != "mcp" for r in t.routes if is_tool(r)]
    assert len(made) == len(routes) and all(isinstance(t, Tool) for t in made.values())
    assert all(n.startswith("lens_") and len(n) <= 64 for n in made)
