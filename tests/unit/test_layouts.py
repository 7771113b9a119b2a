"""The Python mirrors are checked against the C layout field by field, not by size."""

from __future__ import annotations

import ctypes

import pytest

from lens_ebpf.agent.bpf import layouts


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
