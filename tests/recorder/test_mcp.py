"""MCP from the route tables (issue 73): the SDK's own client (`mcp`'s ClientSession over
streamable HTTP) against a running recorder at /mcp on its port. The tools listed are one
per route a tool is made of, named, described and given an input schema from the route's
declaration; a call answers exactly what HTTP answers the route for the same arguments;
a bad argument is a tool error carrying the route's message; a write tool without the
API's credentials is refused as HTTP refuses it, and with them does what the route does;
and no handler reads a parameter its route does not declare."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
import requests
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from lens_ebpf.recorder.api import ROUTES
from lens_ebpf.recorder.api import envelope as envelope_module
from lens_ebpf.recorder.api.tools import COMPOSED, description
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import U
from tests.recorder.test_cluster_api import node, put_trainer

TOKEN = "assistant-token-7"
AT = datetime(2026, 11, 23, 7, 0, tzinfo=UTC)  # the recorder's clock: answers hold still


@pytest.fixture()
def app(api: FakeApiServer, recorder_app: Any, tmp_path: Path) -> Any:
    """A recorder with a bearer token for writes, a node, a Deployment and its two pods."""
    from tests.recorder.objects import gpu_pod, state

    put_trainer(api, "2026-11-23T06:00:00Z")
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    for name in ("trainer-5d9f-a", "trainer-5d9f-b"):
        p = gpu_pod(name, "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
        api.put("pods", p)
        api.put("pods", state(p, "Running", True))
    (tmp_path / "api").write_text(TOKEN + "\n")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    got = recorder_app(url, clock=lambda: AT, api__token_file=str(tmp_path / "api"))
    eventually(
        lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 2
        and len(rows(url, "gpu_workloads")) == 2
        and len(rows(url, "nodes")) == 1,
        timeout=15,
    )
    got.db_url = url
    return got


Session = Callable[[ClientSession], Awaitable[Any]]


def session(app: Any, use: Session, token: str | None = None) -> Any:
    """use(session) with the SDK's client session, initialized, over streamable HTTP."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def main() -> Any:
        url = f"http://127.0.0.1:{app.http.port}/mcp"
        async with (
            httpx2.AsyncClient(headers=headers, timeout=hang_guard(30)) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as s,
        ):
            await s.initialize()
            return await use(s)

    return asyncio.run(main())


def call(app: Any, name: str, args: dict[str, Any], token: str | None = None) -> Any:
    async def use(s: ClientSession) -> Any:
        return await s.call_tool(name, args)

    got = session(app, use, token)
    assert isinstance(got, types.CallToolResult)
    return got


def http(
    app: Any, method: str, path: str, body: Any = None, token: str | None = None
) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.request(
        method,
        f"http://127.0.0.1:{app.http.port}{path}",
        json=body,
        headers=headers,
        timeout=hang_guard(15),
    )


def message(r: requests.Response) -> str:
    body = r.json()
    return str(body["meta"]["message"] if "meta" in body else body["error"])


def tool_routes() -> dict[str, tuple[Any, str]]:
    """The routes a tool is made of, by the name the issue asks for: every GET but a
    file's download (tool=False), every write that names its tool; lens_ and the path in
    snake_case ({uid}: uid), the seed's lens_seed_."""
    out = {}
    for table, _, surface in ROUTES:
        if surface == "mcp":
            continue
        for r in table.routes:
            if r.tool is False or (r.method != "GET" and not r.tool):
                continue
            words = [
                re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", p.strip("{}")).lower().replace("-", "_")
                for p in r.parts
            ]
            generated = ("lens_seed_" if surface == "plain" else "lens_") + "_".join(words)
            name = r.tool if isinstance(r.tool, str) else generated
            assert name not in out, name
            out[name] = (r, surface)
    return out


