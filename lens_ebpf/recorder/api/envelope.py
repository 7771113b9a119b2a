"""The cluster API's surfaces: the Primus-Lens envelope and parameters (`/v1/` as its web
UI calls it, `/lens/v1/`, and the same routes under `/api/`), and what its handlers get.

Envelope `{"meta": {"code": 2000, "message": "OK"}, "data": ...}`; errors carry
`meta.code` 4001 (a bad parameter, named), 4004 (an unknown name) or 5003 (a dependency
that is down, named) with HTTP 400, 404 and 503: the domain's BadRequest, NotFound and
Unavailable, a database error, a Prometheus that cannot answer where its figures are all
the route answers; 409/4002 (it exists already), 403/4003 (a write the service does not
make); a write without the API's credentials 401/4010 (none) or 403/4003 (a wrong token);
a method no route of the path takes 405/4016.
A write (POST, PUT, PATCH, DELETE) runs in one transaction. A route that mixes stored
facts with figures it cannot know now (Prometheus's) answers 2000 with them 0, the
original's types (never null where its Go struct has a number, string, bool or list),
meta.message saying what is unknown and why. Parameters are taken in snake_case (the
UI's `page_num`) and camelCase (`pageNum`), each checked against its route's declaration
(`Param`: its type, whether required, its bounds and choices; check()) before the handler
runs, a bad one 400/4001 naming it. Paged lists answer `{"data": [...], "total": N}`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import Connection
from sqlalchemy.exc import (
    DataError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
    StatementError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout

from lens_ebpf.core.routes import (
    WRITES,
    Answer,
    Param,
    Request,
    Response,
    Route,
    Surface,
    unwanted_type,
)
from lens_ebpf.recorder import inputs, prom
from lens_ebpf.recorder.errors import BadRequest, Conflict, Forbidden, NotFound, Unavailable
from lens_ebpf.recorder.lifecycle import parse_time
from lens_ebpf.recorder.scope import Scope

if TYPE_CHECKING:
    from lens_ebpf.recorder.alerts.service import Alerts
    from lens_ebpf.recorder.config import RecorderConfig
    from lens_ebpf.recorder.deepdive import DeepDive
    from lens_ebpf.recorder.ingest.admission import WriteGuard
    from lens_ebpf.recorder.ingest.leadership import Leadership
    from lens_ebpf.recorder.management.hub import Management
    from lens_ebpf.recorder.profiler.files import Profiler
    from lens_ebpf.recorder.remote_write.receiver import RemoteWrite
    from lens_ebpf.recorder.store.writer import Writer
    from lens_ebpf.recorder.tracker.clusters import Clusters
    from lens_ebpf.recorder.training.progress import Training

# /v1 as the UI names its API, /lens/v1 as it asks it when served under /lens/ (its build's
# base: its proxy passes the path on unchanged), and the seed's /api
log = logging.getLogger(__name__)

PREFIXES = ("/v1", "/lens/v1", "/api")
PAGE_MAX = 1000
# HTTP status -> meta.code: the one table every recorder surface answers by (a handler's
# error as failure() reads it, a request refused on its head or while its body came
# (core/http.py), an ingest route's outcome); a status not here answers its status x 10
CODES = {
    400: 4001,  # a bad parameter or body, named
    401: 4010,  # no credentials
    403: 4003,  # a wrong token, another site, a write the service does not make
    404: 4004,  # an unknown name
    405: 4016,  # a method no route of the path takes (the original's InvalidOperation)
    408: 4008,  # a body not whole in time
    409: 4002,  # it exists already
    413: 4013,  # a body too large
    415: 4015,  # a Content-Type, encoding or protocol the route does not take
    429: 4029,  # too many: retry later
    503: 5003,  # a dependency down (named), the write queue full: retry
}
Connect = Callable[[], contextlib.AbstractContextManager[Connection]]  # a connection, closed after


def code(status: int) -> int:
    """The meta.code of an answer of status: 2000 for a success, else CODES'."""
    return 2000 if status < 300 else CODES.get(status, status * 10)


