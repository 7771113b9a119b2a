"""Fuzzing both services (issue 69): Hypothesis strategies for what a client may send, the
recorder's routes as its route tables declare them (lens_ebpf/recorder/api/__init__.py's
ROUTES, the list scripts/routes_reference.py documents: a new route is fuzzed as it is
declared), the protobuf messages of the collector port and of the agent's gRPC port built
field by field from their descriptors, and the services under fuzz with what must hold
after every input: no 5xx (no gRPC INTERNAL, UNKNOWN or UNAVAILABLE), no traceback and no
error logged, no statement or driver text in an answer, /readyz answering.

tests/recorder/test_fuzz.py runs it bounded and seeded; bench/fuzz.py runs it longer.
"""

from __future__ import annotations

import http.client
import http.server
import inspect
import json
import logging
import math
import re
import threading
import types
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cramjam
import grpc
import promql_parser
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lens_ebpf.core.routes import Route
from lens_ebpf.protocol.collector_server import MAX_SEQ_JUMP
from lens_ebpf.protocol.gen import lens_pb2 as pb

# what no answer may hold: a statement, a traceback, the driver's or SQLAlchemy's words
LEAKS = (
    "SELECT ",
    "INSERT ",
    "Traceback",
    "psycopg",
    "sqlalchemy",
    "sqlite3",
    "Background on",
    "connection to server",
    'File "',
)
TOKEN = "fuzz-token"  # the API's, the POST routes' and the agent's subscribers' bearer token
HEAD_MOST = 60_000  # a request line longer: past server.max_header_bytes (64 KiB)
NODES = 1000  # collector tokens: fz-<i> reports as node fz-<i>

# -- values ---------------------------------------------------------------------------------
INTS = [
    0,
    -1,
    1,
    7,
    2**31 - 1,
    2**31,
    -(2**31) - 1,
    2**32,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64,
    10**19,
    -(10**19),
    10**30,
    10**400,
]
FLOATS = [
    1e308,
    -1e308,
    1.7976931348623157e308,
    5e-324,
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    0.5,
    1e19,
    9.3e18,
    1e15,
    1.5e9,
]
TEXTS = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "%00",
    "\x00" * 3,
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1" * 30,
    "-1",
    "0",
    "+0",
    "0x10",
    "1_000",
    "１２",
    "٣",
    "²",
    "1e308",
    "1e309",
    "-1e308",
    "1e-400",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1.5",
    "true",
    "false",
    "null",
    "[]",
    "{}",
    "(a+)+$",
    "(x+x+)+y",
    "((((",
    "[",
    "\\",
    "a{1000}{1000}",
    "(?i)(a|aa)*b",
    "\\1",
    "(?=a)",
    "*",
    "' OR 1=1 --",
    '"; DROP TABLE x',
    "%s%s%n",
    "{0}",
    "${jndi:x}",
    "../../etc/passwd",
    "..",
    ".",
    "/",
    "a/b",
    "\u202e\u2066",
    "\ufeff",
    "\ufffd",
    "\U0001f600",
    "\u0301",
    "\r\n",
    "\t",
    "\x7f",
    "\x1b[31m",
    "🏳️‍🌈",
    "2026-11-23T06:00:00Z",
    "2026-13-45T25:61:61Z",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "10000-01-01T00:00:00Z",
    "-0001-01-01T00:00:00Z",
    "1999-12-31T23:59:59+25:00",
    "1700000000000",
    "99999999999999999999",
    "all",
    "local",
    "gpu-1",
    "ml",
    "bert-worker-0",
    "uid-pt-bert",
    "=~",
    "!~",
    "!=",
    "=",
    "critical",
    "firing",
    "a" * 300,
    "é" * 1000,
]
LONG = [2_000, 70_000]  # a long text's lengths (past server.max_header_bytes in a query)


def nan_free(values: list[Any]) -> list[Any]:
    return [v for v in values if not (isinstance(v, float) and math.isnan(v))]


def texts(surrogates: bool = True, longest: int = 70_000) -> st.SearchStrategy[str]:
    """Text a client may send: the edge cases above, any unicode (lone surrogates too, which
    UTF-8 cannot carry: the encoder decides what goes out), numbers as text, long runs."""
    alphabet = st.characters() if surrogates else st.characters(exclude_categories=("Cs",))
    return st.one_of(
        st.sampled_from(TEXTS),
        st.text(alphabet, max_size=24),
        st.integers().map(str),
        st.floats().map(repr),
        st.builds(
            lambda c, n: c * n,
            st.sampled_from("a\x00(é"),
            st.sampled_from([n for n in (300, 2_000, 70_000) if n <= longest]),
        ),
    )


def plausible(name: str) -> st.SearchStrategy[str]:
    """A value a parameter of this name takes when it is right (a time, a count, a flag,
    a name the stand-in cluster has), so that a request gets past its first check."""
    low = name.lower()
    if any(
        w in low
        for w in (
            "start",
            "end",
            "since",
            "until",
            "time",
            "_at",
            "after",
            "before",
            "from",
            "date",
        )
    ):
        return st.sampled_from(
            [
                "1795000000",
                "1795003600",
                "1795000000000",
                "0",
                "2026-11-23T06:00:00Z",
                "2026-11-23T07:00:00+01:00",
            ]
        )
    if any(
        w in low
        for w in (
            "page",
            "size",
            "limit",
            "offset",
            "step",
            "hours",
            "num",
            "days",
            "top",
            "id",
            "count",
            "window",
        )
    ):
        return st.sampled_from(["0", "1", "2", "10", "60", "1000", "1001", "3600"])
    return st.sampled_from(
        [
            "",
            "true",
            "false",
            "gpu-1",
            "ml",
            "bert",
            "local",
            "all",
            "uid-pt-bert",
            "bert-worker-0",
            "critical",
            "firing",
            "pending",
            "nvidia.com/gpu",
            "name",
            "team",
            "desc",
        ]
    )


