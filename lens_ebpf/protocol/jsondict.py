"""A protobuf message as the dict protobuf's JSON mapping gives it
(json_format.MessageToDict(msg, preserving_proto_field_name=True)), from ListFields():
the same keys and values (64-bit integers as strings, enums by name, bytes in base64,
floats at float32 precision, NaN/Infinity as strings, default values left out), at a
fraction of its cost (the recorder converts every event a thousand nodes send).
Well-known types (Any, Timestamp, Struct, ...) have their own JSON forms: a message
holding one goes to json_format itself."""

from __future__ import annotations

import base64
import math
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.internal.type_checkers import ToShortestFloat
from google.protobuf.message import Message

_INT64 = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}
_SPECIAL = {math.inf: "Infinity", -math.inf: "-Infinity"}
_plain: dict[str, bool] = {}  # message full name -> holds no well-known type, at any depth


def _is_plain(desc: Any, seen: frozenset[str] = frozenset()) -> bool:
    name = desc.full_name
    if name in _plain:
        return _plain[name]
    if name.startswith("google.protobuf."):
        return False
    if name in seen:
        return True  # recursion: decided by the other fields
    ok = all(
        f.message_type is None or _is_plain(f.message_type, seen | {name}) for f in desc.fields
    )
    _plain[name] = ok
    return ok


def _scalar(fd: FieldDescriptor, v: Any) -> Any:
    t = fd.type
    if t in _INT64:
        return str(v)
    if t == FieldDescriptor.TYPE_ENUM:
        ev = fd.enum_type.values_by_number.get(v) if fd.enum_type is not None else None
        return ev.name if ev is not None else v
    if t == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(v).decode("utf-8")
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        if math.isnan(v):
            return "NaN"
        if v in _SPECIAL:
            return _SPECIAL[v]
        if t == FieldDescriptor.TYPE_FLOAT:
            return ToShortestFloat(v)
    return v


def _repeated(fd: FieldDescriptor) -> bool:
    # is_repeated since protobuf 6; label (deprecated there) before
    rep = getattr(fd, "is_repeated", None)
    if rep is None:
        return bool(fd.label == FieldDescriptor.LABEL_REPEATED)  # type: ignore[attr-defined]
    return bool(rep)


def _value(fd: FieldDescriptor, v: Any) -> Any:
    return _dict(v) if fd.message_type is not None else _scalar(fd, v)


def _dict(msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fd, v in msg.ListFields():
        mt = fd.message_type
        if mt is not None and mt.GetOptions().map_entry:
            vf = mt.fields_by_name["value"]
            out[fd.name] = {
                (str(k).lower() if isinstance(k, bool) else str(k)): _value(vf, x)
                for k, x in v.items()
            }
        elif _repeated(fd):
            out[fd.name] = [_value(fd, x) for x in v]
        else:
            out[fd.name] = _value(fd, v)
    return out


def to_dict(msg: Message) -> dict[str, Any]:
    """MessageToDict(msg, preserving_proto_field_name=True), the same dict."""
    if not _is_plain(msg.DESCRIPTOR):
        return json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return _dict(msg)