class ApiError(Exception):
    """An answer's status and message; its meta.code is the status's (CODES)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code(status), message


def bad(message: str) -> BadRequest:
    return BadRequest(message)


JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_APPEND_NEWLINE


def answer(status: int, body: Any) -> Response:
    """The API's JSON by orjson, keys in the order the handler made them (as Go writes a
    struct's fields in its order): a 10,000-row statistics page (8 MB) in 4 ms, where
    the json module with sorted keys takes 60; stored JSON text passes through as an
    orjson.Fragment."""
    return status, "application/json", orjson.dumps(body, option=JSON_OPTIONS)


UNKNOWN = "OK; figures unknown, answered as 0: "  # meta.message's start, then why


def ok(data: Any, missing: list[str] | None = None) -> Response:
    """2000 with the data; where some figures are unknown (Prometheus could not give
    them, an hour had no samples) the data holds 0 for them, the original's type (a
    page does arithmetic on them), and meta.message says which and why."""
    message = "OK" if not missing else UNKNOWN + "; ".join(missing)
    return answer(200, {"meta": {"code": code(200), "message": message}, "data": data})


def error(e: ApiError) -> Response:
    return answer(e.status, {"meta": {"code": e.code, "message": e.message}, "data": None})


def failure(exc: Exception) -> ApiError | None:
    """What a handler's exception answers: status, meta.code, message (None: not one the
    API answers, a bug). The one mapping every recorder surface answers errors by."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, Conflict):  # before BadRequest: both are ValueErrors
        return ApiError(409, str(exc))
    if isinstance(exc, Forbidden):
        return ApiError(403, str(exc))
    if isinstance(exc, BadRequest | prom.TooManyPointsError):
        return ApiError(400, str(exc))
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc))
    if isinstance(exc, Unavailable | prom.PromError):
        return ApiError(503, str(exc))
    if isinstance(exc, IntegrityError):  # a concurrent write made the same name first
        return ApiError(409, f"it exists already: {type(exc.orig).__name__}")
    # what a client sent that a check let through and the database or Python cannot hold
    # (a value out of its column's range, a character its text refuses): the client's,
    # named by kind only (the statement and the driver's words stay here)
    if isinstance(exc, DataError) or (
        isinstance(exc, StatementError) and isinstance(exc.orig, OverflowError)
    ):
        return ApiError(
            400,
            "a value the database cannot store (out of range, or a " "character it does not take)",
        )
    if isinstance(exc, OverflowError):
        return ApiError(400, "a value out of range")
    if isinstance(exc, SQLAlchemyError):
        return ApiError(503, f"database unavailable: {type(exc).__name__}")
    return None


def down(exc: BaseException) -> bool:
    """Whether exc says the database cannot be reached (not what a statement asked)."""
    return isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeout)


class Outage:
    """The database as requests find it: an outage logged once, when the first request
    finds it down, and its end once, when a request that read it gets through; not once
    per request (an outage under load is thousands)."""

    def __init__(self) -> None:
        self.down = False
        self.requests = 0  # answered 503 in the outage now (or the last one)
        self._lock = threading.Lock()

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self.requests += 1
            if self.down:
                return
            self.down, self.requests = True, 1
        log.warning(
            "recorder: the database is unavailable to requests (%s); they are "
            "answered 503 until it is back",
            type(exc).__name__,
        )

    def answered(self) -> None:
        if not self.down:
            return
        with self._lock:
            if not self.down:
                return
            self.down, n = False, self.requests
        log.info("recorder: the database answers requests again (%d answered 503 meanwhile)", n)


def param(query: dict[str, str], name: str) -> str | None:
    """A parameter by its snake_case name, or its camelCase spelling."""
    if name in query:
        return query[name]
    camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
    return query.get(camel)


def asked_cluster(req: Request) -> str | None:
    """The cluster a request asks about: its `?cluster=`, else a write's JSON body field
    `cluster` (the web UI's POSTs name it there: process-tree, pyspy/sample, pyspy/tasks,
    as the original's handlers read it); none: the home cluster. A body that does not
    parse names none here: its route's own reading says what is wrong with it."""
    named = param(req.query, "cluster")
    if named or not req.body.strip():
        return named or None
    try:
        doc = inputs.body(req.body)
    except BadRequest:
        return None
    got = doc.get("cluster") if isinstance(doc, dict) else None
    return got if isinstance(got, str) and got else None