def integers() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from(INTS), st.integers(), st.integers(-10, 10))


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), integers(), st.sampled_from(FLOATS), st.floats(), texts()
    )


def deep(leaf: Any, depth: int, as_list: bool) -> Any:
    """leaf inside depth lists (or one-key objects)."""
    for _ in range(depth):
        leaf = [leaf] if as_list else {"a": leaf}
    return leaf


def json_values(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """JSON values of any shape, with the keys a route reads among the random ones, and
    nesting past inputs.MAX_DEPTH (past orjson's 1,024: the bodies of bytes)."""
    tree = st.recursive(
        scalars(),
        lambda kids: st.one_of(
            st.lists(kids, max_size=4), st.dictionaries(st.one_of(keys, texts()), kids, max_size=5)
        ),
        max_leaves=12,
    )
    nested = st.builds(deep, scalars(), st.sampled_from([31, 33, 200, 900]), st.booleans())
    return st.one_of(tree, nested)


def dumps(value: Any, ascii_only: bool) -> bytes:
    """value as JSON text the way a lax client writes it: NaN and Infinity as bare words,
    integers past 64 bits, lone surrogates raw (invalid UTF-8) unless ascii_only."""
    text = json.dumps(value, allow_nan=True, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")


# -- the routes -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """One declared route: its method and path, the prefixes it is served under, its
    surface (api/__init__.py's ROUTES)."""

    route: Route
    prefixes: tuple[str, ...]
    surface: str

    @property
    def method(self) -> str:
        return self.route.method

    @property
    def path(self) -> str:
        return self.route.path

    def __str__(self) -> str:
        return f"{self.method} {self.path} ({self.surface})"


def targets() -> list[Target]:
    """Every route of the recorder's route tables."""
    from lens_ebpf.recorder.api import ROUTES

    return [
        Target(r, prefixes, surface) for table, prefixes, surface in ROUTES for r in table.routes
    ]


WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,40}$")
SHARED = (
    "cluster",
    "page_num",
    "page_size",
    "pageNum",
    "pageSize",
    "offset",
    "limit",
    "start",
    "end",
    "step",
    "since",
    "until",
    "hours",
    "search",
    "name",
    "status",
)


def words(fn: Callable[..., Any], depth: int = 2) -> set[str]:
    """The names a handler may read: the identifier-like strings of its code and of the
    functions of this project it calls (depth calls deep), and those its docstring shows
    as `name=`; without a list kept by hand, so a new parameter is among them."""
    out: set[str] = set(re.findall(r"[?&](\w+)=", inspect.getdoc(fn) or ""))
    seen: set[int] = set()

    def code_words(code: types.CodeType, g: dict[str, Any], left: int) -> None:
        if id(code) in seen:
            return
        seen.add(id(code))
        for c in code.co_consts:
            if isinstance(c, str) and WORD.match(c):
                out.add(c)
            elif isinstance(c, types.CodeType):
                code_words(c, g, left)
        if left <= 0:
            return
        for name in code.co_names:
            for obj in (
                g.get(name),
                *(
                    getattr(m, name, None)
                    for m in g.values()
                    if isinstance(m, types.ModuleType) and m.__name__.startswith("lens_ebpf")
                ),
            ):
                fn_ = inspect.unwrap(obj) if callable(obj) else None
                if isinstance(fn_, types.FunctionType) and fn_.__module__.startswith("lens_ebpf"):
                    code_words(fn_.__code__, fn_.__globals__, left - 1)

    fn = inspect.unwrap(fn)
    if isinstance(fn, types.FunctionType):
        code_words(fn.__code__, fn.__globals__, depth)
    return out


def camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


# bodies the routes take, so that a mutation gets past the first check and into the work
# (a route without one is fuzzed with generated bodies only)
NOW = "2026-11-23T06:00:00Z"
SILENCE = {
    "name": "maintenance",
    "description": "",
    "cluster_name": "",
    "enabled": True,
    "silence_type": "resource",
    "resource_filters": [{"resource_type": "node", "operator": "=", "value": "gpu-3"}],
    "label_matchers": [{"name": "x", "operator": "=~", "value": "a.*"}],
    "alert_names": ["GPUXid"],
    "starts_at": NOW,
    "ends_at": "2026-11-24T06:00:00Z",
    "reason": "reboot",
}
METRIC_RULE = {
    "name": "gpu-hot",
    "cluster_name": "local",
    "enabled": True,
    "description": "hot",
    "groups": [
        {
            "name": "group_1",
            "interval": "30s",
            "rules": [
                {
                    "alert": "GPUHot",
                    "expr": "DCGM_FI_DEV_GPU_TEMP > 90",
                    "for": "5m",
                    "labels": {"severity": "critical"},
                    "annotations": {"summary": "hot", "description": "GPU is hot"},
                }
            ],
        }
    ],
    "labels": {},
}
LOG_RULE = {
    "name": "oom",
    "description": "",
    "cluster_name": "",
    "enabled": True,
    "priority": 50,
    "match_type": "pattern",
    "match_config": {"pattern": "out of memory", "flags": {"case_insensitive": True}},
    "label_selectors": [{"key": "pod", "operator": "=~", "value": "bert.*"}],
    "severity": "critical",
    "group_wait": 30,
    "repeat_interval": 3600,
    "alert_template": {"title": "OOM", "summary": "OOM"},
}
CHANNEL = {
    "name": "oncall",
    "type": "webhook",
    "enabled": True,
    "description": "",
    "config": {
        "url": "http://127.0.0.1:9/hook",
        "method": "POST",
        "timeout": 1,
        "headers": {"Authorization": "Bearer x"},
    },
}
AM_ALERT = {
    "status": "firing",
    "labels": {
        "alertname": "GPUHot",
        "node": "gpu-1",
        "namespace": "ml",
        "pod": "bert-worker-0",
        "severity": "critical",
    },
    "annotations": {"summary": "hot"},
    "startsAt": NOW,
    "endsAt": "0001-01-01T00:00:00Z",
    "generatorURL": "http://p/graph",
    "fingerprint": "0123456789abcdef",
}
LOG_LINE = {
    "date": 1795000000.5,
    "log": "iteration 10/100 | elapsed time per iteration (ms): " "512.0\n",
    "stream": "stdout",
    "time": "",
    "kubernetes": {
        "pod_name": "bert-worker-0",
        "namespace_name": "ml",
        "pod_id": "uid-bert-worker-0",
        "container_name": "pytorch",
        "host": "gpu-1",
    },
}
SEEDS: dict[str, Any] = {
    "alert-silences": SILENCE,
    "alert-silences/{id}": SILENCE,
    "metric-alert-rules": METRIC_RULE,
    "metric-alert-rules/{id}": METRIC_RULE,
    "metric-alert-rules/sync": {"cluster": "local"},
    "log-alert-rules": LOG_RULE,
    "log-alert-rules/{id}": LOG_RULE,
    "log-alert-rules/{id}/clone": {"name": "copy"},
    "log-alert-rules/batch-update": {"rule_ids": [1, 2], "enabled": False},
    "log-alert-rules/test": {
        "pattern": "out of (memory)",
        "sample_log": "CUDA Out Of Memory",
        "flags": {"case_insensitive": True, "multi_line": False},
    },
    "log-alert-rule-templates": {
        "name": "t",
        "category": "network",
        "description": "",
        "template_config": {
            k: LOG_RULE[k]
            for k in ("match_type", "match_config", "label_selectors", "severity", "alert_template")
        },
    },
    "log-alert-rule-templates/{id}/instantiate": {"name": "from-template", "cluster_name": "local"},
    "alert-rule-advices/{id}/status": {"status": "rejected"},
    "notification-channels": CHANNEL,
    "notification-channels/{id}": CHANNEL,
    "alerts/metric": {
        "version": "4",
        "status": "firing",
        "receiver": "lens",
        "groupLabels": {},
        "commonLabels": {},
        "alerts": [AM_ALERT],
    },
    "api/v2/alerts": [AM_ALERT],
    "alerts/webhook": {
        "alert_name": "GPUXid",
        "severity": "critical",
        "status": "firing",
        "labels": {"node": "gpu-1"},
        "annotations": {"summary": "xid"},
        "starts_at": NOW,
    },
    "logs": [LOG_LINE, {**LOG_LINE, "log": "CUDA out of memory\n"}],
}


@st.composite
def mutated(draw: st.DrawFn, seed: Any, keys: st.SearchStrategy[str]) -> Any:
    """seed with one place changed: a value replaced (any type), a key dropped or added,
    a list emptied or made long, the place nested past every bound."""
    value = json.loads(json.dumps(seed))
    holder: Any = None
    key: Any = None
    node = value
    while isinstance(node, dict | list) and node and draw(st.integers(0, 3)) > 0:
        holder = node
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        node = node[key]
    how = draw(st.sampled_from(["replace", "replace", "drop", "add", "long", "deep"]))
    new: Any
    if how == "replace":
        new = draw(json_values(keys))
    elif how == "long":
        new = [node] * draw(st.sampled_from([0, 2, 1000, 20_000]))
    elif how == "deep":
        new = deep(node, draw(st.sampled_from([30, 40, 900])), draw(st.booleans()))
    else:
        new = node
    if holder is None:
        return new if how != "drop" else {}
    if how == "drop":
        del holder[key]
    elif how == "add" and isinstance(holder, dict):
        holder[draw(st.one_of(keys, texts()))] = draw(json_values(keys))
    else:
        holder[key] = new
    return value


@dataclass(frozen=True)
class Sent:
    """One HTTP request as it goes out."""

    method: str
    target: str  # the path and query, as sent
    headers: dict[str, str]
    body: bytes

    def __str__(self) -> str:
        body = self.body[:300] + (b"..." if len(self.body) > 300 else b"")
        return f"{self.method} {self.target[:500]} {self.headers} {body!r} ({len(self.body)} B)"

    __repr__ = __str__  # (Hypothesis shows a failing example by its repr)


CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "",
    "application/json; charset=latin-1",
    "application/merge-patch+json",
    "multipart/form-data; boundary=x",
    "application/x-protobuf",
]


def quote(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


def path_values(name: str) -> st.SearchStrategy[str]:
    known = {
        "id": ["1", "2", "3", "0", "-1"],
        "name": ["gpu-1", "i-030791dc5a37cd257", "tw038"],
        "uid": ["uid-pt-bert", "uid-dep-trainer"],
    }
    return st.one_of(
        st.sampled_from(known.get(name, ["1", "gpu-1", "uid-pt-bert"])),
        texts(longest=300),
        integers().map(str),
    )


@st.composite
def queries(draw: st.DrawFn, names: list[str], shown: list[str]) -> str:
    """A query string: the parameters the route's docstring shows (shown) and others it
    may read (names), right or not, then any names with any values; or bytes no form
    encodes (bad escapes, invalid UTF-8, repeated and empty keys)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(
            st.sampled_from(
                [
                    "%zz",
                    "a=%ff%fe",
                    "&&=&",
                    "a=1&a=2",
                    "=x",
                    "a",
                    "a=%00",
                    "page_num=1&page_num=%00",
                    "%E2%82",
                    "a=b=c",
                ]
            )
        )
    pairs = [(n, draw(plausible(n))) for n in shown if draw(st.integers(0, 3))]
    pairs += [
        (n, draw(plausible(n)))
        for n in draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
    ]
    for i in draw(st.lists(st.integers(0, 9), max_size=3)):  # some made wrong
        if i < len(pairs):
            pairs[i] = (pairs[i][0], draw(texts(longest=300)))
        else:
            pairs.append(
                (
                    draw(st.one_of(st.sampled_from(names), texts(longest=300))),
                    draw(texts(longest=300)),
                )
            )
    if draw(st.integers(0, 29)) == 0:  # past server.max_header_bytes: 431
        pairs.append(("x", "a" * 70_000))
    draw(st.randoms()).shuffle(pairs)
    return "&".join(f"{quote(k)}={quote(v)}" for k, v in pairs)


def remote_write_bodies() -> st.SearchStrategy[tuple[bytes, dict[str, str]]]:
    """Remote write requests (1.0's and 2.0's protobuf, field by field), snappy-framed, or
    bytes that only claim to be."""
    from lens_ebpf.recorder.gen import remote_write_v1_pb2 as v1
    from lens_ebpf.recorder.gen import remote_write_v2_pb2 as v2

    def framed(raw: bytes, version: str, proto: str, enc: str) -> tuple[bytes, dict[str, str]]:
        body = bytes(cramjam.snappy.compress_raw(raw)) if enc == "snappy" else raw
        headers = {
            "Content-Type": "application/x-protobuf" + proto,
            "X-Prometheus-Remote-Write-Version": version,
        }
        if enc:
            headers["Content-Encoding"] = enc
        return body, headers

    raw = st.one_of(
        messages(v1.WriteRequest.DESCRIPTOR).map(lambda m: m.SerializeToString()),
        messages(v2.Request.DESCRIPTOR).map(lambda m: m.SerializeToString()),
        st.binary(max_size=64),
    )
    return st.builds(
        framed,
        raw,
        st.sampled_from(["0.1.0", "2.0.0", "", "9"]),
        st.sampled_from(
            [
                "",
                ";proto=io.prometheus.write.v2.Request",
                ";proto=prometheus.WriteRequest",
                ";proto=x",
            ]
        ),
        st.sampled_from(["snappy", "snappy", "", "gzip", "zstd"]),
    )


@st.composite
def requests_for(draw: st.DrawFn, t: Target, names: list[str], shown: list[str]) -> Sent:
    """One request to route t: a prefix it is served under, its path's parameters, a
    query, the credentials (mostly right), and for a write a body."""
    prefix = draw(st.sampled_from(t.prefixes))
    parts = [
        quote(draw(path_values(p[1:-1]))) if p.startswith("{") else p for p in t.path.split("/")
    ]
    query = draw(queries(names, shown))
    target = f"{prefix}/{'/'.join(parts)}" + (f"?{query}" if query else "")
    auth = draw(st.sampled_from(["right"] * 6 + ["none", "wrong"]))
    headers = (
        {"Authorization": f"Bearer {TOKEN}" if auth == "right" else "Bearer nope"}
        if auth != "none"
        else {}
    )
    accept = draw(
        st.sampled_from(["", "", "application/json, text/event-stream", "*/*", "text/html"])
    )
    if accept:
        headers["Accept"] = accept
    body = b""
    if t.method != "GET":
        keys = st.sampled_from(names)
        seed = SEEDS.get(t.path)
        how = draw(
            st.sampled_from(
                ["seed", "seed", "json", "bytes", "empty"]
                if seed is not None
                else ["json", "json", "bytes", "empty"]
            )
        )
        if t.path == "prometheus" and how != "empty":
            body, more = draw(remote_write_bodies())
            headers.update(more)
        else:
            if how == "plain":  # as the page sends it, under a name of its own
                named = json.loads(json.dumps(seed))
                if isinstance(named, dict) and "name" in named:
                    named["name"] = draw(st.text("abcdefgh-", min_size=1, max_size=12))
                body = dumps(named, True)
            elif how == "seed":
                body = dumps(draw(mutated(seed, keys)), draw(st.booleans()))
            elif how == "json":
                body = dumps(draw(json_values(keys)), draw(st.booleans()))
            elif how == "bytes":
                body = draw(
                    st.one_of(
                        st.binary(max_size=64),
                        st.sampled_from(
                            [
                                b"{",
                                b"[" * 100_000,
                                b"[" * 1100 + b"]" * 1100,
                                b'{"a":' * 2000,
                                b"\xff\xfe",
                                b"null",
                                b"1e999",
                                b'{"a": 1e999}',
                                b'{"a": -}',
                                b"\n".join([b"{}"] * 3),
                                b"\x00",
                            ]
                        ),
                    )
                )
            ctype = draw(
                st.sampled_from([t.route.takes[0]] * 20 + list(t.route.takes) + CONTENT_TYPES)
            )
            if ctype:
                headers["Content-Type"] = ctype
            if t.path == "logs" and draw(st.integers(0, 4)) == 0:
                headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "snappy", "br"]))
                if headers["Content-Encoding"] == "gzip" and draw(st.booleans()):
                    import gzip

                    body = gzip.compress(body)
    return Sent(t.method, target, headers, body)


# -- protobuf messages, field by field --------------------------------------------------------
F = FieldDescriptor
INT_RANGES = {
    F.TYPE_INT32: (-(2**31), 2**31 - 1),
    F.TYPE_SINT32: (-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    F.TYPE_UINT32: (0, 2**32 - 1),
    F.TYPE_FIXED32: (0, 2**32 - 1),
    F.TYPE_INT64: (-(2**63), 2**63 - 1),
    F.TYPE_SINT64: (-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    F.TYPE_UINT64: (0, 2**64 - 1),
    F.TYPE_FIXED64: (0, 2**64 - 1),
}


def field_values(f: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    """Values of one field's type: every integer of its width (its edges first), any
    float, any text protobuf can carry, bytes, enum numbers known or not, messages."""
    if f.type in INT_RANGES:
        lo, hi = INT_RANGES[f.type]
        edges = sorted(
            {
                v
                for v in (
                    lo,
                    hi,
                    0,
                    1,
                    -1,
                    lo // 2,
                    hi // 2,
                    10**12,
                    10**12 + 1,
                    10**18,
                    1_795_000_000_000_000_000,
                )
                if lo <= v <= hi
            }
        )
        return st.one_of(st.sampled_from(edges), st.integers(lo, hi), st.integers(0, 100))
    if f.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return st.one_of(
            st.sampled_from(FLOATS), st.floats(width=64 if f.type == F.TYPE_DOUBLE else 32)
        )
    if f.type == F.TYPE_BOOL:
        return st.booleans()
    if f.type == F.TYPE_STRING:
        return texts(surrogates=False)
    if f.type == F.TYPE_BYTES:
        return st.binary(max_size=32)
    if f.type == F.TYPE_ENUM:
        return st.one_of(
            st.sampled_from([v.number for v in f.enum_type.values]),
            st.integers(-(2**31), 2**31 - 1),
        )
    return messages(f.message_type, depth + 1)


def messages(d: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of d's type with any of their fields set (one of each oneof), nested
    messages to a depth of 3, repeated fields up to 3 long."""
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(d)

    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = cls()
        oneofs = {o.name: draw(st.sampled_from([None, *o.fields])) for o in d.oneofs}
        for f in d.fields:
            if f.containing_oneof is not None and oneofs[f.containing_oneof.name] is not f:
                continue
            if f.containing_oneof is None and not draw(st.booleans()):
                continue
            if f.message_type is not None and depth >= 3:
                continue
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                key_f, val_f = (
                    f.message_type.fields_by_name["key"],
                    f.message_type.fields_by_name["value"],
                )
                m = getattr(msg, f.name)
                for k, v in draw(
                    st.lists(
                        st.tuples(field_values(key_f, depth), field_values(val_f, depth)),
                        max_size=3,
                    )
                ):
                    if val_f.message_type is None:
                        m[k] = v
                    else:
                        m[k].CopyFrom(v)
            elif f.label == F.LABEL_REPEATED:
                got = draw(st.lists(field_values(f, depth), max_size=3))
                if f.message_type is None:
                    getattr(msg, f.name).extend(got)
                else:
                    getattr(msg, f.name).extend(got)
            elif f.message_type is not None:
                getattr(msg, f.name).CopyFrom(draw(field_values(f, depth)))
            else:
                setattr(msg, f.name, draw(field_values(f, depth)))
        return msg

    return build()


# -- what must hold --------------------------------------------------------------------------
class Logged(logging.Handler):
    """Every log record with a traceback or at ERROR and above, and every exception a
    thread did not catch: what the fuzz must never cause."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.bad: list[str] = []
        self._hook = threading.excepthook

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.bad.append(f"{record.name} {record.levelname}: {self.format(record)}")

    def thread_died(self, args: threading.ExceptHookArgs) -> None:
        self.bad.append(
            f"thread {args.thread.name if args.thread else '?'}: "
            f"{args.exc_type.__name__}: {args.exc_value}"
        )

    def __enter__(self) -> Logged:
        logging.getLogger().addHandler(self)
        threading.excepthook = self.thread_died
        return self

    def __exit__(self, *_: Any) -> None:
        logging.getLogger().removeHandler(self)
        threading.excepthook = self._hook

    def take(self) -> list[str]:
        got, self.bad = self.bad, []
        return got


@dataclass
class Tally:
    """What a run did: requests and streams by outcome, and what it found."""

    sent: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, outcome: str) -> None:
        self.sent += 1
        self.by_status[outcome] = self.by_status.get(outcome, 0) + 1


def fuzz_settings(examples: int) -> settings:
    """Seeded (derandomize: the same examples each run, no example database), no deadline
    (a busy machine is slow, not wrong), generation and shrinking only."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.explicit, Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )


# -- the stand-ins ---------------------------------------------------------------------------
class PromStandIn:
    """A Prometheus HTTP API that answers no series, and refuses what Prometheus refuses: a
    query its parser refuses, a time or step that is not a number, a range over 11,000
    points (400 bad_data): a query the recorder builds from a client's value must parse."""

    def __init__(self) -> None:
        self.refused: list[str] = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                q = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
                status, body = me.answer(url.path, q)
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, q: dict[str, str]) -> tuple[int, dict[str, Any]]:
        def bad(why: str) -> tuple[int, dict[str, Any]]:
            self.refused.append(f"{why}: {q}")
            return 400, {"status": "error", "errorType": "bad_data", "error": why}

        try:
            promql_parser.parse(q.get("query", ""))
        except Exception as exc:  # noqa: BLE001 (the parser's own error types)
            return bad(f"invalid parameter 'query': {exc}")
        try:
            times = {k: float(q[k]) for k in ("time", "start", "end", "step") if k in q}
        except ValueError:
            return bad("cannot parse a time or step")
        if path.endswith("/query_range"):
            start, end, step = times.get("start"), times.get("end"), times.get("step")
            if start is None or end is None or not step or step <= 0:
                return bad("start, end and a positive step are required")
            if end < start:
                return bad("end timestamp must not be before start time")
            if (end - start) / step > 11000:
                return bad("exceeded maximum resolution of 11,000 points per timeseries")
            return 200, {"status": "success", "data": {"resultType": "matrix", "result": []}}
        return 200, {"status": "success", "data": {"resultType": "vector", "result": []}}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Sink:
    """A remote write receiver (and webhook) that takes everything: 204."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- the recorder under fuzz -----------------------------------------------------------------
OK_CODES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
}


class RecorderUnderFuzz:
    """The recorder on url's database, with the API stand-in (a PyTorchJob's three GPU
    pods on three nodes), a Prometheus and a remote write receiver stand-in, credentials
    for its writes, its POST routes and its collector port; every request sent and
    checked here."""

    def __init__(self, url: str, tmp: Path, logged: Logged) -> None:
        from lens_ebpf.k8s.client import api_client
        from lens_ebpf.recorder import config
        from lens_ebpf.recorder.service import RecorderApp
        from tests.k8slab import FakeApiServer, eventually
        from tests.recorder.test_remote_write import bert

        self.logged, self.tally = logged, Tally()
        self.examples = 5  # a route's, as a run sets it
        self.api = FakeApiServer().start()
        bert(self.api)
        self.prom, self.sink = PromStandIn(), Sink()
        token = tmp / "token"
        token.write_text(TOKEN + "\n")
        nodes = tmp / "nodes"
        nodes.write_text("".join(f"fz-{i} tok-{i}\n" for i in range(NODES)))
        over: dict[tuple[str, ...], Any] = {
            ("recorder", "database_url"): url,
            ("recorder", "listen"): "127.0.0.1:0",
            ("recorder", "collect_listen"): "127.0.0.1:0",
            ("recorder", "db_retry_max_seconds"): 0.5,
            ("kubernetes", "backoff_max_seconds"): 0.5,
            ("recorder", "jobs", "allocation_seconds"): 3600,
            ("recorder", "api", "token_file"): str(token),
            ("recorder", "ingest", "token_file"): str(token),
            ("recorder", "prometheus", "url"): self.prom.url,
            ("recorder", "prometheus", "timeout_seconds"): 2,
            ("recorder", "remote_write", "url"): self.sink.url,
            ("recorder", "alerts", "timeout_seconds"): 1,
            ("recorder", "alerts", "rules_file"): str(tmp / "rules.yaml"),
            ("recorder", "reports", "pdf"): False,
            ("grpc", "auth", "tokenreview"): False,
            ("grpc", "auth", "tokens_file"): str(nodes),
            ("grpc", "auth", "anonymous"): "never",
        }
        cfg = config.load(env={}, overrides=over)
        client = api_client("kubeconfig", str(self.api.kubeconfig(tmp / "kubeconfig")))
        self.app = RecorderApp(cfg, client)
        self.app.start()
        eventually(self.app.tracker.pod_reflector.synced.is_set, timeout=20)
        eventually(self.app.nodes.reflector.synced.is_set, timeout=20)
        eventually(lambda: self.app.jobs.runs["prune"] >= 1, timeout=20)
        self._conn: http.client.HTTPConnection | None = None
        self.last: dict[str, int] = {}  # node -> its last seq, as the collector keeps it
        problems = self.logged.take()
        assert not problems, problems  # the start itself logs nothing bad

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self.app.stop(flush_timeout=2)
        self.prom.stop()
        self.sink.stop()
        self.api.kill()

    # HTTP
    def send(self, sent: Sent, timeout: float = 30) -> tuple[int, str]:
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(
                    "127.0.0.1", self.app.http.port, timeout=timeout
                )
            try:
                self._conn.request(
                    sent.method, sent.target, body=sent.body or None, headers=sent.headers
                )
                r = self._conn.getresponse()
                text = r.read().decode(errors="replace")
                if r.getheader("Connection", "").lower() == "close":
                    self._conn.close()
                    self._conn = None
                return r.status, text
            except (ConnectionError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if len(sent.target) > HEAD_MOST:  # refused (431) and closed while it was sent
                    return 431, ""
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def check(self, sent: Sent) -> None:
        status, text = self.send(sent)
        self.tally.count(str(status))
        problems = []
        if status >= 500:
            problems.append(f"answered {status}: {text[:600]}")
        # (an error's text: stored rows may hold anything, the shipped log rules "Traceback")
        leaked = [leak for leak in LEAKS if leak in text] if status >= 400 else []
        if leaked:
            problems.append(f"its answer holds {leaked}: {text[:600]}")
        problems += self.logged.take()
        if problems:
            self.tally.findings.append(f"{sent}: {problems}")
            raise AssertionError(f"{sent}\n" + "\n".join(problems))

    def ready(self) -> None:
        """/readyz answers 200 (the service serving after what it was sent)."""
        status, text = self.send(Sent("GET", "/readyz", {}, b""), timeout=10)
        assert status == 200, f"/readyz answered {status}: {text[:300]}"

    def fuzz_route(self, t: Target, examples: int) -> None:
        got = words(t.route.handler)
        names = sorted(got | set(SHARED) | {camel(n) for n in got})
        shown = sorted(set(re.findall(r"[?&](\w+)=", inspect.getdoc(t.route.handler) or "")))

        @fuzz_settings(examples)
        @given(requests_for(t, names, shown))
        def one(sent: Sent) -> None:
            self.check(sent)

        one()
        self.ready()

    # the collector port
    def stream(
        self, method: str, frames: list[bytes], meta: list[tuple[str, str]], timeout: float = 10
    ) -> tuple[grpc.StatusCode, list[int], str]:
        """One Report or ReportBatch stream of frames (serialized messages, or not): its
        final code, the acks it got, the code's details."""
        with grpc.insecure_channel(f"127.0.0.1:{self.app.collect_port}") as ch:
            call = ch.stream_stream(
                f"/lens.v1.CollectorService/{method}",
                request_serializer=None,
                response_deserializer=pb.Ack.FromString,
            )
            acks: list[int] = []
            try:
                for ack in call(iter(frames), metadata=meta, timeout=timeout):
                    acks.append(ack.seq)
            except grpc.RpcError as exc:
                return exc.code(), acks, exc.details() or ""
            return grpc.StatusCode.OK, acks, ""

    def check_stream(self, s: Stream) -> None:
        code, acks, details = self.stream(s.method, s.frames, s.meta)
        self.tally.count(code.name)
        problems = []
        if code not in OK_CODES:
            problems.append(f"ended {code.name}: {details[:300]}")
        if s.auth != "own" and (acks or code == grpc.StatusCode.OK):
            problems.append(f"a stream with {s.auth} credentials was taken: acks {acks}")
        if s.auth == "own":
            # the node's last seq as the collector keeps it: duplicates dropped, a jump past
            # grpc.max_seq_jump or a message that does not decode ends the stream
            last = prior = self.last.get(s.node, 0)
            why = ""
            for evs in s.decoded:
                if evs is None:
                    why = "a message that does not decode"
                    break
                for ev in evs:
                    if ev.WhichOneof("payload") == "gap" or ev.seq <= last:
                        continue
                    if ev.seq - last > MAX_SEQ_JUMP:
                        why = f"seq {ev.seq} past the node's last {last}"
                        break
                    last = ev.seq
                if why:
                    break
            self.last[s.node] = last
            if why and code != grpc.StatusCode.INVALID_ARGUMENT:
                problems.append(f"{why}: ended {code.name}, not INVALID_ARGUMENT")
            if not why and code != grpc.StatusCode.OK:
                problems.append(f"a good stream ended {code.name}: {details[:300]}")
            if code == grpc.StatusCode.OK and max(acks, default=prior) != last:
                problems.append(f"acknowledged {acks}, not up to {last}: events dropped")
            if any(a > last for a in acks):
                problems.append(f"acknowledged {max(acks)}, beyond the largest seq taken ({last})")
        problems += self.logged.take()
        if problems:
            self.tally.findings.append(f"{s}: {problems}")
            raise AssertionError(f"{s}\n" + "\n".join(problems))

    def fuzz_collector(self, examples: int) -> None:
        @fuzz_settings(examples)
        @given(streams())
        def one(s: Stream) -> None:
            self.check_stream(s)

        one()
        self.ready()


