"""Typed events to lens.v1 protobuf messages, field by field under the same names.

Every field of a payload message is read from the event by its name (a nested Identity
from the event's owner fields), so a proto field that an event type lacks fails the
conversion test rather than going out empty (tests/unit/test_events.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from keyword import iskeyword
from typing import Any

from lens_ebpf.agent.events import KINDS, WIRE, WIRE_ATTRS, Event, EventFilter
from lens_ebpf.protocol.gen import lens_pb2 as pb

_ONEOF = pb.Event.DESCRIPTOR.oneofs_by_name["payload"]
# event kind -> payload message class (the oneof field is named after the kind)
PAYLOADS: dict[str, Any] = {
    f.name: getattr(pb, f.message_type.name)  # type: ignore[union-attr]
    for f in _ONEOF.fields
}


def _plan(cls: Any) -> tuple[tuple[str, str], ...]:
    """(proto field, event attribute) for each field of a message but identity."""
    return tuple(
        (f.name, WIRE_ATTRS.get(f.name, f.name))
        for f in cls.DESCRIPTOR.fields
        if f.name != "identity"
    )


# message fields that hold events themselves (a device_inventory's devices): the class of
# each, converted entry by entry
_NESTED: dict[tuple[Any, str], Any] = {
    (cls, f.name): getattr(pb, f.message_type.name)
    for cls in PAYLOADS.values()
    for f in cls.DESCRIPTOR.fields
    if f.message_type is not None and f.name != "identity"
}


_IDENTITY = _plan(pb.Identity)
# payload class -> its fields read from the event, and whether it carries an Identity
_PLANS: dict[Any, tuple[tuple[tuple[str, str], ...], bool]] = {
    cls: (_plan(cls), "identity" in cls.DESCRIPTOR.fields_by_name)
    for cls in (*PAYLOADS.values(), pb.Identity)
}


def message(cls: Any, ev: Event) -> Any:
    """One payload (or Identity) message, each field read from the event by its name;
    a field the event lacks raises AttributeError. Fields at their zero value are not
    passed (proto3 writes none of them: the same bytes, 4.9 -> 3.2 us for a closed flow,
    most of whose identity fields are empty); the Identity is always set."""
    fields, identity = _PLANS[cls]
    values = {name: v for name, attr in fields if (v := getattr(ev, attr))}
    for name in values:
        if (sub := _NESTED.get((cls, name))) is not None:
            values[name] = [message(sub, e) for e in values[name]]
    if identity:
        values["identity"] = pb.Identity(
            **{name: v for name, attr in _IDENTITY if (v := getattr(ev, attr))}
        )
    return cls(**values)


def to_pb(ev: Event, node_name: str, node_ip: str) -> pb.Event:
    """The event as a pb.Event message, field by field: the reference encode's bytes are
    compared with (the streams and the reporter send encode's)."""
    return pb.Event(
        seq=ev.seq,
        ts_unix_nano=ev.ts_unix_nano,
        node_name=node_name,
        node_ip=node_ip,
        **{ev.kind: message(PAYLOADS[ev.kind], ev)},
    )


def wire(ev: Event, node_name: str, node_ip: str) -> bytes:
    """The event as a serialized pb.Event (encode), made once and kept on the event: every
    subscriber's stream (and batch) sends the same bytes."""
    got = ev._wire
    if not got:
        got = encode(ev, node_name, node_ip)
        object.__setattr__(ev, WIRE, got)
    return got


_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(n: int) -> bytes:
    """A protobuf varint (n >= 0): 7 bits a byte, low first, the high bit set on all but
    the last; written out for the one or two bytes most lengths take."""
    if n < 0x80:
        return _SMALL[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# encode builds each payload with one call of its message class, every field passed from
# the event (zero values too: proto3 writes none of them), by a function made
# once from the message's descriptor, as dataclasses makes __init__; then writes the
# Event's own four fields and appends the payload as its oneof field (the highest numbers,
# so the bytes are protobuf's: tests/unit/test_events.py compares them for every kind).
# to_pb (a dict of the fields set, a payload, then an Event it is copied into) took 3.5-4.0
# us for a closed flow, more than the rest of its way from the ring buffer to a subscriber.
def _builder(cls: Any) -> Callable[[Any], Any]:
    """A function making one message of cls from an event (or a nested entry): each
    field read by its name from the object; the identity from the event's own
    owner fields, always set, as message() sets it."""
    env: dict[str, Any] = {"M": cls}
    args = []
    for f in cls.DESCRIPTOR.fields:
        value = f"ev.{WIRE_ATTRS.get(f.name, f.name)}"
        if f.message_type is not None:
            env[f"B_{f.name}"] = _builder(getattr(pb, f.message_type.name))
            if f.is_repeated:
                value = f"[B_{f.name}(x) for x in {value}]"
            elif f.name == "identity":
                value = f"B_{f.name}(ev)"
            else:
                raise TypeError(f"{cls.__name__}.{f.name}: only identity is a nested message")
        # a field named like a Python keyword (class) goes in through **
        args.append(f"**{{{f.name!r}: {value}}}" if iskeyword(f.name) else f"{f.name}={value}")
    source = f"def build(ev):\n    return M({', '.join(args)})\n"
    exec(source, env)  # noqa: S102 - the source above, from the message's descriptor
    build: Callable[[Any], Any] = env["build"]
    return build


# event kind -> (the Event's tag for that payload, the payload's builder)
_PAYLOAD_WIRE = {
    kind: (_varint(_ONEOF.fields[i].number << 3 | 2), _builder(cls))
    for i, (kind, cls) in enumerate(PAYLOADS.items())
}


def encode(ev: Event, node_name: str, node_ip: str) -> bytes:
    """to_pb(ev, node_name, node_ip).SerializeToString(), in half the time."""
    tag, build = _PAYLOAD_WIRE[ev.kind]
    payload = build(ev).SerializeToString()
    head = pb.Event(
        seq=ev.seq, ts_unix_nano=ev.ts_unix_nano, node_name=node_name, node_ip=node_ip
    ).SerializeToString()
    return b"".join((head, tag, _varint(len(payload)), payload))


# what one EventBatch holds at most (SubscribeBatch, the reporter's ReportBatch): gRPC's
# default limit on a received message is 4 MiB
BATCH_EVENTS = 500
BATCH_BYTES = 1 << 20


def wire_chunks(events: Iterable[Event], node_name: str, node_ip: str) -> Iterator[list[bytes]]:
    """The events' encodings (wire), in order, in lists of at most BATCH_EVENTS events
    and about BATCH_BYTES bytes (a list ends at the event that reaches it)."""
    chunk: list[bytes] = []
    size = 0
    for ev in events:
        data = wire(ev, node_name, node_ip)
        chunk.append(data)
        size += len(data)
        if len(chunk) >= BATCH_EVENTS or size >= BATCH_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def batch_wire(events: list[bytes]) -> bytes:
    """A serialized pb.EventBatch of serialized events (field 1, length-delimited, each:
    what EventBatch(events=[...]).SerializeToString() writes, without parsing them again)."""
    return b"".join(b"\n" + _varint(len(e)) + e for e in events)


def validate(req: pb.SubscribeRequest) -> str | None:
    """Why a SubscribeRequest is malformed, or None."""
    unknown = [k for k in req.kinds if k not in KINDS]
    if unknown:  # named, but bounded: a request is not echoed back whole
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        more = f" (+{len(unknown) - 5} more)" if len(unknown) > 5 else ""
        return f"unknown kind(s) {shown}{more}; known: {', '.join(KINDS)}"
    if req.from_seq < 0:
        return f"from_seq must be 0 (live) or a sequence number, got {req.from_seq}"
    return None


def matcher(req: pb.SubscribeRequest) -> EventFilter:
    return EventFilter(
        kinds=frozenset(req.kinds), namespace=req.namespace, pod=req.pod, container=req.container
    )