def page(query: dict[str, str]) -> tuple[int, int]:
    """(page_num, page_size): defaults 1 and 10; a page size above 1,000 is refused."""
    out = []
    # (a page's offset, (page_num - 1) * page_size, within 64 bits too)
    for name, default, most in (
        ("page_num", 1, inputs.INT_MAX // PAGE_MAX),
        ("page_size", 10, PAGE_MAX),
    ):
        n = integer(query, name, default)
        if not 1 <= n <= most:
            raise bad(f"{name}={n}: must be from 1 to {most}")
        out.append(n)
    return out[0], out[1]


MILLIS = 100_000_000_000  # a unix time above this is milliseconds (year 5138 in seconds)


def when(query: dict[str, str], name: str) -> datetime | None:
    """A time parameter: unix seconds, unix milliseconds (as Grafana and the original's
    trainingPerformance send them), or RFC 3339; None when absent."""
    raw = param(query, name)
    if not raw:
        return None
    try:
        v = float(raw)
        return datetime.fromtimestamp(v / 1000 if v > MILLIS else v, UTC)
    except (ValueError, OverflowError, OSError):
        pass
    got = parse_time(raw)
    if got is None:
        raise bad(f"{name}={raw!r}: not unix seconds, unix milliseconds or RFC 3339")
    return got


def integer(query: dict[str, str], name: str, default: int | None = None) -> int:
    raw = param(query, name)
    if not raw:
        if default is None:
            raise bad(f"{name} is required (unix seconds)")
        return default
    return inputs.whole(raw, name)


def span(query: dict[str, str]) -> tuple[int, int, int]:
    """start, end (unix seconds, required) and step (seconds, default 60) of a graph."""
    start, end = integer(query, "start"), integer(query, "end")
    step = integer(query, "step", 60)
    if step <= 0:
        raise bad(f"step={step}: must be 1 or more")
    return start, end, step


PAGE = (  # page(): the Primus-Lens pages' paging
    Param(
        "page_num",
        "integer",
        "the page, from 1",
        default=1,
        minimum=1,
        maximum=inputs.INT_MAX // PAGE_MAX,
    ),
    Param("page_size", "integer", "rows a page", default=10, minimum=1, maximum=PAGE_MAX),
)
SPAN = (  # span(): a graph's span
    Param("start", "integer", "unix seconds", required=True),
    Param("end", "integer", "unix seconds", required=True),
    Param("step", "integer", "seconds between points", default=60, minimum=1),
)
CLUSTER = Param(
    "cluster",
    doc="the cluster asked about (a followed cluster's name); none: the home cluster",
)
TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no")  # a boolean as a query may say it
BODY_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "string": ((str,), "a string"),
    "integer": ((int,), "a whole number"),
    "number": ((int, float), "a number"),
    "boolean": ((bool,), "true or false"),
    "list": ((list,), "a list"),
    "array": ((list,), "a list"),
    "object": ((dict,), "an object"),
    "date-time": ((str,), "an RFC 3339 time"),
    "time": ((int, str), "unix seconds or RFC 3339"),
}


def given(p: Param, values: dict[str, str]) -> tuple[str, str] | None:
    """(the name it came under, its text); None when absent ("" is absent, as the
    handlers read it)."""
    for name in p.spellings:
        if values.get(name):
            return name, values[name]
    return None


def check(params: tuple[Param, ...], req: Request) -> None:
    """A request against what its route declares (core/routes.py's Param): each path and
    query parameter given reads as its type, within its bounds and choices; each body
    field declared is of its JSON type; none required is missing. BadRequest names the
    first that is not (by the name it came under)."""
    fields: dict[str, Any] | None = None
    for p in params:
        if p.body:
            if fields is None:
                doc = inputs.body(req.body) if req.body.strip() else {}
                fields = doc if isinstance(doc, dict) else {}
            field_value(p, fields)
            continue
        got = given(p, req.params if p.name in req.params else req.query)
        if got is None:
            if p.required:
                raise bad(f"{p.name} is required")
            continue
        text_value(p, *got)


