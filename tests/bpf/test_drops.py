"""Drops on the real kernel: packets the test makes the kernel drop, counted exactly,
attributed to the pod holding the address, named as the running kernel names them."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_ebpf.agent import config, kernel_headers
from lens_ebpf.agent.bpf import btf
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.drops import reasons
from lens_ebpf.agent.drops.drops import DROPS, LISTEN_DROPS, OVERFLOWS, Drops
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net.policy import load_policy
from lens_ebpf.agent.pods.index import ClusterIndex, OwnerResolver
from tests.conftest import netns_unavailable, wait_for
from tests.k8slab import owned, pod
from tests.netlab import Lab, _alive, listener

pytestmark = pytest.mark.bpf

POD_IP = "198.51.100.79"  # the drop lab's address; a pod by the index
WHO = ("shop", "web-5d-x7k", "Deployment", "web")
PEER = "internalHosts"  # the host's end of the lab (192.168.79.1), by the test policy


class DropRig:
    def __init__(self, drops: Drops, cache: MetricCache, lab: Lab) -> None:
        self.drops, self.cache, self.lab = drops, cache, lab

    def count(self, protocol: str, reason: str, location: str = "") -> int:
        """What lens_packet_drops_total holds for the pod's received drops of this kind
        (reason: the kernel's name; where it names none, the location's function)."""
        self.drops.read()
        total = 0
        for labels, value in self.cache.family(DROPS).series.items():
            ns, name, _wk, _w, direction, cls, proto, why, _code, where = labels
            if (ns, name, direction, cls, proto) != (*WHO[:2], "ingress", PEER, protocol):
                continue
            if why == reason and (not location or where == location):
                total += int(value.value)
        return total

    def count_pod(self, direction: str, protocol: str, reason: str) -> int:
        """The pod's drops of this kind, whatever the other end's class."""
        self.drops.read()
        total = 0
        for labels, value in self.cache.family(DROPS).series.items():
            ns, name, _wk, _w, way, _cls, proto, why, _code, _where = labels
            if (ns, name, way, proto, why) == (*WHO[:2], direction, protocol, reason):
                total += int(value.value)
        return total

    def named(self, name: str, location: str) -> str:
        """The reason label a drop gets on this kernel: its name, or (5.10) its location."""
        return name if self.drops.has_reasons else location


def reap_stale_drop_labs() -> None:
    """Remove drop labs (veth `ld<pid>a`, namespace `lenst-<pid>-drops`) whose run is gone
    (tests.netlab.reap_stale_labs does the same for the flows' labs)."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for pid in re.findall(r"^\d+: ld(\d+)a[@:]", links, re.M):
        if not _alive(int(pid)):
            subprocess.run(["ip", "link", "del", f"ld{pid}a"], capture_output=True)
    named = Path("/run/netns")
    for p in named.iterdir() if named.is_dir() else ():
        m = re.fullmatch(r"lenst-(\d+)-drops", p.name)
        if m and not _alive(int(m.group(1))):
            subprocess.run(["ip", "netns", "del", p.name], capture_output=True)


@pytest.fixture(scope="module")
def drop_lab() -> Iterator[Lab]:
    """A lab of its own (the flows' tests count everything to theirs)."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    lab = Lab(
        f"{os.getpid()}",
        host_v4="192.168.79.1",
        peer_v4="192.168.79.2",
        host_v6="fd00:79::1",
        peer_v6="fd00:79::2",
        extra=[POD_IP],
    )
    lab.ns += "-drops"
    lab.host_if, lab.peer_if = f"ld{os.getpid()}a", f"ld{os.getpid()}b"
    reap_stale_drop_labs()
    lab.up()
    yield lab
    lab.down()


@pytest.fixture(scope="module")
def drop_rig(policy_file: Path, drop_lab: Lab) -> Iterator[DropRig]:
    kernel_headers.resolve(link=True)
    lab = drop_lab
    cfg = config.load(None, env={})
    cache = MetricCache(ttl_seconds=3600, max_series=100000)
    idx = ClusterIndex(
        owners=OwnerResolver(
            {
                "ReplicaSet": lambda ns, name: owned(
                    "ReplicaSet", name, ns, owner=("Deployment", "web")
                ),
                "Deployment": lambda ns, name: owned("Deployment", name, ns),
            }
        )
    )
    idx.replace_pods([pod("web-5d-x7k", POD_IP, "shop", owner=("ReplicaSet", "web-5d"))])
    enrich = Enrichment()
    enrich.index = idx
    loader = BpfLoader()
    drops = Drops(cfg.bpf, cache, loader, enrich)
    assert drops.start(load_policy(policy_file)), loader.status
    try:
        yield DropRig(drops, cache, lab)
    finally:
        loader.close()


def settle(rig: DropRig, protocol: str, reason: str, want: int, location: str = "") -> None:
    """Wait until the count reaches want (the drop can land in a softirq after the call
    that caused it returned), then hold it equal: no more than want either."""
    wait_for(
        lambda: rig.count(protocol, reason, location) >= want,
        lambda: f"{protocol} {reason}: {rig.count(protocol, reason, location)} of {want}",
    )
    assert rig.count(protocol, reason, location) == want


def test_tcp_to_a_closed_port(drop_rig: DropRig) -> None:
    """Each SYN to a port nobody listens on: one NO_SOCKET drop (5.10: in tcp_v4_rcv)."""
    reason = drop_rig.named("NO_SOCKET", "tcp_v4_rcv")
    before = drop_rig.count("tcp", reason)
    for _ in range(5):
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect((POD_IP, 9))
    settle(drop_rig, "tcp", reason, before + 5)


def test_udp_to_a_closed_port(drop_rig: DropRig) -> None:
    reason = drop_rig.named("NO_SOCKET", "__udp4_lib_rcv")
    before = drop_rig.count("udp", reason)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(7):
            s.sendto(b"x", (POD_IP, 9))
    settle(drop_rig, "udp", reason, before + 7)


def netns_attributed(rig: DropRig) -> None:
    if not rig.drops.attributes_netns:
        pytest.skip("this kernel's BTF does not place sk_buff's sk and dev: no namespaces")


def test_a_drop_for_an_address_the_index_lacks_counts_by_namespace(drop_rig: DropRig) -> None:
    """Datagrams to a closed port on the lab's other address (192.168.79.2: no pod's, by the
    index): dropped on the pod's device, in its namespace, so counted for the pod."""
    netns_attributed(drop_rig)
    reason = drop_rig.named("NO_SOCKET", "__udp4_lib_rcv")
    before = drop_rig.count_pod("ingress", "udp", reason)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _ in range(6):
            s.sendto(b"x", (drop_rig.lab.peer_v4, 9))
    wait_for(
        lambda: drop_rig.count_pod("ingress", "udp", reason) >= before + 6,
        lambda: f"{drop_rig.count_pod('ingress', 'udp', reason) - before} of 6",
    )
    assert drop_rig.count_pod("ingress", "udp", reason) == before + 6


