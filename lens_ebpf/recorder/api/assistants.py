"""/mcp: the recorder's routes as MCP tools (tools.py) for AI assistants, served with the
MCP Python SDK (`mcp`: streamable HTTP, stateless, JSON answers) on the recorder's port.

The SDK speaks ASGI; the recorder's HTTP front is aiohttp with bounds of its own
(core/http.py). So /mcp is a route like the others: a POST judged on its head (a body
that is not JSON is refused before it is read), its body bounded and counted in the
service's budget of writes; its surface hands the request to the SDK's session manager
as one ASGI call on a loop of its own and answers what the SDK answered. The SDK calls
back `tools/list` and `tools/call`; a call runs the route through its surface on a
worker thread, as HTTP does. Reads are open, as over HTTP; a write tool asks the /mcp
request for the API's credentials (a bearer token, a client certificate), as its route
does: refused without them, the refusal a tool error carrying the route's message.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import MutableMapping
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from lens_ebpf import __version__
from lens_ebpf.core.http import json_response
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.core.routes import Answer, Request, Route, RouteTable, Surface
from lens_ebpf.recorder.api.envelope import Ask, Connect, Services
from lens_ebpf.recorder.api.tools import COMPOSED, Composed, Tool, ToolError

log = logging.getLogger(__name__)

routes = RouteTable()
MAX_BODY = 1 << 20  # a JSON-RPC message: a tool's name and arguments
CALL_SECONDS = 300.0  # the longest a request to /mcp is waited for (a slow Prometheus)
INSTRUCTIONS = (
    "lens-ebpf's recorder: GPU clusters, their nodes, workloads, allocation "
    "and utilization, training progress and timelines, alerts. Each tool is "
    "one route of its HTTP API and answers its JSON (the Primus-Lens envelope: "
    "meta.code 2000 and data). Times are unix seconds unless a parameter says "
    "RFC 3339."
)


@routes.post("mcp", max_body=MAX_BODY)
def mcp_post(ask: Ask) -> Answer:
    """MCP over streamable HTTP: a JSON-RPC message (initialize, tools/list, tools/call),
    answered as JSON."""
    return server(ask).answer("POST", ask.req)


@routes.get("mcp", tool=False)
def mcp_get(ask: Ask) -> Answer:
    """405: no event stream (a stateless server answers each POST whole)."""
    return stateless("GET")


@routes.delete("mcp")
def mcp_delete(ask: Ask) -> Answer:
    """405: no session to end (a stateless server keeps none)."""
    return stateless("DELETE")


def server(ask: Ask) -> Assistants:
    """The /mcp surface that called the handler (its SDK's session manager)."""
    assert isinstance(ask.surface, Assistants), "a route of /mcp"
    return ask.surface


def stateless(method: str) -> Answer:
    """What streamable HTTP lets a stateless server answer a GET (its event stream) and a
    DELETE (a session's end): 405, POST allowed."""
    status, ctype, body = json_response(
        405, {"error": f"{method} /mcp: this server is " "stateless; POST each message"}
    )
    return status, ctype, body, {"Allow": "POST"}


class Assistants(Surface):
    """The /mcp routes: handler(ask) -> the SDK's answer (ask.surface: this one)."""

    def __init__(
        self,
        tools: dict[str, Tool],
        app: Services,
        connect: Connect,
        composed: tuple[Composed, ...] = COMPOSED,
    ) -> None:
        self.tools, self.app, self.connect = tools, app, connect
        self.composed = {c.name: c for c in composed}
        if clash := set(self.tools) & set(self.composed):
            raise ValueError(f"tools named twice: {sorted(clash)}")
        self.server: Server[Any] = Server(
            "lens-ebpf-recorder",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list,
            on_call_tool=self._call,
        )
        self._lock = threading.Lock()
        self._loop: EventLoopThread | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._done: asyncio.Event | None = None
        self._running: Any = None  # the manager's run(), as a future of the loop

    # -- the surface ----------------------------------------------------------------------
    def call(self, route: Route, req: Request) -> Answer:
        ask = Ask(req, self.app, None, self.connect, self)
        try:
            got: Answer = route.handler(ask)
        finally:
            ask.close()
        return got

    def answer(self, method: str, req: Request) -> Answer:
        """The SDK's answer to one request to /mcp (on the caller's thread, waiting)."""
        loop = self._started()
        return loop.call(self._asgi(method, req), timeout=CALL_SECONDS)

    def close(self) -> None:
        """The session manager stopped, its loop closed."""
        with self._lock:
            loop, done, running = self._loop, self._done, self._running
            self._loop = None
        if loop is None:
            return
        if done is not None:
            loop.loop.call_soon_threadsafe(done.set)
        if running is not None:
            try:
                running.result(timeout=5)
            except Exception:  # stopping: what it says is only logged
                log.debug("mcp: the session manager stopped uncleanly", exc_info=True)
        loop.close()

    def _started(self) -> EventLoopThread:
        with self._lock:
            if self._loop is not None:
                return self._loop
            loop = EventLoopThread("mcp")
            ready = threading.Event()
            self._running = asyncio.run_coroutine_threadsafe(self._run(ready), loop.loop)
            if not ready.wait(10):
                loop.close()
                raise RuntimeError("mcp: the SDK's session manager did not start")
            self._loop = loop
            return loop

    async def _run(self, ready: threading.Event) -> None:
        """The SDK's session manager, running until close()."""
        self._done = asyncio.Event()
        self._manager = StreamableHTTPSessionManager(
            self.server, json_response=True, stateless=True, max_request_body_size=MAX_BODY
        )
        async with self._manager.run():
            ready.set()
            await self._done.wait()

    async def _asgi(self, method: str, req: Request) -> Answer:
        """req as one ASGI request to the SDK; its status, headers and body gathered."""
        assert self._manager is not None
        host = req.headers.get("host", "localhost")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": "/mcp",
            "raw_path": b"/mcp",
            "query_string": b"",
            "root_path": "",
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in req.headers.items()],
            "client": (req.peer, 0),
            "server": (host, 0),
            "state": {"lens.request": req},  # what a tool call asks with (_head)
        }
        answered = anyio.Event()
        sent = False
        status, ctype, extra, chunks = 500, "application/json", {}, []

        async def receive() -> MutableMapping[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": req.body, "more_body": False}
            await answered.wait()  # the client "goes" once it has its answer
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status, ctype
            if message["type"] == "http.response.start":
                status = int(message["status"])
                for k, v in message.get("headers", []):
                    name, value = k.decode("latin-1").lower(), v.decode("latin-1")
                    if name == "content-type":
                        ctype = value
                    elif name in ("mcp-session-id", "allow", "www-authenticate"):
                        extra[name.title()] = value
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    answered.set()

        await self._manager.handle_request(scope, receive, send)
        answered.set()
        return status, ctype, b"".join(chunks), extra

    # -- the tools ------------------------------------------------------------------------
    async def _list(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        out = [
            types.Tool(
                name=t.name,
                description=t.description,
                input_schema=t.schema,
                annotations=types.ToolAnnotations(
                    read_only_hint=not t.write,
                    destructive_hint=False,
                    idempotent_hint=not t.write or t.route.method != "POST",
                    open_world_hint=False,
                ),
            )
            for t in self.tools.values()
        ]
        out += [
            types.Tool(
                name=c.name,
                description=c.description,
                input_schema=c.schema,
                annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
            )
            for c in self.composed.values()
        ]
        return types.ListToolsResult(tools=out)

    async def _call(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        args = dict(params.arguments or {})
        head = _head(ctx)
        try:
            if (tool := self.tools.get(params.name)) is not None:
                got = await anyio.to_thread.run_sync(tool.call, args, head)
            elif (composed := self.composed.get(params.name)) is not None:
                got = await anyio.to_thread.run_sync(composed.call, args, head, self.tools)
            else:
                raise ToolError(f"no tool {params.name!r}")
        except ToolError as exc:
            return _error(str(exc))
        except Exception as exc:  # a broken route: said as its HTTP 500 says it
            log.exception("mcp: tool %s failed", params.name)
            return _error(str(exc))
        if got.error is not None:
            return _error(got.error, got.data)
        structured = got.data if isinstance(got.data, dict) else None
        return types.CallToolResult(
            content=[types.TextContent(text=got.text)], structured_content=structured
        )


def _head(ctx: ServerRequestContext[Any]) -> Request:
    """The /mcp request a tool is called in (its credentials and client)."""
    request = ctx.request
    scope = getattr(request, "scope", None) or {}
    got = scope.get("state", {}).get("lens.request")
    return got if isinstance(got, Request) else Request("mcp", {}, {})


def _error(message: str, data: Any = None) -> types.CallToolResult:
    """A tool error (isError) carrying our message; the route's whole answer with it."""
    structured = data if isinstance(data, dict) else None
    return types.CallToolResult(
        content=[types.TextContent(text=message)], is_error=True, structured_content=structured
    )
