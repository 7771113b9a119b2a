"""Python mirrors of the records in programs/*.h (lens_common.h, tcp_flows.h,
proc_events.h, drops.h), the one source of each layout.

Each mirror is checked against its header by tests/unit/test_layouts.py (every struct
there has one here, field by field, types too), and field by field (name, offset, size)
against the type BCC derived from the C at load time; a mismatch is an error, never a
guess (docs/contributing/style.md).
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, cast


class LpmKey(ctypes.Structure):
    _fields_ = [("prefixlen", ctypes.c_uint32), ("addr", ctypes.c_uint8 * 16)]


class FlowKey(ctypes.Structure):
    _fields_ = [
        ("raddr", ctypes.c_uint8 * 16),
        ("port", ctypes.c_uint16),
        ("direction", ctypes.c_uint8),
        ("cls", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("overflow", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 2),
    ]


class FlowVal(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "opened",
            "closed",
            "failed",
            "sent",
            "recv",
            "retrans",
            "resets_sent",
            "resets_recv",
        )
    ]


class SockInfo(ctypes.Structure):
    _fields_ = [
        ("start_ns", ctypes.c_uint64),
        ("sent", ctypes.c_uint64),
        ("recv", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("rtt_period", ctypes.c_uint64),
        ("pre_sent", ctypes.c_uint64),
        ("pre_recv", ctypes.c_uint64),
        ("key", FlowKey),
        ("laddr", ctypes.c_uint8 * 16),
        ("pid", ctypes.c_uint32),
        ("retrans", ctypes.c_uint32),
        ("lport", ctypes.c_uint16),
        ("rport", ctypes.c_uint16),
        ("keyed", ctypes.c_uint8),
        ("pid_known", ctypes.c_uint8),
        ("rst_sent", ctypes.c_uint8),
        ("rst_recv", ctypes.c_uint8),
        ("direction", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("comm", ctypes.c_char * 16),
    ]


class FlowEvent(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("duration_ns", ctypes.c_uint64),
        ("sent", ctypes.c_uint64),
        ("recv", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("laddr", ctypes.c_uint8 * 16),
        ("raddr", ctypes.c_uint8 * 16),
        ("pid", ctypes.c_uint32),
        ("retrans", ctypes.c_uint32),
        ("lport", ctypes.c_uint16),
        ("rport", ctypes.c_uint16),
        ("family", ctypes.c_uint8),
        ("direction", ctypes.c_uint8),
        ("cls", ctypes.c_uint8),
        ("reason", ctypes.c_uint8),
        ("comm", ctypes.c_char * 16),
    ]


class RttKey(ctypes.Structure):
    _fields_ = [
        ("raddr", ctypes.c_uint8 * 16),
        ("direction", ctypes.c_uint8),
        ("cls", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("overflow", ctypes.c_uint8),
    ]


RTT_BINS = 28  # len(tcp_rtt.RTT_BOUNDS_US) + 1; tcp_rtt checks it


class RttVal(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_uint64),
        ("sum_us", ctypes.c_uint64),
        ("bins", ctypes.c_uint64 * RTT_BINS),
    ]


class ProcEvent(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("cgroup_id", ctypes.c_uint64),
        ("kind", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("ppid", ctypes.c_uint32),
        ("exit_code", ctypes.c_int32),
        ("signal", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("comm", ctypes.c_char * 16),
        ("filename", ctypes.c_char * 256),
    ]


class DropKey(ctypes.Structure):
    """struct drop_key (programs/drops.h)."""

    _fields_ = [
        ("addr", ctypes.c_uint8 * 16),
        ("location", ctypes.c_uint64),
        ("reason", ctypes.c_uint32),
        ("direction", ctypes.c_uint8),
        ("cls", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("l4proto", ctypes.c_uint8),
        ("overflow", ctypes.c_uint8),
        ("pad", ctypes.c_uint8 * 3),
        ("netns", ctypes.c_uint32),
    ]


class DropEvent(ctypes.Structure):
    """struct drop_event (programs/drops.h): one drop, while a trace asks."""

    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("location", ctypes.c_uint64),
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
        ("reason", ctypes.c_uint32),
        ("pid", ctypes.c_uint32),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("direction", ctypes.c_uint8),
        ("cls", ctypes.c_uint8),
        ("family", ctypes.c_uint8),
        ("l4proto", ctypes.c_uint8),
        ("comm", ctypes.c_char * 16),
    ]


class TraceFilter(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint32), ("port", ctypes.c_uint16), ("enabled", ctypes.c_uint16)]


def set_trace_filter(bpf: object, pid: int = 0, port: int = 0) -> None:
    """Fill a program's trace_filter map (events only; counters are never filtered)."""
    table = bpf[b"trace_filter"]  # type: ignore[index]
    check_layout("trace_filter", TraceFilter, table.Leaf)
    table[ctypes.c_int(0)] = table.Leaf(pid, port, 1 if (pid or port) else 0)


