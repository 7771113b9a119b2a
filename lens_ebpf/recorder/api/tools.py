"""The recorder's routes as MCP tools, each made of the route table entry that serves it
over HTTP: its name (`lens_` and the route's path in snake_case, `{uid}` as `uid`; the
seed's `lens_seed_`; or the name the route gives), its description (the handler's
docstring), its input schema (the parameters the route and its surface declare: types,
required, defaults, bounds, choices), and its answer (the route's own, called through its
surface as HTTP calls it: a write admitted on its head first, the same checks, the same
JSON). A tool for every GET but a file's download, and for the writes that say so
(`tool=` where they are declared). A composed tool answers one question with several
routes' answers (COMPOSED: a workload's why).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from lens_ebpf.core.routes import WRITES, Answer, Param, Request, Route, Surface

PREFIX = "lens_"
NAMED = {"plain": "lens_seed_"}  # a surface whose routes' names would be another's
# a request's own: not what a route called as a tool is asked with
HOP = (
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "accept",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
)


class ToolError(Exception):
    """A call a tool refuses before any route is asked (an unknown argument)."""


def tool_name(route: Route, prefix: str = PREFIX) -> str:
    """The route's tool name: the one it gives, or prefix and its path in snake_case."""
    if isinstance(route.tool, str):
        return route.tool
    words = (
        re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", p.strip("{}")).lower().replace("-", "_")
        for p in route.parts
    )
    return prefix + "_".join(words)


def is_tool(route: Route) -> bool:
    """Every GET unless it says not (a file's download); a write only where it says so."""
    return route.tool is not False and (route.tool is not None or route.method == "GET")


def description(handler: Callable[..., Any]) -> str:
    """The handler's docstring, its lines joined ("" when it has none)."""
    doc = handler.__doc__ or ""
    return "\n\n".join(" ".join(para.split()) for para in doc.strip().split("\n\n") if para)


def input_schema(params: Iterable[Param]) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments: one property per parameter."""
    params = list(params)
    out: dict[str, Any] = {
        "type": "object",
        "properties": {p.name: p.schema() for p in params},
        "additionalProperties": False,
    }
    if required := [p.name for p in params if p.required]:
        out["required"] = required
    return out


@dataclass(frozen=True)
class Result:
    """A tool's answer: the route's HTTP status and its body's text; the JSON in it (None
    where it is none); the error's message where the status is one."""

    status: int
    text: str
    data: Any
    error: str | None

    @classmethod
    def of(cls, got: Answer) -> Result:
        status, ctype, body = got[0], got[1], got[2]
        text = body.decode("utf-8", "replace")
        data = None
        if ctype.split(";")[0].strip() == "application/json":
            try:
                data = json.loads(body)
            except ValueError:
                data = None
        if status < 400:
            return cls(status, text, data, None)
        said = data.get("meta") if isinstance(data, dict) else None
        message = said.get("message") if isinstance(said, dict) else None
        if message is None and isinstance(data, dict):
            message = data.get("error")
        return cls(status, text, data, str(message) if message is not None else text.strip())


@dataclass(frozen=True)
class Tool:
    """A route as a tool: how it is named and described, what it takes, the surface
    that calls it, and the path HTTP serves it at."""

    name: str
    description: str
    route: Route
    surface: Surface
    served: str  # its HTTP path under the first prefix it is served at

    @property
    def params(self) -> tuple[Param, ...]:
        return self.surface.declared(self.route)

    @property
    def schema(self) -> dict[str, Any]:
        return input_schema(self.params)

    @property
    def write(self) -> bool:
        return self.route.method in WRITES

    def request(self, args: dict[str, Any], head: Request) -> Request:
        """The request HTTP would hand the route for args: path parameters in the path,
        the others in the query (as text), a write's body fields as its JSON body; the
        credentials and client of head (the /mcp request)."""
        params = self.params
        unknown = sorted(set(args) - {p.name for p in params})
        if unknown:
            raise ToolError(
                f"{', '.join(unknown)}: not an argument of {self.name} (it takes "
                f"{', '.join(p.name for p in params) or 'none'})"
            )
        path = {p.name: text(args[p.name]) for p in self.route.path_params if p.name in args}
        if missing := [p.name for p in self.route.path_params if not path.get(p.name)]:
            raise ToolError(f"{', '.join(missing)} is required")
        query = {
            p.name: text(args[p.name])
            for p in params
            if not p.body and p.name not in path and args.get(p.name) is not None
        }
        fields = {p.name: args[p.name] for p in params if p.body and p.name in args}
        body = json.dumps(fields).encode() if self.write else b""
        headers = {k: v for k, v in head.headers.items() if k not in HOP}
        if self.write:
            headers |= {"content-type": "application/json", "content-length": str(len(body))}
        at = "/".join(path[s[1:-1]] if s.startswith("{") else s for s in self.route.parts)
        return Request(at, path, query, headers, body, head.peer, head.certified, head.subject)

    def call(self, args: dict[str, Any], head: Request) -> Result:
        """The route's answer for args, as HTTP answers it (on the caller's thread: a
        handler blocks on its database)."""
        req = self.request(args, head)
        if self.write:
            refused = self.surface.admit(self.route, replace(req, body=b""))
            if refused is not None:
                return Result.of(refused)
        return Result.of(self.surface.call(self.route, req))