@dataclass(frozen=True)
class Stream:
    """One stream to the collector port: its method, metadata, frames (and their events,
    None for a frame that does not decode)."""

    method: str
    auth: str  # own (the node's token), other (another node's), wrong, none
    node: str
    meta: list[tuple[str, str]]
    frames: list[bytes]
    decoded: list[list[pb.Event] | None]

    def __str__(self) -> str:
        frames = [f[:120] for f in self.frames]
        return f"{self.method} {self.meta} {frames}"

    __repr__ = __str__


# (gRPC carries a metadata value without its edges' spaces: none are drawn)
METADATA_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(
    str.strip
)


@st.composite
def streams(draw: st.DrawFn) -> Stream:
    """A Report or ReportBatch stream: the node's token, another's, a wrong one or none;
    events (or batches) field by field, or bytes that may be no message."""
    i = draw(st.integers(0, NODES - 1))
    node = draw(
        st.one_of(st.just(f"fz-{i}"), st.just(f"fz-{i}"), st.just(f"fz-{i}"), METADATA_TEXT)
    )
    auth = draw(st.sampled_from(["own", "own", "own", "other", "wrong", "none"]))
    meta = [("lens-node", node)]
    if draw(st.integers(0, 4)) == 0:
        meta.append(("lens-cluster", draw(st.one_of(st.just("local"), METADATA_TEXT))))
    if auth != "none":
        token = {"own": f"tok-{i}", "other": f"tok-{(i + 1) % NODES}"}.get(auth, "nope")
        meta.append(
            ("authorization", draw(st.sampled_from(["Bearer ", "bearer ", "Bearer  "])) + token)
        )
    # (no lens-cluster, or an empty one: the recorder's home cluster)
    if node != f"fz-{i}" or any(k == "lens-cluster" and v not in ("", "local") for k, v in meta):
        auth = "other" if auth == "own" else auth  # the token is not this claim's
    method = draw(st.sampled_from(["Report", "ReportBatch"]))
    cls = pb.Event if method == "Report" else pb.EventBatch
    frames: list[bytes] = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 7)) == 0:
            frames.append(
                draw(
                    st.one_of(
                        st.binary(max_size=40),
                        st.sampled_from([b"\x08", b"\xff" * 10, b"\x0a\x05ab"]),
                    )
                )
            )
        else:
            frames.append(draw(messages(cls.DESCRIPTOR)).SerializeToString())
    decoded: list[list[pb.Event] | None] = []
    for f in frames:
        try:
            msg = cls.FromString(f)
        except DecodeError:
            decoded.append(None)
            continue
        decoded.append([msg] if isinstance(msg, pb.Event) else list(msg.events))
    return Stream(method, auth, f"local/{node}", meta, frames, decoded)