def text_value(p: Param, name: str, raw: str) -> None:
    """A path or query parameter's text, read as its kind (BadRequest otherwise, naming
    it as the client spelled it, and as declared where that differs: `pageNum=0: ...
    (page_num)`)."""
    try:
        read_as(p, name, raw)
    except BadRequest as exc:
        if name == p.name:
            raise
        raise bad(f"{exc} ({p.name})") from None


def read_as(p: Param, name: str, raw: str) -> None:
    if p.kind == "integer":
        n = inputs.whole(raw, name)
        lo, hi = p.minimum, p.maximum
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            said = (
                f"from {lo} to {hi}"
                if lo is not None and hi is not None
                else f"{lo} or more"
                if lo is not None
                else f"{hi} or less"
            )
            raise bad(f"{name}={n}: must be {said}")
    elif p.kind == "number":
        try:
            if not math.isfinite(float(raw)):
                raise ValueError
        except ValueError:
            raise bad(f"{name}={inputs.shown(raw)}: not a finite number") from None
    elif p.kind == "boolean" and raw.strip().lower() not in TRUE + FALSE:
        raise bad(f"{name}={inputs.shown(raw)}: true or false")
    elif p.kind == "time":
        when({name: raw}, name)
    elif p.kind == "date-time" and parse_time(raw) is None:
        raise bad(f"{name}={inputs.shown(raw)}: an RFC 3339 time is required")
    if p.choices:
        for v in raw.split(",") if p.kind == "list" else [raw]:
            if v not in p.choices and v.lower() not in p.choices:
                raise bad(f"{name}={inputs.shown(v)}: one of {', '.join(p.choices)}")


def field_value(p: Param, fields: dict[str, Any]) -> None:
    """A write's body field, of its declared JSON type (BadRequest otherwise)."""
    v = fields.get(p.name)
    if v is None:
        if p.required:
            raise bad(f"{p.name} is required")
        return
    kind, said = BODY_TYPES[p.kind]
    if not isinstance(v, kind) or (isinstance(v, bool) and p.kind in ("integer", "number")):
        raise bad(f"{p.name}: {said} is required")
    if p.kind == "date-time" and v and parse_time(v) is None:
        raise bad(f"{p.name}={inputs.shown(str(v))}: an RFC 3339 time is required")
    if p.choices and v not in p.choices:
        raise bad(f"{p.name}={inputs.shown(str(v))}: one of {', '.join(p.choices)}")


@dataclass
class Services:
    """The service's parts the handlers call into."""

    cfg: RecorderConfig
    clusters: Clusters
    remote_write: RemoteWrite
    training: Training
    writer: Writer
    readiness: Callable[[], tuple[bool, dict[str, Any]]]
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    leadership: Leadership | None = None  # with replicas: whether this one leads, the leader
    alerts: Alerts | None = None
    outage: Outage = field(default_factory=Outage)  # the database as requests find it
    management: Management | None = None  # the Management pages' clusters, settings, releases
    deepdive: DeepDive | None = None  # process trees and py-spy tasks through the agents
    profiler: Profiler | None = None  # profiler traces through the agents, their sessions


@dataclass
class Ask:
    """What every recorder handler gets, its one argument (`def handler(ask: Ask)`): the
    request, the cluster asked about (the Primus-Lens API's `?cluster=`), the service's
    parts, a database connection opened on first use, and the surface calling it."""

    req: Request
    app: Services
    scope: Scope | None
    connect: Connect
    surface: Surface | None = None  # the surface calling the handler (/mcp's: its SDK)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    _conn: Connection | None = None

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            self._conn = self._stack.enter_context(self.connect())
        return self._conn

    @property
    def c(self) -> Scope:
        assert self.scope is not None, "a route of the Primus-Lens API"
        return self.scope

    @property
    def query(self) -> dict[str, str]:
        return self.req.query

    def arg(self, name: str) -> str:
        """A path parameter ({name} in the route's path)."""
        return self.req.params[name]

    def body(self) -> dict[str, Any]:
        """The request's JSON object ({} for none), checked as every body is (inputs.py);
        any other JSON is a 400."""
        raw = self.req.body.strip()
        got = inputs.body(raw) if raw else {}
        if not isinstance(got, dict):
            raise bad("the body must be a JSON object")
        return got

    def now(self) -> datetime:
        return self.app.clock()

    def abort(self, exc: Exception) -> None:
        """The handler failed: what it wrote is not kept (a rollback that finds the
        database gone has nothing to undo)."""
        stack, self._stack = self._stack, contextlib.ExitStack()
        with contextlib.suppress(SQLAlchemyError):
            stack.__exit__(type(exc), exc, exc.__traceback__)

    def close(self) -> None:
        stack, self._stack = self._stack, contextlib.ExitStack()
        stack.close()


