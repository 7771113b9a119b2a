"""Routes by resource: the one way to add one, for both services.

A module of routes makes a `RouteTable` and declares each handler on it
(`@routes.get("nodes/{name}/devices")`, `@routes.post("logs", max_body=...)`), with the
parameters it takes (`Param`: name, type, required, default): what its surface checks a
request against before the handler runs, and what an MCP tool made of the route takes;
`HttpServer.mount(prefix, surface, *tables)` serves tables under a prefix through a
`Surface`: how that API calls its handlers and wraps their answers (its envelope), and
what it asks of a write's head before a byte of its body is read (`admit`). A path
matches a route with as many segments whose literal segments are equal; where several
match, the one whose first differing segment is literal wins (`nodes/gpuAllocation`
over `nodes/{name}`, `workloads/statistics` over `workloads/{uid}`).
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

Response = tuple[int, str, bytes]
# an answer may carry headers of its own too (Retry-After, ...)
Answer = tuple[int, str, bytes] | tuple[int, str, bytes, dict[str, str]]
H = TypeVar("H", bound=Callable[..., Any])


@dataclass(frozen=True)
class Request:
    """A request as a surface gets it: the path below the mount's prefix, the path's
    parameters by name, the query's last value per key; a POST's body read whole."""

    path: str
    params: dict[str, str]
    query: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case
    body: bytes = b""
    peer: str = ""  # the client's address
    certified: bool = False  # the client presented a certificate the server's CA verified
    subject: str = ""  # that certificate's subject (its commonName)
    user: str = ""  # who a write is made by, as its surface's credentials say


WRITES = ("POST", "PUT", "PATCH", "DELETE")  # the methods whose body a route reads
JSON = ("application/json",)  # what a write takes unless it says otherwise (+json too)


# a parameter's types: its JSON Schema, and what a query's text must read as
KINDS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "boolean": {"type": "boolean"},  # true or false (1, 0, yes, no as the query's text)
    "time": {"type": ["integer", "string"]},  # unix seconds or milliseconds, or RFC 3339
    "date-time": {"type": "string", "format": "date-time"},  # RFC 3339
    "list": {"type": "array", "items": {"type": "string"}},  # the query's a,b,c
    "array": {"type": "array"},  # a write's body field
    "object": {"type": "object"},  # a write's body field
}


@dataclass(frozen=True)
class Param:
    """A parameter a route takes: in its path ({name}), its query (snake_case, the
    camelCase spelling too), or a field of a write's JSON body (body=True)."""

    name: str
    kind: str = "string"  # one of KINDS
    doc: str = ""
    required: bool = False
    default: Any = None  # what the handler takes when it is absent (said, not filled in)
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    also: tuple[str, ...] = ()  # other names it is taken under (cluster_name for cluster)
    body: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @property
    def spellings(self) -> tuple[str, ...]:
        """Its names as a query may give them: snake_case, then camelCase, of its name
        and then of the others."""
        return tuple(
            dict.fromkeys(
                spelled for name in (self.name, *self.also) for spelled in (name, camel(name))
            )
        )

    def schema(self) -> dict[str, Any]:
        """Its JSON Schema (an MCP tool's input schema holds one per parameter)."""
        out: dict[str, Any] = dict(KINDS[self.kind])
        if self.doc:
            out["description"] = self.doc
        if self.choices:
            out["enum"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.default is not None:
            out["default"] = self.default
        return out


def camel(name: str) -> str:
    """snake_case as camelCase (page_num: pageNum)."""
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


Params = Param | Iterable[Param]  # one, or a group several routes take (paging, a span)


def flat(params: Iterable[Params]) -> tuple[Param, ...]:
    out: list[Param] = []
    for p in params:
        out.extend([p] if isinstance(p, Param) else p)
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise ValueError(f"a parameter declared twice: {sorted(names)}")
    return tuple(out)


@dataclass(frozen=True)
class Route:
    method: str  # GET (HEAD too), or one of WRITES
    path: str  # segments, "{name}" for a parameter: "nodes/{name}/devices"
    handler: Callable[..., Any]
    max_body: int = 0  # a write: bodies over it get 413
    takes: tuple[str, ...] = JSON  # a write: the media types its body may declare
    probe: bool = False  # a GET answered apart from request work (health)
    params: tuple[Param, ...] = ()  # what it takes beyond its path's, and how to read it
    tool: bool | str | None = None  # an MCP tool: None, a GET is (a write not); its name

    @property
    def parts(self) -> tuple[str, ...]:
        return split(self.path)

    @property
    def path_params(self) -> tuple[Param, ...]:
        """Its path's parameters, in order: declared (an id's type), or strings."""
        declared = {p.name: p for p in self.params}
        names = [p[1:-1] for p in self.parts if p.startswith("{")]
        return tuple(
            replace(
                declared.get(n, Param(n)),
                required=True,
                doc=declared[n].doc
                if n in declared and declared[n].doc
                else f"{{{n}}} in {self.path}",
            )
            for n in names
        )

    @property
    def query_params(self) -> tuple[Param, ...]:
        inpath = {p[1:-1] for p in self.parts if p.startswith("{")}
        return tuple(p for p in self.params if not p.body and p.name not in inpath)

    @property
    def body_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.body)


