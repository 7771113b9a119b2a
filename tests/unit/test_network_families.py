"""The network side without root or BCC: map keys and ring records decoded from the C
layouts, apply_deltas and the RTT histograms into the cache, and a golden exposition."""

import ctypes
import dataclasses
import socket

from prometheus_client import CollectorRegistry

from lens_ebpf.agent.bpf import layouts
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus, FlowClosed
from lens_ebpf.agent.metrics.cache import CacheCollector, MetricCache
from lens_ebpf.agent.net import identity
from lens_ebpf.agent.net.policy import CLASS_IDS
from lens_ebpf.agent.pods.index import ClusterIndex
from lens_ebpf.agent.tcp import decode, tcp_flows, tcp_rtt
from lens_ebpf.core.exposition import render
from tests.golden import check_golden
from tests.k8slab import pod, service


def addr16(text: str) -> bytes:
    """An address as the programs store it (IPv4 as ::ffff:a.b.c.d)."""
    if ":" in text:
        return socket.inet_pton(socket.AF_INET6, text)
    return b"\0" * 10 + b"\xff\xff" + socket.inet_pton(socket.AF_INET, text)


def flow_key(raddr: str, port: int, direction: int, cls: str, overflow: int = 0):
    family = decode.AF_INET6 if ":" in raddr else decode.AF_INET
    return layouts.FlowKey((ctypes.c_uint8 * 16)(*addr16(raddr)), port, direction,
                           CLASS_IDS[cls], family, overflow)  # fmt: skip


def zero(**grew: int) -> dict[str, int]:
    return {**dict.fromkeys(tcp_flows.VAL_FIELDS, 0), **grew}


def test_map_keys_decode_to_labels() -> None:
    assert decode.flow_key_labels(flow_key("10.0.0.7", 443, 0, "internalHosts")) == (
        "egress", "internalHosts", "10.0.0.7", "443")  # fmt: skip
    assert decode.flow_key_labels(flow_key("fd00::9", 8080, 1, "k8sPod")) == (
        "ingress", "k8sPod", "fd00::9", "8080")  # fmt: skip
    # an overflow slot stands for every key the map had no room for, per direction and class
    assert decode.flow_key_labels(flow_key("0.0.0.0", 0, 0, "dns", overflow=1)) == (
        "egress", "dns", "other", "other")  # fmt: skip


def test_ring_record_decodes_to_a_typed_event() -> None:
    rec = layouts.FlowEvent(
        ts_ns=5, duration_ns=7, sent=123_457, recv=7_777, cgroup_id=9,
        laddr=(ctypes.c_uint8 * 16)(*addr16("10.0.0.1")),
        raddr=(ctypes.c_uint8 * 16)(*addr16("10.0.0.7")), pid=42, retrans=2, lport=40000,
        rport=443, family=decode.AF_INET, direction=0, cls=CLASS_IDS["internalHosts"],
        reason=1, comm=b"curl",
    )  # fmt: skip
    ev = decode.flow_record(bytes(rec))  # as the ring buffer hands it over
    assert ev.duration_ns == 7 and ev.ts_ns == 5 and ev.cgroup_id == 9 and ev.pid == 42
    assert (ev.kind, ev.laddr, ev.raddr, ev.lport, ev.rport) == (
        "flow_closed", "10.0.0.1", "10.0.0.7", 40000, 443)  # fmt: skip
    assert (ev.sent_bytes, ev.received_bytes, ev.retransmits) == (123_457, 7_777, 2)
    assert (ev.cls, ev["class"], ev.reason, ev.comm) == (
        "internalHosts", "internalHosts", "reset_received", "curl")  # fmt: skip
    # made through its slots: the event the constructor makes, field for field
    made = FlowClosed(ts_ns=5, pid=42, comm="curl", cgroup_id=9, family="ipv4",
                      laddr="10.0.0.1", lport=40000, raddr="10.0.0.7", rport=443,
                      direction="egress", cls="internalHosts", sent_bytes=123_457,
                      received_bytes=7_777, retransmits=2, duration_ns=7,
                      reason="reset_received")  # fmt: skip
    slots = [f.name for f in dataclasses.fields(FlowClosed)]
    assert ev == made and hash(ev) == hash(made)
    assert [getattr(ev, n) for n in slots] == [getattr(made, n) for n in slots]
    # the bus numbers a copy: equal to replace's, ev unchanged
    got = EventBus(10).publish(ev)
    assert got == dataclasses.replace(ev, seq=1, ts_unix_nano=got.ts_unix_nano)
    assert (got.seq, ev.seq) == (1, 0) and got.ts_unix_nano > 0 and type(got) is FlowClosed
    # enrichment: the index names both ends; standalone leaves the event as it was
    idx = ClusterIndex()
    idx.replace_pods([pod("db-0", "10.0.0.7", "data", owner=("StatefulSet", "db")),
                      pod("cli", "10.0.0.1", "apps")])  # fmt: skip
    assert Enrichment().flow(ev) is ev
    enrich = Enrichment()
    enrich.index = idx
    got = enrich.flow(ev)
    assert (got.cls, got.remote_pod, got.remote_workload, got.pod, got.namespace) == (
        "k8sPod", "db-0", "db", "cli", "apps")  # fmt: skip
    assert (got.sent_bytes, got.received_bytes) == (123_457, 7_777)


