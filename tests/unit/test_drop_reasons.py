"""Drop reasons named from the running kernel's BTF alone, and locations from kallsyms."""

from __future__ import annotations

import struct

from lens_ebpf.agent.bpf.btf import ENUM, Btf
from lens_ebpf.agent.bpf.spec import Kernel, resolve
from lens_ebpf.agent.drops import reasons
from lens_ebpf.agent.drops.drops import ADDRESSES, SPEC


def enum_btf(name: str, members: dict[str, int]) -> Btf:
    """A BTF blob holding one enum: what a kernel describes, numbered as it likes."""
    strings = b"\0" + name.encode() + b"\0"
    body = b""
    for member, value in members.items():
        body += struct.pack("<Ii", len(strings), value)
        strings += member.encode() + b"\0"
    types = struct.pack("<III", 1, ENUM << 24 | len(members), 4) + body
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return Btf(header + types + strings)


def test_names_are_whatever_the_kernels_btf_says() -> None:
    """A made-up kernel that numbers its reasons its own way gets its own names: no
    table of ours stands between the number and the name."""
    blob = enum_btf("skb_drop_reason", {"SKB_NOT_DROPPED_YET": 0, "SKB_CONSUMED": 1,
                                        "SKB_DROP_REASON_NOT_SPECIFIED": 2,
                                        "SKB_DROP_REASON_MADE_UP_HERE": 7})  # fmt: skip
    names = reasons.reason_names(blob)
    assert names == {0: "NOT_DROPPED_YET", 1: "CONSUMED", 2: "NOT_SPECIFIED", 7: "MADE_UP_HERE"}
    assert reasons.reason_label(7, names, True) == "MADE_UP_HERE"
    assert reasons.reason_label(8, names, True) == reasons.UNKNOWN
    assert reasons.defines(names) == {"LENS_REASON_CONSUMED": 1, "LENS_REASON_NOT_DROPPED": 0,
                                      "LENS_REASON_NOT_SPECIFIED": 2}  # fmt: skip


def test_a_kernel_without_btf_counts_numbers_as_unknown() -> None:
    assert reasons.reason_names(None) is None
    assert reasons.defines(None) == {}
    assert reasons.reason_label(3, None, True) == reasons.UNKNOWN
    assert reasons.reason_label(3, None, False) == ""  # 5.10: the location names it
    plan = resolve(SPEC, Kernel(events=None, kprobes=False, btf=None))
    assert plan.choices[ADDRESSES].path is None


def test_locations_resolve_to_the_function_they_lie_in() -> None:
    text = ("ffffffff81000000 T _stext\nffffffff81a00000 T tcp_v4_rcv\n"
            "ffffffff81a01000 t __udp4_lib_rcv\nffffffff81a02000 D some_data\n"
            "ffffffffc0100000 t nft_do_chain\t[nf_tables]\n")  # fmt: skip
    reads = []

    def read() -> str:
        reads.append(1)
        return text

    locs = reasons.Locations(read)
    assert locs.name(0xFFFFFFFF81A0003C) == "tcp_v4_rcv"
    assert locs.name(0xFFFFFFFF81A01010) == "__udp4_lib_rcv"
    assert locs.name(0xFFFFFFFFC0100020) == "nft_do_chain"
    assert locs.name(0) == ""
    assert locs.name(0x1000) == "0x1000"  # below every symbol: kallsyms hides them