def test_tools_are_the_routes(app: Any) -> None:
    """tools/list: one tool per route a tool is made of, and the composed ones; each
    described (a route without a docstring fails here, and in tests/unit/test_tools.py)
    and typed from its declaration."""

    async def use(s: ClientSession) -> Any:
        return await s.list_tools()

    listed = {t.name: t for t in session(app, use).tools}
    wanted = tool_routes()
    assert set(listed) == set(wanted) | {c.name for c in COMPOSED}
    assert len(listed) == len(wanted) + len(COMPOSED)
    assert {
        "lens_nodes",
        "lens_workloads_uid_timeline",
        "lens_seed_pods",
        "lens_gpu_aggregation_cluster_hourly_stats",
        "lens_alert_silence_create",
        "lens_alert_silence_end",
        "lens_alerts_id_correlations",
    } <= set(listed)
    for name, (route, surface) in wanted.items():
        tool = listed[name]
        assert tool.description and tool.description == description(route.handler), name
        schema = tool.input_schema
        path_params = [p[1:-1] for p in route.parts if p.startswith("{")]
        declared = [p.name for p in route.params if p.name not in path_params]
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert set(path_params) | set(declared) <= set(schema["properties"]), name
        assert set(path_params) <= set(schema.get("required", ())), name
        extra = set(schema["properties"]) - set(path_params) - set(declared)
        assert extra <= ({"cluster"} if surface in ("lens", "posts") else set()), name
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (route.method == "GET"), name
    # a schema whole: types, required, defaults, bounds, choices, descriptions
    assert listed["lens_workloads_uid_timeline"].input_schema == {
        "type": "object",
        "additionalProperties": False,
        "required": ["uid"],
        "properties": {
            "uid": {"type": "string", "description": "{uid} in workloads/{uid}/timeline"},
            "start": {
                "type": ["integer", "string"],
                "description": "unix seconds or RFC 3339; none: the workload's start",
            },
            "end": {
                "type": ["integer", "string"],
                "description": "unix seconds or RFC 3339; none: now",
            },
            "cluster": {
                "type": "string",
                "description": "the cluster asked about (a "
                "followed cluster's name); none: the home cluster",
            },
        },
    }
    nodes = listed["lens_nodes"].input_schema["properties"]
    assert nodes["page_size"] == {
        "type": "integer",
        "description": "rows a page",
        "default": 10,
        "minimum": 1,
        "maximum": 1000,
    }
    assert nodes["desc"] == {"type": "boolean", "description": "descending", "default": False}
    assert nodes["status"]["type"] == "array" and "gpu_count" in nodes["order_by"]["enum"]
    silence = listed["lens_alert_silence_create"].input_schema
    assert silence["required"] == ["name", "silence_type"]
    assert silence["properties"]["silence_type"]["enum"] == ["alert_name", "label", "resource"]
    assert silence["properties"]["alert_names"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "the alert names it holds (silence_type alert_name)",
    }


# (tool, its arguments, the same asked of HTTP)
READS = [
    ("lens_clusters", {}, "/v1/clusters"),
    (
        "lens_nodes",
        {"page_size": 1, "order_by": "gpu_count", "desc": True},
        "/v1/nodes?page_size=1&order_by=gpu_count&desc=true",
    ),
    ("lens_nodes_gpu_allocation", {}, "/v1/nodes/gpuAllocation"),
    ("lens_nodes_name", {"name": "gpu-1"}, "/v1/nodes/gpu-1"),
    (
        "lens_nodes_name_workloads",
        {"name": "gpu-1", "page_num": 1, "page_size": 5},
        "/v1/nodes/gpu-1/workloads?page_num=1&page_size=5",
    ),
    (
        "lens_workloads",
        {"page_size": 5, "kind": "Deployment"},
        "/v1/workloads?page_size=5&kind=Deployment",
    ),
    ("lens_workloads_uid", {"uid": U["trainer"]}, f"/v1/workloads/{U['trainer']}"),
    (
        "lens_workloads_uid_hierarchy",
        {"uid": U["trainer"]},
        f"/api/workloads/{U['trainer']}/hierarchy",
    ),
    ("lens_workload_metadata", {}, "/v1/workloadMetadata"),
    (
        "lens_clusters_allocation",
        {"start": "2026-11-23T00:00:00Z", "end": 1795417200},
        "/v1/clusters/allocation?start=2026-11-23T00:00:00Z&end=1795417200",
    ),
    ("lens_alerts_summary", {}, "/v1/alerts/summary"),
    ("lens_alerts", {"limit": 5, "status": "firing"}, "/v1/alerts?limit=5&status=firing"),
    ("lens_notification_channels_types", {}, "/v1/notification-channels/types"),
    ("lens_seed_pods", {"limit": 1}, "/pods?limit=1"),
    ("lens_seed_workloads", {"top": True}, "/workloads?top=true"),
    ("lens_pods_workload_cache", {}, "/pods/workload/cache"),
]


def test_a_tool_answers_what_its_route_answers(app: Any) -> None:
    async def use(s: ClientSession) -> list[Any]:
        return [await s.call_tool(name, args) for name, args, _ in READS]

    for (name, _, path), got in zip(READS, session(app, use), strict=True):
        r = http(app, "GET", path)
        assert r.status_code == 200, (path, r.text)
        assert not got.is_error, (name, got.content)
        assert got.content[0].text == r.text, name  # the same bytes
        assert got.structured_content == r.json(), name
    # not empty answers: the trainer's two pods on gpu-1
    workloads = call(app, "lens_nodes_name_workloads", {"name": "gpu-1"}).structured_content
    assert workloads["data"] == {
        "total": 1,
        "data": [
            {
                "kind": "Deployment",
                "name": "trainer",
                "namespace": "ml",
                "uid": U["trainer"],
                "gpu_allocated": 2,
                "gpu_allocated_node": 2,
                "node_name": "gpu-1",
                "status": "Running",
            }
        ],
    }