def network_cache(lookup=None) -> MetricCache:
    cache = MetricCache(3600, 1000)
    tcp_flows.register_families(cache)
    tcp_rtt.register_families(cache)
    for key, grew in (
        (("egress", "externalHosts", "93.184.216.34", "443"),
         zero(opened=3, closed=2, sent=517, recv=1_398_101, retrans=4)),
        (("ingress", "internalHosts", "10.0.0.7", "8080"),
         zero(opened=1, closed=1, sent=2048, recv=310, resets_sent=1)),
        (("egress", "k8sPod", "10.244.1.5", "5432"), zero(opened=1, sent=100, recv=50)),
        (("egress", "k8sSvc", "10.96.0.10", "80"), zero(failed=2, resets_recv=2)),
        (("egress", "dns", "10.53.0.53", "53"), zero(opened=1, closed=1, sent=40, recv=80)),
    ):  # fmt: skip
        tcp_flows.apply_deltas(cache, *identity.refine(lookup, key), grew)
    # one RTT key: 3 samples of 120, 180 and 4500 us
    rtt_key = layouts.RttKey((ctypes.c_uint8 * 16)(*addr16("10.0.0.7")), 0,
                             CLASS_IDS["internalHosts"], decode.AF_INET, 0)  # fmt: skip
    bins = [0] * layouts.RTT_BINS
    bins[tcp_rtt.RTT_BOUNDS_US.index(200)] = 2  # 120 and 180 us: the (100, 200] bin
    bins[tcp_rtt.RTT_BOUNDS_US.index(5000)] = 1
    tcp_rtt.apply_rtt(cache, *identity.refine(lookup, decode.remote_labels(rtt_key)),
                      (3, 4800, *bins))  # fmt: skip
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
    assert cache.get(tcp_flows.SEED_EGRESS, seed_ext) == 517 + 1_398_101
    seed_in = ("8080", "10.0.0.7", "ingress", "internalHosts")
    assert cache.get(tcp_flows.SEED_INGRESS, seed_in) == 2048 + 310
    assert cache.get(tcp_flows.SEED_K8S, ("k8sPod",)) == 150
    assert cache.get(tcp_flows.SEED_K8S, ("k8sSvc",)) is None  # no bytes, no series
    assert cache.get(tcp_flows.SEED_DNS, ()) == 120


def test_a_pod_address_is_k8sPod_whatever_the_policy_said() -> None:
    idx = ClusterIndex()
    idx.replace_pods([pod("db-0", "10.0.0.7", "data", owner=("StatefulSet", "db"))])
    idx.replace_services([service("web", "93.184.216.34", "shop")])
    cache = network_cache(idx.lookup)
    assert cache.get("lens_tcp_received_bytes_total", ("ingress", "k8sPod", "10.0.0.7", "8080",
                     "data", "db-0", "StatefulSet", "db", "")) == 310  # fmt: skip
    assert cache.get(tcp_flows.SEED_K8S, ("k8sPod",)) == 2048 + 310 + 150
    assert cache.get(tcp_flows.SEED_K8S, ("k8sSvc",)) == 517 + 1_398_101


def test_network_exposition_is_golden() -> None:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CacheCollector(network_cache()))
    text = render([reg]).decode()
    lines = [ln for ln in text.splitlines(keepends=True)
             if not ln.startswith("lens_cache_") and "lens_cache_" not in ln]  # fmt: skip
    check_golden("network.prom", "".join(lines))