# -- the agent's port ------------------------------------------------------------------------
class AgentUnderFuzz:
    """The agent's gRPC server (EventService, NodeService, health) on a bus that holds
    events, its subscribers' token in a tokens file, no anonymous calls."""

    def __init__(self, tmp: Path, logged: Logged) -> None:
        from lens_ebpf.agent.events import EventBus
        from lens_ebpf.agent.stream.grpc_server import GrpcServer
        from lens_ebpf.protocol.stream_auth import Guard, SubscriberAuthConfig
        from tests.unit.test_events import EXEC, FLOW

        self.logged, self.tally = logged, Tally()
        tokens = tmp / "subscribers"
        tokens.write_text(f"recorder {TOKEN}\n")
        auth = SubscriberAuthConfig(tokenreview=False, tokens_file=str(tokens), anonymous="never")
        self.bus = EventBus(queue_size=1000, history=50)
        for ev in (EXEC, FLOW) * 10:
            self.bus.publish(ev)
        listen = "127.0.0.1:0"
        self.server = GrpcServer(
            listen,
            self.bus,
            ("gpu-1", "10.0.0.1"),
            lambda: {"tcp": "on"},
            max_subscribers=50,
            guard=Guard(auth, listen, "gRPC"),
        )
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")

    def close(self) -> None:
        self.channel.close()
        self.server.stop()

    def call(self, c: AgentCall) -> tuple[grpc.StatusCode, int, str]:
        """The call's final code (DEADLINE_EXCEEDED: a live stream still open), how many
        messages it got, the code's details."""
        got = 0
        if c.method == "GetNode":
            fn = self.channel.unary_unary(
                "/lens.v1.NodeService/GetNode", request_serializer=None, response_deserializer=None
            )
            try:
                fn(c.request, metadata=c.meta, timeout=5)
                return grpc.StatusCode.OK, 1, ""
            except grpc.RpcError as exc:
                return exc.code(), 0, exc.details() or ""
        stream = self.channel.unary_stream(
            f"/lens.v1.EventService/{c.method}", request_serializer=None, response_deserializer=None
        )(c.request, metadata=c.meta, timeout=0.3)
        try:
            for _ in stream:
                got += 1
                if got >= 3:
                    stream.cancel()
                    return grpc.StatusCode.OK, got, ""
        except grpc.RpcError as exc:
            code = exc.code()
            return (
                (grpc.StatusCode.OK if code == grpc.StatusCode.CANCELLED else code),
                got,
                exc.details() or "",
            )
        return grpc.StatusCode.OK, got, ""

    def check(self, c: AgentCall) -> None:
        code, got, details = self.call(c)
        self.tally.count(code.name)
        problems = []
        if code not in OK_CODES | {grpc.StatusCode.DEADLINE_EXCEEDED}:
            problems.append(f"ended {code.name}: {details[:300]}")
        if c.auth != "right" and (got or code not in (grpc.StatusCode.UNAUTHENTICATED,)):
            problems.append(f"a call with {c.auth} credentials got {got} messages, {code.name}")
        problems += self.logged.take()
        if problems:
            self.tally.findings.append(f"{c}: {problems}")
            raise AssertionError(f"{c}\n" + "\n".join(problems))

    def serving(self) -> None:
        """The health service says SERVING (the port answering after the fuzz)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        got = health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert got.status == health_pb2.HealthCheckResponse.SERVING

    def fuzz(self, examples: int) -> None:
        @fuzz_settings(examples)
        @given(agent_calls())
        def one(c: AgentCall) -> None:
            self.check(c)

        one()
        self.serving()


@dataclass(frozen=True)
class AgentCall:
    method: str
    auth: str  # right, wrong, none
    meta: list[tuple[str, str]]
    request: bytes

    def __str__(self) -> str:
        return f"{self.method} {self.meta} {self.request[:200]!r}"

    __repr__ = __str__


@st.composite
def agent_calls(draw: st.DrawFn) -> AgentCall:
    """Subscribe, SubscribeBatch or GetNode: their requests field by field (or bytes that
    are none), with the subscribers' token, a wrong one, or none."""
    method = draw(st.sampled_from(["Subscribe", "SubscribeBatch", "GetNode"]))
    auth = draw(st.sampled_from(["right", "right", "right", "wrong", "none"]))
    meta = (
        [("authorization", f"Bearer {TOKEN if auth == 'right' else 'nope'}")]
        if auth != "none"
        else []
    )
    cls = pb.GetNodeRequest if method == "GetNode" else pb.SubscribeRequest
    request = draw(
        st.one_of(
            messages(cls.DESCRIPTOR).map(lambda m: m.SerializeToString()),
            messages(cls.DESCRIPTOR).map(lambda m: m.SerializeToString()),
            st.binary(max_size=40),
        )
    )
    return AgentCall(method, auth, meta, request)