# (tool, bad arguments, the same asked of HTTP (None: no HTTP request says it), what it says)
BAD = [
    (
        "lens_nodes",
        {"page_size": 5000},
        "/v1/nodes?page_size=5000",
        "page_size=5000: must be from 1 to 1000",
    ),
    (
        "lens_nodes",
        {"page_size": "many"},
        "/v1/nodes?page_size=many",
        "page_size='many': not a whole number",
    ),
    (
        "lens_nodes",
        {"order_by": "colour"},
        "/v1/nodes?order_by=colour",
        "order_by='colour': one of",
    ),
    ("lens_nodes", {"desc": "maybe"}, "/v1/nodes?desc=maybe", "desc='maybe': true or false"),
    (
        "lens_nodes_gpu_utilization_history",
        {"end": 2},
        "/v1/nodes/gpuUtilizationHistory?end=2",
        "start is required",
    ),
    (
        "lens_gpu_aggregation_namespaces",
        {"start_time": "yesterday", "end_time": "now"},
        "/v1/gpu-aggregation/namespaces?start_time=yesterday&end_time=now",
        "start_time='yesterday': an RFC 3339 time is required",
    ),
    ("lens_workloads_uid", {"uid": "no-such"}, "/v1/workloads/no-such", "no-such"),
    (
        "lens_metric_alert_rules_id",
        {"id": "x"},
        "/v1/metric-alert-rules/x",
        "id='x': not a whole number",
    ),
    ("lens_seed_pods", {"since": "yesterday"}, "/pods?since=yesterday", "since='yesterday'"),
    ("lens_nodes", {"name": "a\x00b"}, "/v1/nodes?name=a%00b", "NUL"),
    (
        "lens_nodes",
        {"pagesize": 5},
        None,
        "pagesize: not an argument of lens_nodes (it takes page_num, page_size, name, gpu_name, "
        "status, order_by, desc, cluster)",
    ),
    ("lens_no_such_tool", {}, None, "no tool 'lens_no_such_tool'"),
]


def test_a_bad_argument_is_a_tool_error_with_the_routes_message(app: Any) -> None:
    async def use(s: ClientSession) -> list[Any]:
        return [await s.call_tool(name, args) for name, args, _, _ in BAD]

    for (name, _, path, says), got in zip(BAD, session(app, use), strict=True):
        assert got.is_error, (name, got.content)
        text = got.content[0].text
        assert says in text, (name, text)
        if path is not None:
            r = http(app, "GET", path)
            assert r.status_code in (400, 404), (path, r.text)
            assert text == message(r), name  # the route's message, as HTTP says it


SILENCE = {
    "name": "quiet",
    "silence_type": "alert_name",
    "alert_names": ["GpuHot"],
    "reason": "maintenance",
    "ends_at": "2026-11-24T00:00:00Z",
}


def test_a_write_tool_asks_for_the_apis_credentials(app: Any) -> None:
    # without a token and with a wrong one: refused, as HTTP refuses it, nothing written
    for token in (None, "wrong"):
        got = call(app, "lens_alert_silence_create", SILENCE, token)
        r = http(app, "POST", "/v1/alert-silences", SILENCE, token)
        assert r.status_code == (401 if token is None else 403), r.text
        assert got.is_error and got.content[0].text == message(r), got.content
        assert got.structured_content == r.json()
    assert rows(app.db_url, "alert_silences") == []
    # reads need none, as over HTTP
    assert not call(app, "lens_alert_silences", {}).is_error
    # a bad body field: the route's message
    got = call(app, "lens_alert_silence_create", {**SILENCE, "alert_names": "GpuHot"}, TOKEN)
    assert got.is_error and got.content[0].text == "alert_names: a list is required"
    got = call(app, "lens_alert_silence_create", {**SILENCE, "silence_type": "mood"}, TOKEN)
    r = http(app, "POST", "/v1/alert-silences", {**SILENCE, "silence_type": "mood"}, TOKEN)
    assert (
        got.is_error
        and got.content[0].text
        == message(r)
        == "silence_type='mood': one of alert_name, label, resource"
    )
    # with it: made as the route makes it, by the token
    made = call(app, "lens_alert_silence_create", SILENCE, TOKEN)
    assert not made.is_error, made.content
    sid = made.structured_content["data"]["silence_id"]
    (row,) = rows(app.db_url, "alert_silences")
    assert (row["id"], row["name"], row["alert_names"], row["created_by"], row["enabled"]) == (
        sid,
        "quiet",
        ["GpuHot"],
        "token",
        True,
    )
    shown = call(app, "lens_alert_silences_id", {"id": sid})
    assert shown.content[0].text == http(app, "GET", f"/v1/alert-silences/{sid}").text
    # ended through its tool: refused without the token, done with it
    assert call(app, "lens_alert_silence_end", {"id": sid}).is_error
    assert rows(app.db_url, "alert_silences")[0]["enabled"] is True
    ended = call(app, "lens_alert_silence_end", {"id": sid}, TOKEN)
    assert not ended.is_error and ended.structured_content["data"]["silence_id"] == sid
    assert rows(app.db_url, "alert_silences")[0]["enabled"] is False


