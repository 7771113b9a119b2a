"""The network side without root or BCC: map keys and ring records decoded from the C
layouts, apply_deltas and the RTT histograms into the cache, and a golden exposition."""

import ctypes
import dataclasses
import functools
import socket

from prometheus_client import CollectorRegistry

from lens_ebpf.agent.bpf import layouts
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus, FlowClosed
from lens_ebpf.agent.metrics.cache import CacheCollector, MetricCache
from lens_ebpf.agent.net import identity
from lens_ebpf.agent.net.policy import CLASS_IDS
from lens_ebpf.agent.pods.index import ClusterIndex, OwnerResolver
from lens_ebpf.agent.tcp import decode, flow_families, tcp_flows, tcp_rtt
from lens_ebpf.agent.tcp.attribution import Unattributed
from lens_ebpf.core.exposition import render
from tests.golden import check_golden
from tests.k8slab import owned, pod, service

OPENED, CLOSED = "lens_tcp_connections_opened_total", "lens_tcp_connections_closed_total"
SENT, RECV = "lens_tcp_sent_bytes_total", "lens_tcp_received_bytes_total"


def addr16(text: str) -> bytes:
    """An address as the programs store it (IPv4 as ::ffff:a.b.c.d)."""
    if ":" in text:
        return socket.inet_pton(socket.AF_INET6, text)
    return b"\0" * 10 + b"\xff\xff" + socket.inet_pton(socket.AF_INET, text)


def flow_key(raddr: str, port: int, direction: int, cls: str, overflow: int = 0):
    family = decode.AF_INET6 if ":" in raddr else decode.AF_INET
    return layouts.FlowKey(
        (ctypes.c_uint8 * 16)(*addr16(raddr)), port, direction, CLASS_IDS[cls], family, overflow
    )


def zero(**grew: int) -> dict[str, int]:
    return {**dict.fromkeys(tcp_flows.VAL_FIELDS, 0), **grew}


def test_map_keys_decode_to_labels() -> None:
    assert decode.flow_key_labels(flow_key("10.0.0.7", 443, 0, "internalHosts")) == (
        "egress",
        "internalHosts",
        "10.0.0.7",
        "443",
    )
    assert decode.flow_key_labels(flow_key("fd00::9", 8080, 1, "k8sPod")) == (
        "ingress",
        "k8sPod",
        "fd00::9",
        "8080",
    )
    # an overflow slot stands for every key the map had no room for, per direction and class
    assert decode.flow_key_labels(flow_key("0.0.0.0", 0, 0, "dns", overflow=1)) == (
        "egress",
        "dns",
        "other",
        "other",
    )


def test_ring_record_decodes_to_a_typed_event() -> None:
    rec = layouts.FlowEvent(
        ts_ns=5,
        duration_ns=7,
        sent=123_457,
        recv=7_777,
        cgroup_id=9,
        laddr=(ctypes.c_uint8 * 16)(*addr16("10.0.0.1")),
        raddr=(ctypes.c_uint8 * 16)(*addr16("10.0.0.7")),
        pid=42,
        retrans=2,
        lport=40000,
        rport=443,
        family=decode.AF_INET,
        direction=0,
        cls=CLASS_IDS["internalHosts"],
        reason=1,
        comm=b"curl",
    )
    ev = decode.flow_record(bytes(rec))  # as the ring buffer hands it over
    assert ev.duration_ns == 7 and ev.ts_ns == 5 and ev.cgroup_id == 9 and ev.pid == 42
    assert (ev.kind, ev.laddr, ev.raddr, ev.lport, ev.rport) == (
        "flow_closed",
        "10.0.0.1",
        "10.0.0.7",
        40000,
        443,
    )
    assert (ev.sent_bytes, ev.received_bytes, ev.retransmits) == (123_457, 7_777, 2)
    assert (ev.cls, ev["class"], ev.reason, ev.comm) == (
        "internalHosts",
        "internalHosts",
        "reset_received",
        "curl",
    )
    # made through its slots: the event the constructor makes, field for field
    made = FlowClosed(
        ts_ns=5,
        pid=42,
        comm="curl",
        cgroup_id=9,
        family="ipv4",
        laddr="10.0.0.1",
        lport=40000,
        raddr="10.0.0.7",
        rport=443,
        direction="egress",
        cls="internalHosts",
        sent_bytes=123_457,
        received_bytes=7_777,
        retransmits=2,
        duration_ns=7,
        reason="reset_received",
    )
    slots = [f.name for f in dataclasses.fields(FlowClosed)]
    assert ev == made and hash(ev) == hash(made)
    assert [getattr(ev, n) for n in slots] == [getattr(made, n) for n in slots]
    # the bus numbers a copy: equal to replace's, ev unchanged
    got = EventBus(10).publish(ev)
    assert got == dataclasses.replace(ev, seq=1, ts_unix_nano=got.ts_unix_nano)
    assert (got.seq, ev.seq) == (1, 0) and got.ts_unix_nano > 0 and type(got) is FlowClosed
    # enrichment: the index names both ends; standalone leaves the event as it was
    idx = ClusterIndex()
    idx.replace_pods(
        [
            pod("db-0", "10.0.0.7", "data", owner=("StatefulSet", "db")),
            pod("cli", "10.0.0.1", "apps"),
        ]
    )
    assert Enrichment().flow(ev) is ev
    enrich = Enrichment()
    enrich.index = idx
    got = enrich.flow(ev)
    assert (got.cls, got.remote_pod, got.remote_workload, got.pod, got.namespace) == (
        "k8sPod",
        "db-0",
        "db",
        "cli",
        "apps",
    )
    assert (got.sent_bytes, got.received_bytes) == (123_457, 7_777)