@pytest.mark.skipif(shutil.which("iptables") is None, reason="iptables is not installed")
def test_a_pods_socket_names_its_drops(drop_rig: DropRig) -> None:
    """Datagrams a socket in the pod's namespace sends from an address the index lacks,
    dropped by a rule in its OUTPUT (before the packet has a device): the socket's
    namespace names the pod."""
    netns_attributed(drop_rig)
    port = 40998
    rule = ["OUTPUT", "-p", "udp", "--dport", str(port), "-j", "DROP"]
    nsx = ["ip", "netns", "exec", drop_rig.lab.ns]
    subprocess.run([*nsx, "iptables", "-A", *rule], check=True, capture_output=True)
    send = (
        "import socket\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"s.bind(({drop_rig.lab.peer_v4!r}, 0))\n"
        "for _ in range(5):\n"
        "    try:\n"
        f"        s.sendto(b'x', ({drop_rig.lab.host_v4!r}, {port}))\n"
        "    except PermissionError:\n"
        "        pass\n"
    )
    try:
        reason = drop_rig.named("NETFILTER_DROP", "nf_hook_slow")
        before = drop_rig.count_pod("egress", "udp", reason)
        subprocess.run([*nsx, sys.executable, "-c", send], check=True)
        wait_for(
            lambda: drop_rig.count_pod("egress", "udp", reason) >= before + 5,
            lambda: f"{drop_rig.count_pod('egress', 'udp', reason) - before} of 5",
        )
        assert drop_rig.count_pod("egress", "udp", reason) == before + 5
    finally:
        subprocess.run([*nsx, "iptables", "-D", *rule], capture_output=True)