class LayoutError(Exception):
    """A Python mirror does not match its C layout."""


def fields_of(t: type) -> list[tuple[str, int, int]]:
    """(name, offset, size) of each field of a ctypes structure, padding left out."""
    fields = getattr(t, "_fields_", ())
    return [
        (f[0], getattr(t, f[0]).offset, getattr(t, f[0]).size)
        for f in fields
        if not f[0].startswith("__pad")
    ]


def check_layout(what: str, mirror: type[ctypes.Structure], c_type: type) -> None:
    """Refuse to run when a mirror and the compiled layout differ: in size, or in any
    field's name, offset or size (nested structures too)."""
    want, got = ctypes.sizeof(c_type), ctypes.sizeof(mirror)
    if want != got:
        raise LayoutError(f"{what}: C layout is {want} bytes, Python mirror {got}")
    c_fields, py_fields = fields_of(c_type), fields_of(mirror)
    for i in range(max(len(c_fields), len(py_fields))):
        c = c_fields[i] if i < len(c_fields) else None
        py = py_fields[i] if i < len(py_fields) else None
        if c != py:
            raise LayoutError(
                f"{what}: field {i} is {_field_text(c)} in C, {_field_text(py)} in Python"
            )
    for (name, ctype), (_, ptype) in zip(_typed(c_type), _typed(mirror), strict=True):
        if hasattr(ctype, "_fields_") and hasattr(ptype, "_fields_"):
            check_layout(f"{what}.{name}", ptype, ctype)


def _typed(t: type) -> list[tuple[str, type]]:
    return [(f[0], f[1]) for f in getattr(t, "_fields_", ()) if not f[0].startswith("__pad")]


def _field_text(f: tuple[str, int, int] | None) -> str:
    return "missing" if f is None else f"{f[0]} at offset {f[1]}, {f[2]} bytes"


def c_text(raw: bytes) -> str:
    """A NUL-terminated char array's text."""
    return raw.split(b"\0", 1)[0].decode(errors="replace")


_COMMS: dict[bytes, str] = {}
_COMMS_HELD = 4096


def comm_text(raw: bytes) -> str:
    """A record's comm as text (c_text), remembered: a node's records name a few hundred
    programs, so most are one lookup, and their events share one string each."""
    got = _COMMS.get(raw)
    if got is None:
        if len(_COMMS) >= _COMMS_HELD:
            _COMMS.clear()
        got = _COMMS[raw] = c_text(raw)
    return got


def record_struct(t: type[ctypes.Structure]) -> struct.Struct:
    """A struct.Struct that unpacks a ctypes mirror's bytes into its fields in order
    (arrays of bytes and chars as bytes), padding skipped; checked against the mirror's
    offsets and size."""
    codes: dict[Any, str] = {
        ctypes.c_uint64: "Q",
        ctypes.c_int64: "q",
        ctypes.c_uint32: "I",
        ctypes.c_int32: "i",
        ctypes.c_uint16: "H",
        ctypes.c_uint8: "B",
    }
    fmt, at = "<", 0
    for name, ftype in t._fields_:  # type: ignore[misc]
        ftype = cast(Any, ftype)
        off = getattr(t, name).offset
        if off > at:
            fmt += f"{off - at}x"
        if ftype in codes:
            fmt += codes[ftype]
        elif getattr(ftype, "_type_", None) in (ctypes.c_uint8, ctypes.c_char):
            fmt += f"{ftype._length_}s"
        else:
            raise TypeError(f"{t.__name__}.{name}: no struct code for {ftype}")
        at = off + ctypes.sizeof(ftype)
    if ctypes.sizeof(t) > at:
        fmt += f"{ctypes.sizeof(t) - at}x"
    s = struct.Struct(fmt)
    if s.size != ctypes.sizeof(t):
        raise TypeError(f"{t.__name__}: struct {fmt} is {s.size} bytes, ctypes {ctypes.sizeof(t)}")
    return s
