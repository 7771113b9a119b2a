"""The Python mirrors are checked against the C layout field by field, not by size; and
against the headers they mirror (lens_ebpf/agent/bpf/programs/*.h, the one source of each
record), read here without a compiler: each struct's members in order, laid out by ctypes
as C lays them out."""

from __future__ import annotations

import ctypes
import functools
import re
from typing import Any

import pytest

from lens_ebpf.agent.bpf import layouts
from lens_ebpf.agent.bpf.loader import program_dir
from lens_ebpf.agent.processes import proc_events


def c_like(fields: list[tuple[str, type]]) -> type[ctypes.Structure]:
    """A ctypes type shaped like the ones BCC derives from a C struct."""
    return type("c_struct", (ctypes.Structure,), {"_fields_": fields})


def test_same_fields_pass() -> None:
    c = c_like([(name, t) for name, t in layouts.FlowKey._fields_])
    layouts.check_layout("flow_key", layouts.FlowKey, c)


def test_swapped_fields_of_equal_size_are_refused() -> None:
    fields = list(layouts.FlowKey._fields_)
    i, j = 2, 3  # direction and cls: both u8, so the sizes still match
    fields[i], fields[j] = fields[j], fields[i]
    with pytest.raises(layouts.LayoutError) as err:
        layouts.check_layout("flow_key", layouts.FlowKey, c_like(fields))
    assert str(err.value) == (
        "flow_key: field 2 is cls at offset 18, 1 bytes in C, "
        "direction at offset 18, 1 bytes in Python"
    )


def test_nested_structure_is_checked_too() -> None:
    key = [(n, t) for n, t in layouts.FlowKey._fields_]
    key[5] = ("overflowed", ctypes.c_uint8)  # renamed inside sock_info.key
    sock = [(n, c_like(key) if n == "key" else t) for n, t in layouts.SockInfo._fields_]
    with pytest.raises(layouts.LayoutError, match=r"^sock_info\.key: field 5 is overflowed"):
        layouts.check_layout("sock_info", layouts.SockInfo, c_like(sock))


def test_size_mismatch_is_refused() -> None:
    c = c_like([*layouts.TraceFilter._fields_, ("extra", ctypes.c_uint32)])
    with pytest.raises(layouts.LayoutError, match="C layout is 12 bytes, Python mirror 8"):
        layouts.check_layout("trace_filter", layouts.TraceFilter, c)


# -------------------------------------------------------------- the headers' records

HEADERS = ("lens_common.h", "tcp_flows.h", "proc_events.h", "drops.h")
# each struct a header declares -> its mirror; a struct without one fails the test
MIRRORS = {
    "lens_trace_filter": layouts.TraceFilter,
    "lens_lpm_key": layouts.LpmKey,
    "flow_key": layouts.FlowKey,
    "flow_val": layouts.FlowVal,
    "sock_info": layouts.SockInfo,
    "flow_event": layouts.FlowEvent,
    "rtt_key": layouts.RttKey,
    "rtt_val": layouts.RttVal,
    "proc_event": layouts.ProcEvent,
    "drop_key": layouts.DropKey,
    "drop_event": layouts.DropEvent,
}
# the fixed-width types a record is written in (the kernel's, <linux/types.h>)
C_TYPES: dict[str, Any] = {
    "__u8": ctypes.c_uint8,
    "__u16": ctypes.c_uint16,
    "__u32": ctypes.c_uint32,
    "__u64": ctypes.c_uint64,
    "__s32": ctypes.c_int32,
    "__s64": ctypes.c_int64,
    "char": ctypes.c_char,
}


def header_text(name: str) -> str:
    """A header without its comments."""
    text = (program_dir() / name).read_text()
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def defines(text: str) -> dict[str, int]:
    return {
        m[1]: int(m[2], 0) for m in re.finditer(r"(?m)^#define (\w+) (\d+|0x[0-9a-f]+)\s*$", text)
    }