@pytest.mark.skipif(shutil.which("iptables") is None, reason="iptables is not installed")
def test_netfilter_drop_in_the_pods_namespace(drop_rig: DropRig) -> None:
    """A DROP rule in the pod's own namespace: each datagram it matches, one drop."""
    port = 40999
    rule = ["INPUT", "-p", "udp", "--dport", str(port), "-j", "DROP"]
    nsx = ["ip", "netns", "exec", drop_rig.lab.ns, "iptables"]
    subprocess.run([*nsx, "-A", *rule], check=True, capture_output=True)
    try:
        reason = drop_rig.named("NETFILTER_DROP", "nf_hook_slow")
        before = drop_rig.count("udp", reason)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _ in range(4):
                s.sendto(b"x", (POD_IP, port))
        settle(drop_rig, "udp", reason, before + 4)
    finally:
        subprocess.run([*nsx, "-D", *rule], capture_output=True)


def _syn(src: str, dst: str, sport: int, dport: int, good: bool) -> bytes:
    """A TCP SYN header; its checksum right, or off by one."""
    hdr = struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x02, 65535, 0, 0)
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, len(hdr))
    data = pseudo + hdr
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    csum = ~total & 0xFFFF
    return hdr[:16] + struct.pack("!H", csum if good else csum ^ 1) + hdr[18:]


def test_tcp_with_a_bad_checksum(drop_rig: DropRig) -> None:
    """Segments whose checksum is wrong: TCP_CSUM where the kernel names it (5.10: in
    tcp_v4_rcv, the location a closed port's SYN shares)."""
    reason = drop_rig.named("TCP_CSUM", "tcp_v4_rcv")
    before = drop_rig.count("tcp", reason)
    src = drop_rig.lab.host_v4
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP) as s:
        for i in range(3):
            s.sendto(_syn(src, POD_IP, 40000 + i, 80, good=False), (POD_IP, 0))
    settle(drop_rig, "tcp", reason, before + 3)


TCP_REPAIR, TCP_REPAIR_QUEUE, TCP_QUEUE_SEQ, TCP_SEND_QUEUE = 19, 20, 21, 2


def next_seq(sock: socket.socket) -> int:
    """The sequence number the socket sends next (its write_seq, read in repair mode; all
    it sent was acknowledged): what its peer expects next."""
    sock.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 1)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR_QUEUE, TCP_SEND_QUEUE)
        return struct.unpack("=I", sock.getsockopt(socket.IPPROTO_TCP, TCP_QUEUE_SEQ, 4))[0]
    finally:
        sock.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 0)


def _segment(src: str, dst: str, sport: int, dport: int, seq: int, flags: int) -> bytes:
    """A TCP header (no options, no data) with a right checksum."""
    hdr = struct.pack("!HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, 0, 5 << 4, flags, 65535, 0, 0)
    data = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 6, len(hdr))
    data += hdr
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return hdr[:16] + struct.pack("!H", ~total & 0xFFFF) + hdr[18:]


def test_tcp_outside_the_window(drop_rig: DropRig) -> None:
    """Segments of a live connection whose sequence lies far past the receive window: one
    TCP_INVALID_SEQUENCE drop each, where the kernel names that reason (5.10 frees them
    with __kfree_skb, which no tracepoint sees)."""
    names = drop_rig.drops.names or {}
    if "TCP_INVALID_SEQUENCE" not in names.values():
        pytest.skip("this kernel names no TCP_INVALID_SEQUENCE drop")
    ns = drop_rig.lab.ns
    # no timestamps on the pod's side: a segment without them is judged by its sequence
    subprocess.run(
        ["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_timestamps=0"], check=True
    )
    srv = listener(POD_IP, ns=ns)
    try:
        cli = socket.create_connection((POD_IP, srv.getsockname()[1]))
        conn, _ = srv.accept()
        with cli, conn:
            cli.sendall(b"hello")
            assert conn.recv(5) == b"hello"
            sport, dport = cli.getsockname()[1], srv.getsockname()[1]
            far = next_seq(cli) + (1 << 30)  # past any receive window, not yet "old"
            before = drop_rig.count("tcp", "TCP_INVALID_SEQUENCE")
            with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP) as raw:
                for i in range(3):
                    seg = _segment(drop_rig.lab.host_v4, POD_IP, sport, dport, far + i, 0x10)
                    raw.sendto(seg, (POD_IP, 0))
            settle(drop_rig, "tcp", "TCP_INVALID_SEQUENCE", before + 3)
    finally:
        srv.close()
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_timestamps=1"])