def test_the_composed_why_is_its_parts_answers(app: Any) -> None:
    uid = U["trainer"]
    got = call(app, "lens_workload_why", {"uid": uid})
    assert not got.is_error, got.content
    parts = got.structured_content
    assert set(parts) == {"workload", "timeline", "alerts", "training"}

    def part(path: str) -> Any:
        r = http(app, "GET", path)
        return r.json()["data"] if r.status_code == 200 else {"error": message(r)}

    assert parts["workload"] == part(f"/v1/workloads/{uid}")
    assert parts["alerts"] == part(f"/v1/alerts?workload_id={uid}")
    assert parts["timeline"] == part(f"/v1/workloads/{uid}/timeline")
    assert parts["training"] == part(f"/v1/workloads/{uid}/trainingPerformance")
    assert parts["workload"]["uid"] == uid
    # a workload there is not: the error its first part says
    gone = call(app, "lens_workload_why", {"uid": "no-such"})
    r = http(app, "GET", "/v1/workloads/no-such")
    assert gone.is_error and gone.content[0].text == message(r)


def test_mcp_is_bounded_as_every_write_is(app: Any) -> None:
    base = f"http://127.0.0.1:{app.http.port}/mcp"
    # a browser's form cannot post to it (415 on its head); no stream, no session
    r = requests.post(
        base,
        data=b'{"jsonrpc": "2.0"}',
        timeout=hang_guard(10),
        headers={"Content-Type": "text/plain"},
    )
    assert r.status_code == 415, r.text
    r = requests.post(
        base,
        data=b"x" * ((1 << 20) + 1),
        timeout=hang_guard(10),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413, r.text
    for method in ("GET", "DELETE"):
        r = requests.request(
            method, base, timeout=hang_guard(10), headers={"Accept": "text/event-stream"}
        )
        assert (r.status_code, r.headers["Allow"]) == (405, "POST"), r.text


SAMPLE = {
    "string": "x",
    "integer": 1,
    "number": 1,
    "boolean": True,
    "time": 1795417200,
    "date-time": "2026-11-23T00:00:00Z",
    "list": ["x"],
}
KNOWN = {"name": "gpu-1", "uid": U["trainer"], "serial": "x", "id": "1", "dimension_type": "label"}


def test_handlers_read_only_the_parameters_their_routes_declare(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every GET tool called (its required arguments given): every query key its handler
    (and what it calls) reads is a spelling of one it declares."""
    seen: set[str] = set()

    class Reading(dict[str, str]):
        def get(self, key: Any, default: Any = None) -> Any:
            seen.add(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> str:
            seen.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return super().__contains__(key)

    monkeypatch.setattr(
        envelope_module.Ask, "query", property(lambda self: Reading(self.req.query))
    )
    tools = app.assistants.tools
    wrong = {}
    for name, tool in sorted(tools.items()):
        if tool.write:
            continue
        args = {
            p.name: KNOWN.get(p.name, p.choices[0] if p.choices else SAMPLE[p.kind])
            for p in tool.params
            if p.required
        }
        seen.clear()
        got = call(app, name, args)
        said = got.content[0].text if got.is_error else ""
        assert "is required" not in said and "one of" not in said, (name, said)
        spellings = {s for p in tool.params for s in p.spellings}
        if undeclared := seen - spellings:
            wrong[name] = sorted(undeclared)
    assert wrong == {}, wrong


def test_http_checks_a_route_against_its_declaration(app: Any) -> None:
    """The same declaration over HTTP: a camelCase spelling is the parameter; a bound or a
    choice is checked before the handler runs, named as the client spelled it."""
    assert http(app, "GET", "/v1/nodes?pageSize=1").json()["data"]["total"] == 1
    r = http(app, "GET", "/v1/nodes?pageSize=0")
    assert (r.status_code, message(r)) == (400, "pageSize=0: must be from 1 to 1000 (page_size)")
    q = urllib.parse.urlencode({"source": "nowhere"})
    r = http(app, "GET", f"/v1/alerts?{q}")
    assert (r.status_code, message(r)) == (
        400,
        "source='nowhere': one of metric, log, lens, " "webhook",
    )