def network_cache(lookup=None) -> MetricCache:
    cache = MetricCache(3600, 1000)
    flow_families.register_families(cache)
    tcp_rtt.register_families(cache)
    for key, grew in (
        (
            ("egress", "externalHosts", "93.184.216.34", "443"),
            zero(opened=3, closed=2, sent=517, recv=1_398_101, retrans=4),
        ),
        (
            ("ingress", "internalHosts", "10.0.0.7", "8080"),
            zero(opened=1, closed=1, sent=2048, recv=310, resets_sent=1),
        ),
        (("egress", "k8sPod", "10.244.1.5", "5432"), zero(opened=1, sent=100, recv=50)),
        (("egress", "k8sSvc", "10.96.0.10", "80"), zero(failed=2, resets_recv=2)),
        (("egress", "dns", "10.53.0.53", "53"), zero(opened=1, closed=1, sent=40, recv=80)),
    ):
        flow_families.apply_deltas(cache, *identity.refine(lookup, key), grew)
    # one RTT key: 3 samples of 120, 180 and 4500 us
    rtt_key = layouts.RttKey(
        (ctypes.c_uint8 * 16)(*addr16("10.0.0.7")), 0, CLASS_IDS["internalHosts"], decode.AF_INET, 0
    )
    bins = [0] * layouts.RTT_BINS
    bins[tcp_rtt.RTT_BOUNDS_US.index(200)] = 2  # 120 and 180 us: the (100, 200] bin
    bins[tcp_rtt.RTT_BOUNDS_US.index(5000)] = 1
    tcp_rtt.apply_rtt(
        cache, *identity.refine(lookup, decode.remote_labels(rtt_key)), (3, 4800, *bins)
    )
    return cache


def test_apply_deltas_feeds_every_family_exactly() -> None:
    cache = network_cache()
    none = ("",) * 5
    ext = ("egress", "externalHosts", "93.184.216.34", "443")
    assert cache.get("lens_tcp_sent_bytes_total", (*ext, *none)) == 517
    internal = ("ingress", "internalHosts", "10.0.0.7", "8080")
    assert cache.get("lens_tcp_resets_total", (*internal, "sent", *none)) == 1
    # the seed families carry bytes both ways, by where the flow went
    seed_ext = ("93.184.216.34", "443", "egress", "externalHosts")
    assert cache.get(flow_families.SEED_EGRESS, seed_ext) == 517 + 1_398_101
    seed_in = ("8080", "10.0.0.7", "ingress", "internalHosts")
    assert cache.get(flow_families.SEED_INGRESS, seed_in) == 2048 + 310
    assert cache.get(flow_families.SEED_K8S, ("k8sPod",)) == 150
    assert cache.get(flow_families.SEED_K8S, ("k8sSvc",)) is None  # no bytes, no series
    assert cache.get(flow_families.SEED_DNS, ()) == 120


def test_a_pod_address_is_class_k8s_pod_whatever_the_policy_said() -> None:
    idx = ClusterIndex()
    idx.replace_pods([pod("db-0", "10.0.0.7", "data", owner=("StatefulSet", "db"))])
    idx.replace_services([service("web", "93.184.216.34", "shop")])
    cache = network_cache(idx.lookup)
    assert (
        cache.get(
            "lens_tcp_received_bytes_total",
            ("ingress", "k8sPod", "10.0.0.7", "8080", "data", "db-0", "StatefulSet", "db", ""),
        )
        == 310
    )
    assert cache.get(flow_families.SEED_K8S, ("k8sPod",)) == 2048 + 310 + 150
    assert cache.get(flow_families.SEED_K8S, ("k8sSvc",)) == 517 + 1_398_101