def split(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.strip("/").split("/") if p)


class RouteTable:
    """One resource's routes; handlers are declared on it with get() and post()."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def get(
        self, path: str, *params: Params, probe: bool = False, tool: bool | str | None = None
    ) -> Callable[[H], H]:
        """A GET route (HEAD too) taking params; probe: a health check, answered on threads
        of its own, never queued behind other requests' work; tool: False for no MCP tool
        (a file's download), or the tool's name."""
        return self._declare(
            Route("GET", path.strip("/"), _unset, probe=probe, params=flat(params), tool=tool)
        )

    def post(
        self,
        path: str,
        *params: Params,
        max_body: int = 0,
        takes: tuple[str, ...] = JSON,
        tool: bool | str | None = None,
    ) -> Callable[[H], H]:
        """A POST route: bodies over max_body (0: the bound its surface sets) get 413; a
        body must declare a Content-Type of takes (415 otherwise, before it is read); an MCP
        tool only where tool says (True, or its name)."""
        return self._write("POST", path, params, max_body, takes, tool)

    def put(
        self,
        path: str,
        *params: Params,
        max_body: int = 0,
        takes: tuple[str, ...] = JSON,
        tool: bool | str | None = None,
    ) -> Callable[[H], H]:
        """A PUT route, bounded as post()'s."""
        return self._write("PUT", path, params, max_body, takes, tool)

    def patch(
        self,
        path: str,
        *params: Params,
        max_body: int = 0,
        takes: tuple[str, ...] = JSON,
        tool: bool | str | None = None,
    ) -> Callable[[H], H]:
        """A PATCH route, bounded as post()'s."""
        return self._write("PATCH", path, params, max_body, takes, tool)

    def delete(
        self,
        path: str,
        *params: Params,
        max_body: int = 0,
        takes: tuple[str, ...] = JSON,
        tool: bool | str | None = None,
    ) -> Callable[[H], H]:
        """A DELETE route, bounded as post()'s (its body, if any, read the same way)."""
        return self._write("DELETE", path, params, max_body, takes, tool)

    def _write(
        self,
        method: str,
        path: str,
        params: tuple[Params, ...],
        max_body: int,
        takes: tuple[str, ...],
        tool: bool | str | None,
    ) -> Callable[[H], H]:
        return self._declare(
            Route(method, path.strip("/"), _unset, max_body, takes, params=flat(params), tool=tool)
        )

    def _declare(self, proto: Route) -> Callable[[H], H]:
        def declare(handler: H) -> H:
            if any(r.method == proto.method and r.parts == proto.parts for r in self.routes):
                raise ValueError(f"{proto.method} {proto.path}: declared twice")
            self.routes.append(replace(proto, handler=handler))
            return handler

        return declare


def media_type(headers: Mapping[str, str]) -> str:
    """A request's Content-Type without its parameters, in lower case ("" when none)."""
    return headers.get("content-type", "").split(";", 1)[0].strip().lower()


def has_body(headers: Mapping[str, str]) -> bool:
    """Whether a request's head announces a body (a length above 0, or chunks)."""
    length = headers.get("content-length", "").strip()
    return (length not in ("", "0")) or "chunked" in headers.get("transfer-encoding", "").lower()


def unwanted_type(route: Route, headers: Mapping[str, str]) -> str | None:
    """Why a write's body is not one route takes (its declared Content-Type, the only
    guard a browser's cross-site form or text/plain POST cannot pass without asking
    first); None when it is, or when there is no body."""
    if not has_body(headers):
        return None
    got = media_type(headers)
    plus_json = (
        "application/json" in route.takes
        and got.startswith("application/")
        and got.endswith("+json")
    )
    if got in route.takes or plus_json:
        return None
    said = f"Content-Type {got}" if got else "no Content-Type"
    return f"{said}: this route takes {', '.join(route.takes)}"


def _unset() -> None:
    raise AssertionError("a route's handler is set when it is declared")


class Surface(abc.ABC):
    """An API as its clients see it: how its handlers are called, the envelope of their
    answers, what it asks of a write before its body is read, and the parameters every
    route of it takes (params: the Primus-Lens API's ?cluster=)."""

    params: tuple[Param, ...] = ()

    def declared(self, route: Route) -> tuple[Param, ...]:
        """Every parameter route takes here: its path's, its query's, the surface's (where
        the route does not declare one of that name), its body's fields."""
        own = {p.name for p in route.params}
        return (
            *route.path_params,
            *route.query_params,
            *(p for p in self.params if p.name not in own),
            *route.body_params,
        )

    @abc.abstractmethod
    def call(self, route: Route, req: Request) -> Answer:
        """The route's handler on req, its answer (or error) in this API's envelope."""

    def max_body(self, route: Route) -> int:
        """The most body bytes a POST route takes: its own bound, or one the API sets."""
        return route.max_body

    def admit(self, route: Route, head: Request) -> Answer | None:
        """A write's head (its body not read yet, head.body empty): the answer refusing
        it (credentials, its Content-Type), or None to read its body and call it."""
        why = unwanted_type(route, head.headers)
        return None if why is None else self.refuse(route, 415, why)

    def refuse(self, route: Route, status: int, message: str) -> Answer:
        """A request refused before its handler ran (413, 415, 408, 503), in this API's
        envelope."""
        body = (json.dumps({"error": message}, sort_keys=True) + "\n").encode()
        return status, "application/json", body

    def missing(self, req: Request) -> Answer | None:
        """The answer for a path under the prefix that no route holds; None: the server's
        plain 404."""
        return None

    def not_allowed(self, req: Request, method: str, allowed: list[str]) -> Answer | None:
        """The answer for a method no route of the path under the prefix takes (allowed:
        those that some route does); None: the server's plain 405."""
        return None


@dataclass(frozen=True)
class Mounted:
    route: Route
    surface: Surface
    prefix: str
    parts: tuple[str, ...]  # the prefix's and the route's


class Routes:
    """Every mounted route, matched by method and path (literal segments first)."""

    def __init__(self) -> None:
        self.mounted: list[Mounted] = []
        self.prefixes: list[tuple[str, Surface]] = []  # longest first: whose missing() answers

    def mount(self, prefix: str, surface: Surface, *tables: RouteTable) -> None:
        prefix = "/" + "/".join(split(prefix)) if split(prefix) else ""
        for table in tables:
            for r in table.routes:
                parts = split(prefix) + r.parts
                if any(m.parts == parts and m.route.method == r.method for m in self.mounted):
                    raise ValueError(f"{r.method} {prefix}/{r.path}: mounted twice")
                self.mounted.append(Mounted(r, surface, prefix, parts))
        if prefix and all(p != prefix for p, _ in self.prefixes):
            self.prefixes.append((prefix, surface))
            self.prefixes.sort(key=lambda ps: -len(ps[0]))

    def find(self, method: str, path: str) -> tuple[Mounted, dict[str, str]] | None:
        """The route for method and path (a path already unquoted), and its parameters."""
        parts = split(path)
        best: tuple[tuple[bool, ...], Mounted] | None = None
        for m in self.mounted:
            if m.route.method != method or len(m.parts) != len(parts):
                continue
            if all(p.startswith("{") or p == q for p, q in zip(m.parts, parts, strict=True)):
                rank = tuple(not p.startswith("{") for p in m.parts)
                if best is None or rank > best[0]:
                    best = (rank, m)
        if best is None:
            return None
        m = best[1]
        params = {p[1:-1]: q for p, q in zip(m.parts, parts, strict=True) if p.startswith("{")}
        return m, params

    def owner(self, path: str) -> tuple[str, Surface] | None:
        """The prefix and surface of a route of path under any method (a path at the root,
        under no prefix: whose envelope a method it does not take is answered in)."""
        for method in ("GET", *WRITES):
            found = self.find(method, path)
            if found is not None:
                return found[0].prefix, found[0].surface
        return None

    def below(self, path: str) -> tuple[str, Surface] | None:
        """The longest mounted prefix path is under, and its surface."""
        for prefix, surface in self.prefixes:
            if path == prefix or path.startswith(prefix + "/"):
                return prefix, surface
        return None


class Whole(Surface):
    """handler() -> its answer whole: the envelope is the handler's own (the agent's REST:
    the node exporter's, core.http.envelope, or none where the exporter has none)."""

    def call(self, route: Route, req: Request) -> Answer:
        got: Answer = route.handler()
        return got
