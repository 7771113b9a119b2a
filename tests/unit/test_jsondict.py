"""jsondict.to_dict gives json_format.MessageToDict's dict for every message of lens.proto,
filled at random (every field, each oneof member in turn, edge values), and for one
that holds a well-known type."""

from __future__ import annotations

import random
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.jsondict import to_dict

F = FieldDescriptor
INTS = {
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
FLOATS = [0.1, -2.5, 1e-7, 3.4e38, float("nan"), float("inf"), float("-inf"), 0.0]


def scalar(fd: FieldDescriptor, rnd: random.Random) -> Any:
    if fd.type in INTS:
        lo, hi = INTS[fd.type]
        return rnd.choice([lo, hi, 0, 1, rnd.randint(lo, hi)])
    if fd.type == F.TYPE_BOOL:
        return rnd.choice([True, False])
    if fd.type == F.TYPE_STRING:
        return rnd.choice(["", "gpu-0", 'é ü \n"x"', "0000:c1:00.0"])
    if fd.type == F.TYPE_BYTES:
        return rnd.randbytes(rnd.randint(0, 9))
    if fd.type in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return rnd.choice(FLOATS)
    if fd.type == F.TYPE_ENUM:
        return rnd.choice([v.number for v in fd.enum_type.values])
    raise AssertionError(fd.type)


def fill(msg: Message, rnd: random.Random, depth: int = 0, oneof_pick: int = 0) -> None:
    desc: Descriptor = msg.DESCRIPTOR
    skip = set()
    for oneof in desc.oneofs:
        keep = oneof.fields[oneof_pick % len(oneof.fields)]
        skip |= {f.name for f in oneof.fields if f is not keep}
    for fd in desc.fields:
        if fd.name in skip:
            continue
        mt = fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            kf, vf = mt.fields_by_name["key"], mt.fields_by_name["value"]
            m = getattr(msg, fd.name)
            for _ in range(rnd.randint(0, 3)):
                k = scalar(kf, rnd)
                if vf.message_type is None:
                    m[k] = scalar(vf, rnd)
                else:
                    fill(m[k], rnd, depth + 1)
        elif fd.is_repeated:
            seq = getattr(msg, fd.name)
            for _ in range(rnd.randint(0, 3)):
                if mt is None:
                    seq.append(scalar(fd, rnd))
                elif depth < 3:
                    fill(seq.add(), rnd, depth + 1)
        elif mt is not None:
            if depth < 3:
                fill(getattr(msg, fd.name), rnd, depth + 1)
                getattr(msg, fd.name).SetInParent()
        else:
            setattr(msg, fd.name, scalar(fd, rnd))


MESSAGES = sorted(pb.DESCRIPTOR.message_types_by_name)


@pytest.mark.parametrize("name", MESSAGES)
def test_every_lens_message_converts_as_message_to_dict(name: str) -> None:
    cls = getattr(pb, name)
    rnd = random.Random(name)
    oneofs = max([len(o.fields) for o in cls.DESCRIPTOR.oneofs] or [1])
    for i in range(60):
        msg = cls()
        fill(msg, rnd, oneof_pick=i % oneofs)
        want = json_format.MessageToDict(msg, preserving_proto_field_name=True)
        assert to_dict(msg) == want, (name, i)
    empty = cls()
    assert to_dict(empty) == {} == json_format.MessageToDict(empty)


def test_every_event_payload_kind_is_covered() -> None:
    kinds = {f.name for f in pb.Event.DESCRIPTOR.oneofs_by_name["payload"].fields}
    assert "device_inventory" in kinds and "container_start" in kinds
    for i, kind in enumerate(sorted(kinds)):
        ev = pb.Event()
        fill(getattr(ev, kind), random.Random(kind), 1)
        getattr(ev, kind).SetInParent()
        ev.seq = 2**64 - 1 - i
        assert ev.WhichOneof("payload") == kind
        assert to_dict(ev) == json_format.MessageToDict(ev, preserving_proto_field_name=True)


def test_a_well_known_type_takes_json_formats_own_form() -> None:
    s = struct_pb2.Struct()
    s.update({"a": 1.5, "b": [True, None, "x"]})
    assert to_dict(s) == {"a": 1.5, "b": [True, None, "x"]} == json_format.MessageToDict(s)