def text(value: Any) -> str:
    """An argument as a query's text: true/false, numbers as JSON writes them, a list
    as a,b,c."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ",".join(text(v) for v in value)
    return json.dumps(value)


def tools(
    routes: Iterable[tuple[Iterable[Route], tuple[str, ...], str]], surfaces: dict[str, Surface]
) -> dict[str, Tool]:
    """Every route that is a tool, by name (a name made twice is an error): routes as
    ROUTES lists them (a table's routes, its prefixes, its surface's name)."""
    out: dict[str, Tool] = {}
    for table, prefixes, surface in routes:
        for r in table:
            if not is_tool(r):
                continue
            name = tool_name(r, NAMED.get(surface, PREFIX))
            if name in out:
                raise ValueError(f"tool {name}: made of {out[name].served} and of /{r.path}")
            out[name] = Tool(
                name, description(r.handler), r, surfaces[surface], f"{prefixes[0]}/{r.path}"
            )
    return out


@dataclass(frozen=True)
class Composed:
    """A tool answering one question with several tools' answers: {part: its data}, each
    part asked with the arguments it takes of the composed tool's."""

    name: str
    description: str
    params: tuple[Param, ...]
    parts: tuple[tuple[str, str, dict[str, str]], ...]  # (key, tool, {its arg: ours})

    @property
    def schema(self) -> dict[str, Any]:
        return input_schema(self.params)

    def call(self, args: dict[str, Any], head: Request, known: dict[str, Tool]) -> Result:
        unknown = sorted(set(args) - {p.name for p in self.params})
        if unknown:
            raise ToolError(
                f"{', '.join(unknown)}: not an argument of {self.name} (it takes "
                f"{', '.join(p.name for p in self.params)})"
            )
        out: dict[str, Any] = {}
        for key, tool, asks in self.parts:
            got = known[tool].call(
                {theirs: args[ours] for theirs, ours in asks.items() if args.get(ours) is not None},
                head,
            )
            if got.error is not None and key == self.parts[0][0]:
                return got  # the first part says whether the question has an answer
            out[key] = (
                {"error": got.error}
                if got.error is not None
                else got.data.get("data")
                if isinstance(got.data, dict)
                else got.data
            )
        return Result(200, json.dumps(out, sort_keys=True), out, None)


COMPOSED = (
    Composed(
        "lens_workload_why",
        "Why a workload ran as it did, in one answer: its detail (GPUs, pods, status), its "
        "timeline (slowdowns, stalls, outliers, GPU faults and throttling, OOM kills, "
        "network regressions), its alerts and its training performance; each part as its "
        "own tool answers it (an error in a part is said there).",
        (
            Param("uid", doc="the workload's uid", required=True),
            Param("cluster", doc="the cluster it runs in; none: the home cluster"),
            Param("start", "time", "unix seconds or RFC 3339; none: the workload's start"),
            Param("end", "time", "unix seconds or RFC 3339; none: now"),
        ),
        (
            ("workload", "lens_workloads_uid", {"uid": "uid", "cluster": "cluster"}),
            (
                "timeline",
                "lens_workloads_uid_timeline",
                {"uid": "uid", "cluster": "cluster", "start": "start", "end": "end"},
            ),
            ("alerts", "lens_alerts", {"workload_id": "uid", "cluster": "cluster"}),
            (
                "training",
                "lens_workloads_uid_training_performance",
                {"uid": "uid", "cluster": "cluster", "start": "start", "end": "end"},
            ),
        ),
    ),
)
