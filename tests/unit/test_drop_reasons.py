"""Drop reasons named from the running kernel's BTF alone, and locations from kallsyms."""

from __future__ import annotations

import struct

from lens_ebpf.agent.bpf.btf import ENUM, Btf
from lens_ebpf.agent.bpf.layouts import DropKey
from lens_ebpf.agent.bpf.spec import Kernel, resolve
from lens_ebpf.agent.drops import listeners, reasons
from lens_ebpf.agent.drops.drops import ADDRESSES, NETNS, SPEC, DropLabels
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.pods.index import ClusterIndex
from tests.k8slab import pod


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
    blob = enum_btf(
        "skb_drop_reason",
        {
            "SKB_NOT_DROPPED_YET": 0,
            "SKB_CONSUMED": 1,
            "SKB_DROP_REASON_NOT_SPECIFIED": 2,
            "SKB_DROP_REASON_MADE_UP_HERE": 7,
        },
    )
    names = reasons.reason_names(blob)
    assert names == {0: "NOT_DROPPED_YET", 1: "CONSUMED", 2: "NOT_SPECIFIED", 7: "MADE_UP_HERE"}
    assert reasons.reason_label(7, names, True) == "MADE_UP_HERE"
    assert reasons.reason_label(8, names, True) == reasons.UNKNOWN
    assert reasons.defines(names) == {
        "LENS_REASON_CONSUMED": 1,
        "LENS_REASON_NOT_DROPPED": 0,
        "LENS_REASON_NOT_SPECIFIED": 2,
    }


def test_a_kernel_without_btf_counts_numbers_as_unknown() -> None:
    assert reasons.reason_names(None) is None
    assert reasons.defines(None) == {}
    assert reasons.reason_label(3, None, True) == reasons.UNKNOWN
    assert reasons.reason_label(3, None, False) == ""  # 5.10: the location names it
    plan = resolve(SPEC, Kernel(events=None, kprobes=False, btf=None))
    assert plan.choices[ADDRESSES].path is None
    assert plan.choices[NETNS].path is None


def test_a_pods_namespace_names_its_drops_before_their_address() -> None:
    """A key's namespace, where it is a pod's, names the pod whatever the address; the
    host's namespace (no pod's) leaves the address to name it."""
    idx = ClusterIndex()
    idx.replace_pods([pod("web-1", "10.244.0.7", "shop"), pod("db-1", "10.244.0.9", "data")])
    enrich = Enrichment()
    enrich.index = idx
    labels = DropLabels({2: "NO_SOCKET"}, True, reasons.Locations(lambda: ""))
    labels.netns_pods = {4026532001: ("shop", "web-1", "", "")}

    def key(addr: str, netns: int) -> DropKey:
        k = DropKey(family=2, l4proto=17, reason=2, netns=netns)
        k.addr[10:16] = [0xFF, 0xFF, *map(int, addr.split("."))]
        return k

    # an address the index lacks, in the pod's namespace; the other pod's address too
    assert labels(key("192.168.9.9", 4026532001), enrich)[:2] == ("shop", "web-1")
    assert labels(key("10.244.0.9", 4026532001), enrich)[:2] == ("shop", "web-1")
    # the host's namespace, or none known: the address
    assert labels(key("10.244.0.9", 4026531840), enrich)[:2] == ("data", "db-1")
    assert labels(key("10.244.0.9", 0), enrich)[:2] == ("data", "db-1")
    assert labels(key("192.168.9.9", 0), enrich)[:2] == ("", "")


def test_locations_resolve_to_the_function_they_lie_in() -> None:
    text = (
        "ffffffff81000000 T _stext\nffffffff81a00000 T tcp_v4_rcv\n"
        "ffffffff81a01000 t __udp4_lib_rcv\nffffffff81a02000 D some_data\n"
        "ffffffffc0100000 t nft_do_chain\t[nf_tables]\n"
    )
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


def test_listener_counters_parse_as_the_kernel_writes_them() -> None:
    netstat = (
        "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 6 7\n"
        "IpExt: InNoRoutes\nIpExt: 0\n"
    )
    assert listeners.parse_netstat(netstat) == {
        "SyncookiesSent": 0,
        "ListenOverflows": 6,
        "ListenDrops": 7,
    }
    fib = (
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n"
        "Local:\n     |-- 127.0.0.1\n        /32 host LOCAL\n"
        "     |-- 198.51.100.79\n        /32 host LOCAL\n"
        "     |-- 198.51.100.255\n        /32 link BROADCAST\n"
    )
    inet6 = (
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "fd000079000000000000000000000002 02 40 00 80     eth0\n"
        "fe800000000000000000000000000002 02 40 20 80     eth0\n"
    )
    assert listeners.parse_local_addresses(fib, inet6) == ["198.51.100.79", "fd00:79::2"]


def test_a_sock_diag_answer_gives_each_listener() -> None:
    """One inet_diag message as the kernel sends it for a listener on ::ffff:10.0.0.1:8080
    with 2 waiting of 128 and 5 drops, then NLMSG_DONE."""
    sockid = struct.pack("!HH", 8080, 0) + bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
    sockid += bytes(16) + struct.pack("=IQ", 0, 0)
    msg = struct.pack("=BBBB", 10, 10, 0, 0) + sockid + struct.pack("=IIIII", 0, 2, 128, 0, 9)
    mem = struct.pack("=9I", *([0] * 8), 5)
    msg += struct.pack("=HH", 4 + len(mem), listeners.INET_DIAG_SKMEMINFO) + mem
    data = struct.pack("=IHHII", 16 + len(msg), listeners.SOCK_DIAG_BY_FAMILY, 2, 1, 0) + msg
    data += struct.pack("=IHHII", 20, listeners.NLMSG_DONE, 2, 1, 0) + bytes(4)
    got, done = listeners.parse_diag(data, 10)
    assert done and got == [listeners.Listener(10, "10.0.0.1", 8080, 2, 128, 5)]


def test_counts_start_at_first_sight_and_survive_a_new_socket() -> None:
    d = listeners.Deltas()
    assert d.take("k", 10) == 0  # first sight: the baseline
    assert d.take("k", 13) == 3
    assert d.take("k", 2) == 2  # a new socket at the same key starts from zero
    d.end_round()
    d.end_round()  # not seen in a round: forgotten
    assert d.take("k", 5) == 0