def header_structs(name: str) -> dict[str, type[ctypes.Structure]]:
    """Each struct the header declares, as a ctypes type built from its members."""
    text = header_text(name)
    consts = defines(text)
    out: dict[str, type[ctypes.Structure]] = {}
    for sname, body in re.findall(r"struct (\w+) \{([^{}]*)\};", text):
        fields: list[tuple[str, Any]] = []
        for member in filter(None, (m.strip() for m in body.split(";"))):
            got = re.fullmatch(r"(struct \w+|\w+) (\w+)(?:\[([^\]]+)\])?", " ".join(member.split()))
            assert got, f"{name}: struct {sname}: cannot read member {member!r}"
            ctype, fname, dim = got.groups()
            if ctype.startswith("struct "):
                t = out[ctype.split()[1]]
            else:
                assert ctype in C_TYPES, f"{name}: {sname}.{fname} is {ctype}, not {set(C_TYPES)}"
                t = C_TYPES[ctype]
            if dim is not None:
                expr = re.sub(r"[A-Z_][A-Z0-9_]*", lambda m: str(consts[m[0]]), dim)
                assert re.fullmatch(r"[\d\s+*-]+", expr), f"{sname}.{fname}[{dim}]"
                t = t * eval(expr)  # digits and + - * only
            fields.append((fname, t))
        out[sname] = type(sname, (ctypes.Structure,), {"_fields_": fields})
    return out


def shape(t: Any) -> Any:
    """A ctypes type as comparable data: a structure's (name, offset, shape) of each
    field and its size; an array's element shape and length; a scalar itself."""
    if hasattr(t, "_fields_"):
        fields = [(n, getattr(t, n).offset, shape(ft)) for n, ft in t._fields_]
        return ("struct", ctypes.sizeof(t), fields)
    if hasattr(t, "_length_"):
        return ("array", shape(t._type_), t._length_)
    return t


@functools.cache
def all_structs() -> dict[str, tuple[str, type[ctypes.Structure]]]:
    """Every header's structs: name -> (its header, its type)."""
    return {s: (h, t) for h in HEADERS for s, t in header_structs(h).items()}


def test_every_record_in_the_headers_has_its_mirror_and_no_mirror_is_left() -> None:
    assert sorted(all_structs()) == sorted(MIRRORS)
    mirrors = {
        v
        for v in vars(layouts).values()
        if isinstance(v, type)
        and issubclass(v, ctypes.Structure)
        and v.__module__ == layouts.__name__
    }
    assert mirrors == set(MIRRORS.values())


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_mirror_is_the_header(name: str) -> None:
    header, c_type = all_structs()[name]
    assert shape(MIRRORS[name]) == shape(c_type), f"layouts.{MIRRORS[name].__name__} vs {header}"
    layouts.check_layout(name, MIRRORS[name], c_type)  # the load-time check agrees


def test_a_changed_header_is_noticed() -> None:
    """The reading is real: a member retyped in the header's text changes its shape."""
    _, c_type = all_structs()["flow_key"]
    fields = [(n, ctypes.c_uint32 if n == "port" else t) for n, t in c_type._fields_]
    assert shape(type("k", (ctypes.Structure,), {"_fields_": fields})) != shape(layouts.FlowKey)


def test_process_record_numbers_are_the_headers() -> None:
    """The record's kinds and flags, as proc_events.py names them."""
    want = defines(header_text("proc_events.h"))
    mirrored = [n for n in vars(proc_events) if re.fullmatch(r"(EV|PF|REC)_[A-Z_]+", n)]
    assert mirrored, "proc_events.py names no EV_/PF_/REC_ numbers"
    assert {n: getattr(proc_events, n) for n in mirrored} == {n: want.get(n) for n in mirrored}


def test_the_trace_filter_is_declared_whatever_came_first() -> None:
    """lens_common.h declares struct lens_trace_filter outside its AF_INET fallback, so a
    program that includes a socket header first still has it."""
    text = header_text("lens_common.h")
    guarded = re.search(r"#ifndef AF_INET\b(.*?)#endif", text, flags=re.S)
    assert guarded and "struct" not in guarded[1]