class LensApi(Surface):
    """The Primus-Lens API: handler(ask) -> data, answered in its envelope; a write only
    with the API's credentials (guard), in one transaction (begin)."""

    params: tuple[Param, ...] = (CLUSTER,)

    def __init__(
        self,
        app: Services,
        connect: Connect,
        scopes: Callable[[str | None], Scope],
        begin: Connect | None = None,
        guard: WriteGuard | None = None,
    ) -> None:
        self.app, self.connect, self.scopes = app, connect, scopes
        self.begin, self.guard = begin or connect, guard

    def scope(self, req: Request) -> Scope | None:
        return self.scopes(asked_cluster(req))

    def max_body(self, route: Route) -> int:
        return route.max_body or (1 << 20)  # a rule, a silence, a channel: small

    def admit(self, route: Route, head: Request) -> Answer | None:
        """A write's credentials and Content-Type, on its head (the guard's)."""
        if self.guard is None:
            return super().admit(route, head)
        name = "/" + route.path
        refused = self.guard.refused(name, head.headers, head.certified)
        if refused is None and (why := unwanted_type(route, head.headers)) is not None:
            refused = self.guard.refuse(name, 415, why)  # what a browser's form sends
        return None if refused is None else self.refuse(route, *refused)

    def refuse(self, route: Route, status: int, message: str) -> Answer:
        return error(ApiError(status, message))

    def call(self, route: Route, req: Request) -> Answer:
        write = route.method in WRITES
        if write and self.guard is not None:  # admitted on its head (admit)
            req = replace(req, user=self.guard.user(req.headers, req.certified, req.subject))
        got = self._call(route, req, self.begin if write else self.connect)
        if write and self.guard is not None:
            self.guard.count("/" + route.path, got[0])
        return got

    def _call(self, route: Route, req: Request, connect: Connect) -> Answer:
        ask = None
        try:
            inputs.parameters(req.params, req.query)
            check(self.declared(route), req)
            ask = Ask(req, self.app, self.scope(req), connect)
            with prom.missing_figures() as missing:
                data = route.handler(ask)
            used = ask._conn is not None
            ask.close()  # a write committed before it is answered
            if used:
                self.app.outage.answered()
            return ok(data, missing)
        except Exception as exc:
            if ask is not None:  # a write's transaction rolled back, not committed
                ask.abort(exc)
            e = failure(exc)
            if e is None:
                raise
            if down(exc):
                self.app.outage.failed(exc)
            return error(e)
        finally:
            if ask is not None:
                ask.close()

    def missing(self, req: Request) -> Answer:
        try:
            self.scopes(param(req.query, "cluster") or None)
        except NotFound as exc:
            e = failure(exc)
            assert e is not None
            return error(e)
        return error(ApiError(404, f"no route {req.path!r}"))

    def not_allowed(self, req: Request, method: str, allowed: list[str]) -> Answer:
        said = ", ".join(allowed) or "nothing"
        return error(ApiError(405, f"{method} /{req.path}: not served here " f"({said} is)"))


class AlertsApi(LensApi):
    """The Alert pages' routes: their `cluster` names the clusters alerts come from (any
    name, "all" or none: every cluster), read by the handlers, not resolved to a scope;
    declared by the routes that read it."""

    params: tuple[Param, ...] = ()

    def scope(self, req: Request) -> Scope | None:
        return None