def test_network_exposition_is_golden() -> None:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CacheCollector(network_cache()))
    text = render([reg]).decode()
    lines = [
        ln
        for ln in text.splitlines(keepends=True)
        if not ln.startswith("lens_cache_") and "lens_cache_" not in ln
    ]
    check_golden("network.prom", "".join(lines))


def test_an_ipv4_peer_of_a_dual_stack_socket_is_spelled_as_ipv4() -> None:
    """A dual-stack listener's accepted socket is AF_INET6 with the client as
    ::ffff:a.b.c.d: labels, events and index lookups spell it a.b.c.d, as an IPv4
    socket's (the same peer's egress side) does."""
    mapped = flow_key("::ffff:10.213.128.4", 8080, 1, "k8sPod")
    assert mapped.family == decode.AF_INET6
    assert decode.flow_key_labels(mapped) == ("ingress", "k8sPod", "10.213.128.4", "8080")
    assert decode.flow_key_labels(flow_key("10.213.128.4", 8080, 0, "k8sPod")) == (
        "egress",
        "k8sPod",
        "10.213.128.4",
        "8080",
    )
    rtt_key = layouts.RttKey(
        (ctypes.c_uint8 * 16)(*addr16("::ffff:10.213.128.4")),
        1,
        CLASS_IDS["k8sPod"],
        decode.AF_INET6,
        0,
    )
    assert decode.remote_labels(rtt_key) == ("ingress", "k8sPod", "10.213.128.4")
    # IPv6 proper stays IPv6, a v4-compatible (not mapped) address too
    assert decode.format_addr(decode.AF_INET6, addr16("fd00::9")) == "fd00::9"
    assert decode.format_addr(decode.AF_INET6, addr16("::10.0.0.1")) == "::10.0.0.1"

    def record(laddr: str, raddr: str) -> bytes:
        return bytes(
            layouts.FlowEvent(
                laddr=(ctypes.c_uint8 * 16)(*addr16(laddr)),
                raddr=(ctypes.c_uint8 * 16)(*addr16(raddr)),
                lport=8080,
                rport=51000,
                family=decode.AF_INET6,
                direction=1,
                cls=CLASS_IDS["k8sPod"],
                comm=b"server",
            )
        )

    ev = decode.flow_record(record("::ffff:10.213.128.9", "::ffff:10.213.128.4"))
    assert (ev.family, ev.laddr, ev.raddr) == ("ipv4", "10.213.128.9", "10.213.128.4")
    six = decode.flow_record(record("fd00::9", "fd00::4"))
    assert (six.family, six.laddr, six.raddr) == ("ipv6", "fd00::9", "fd00::4")
    # the index finds both ends' pods from the one spelling
    idx = ClusterIndex()
    idx.replace_pods(
        [pod("client-7f-abc", "10.213.128.4", "shop"), pod("server-0", "10.213.128.9", "shop")]
    )
    enrich = Enrichment()
    enrich.index = idx
    got = enrich.flow(ev)
    assert (got.remote_pod, got.pod, got.cls) == ("client-7f-abc", "server-0", "k8sPod")
    assert enrich.flow_key(decode.flow_key_labels(mapped))[1] == (
        "shop",
        "client-7f-abc",
        "",
        "",
        "",
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_flows_counted_before_the_index_knew_their_pod_move_to_it() -> None:
    """Issue 74: a client pod connected in its first instant, before the index had its
    address; its 7 connections must end up under its pod, exactly, with no unlabelled
    series left counting them."""
    clock = Clock()
    cache = MetricCache(3600, 1000, clock=clock)
    flow_families.register_families(cache)
    tcp_rtt.register_families(cache)
    getters = {
        "ReplicaSet": lambda ns, name: owned(
            "ReplicaSet", name, ns, owner=("Deployment", "client")
        ),
        "Deployment": lambda ns, name: owned("Deployment", name, ns),
    }
    idx = ClusterIndex(owners=OwnerResolver(getters))
    idx.replace_pods([pod("server-0", "10.213.128.9", "shop", owner=("StatefulSet", "server"))])
    enrich = Enrichment()
    enrich.index = idx
    flows = Unattributed(functools.partial(flow_families.attribute, cache), 600, 1000, clock)
    rtts = Unattributed(functools.partial(tcp_rtt.attribute, cache), 600, 1000, clock)

    def count(key: tuple[str, ...], **grew: int) -> None:  # as TcpFlows.read counts a key
        labels, who = enrich.flow_key(key)
        flow_families.apply_deltas(cache, labels, who, zero(**grew))
        flows.note(key, who)

    ingress = ("ingress", "k8sPod", "10.213.128.4", "8080")  # the client, in the pod CIDR
    egress = ("egress", "externalHosts", "198.51.100.7", "443")  # a pod the policy missed
    count(ingress, opened=7, closed=7, sent=700, recv=7000, resets_sent=1)
    count(egress, opened=2, sent=30, recv=40)
    count(("egress", "k8sPod", "10.213.128.9", "8080"), opened=1, sent=5)  # known already
    rtt = ("ingress", "k8sPod", "10.213.128.4")
    bins = [0] * layouts.RTT_BINS
    bins[tcp_rtt.RTT_BOUNDS_US.index(200)] = 2  # 70 and 110 us: the (100, 200] bin
    labels, who = enrich.flow_key(rtt)
    tcp_rtt.apply_rtt(cache, labels, who, (2, 180, *bins))
    rtts.note(rtt, who)
    none = identity.NO_IDENTITY
    assert cache.get(OPENED, (*ingress, *none)) == 7
    assert (flows.settle(enrich), len(flows)) == (0, 2)  # the index knows neither yet

    client = ("shop", "client-7f-abc", "Deployment", "client", "")
    idx.pod_event(
        "ADDED", pod("client-7f-abc", "10.213.128.4", "shop", owner=("ReplicaSet", "client-7f"))
    )
    assert (flows.settle(enrich), rtts.settle(enrich)) == (1, 1)
    for name, want in ((OPENED, 7), (CLOSED, 7), (SENT, 700), (RECV, 7000)):
        assert cache.get(name, (*ingress, *client)) == want, name
        assert cache.get(name, (*ingress, *none)) is None, name
    assert cache.get(flow_families.RESETS, (*ingress, "sent", *client)) == 1
    assert cache.get(flow_families.RESETS, (*ingress, "sent", *none)) is None
    assert cache.get(flow_families.SEED_K8S, ("k8sPod",)) == 7700 + 5  # by class: as it was
    assert cache.get(tcp_rtt.LENS, (*rtt, *client)) == (bins, 180 / 1e6)
    assert cache.get(tcp_rtt.LENS, (*rtt, *none)) is None
    assert cache.get(tcp_rtt.SEED, ("10.213.128.4", "ingress")) == (
        [2 if b == 200 else 0 for b in (*tcp_rtt.SEED_BOUNDS_US, 0)],
        180.0,
    )
    # later growth goes straight to the pod's series; nothing is asked again
    count(ingress, opened=1, sent=1)
    assert cache.get(OPENED, (*ingress, *client)) == 8
    assert cache.get(OPENED, (*ingress, *none)) is None
    assert (flows.settle(enrich), len(flows)) == (0, 1)

    # a pod the policy missed: its class refined, its seed bytes out of the per-address
    # series into the pods' one
    idx.pod_event("ADDED", pod("web-0", "198.51.100.7", "shop", owner=("StatefulSet", "web")))
    assert flows.settle(enrich) == 1
    web = ("egress", "k8sPod", "198.51.100.7", "443", "shop", "web-0", "StatefulSet", "web", "")
    assert cache.get(OPENED, web) == 2 and cache.get(SENT, web) == 30
    assert cache.get(OPENED, (*egress, *none)) is None
    assert (
        cache.get(flow_families.SEED_EGRESS, ("198.51.100.7", "443", "egress", "externalHosts"))
        is None
    )
    assert cache.get(flow_families.SEED_K8S, ("k8sPod",)) == 7700 + 5 + 1 + 70
    assert len(flows) == 0

    # only unknown -> known: what an address counted under a pod stays with that pod
    # when the address passes to another
    idx.pod_event("DELETED", pod("web-0", "198.51.100.7", "shop"))
    idx.pod_event("ADDED", pod("web-1", "198.51.100.7", "shop", owner=("StatefulSet", "web")))
    count(egress, opened=1)
    assert flows.settle(enrich) == 0
    assert cache.get(OPENED, web) == 2
    web1 = (*web[:5], "web-1", *web[6:])
    assert cache.get(OPENED, web1) == 1
