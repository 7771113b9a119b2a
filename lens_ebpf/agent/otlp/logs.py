"""The agent's events as OTLP log records, one ExportLogsServiceRequest per batch.

A record's time is the event's (the bus's wall clock when it was published), its
`event_name` and body the event's kind, its severity INFO but for an abnormal flow or an
OOM kill (WARN) and a GPU fault (ERROR). Its attributes are the event's fields under
their own names (as `trace --json` and the gRPC stream name them: `class`, `seq`,
`raddr` ...), empty strings left out; who the event belongs to (a process's container and
pod, the local pod of a flow) is its resource instead (semconv.py), so records of one pod
share one.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope

from lens_ebpf.agent.events import KINDS, WIRE_ATTRS, Event
from lens_ebpf.agent.otlp import semconv, wire
from lens_ebpf.agent.otlp.metrics import Snapshot, resource
from lens_ebpf.agent.otlp.semconv import NODE, OWNER_FIELDS, Owner

# SeverityNumber
INFO, WARN, ERROR = 9, 13, 17
SEVERITY = {"abnormal_flow": WARN, "oom_kill": WARN, "gpu_fault": ERROR, "gap": WARN}
_TEXT = {INFO: "INFO", WARN: "WARN", ERROR: "ERROR"}
_Q = struct.Struct("<Q")
_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class _Plan:
    """One event type's record: its attribute fields (the event's attribute, the
    KeyValue's bytes up to its value's length) and its owner fields."""

    fields: tuple[tuple[str, bytes], ...]
    owner: tuple[str, ...]  # for each of OWNER_FIELDS, the event's attribute or ""


def _plan(cls: type[Event]) -> _Plan:
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    owner = tuple(f if f in names else "" for f in OWNER_FIELDS)
    wire_name = {v: k for k, v in WIRE_ATTRS.items()}
    fields = tuple(
        (f.name, wire.ld(1, wire_name.get(f.name, f.name).encode()) + b"\x12")
        for f in dataclasses.fields(cls)
        if f.init and f.name != "ts_unix_nano" and f.name not in owner
    )
    return _Plan(fields, owner)


PLANS: dict[type[Event], _Plan] = {cls: _plan(cls) for cls in set(KINDS.values())}


def _heads() -> dict[str, tuple[bytes, bytes]]:
    """Per kind: a record's bytes between its time and its attributes (severity, body),
    and after them (event_name); observed time goes between."""
    out = {}
    for kind in KINDS:
        sev = SEVERITY.get(kind, INFO)
        body = wire.ld(1, kind.encode())  # AnyValue.string_value
        out[kind] = (
            wire.uint(2, sev) + wire.ld(3, _TEXT[sev].encode()) + wire.ld(5, body),
            wire.ld(12, kind.encode()),
        )
    return out


HEADS = _heads()


def record_attributes(ev: Event, plan: _Plan) -> bytes:
    """An event's fields but its time and owner as LogRecord.attributes (field 6)."""
    out = []
    for name, head in plan.fields:
        v = getattr(ev, name)
        t = type(v)
        if t is str:
            if not v:
                continue
            raw = v.encode()
            anyv = b"\x0a" + wire.varint(len(raw)) + raw
        elif t is int and _INT64[0] <= v <= _INT64[1]:
            anyv = b"\x18" + wire.varint(v)
        elif t is bool:
            anyv = b"\x10\x01" if v else b"\x10\x00"
        elif t is tuple and not v:
            continue
        else:
            anyv = wire.any_value(v)
        kv = head + wire.varint(len(anyv)) + anyv
        out.append(b"\x32" + wire.varint(len(kv)) + kv)
    return b"".join(out)


@dataclass
class LogsEncoder:
    """Makes ExportLogsServiceRequests of events, each grouped under its resource."""

    node: list[tuple[str, str]]  # the node's resource attributes
    scope_version: str = ""
    _resources: dict[Owner, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._scope = wire.ld(
            1,
            InstrumentationScope(name="lens-ebpf", version=self.scope_version).SerializeToString(),
        )

    def record(self, ev: Event) -> tuple[Owner, bytes]:
        """One event's LogRecord bytes, and whose resource it goes under."""
        plan = PLANS[type(ev)]
        owner = NODE
        if any(plan.owner):
            got = tuple(getattr(ev, a) if a else "" for a in plan.owner)
            if any(got):
                owner = got
        head, tail = HEADS[ev.kind]
        ts = _Q.pack(ev.ts_unix_nano)
        return owner, b"".join((b"\x09", ts, head, record_attributes(ev, plan), b"\x59", ts, tail))

    def encode(self, events: Iterable[Event]) -> Snapshot:
        """One ExportLogsServiceRequest of these events, in their order within a
        resource."""
        by_owner: dict[Owner, list[bytes]] = {}
        n = 0
        for ev in events:
            owner, rec = self.record(ev)
            by_owner.setdefault(owner, []).append(rec)
            n += 1
        body = wire.ld_many(
            1,
            (
                wire.ld(1, self._resource(owner)) + wire.ld(2, self._scope + wire.ld_many(2, recs))
                for owner, recs in by_owner.items()
            ),
        )
        return Snapshot(body, n)

    def _resource(self, owner: Owner) -> bytes:
        got = self._resources.get(owner)
        if got is None:
            if len(self._resources) > 10000:
                self._resources.clear()
            got = self._resources[owner] = resource(self.node + semconv.owner_attributes(owner))
        return got