def nstat(ns: str) -> tuple[int, int]:
    """(ListenOverflows, ListenDrops) of the namespace, as nstat reports them."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "nstat", "-asz", "TcpExtListenOverflows", "TcpExtListenDrops"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    got = dict(re.findall(r"^TcpExt(\w+)\s+(\d+)", out, re.M))
    return int(got["ListenOverflows"]), int(got["ListenDrops"])


@pytest.mark.skipif(shutil.which("nstat") is None, reason="nstat (iproute2) is not installed")
def test_listen_queue_overflows_per_pod_and_port(drop_rig: DropRig) -> None:
    """A listener whose accept queue is full: the namespace's ListenOverflows and the
    listener's drops, as nstat counts them, on the pod and its port."""
    ns, cache = drop_rig.lab.ns, drop_rig.cache
    srv = listener(POD_IP, ns=ns, backlog=0)  # one connection fits; the next overflow
    port = srv.getsockname()[1]

    def ours() -> tuple[int, int]:
        drop_rig.drops.read()
        return (
            int(cache.get(OVERFLOWS, WHO) or 0),
            int(cache.get(LISTEN_DROPS, (*WHO, str(port))) or 0),
        )

    start, seen = nstat(ns), ours()  # the listener's first sight: its baseline
    clients = []
    try:
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                c.connect((POD_IP, port))
            clients.append(c)
        wait_for(lambda: nstat(ns)[0] - start[0] >= 3, "3 SYNs refused by the full queue")
        for c in clients:
            c.close()  # no more retransmitted SYNs
        now = nstat(ns)
        got = ours()  # while the listener lives: its drops go with it
    finally:
        for c in clients:
            c.close()
        srv.close()
    grew = (now[0] - start[0], now[1] - start[1])
    assert grew[0] >= 3 and grew[1] >= grew[0]
    assert (got[0] - seen[0], got[1] - seen[1]) == grew, (got, seen, now, start)


def _bpftool_enum(name: str) -> dict[int, str] | None:
    """The enum's members as bpftool reads the kernel's BTF."""
    out = subprocess.run(
        ["bpftool", "btf", "dump", "file", str(btf.VMLINUX), "format", "raw"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    m = re.search(rf"^\[\d+\] ENUM(?:64)? '{name}' .*\n((?:\t.*\n)*)", out, re.M)
    if m is None:
        return None
    return {int(v): n for n, v in re.findall(r"'(\w+)' val=(-?\d+)", m.group(1))}


@pytest.mark.skipif(shutil.which("bpftool") is None, reason="bpftool is not installed")
def test_reason_names_are_the_kernels_own(drop_rig: DropRig) -> None:
    """Every name the agent gives a reason is the running kernel's (bpftool's reading of
    its BTF), and none of them is written in our code: they can only have come from BTF."""
    if not drop_rig.drops.has_reasons:  # 5.10: no reason field, so no names to check
        pytest.skip("skb:kfree_skb has no reason on this kernel (before 5.17)")
    theirs = _bpftool_enum(reasons.ENUM)
    if theirs is None:
        assert drop_rig.drops.names is None
        pytest.skip("this kernel's BTF has no enum skb_drop_reason (before 5.17)")
    assert drop_rig.drops.names == {v: reasons.short_name(n) for v, n in theirs.items()}
    ours = "\n".join(
        p.read_text()
        for d in ("lens_ebpf",)
        for p in Path(__file__).parents[2].joinpath(d).rglob("*.[ch]*")
        if p.suffix in (".py", ".c", ".h")
    )
    written = {n for n in theirs.values() if re.search(rf"\b{reasons.short_name(n)}\b", ours)}
    # the three the program must find by name, to pass over normal frees
    assert written <= {"SKB_CONSUMED", "SKB_NOT_DROPPED_YET", "SKB_DROP_REASON_NOT_SPECIFIED"}
