"""Loads bpf/programs/drops.c and turns its drops map into lens_packet_drops_total."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.bpf import btf as btf_mod
from lens_ebpf.agent.bpf import layouts
from lens_ebpf.agent.bpf.loader import BpfLoader, plan_for
from lens_ebpf.agent.bpf.map_reader import DeltaReader, prefill_overflow
from lens_ebpf.agent.bpf.program import RingProgram
from lens_ebpf.agent.bpf.spec import (
    BTF,
    TRACEPOINT,
    BtfField,
    Field,
    Kernel,
    Need,
    ProbePath,
    ProgramSpec,
)
from lens_ebpf.agent.config import BpfConfig
from lens_ebpf.agent.drops import listeners, reasons
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.metrics.cache import COUNTER, MetricCache
from lens_ebpf.agent.net import netns
from lens_ebpf.agent.net.policy import CLASS_IDS, CLASS_NAMES, MAX_PREFIXES, Policy, lpm_entries
from lens_ebpf.agent.tcp.decode import direction_name, format_addr
from lens_ebpf.core.exposition import counter

log = logging.getLogger(__name__)

NAME = "drops"
TRACEPOINT_NAME = "skb:kfree_skb"
ADDRESSES = "addresses"  # the need that attributes drops to pods
NETNS = "netns"  # the need that attributes them by their network namespace
SPEC = ProgramSpec(
    NAME,
    needs=(
        Need("drops", (ProbePath(TRACEPOINT, (TRACEPOINT_NAME,)),)),
        # the IP header's addresses, where the running kernel's BTF places the sk_buff
        # fields that find it (drops.c, LENS_DROP_ADDRESSES)
        Need(
            ADDRESSES,
            (
                ProbePath(
                    BTF,
                    (),
                    "LENS_DROP_ADDRESSES",
                    btf=tuple(
                        BtfField(*f)
                        for f in (
                            ("LENS_SKB_HEAD_OFF", "sk_buff.head", 8),
                            ("LENS_SKB_NETWORK_HEADER_OFF", "sk_buff.network_header", 2),
                            ("LENS_SKB_TRANSPORT_HEADER_OFF", "sk_buff.transport_header", 2),
                            ("LENS_SKB_IIF_OFF", "sk_buff.skb_iif", 4),
                        )
                    ),
                ),
            ),
            optional=True,
            what_is_lost="drops are not attributed to pods",
        ),
        # the network namespace of the packet's socket, else of its device (drops.c,
        # LENS_DROP_NETNS): a pod's drops whose addresses the index does not hold
        Need(
            NETNS,
            (
                ProbePath(
                    BTF,
                    (),
                    "LENS_DROP_NETNS",
                    btf=tuple(
                        BtfField(*f)
                        for f in (
                            ("LENS_SKB_SK_OFF", "sk_buff.sk", 8),
                            ("LENS_SKB_DEV_OFF", "sk_buff.dev", 8),
                            ("LENS_SK_NET_OFF", "sock.__sk_common.skc_net.net", 8),
                            ("LENS_DEV_NET_OFF", "net_device.nd_net.net", 8),
                            ("LENS_NET_INUM_OFF", "net.ns.inum", 4),
                        )
                    ),
                ),
            ),
            optional=True,
            what_is_lost="drops are attributed by their addresses alone, not their namespace",
        ),
    ),
    fields=(
        Field(
            TRACEPOINT_NAME,
            "reason",
            "LENS_TP_KFREE_SKB_REASON",
            "no drop reasons (before Linux 5.17): the location names each drop",
        ),
    ),
)
MAX_POLICY_PREFIXES = MAX_PREFIXES + 64
# Index of the program's stats array (ST_* in drops.c).
STATS = ("ringbuf_full", "map_full", "events", "no_header")
DROPS = "lens_packet_drops_total"
OVERFLOWS = "lens_tcp_listen_overflows_total"
LISTEN_DROPS = "lens_tcp_listen_drops_total"
IDENTITY = ("namespace", "pod", "workload_kind", "workload")
LABELS = (
    "namespace",
    "pod",
    "workload_kind",
    "workload",
    "direction",
    "type",
    "protocol",
    "reason",
    "code",
    "location",
)
assert LABELS[: len(IDENTITY)] == IDENTITY
PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp"}


def protocol_name(family: int, l4proto: int) -> str:
    """The IP protocol of a drop's packet; "" for a packet that is not IP (or whose
    header the program could not read)."""
    if not family:
        return ""
    return PROTOCOLS.get(l4proto, str(l4proto))


class DropLabels:
    """A drops-map key to its labels: whose it is (the pod of its network namespace, else
    the pod holding the address by the cluster index, as the flows' local pod), the
    kernel's name for the reason, the location's function."""

    def __init__(
        self, names: dict[int, str] | None, has_reasons: bool, locations: reasons.Locations
    ) -> None:
        self.names, self.has_reasons, self.locations = names, has_reasons, locations
        # network namespace inode -> the pod it belongs to (pods' namespaces only)
        self.netns_pods: dict[int, listeners.Who] = {}

    def __call__(self, key: Any, enrich: Enrichment) -> tuple[str, ...]:
        who = self.netns_pods.get(key.netns, listeners.NOBODY)
        lookup = enrich.lookup
        if who == listeners.NOBODY and key.family and lookup is not None:
            ident = lookup(format_addr(key.family, bytes(key.addr)))
            if ident is not None and ident.kind == "pod":
                who = (ident.namespace, ident.name, ident.workload_kind, ident.workload)
        code = str(key.reason) if self.has_reasons else ""
        if key.overflow:
            reason, code, location = "other", "", ""
        else:
            reason = reasons.reason_label(key.reason, self.names, self.has_reasons)
            location = self.locations.name(key.location)
            if not self.has_reasons:
                reason = location  # 5.10: where it was dropped is all the kernel says
        return (
            *who,
            direction_name(key.direction),
            CLASS_NAMES.get(key.cls, str(key.cls)),
            protocol_name(key.family, key.l4proto),
            reason,
            code,
            location,
        )


def drop_record(
    rec: bytes, names: dict[int, str] | None, has_reasons: bool, locations: reasons.Locations
) -> dict[str, Any]:
    """One drop_event record (trace mode) as trace prints it, named as the metric is."""
    e = layouts.DropEvent.from_buffer_copy(rec)
    location = locations.name(e.location)
    reason = reasons.reason_label(e.reason, names, has_reasons) if has_reasons else location
    family = e.family
    return {
        "kind": "packet_drop",
        "ts_ns": e.ts_ns,
        "pid": e.pid,
        "comm": layouts.comm_text(bytes(e.comm)),
        "direction": direction_name(e.direction),
        "class": CLASS_NAMES.get(e.cls, str(e.cls)),
        "protocol": protocol_name(family, e.l4proto),
        "saddr": format_addr(family, bytes(e.saddr)) if family else "",
        "daddr": format_addr(family, bytes(e.daddr)) if family else "",
        "sport": e.sport,
        "dport": e.dport,
        "reason": reason,
        "code": e.reason if has_reasons else None,
        "location": location,
    }


class Drops(RingProgram):
    """The drops program: policy trie in, per-(address, class, protocol, reason) drop
    counts out; per-drop records only while a trace asks."""

    NAME = NAME
    STATS = STATS

    def __init__(
        self,
        bpf: BpfConfig,
        cache: MetricCache,
        loader: BpfLoader,
        enrich: Enrichment | None = None,
        max_keys: int = 4096,
        clock: Callable[[], float] = time.monotonic,
        kernel: Kernel | None = None,
        locations: reasons.Locations | None = None,
        listen: bool = True,
    ) -> None:
        super().__init__(loader)
        self.bpf_cfg, self.cache, self.max_keys = bpf, cache, max_keys
        self.enrich = enrich or Enrichment()
        self.reader = DeltaReader(
            lambda v: (int(getattr(v, "value", v)),),
            bpf.flow_key_idle_seconds,
            clock,
            pinned=lambda key: bool(key.overflow),
        )
        kernel = kernel or Kernel.running((SPEC,))
        self.plan = plan_for(SPEC, (), kernel)
        self.has_reasons = "LENS_TP_KFREE_SKB_REASON" in self.plan.defines
        self.attributes_netns = "LENS_DROP_NETNS" in self.plan.defines
        # the running kernel's names, read from its BTF now: never a table of ours
        self.names = reasons.reason_names(
            kernel.btf if kernel.btf is not None else btf_mod.running()
        )
        self.labels = DropLabels(self.names, self.has_reasons, locations or reasons.Locations())
        self._policy_keys: set[tuple[int, bytes]] = set()
        self._lock = threading.Lock()
        cache.register(
            DROPS,
            COUNTER,
            "Packets the kernel dropped (skb:kfree_skb), by the pod whose network "
            "namespace dropped them (else the pod holding the address on this node), "
            "the other end's class, protocol and the kernel's reason (its location "
            "where it names none)",
            (
                "namespace",
                "pod",
                "workload_kind",
                "workload",
                "direction",
                "type",
                "protocol",
                "reason",
                "code",
                "location",
            ),
        )
        assert cache.family(DROPS).labelnames == LABELS  # DropLabels' order
        # listen-queue overflows and SYN drops: the kernel's counters, per namespace
        self.listen = listeners.ListenCounts(self._pod_of) if listen else None
        self.listen_walks_failed = 0
        cache.register(
            OVERFLOWS,
            COUNTER,
            "Connections a full accept queue refused: the network namespace's "
            "TcpExt ListenOverflows (as nstat reports it), by its pod",
            ("namespace", "pod", "workload_kind", "workload"),
        )
        cache.register(
            LISTEN_DROPS,
            COUNTER,
            "SYNs and handshakes a listener dropped (its sk_drops, which each "
            "TcpExt ListenDrops raises), by the listening pod and port",
            ("namespace", "pod", "workload_kind", "workload", "port"),
        )

    def defines(self) -> dict[str, int | str]:
        return self.static_defines(self.bpf_cfg, self.max_keys, self.names)

    @staticmethod
    def static_defines(
        b: BpfConfig, max_keys: int, names: dict[int, str] | None
    ) -> dict[str, int | str]:
        return reasons.defines(names) | {
            "MAX_DROP_KEYS": max_keys + 2 * len(CLASS_IDS),  # plus the overflow slots
            "MAX_POLICY_PREFIXES": MAX_POLICY_PREFIXES,
            "RINGBUF_PAGES": b.ringbuf_pages,
        }

    def start(self, policy: Policy) -> bool:
        self.bpf = self.loader.load(self.plan, self.defines())
        if self.bpf is None:
            return False
        layouts.check_layout("drop_key", layouts.DropKey, self.bpf[b"drops"].Key)
        layouts.check_layout("drop_event", layouts.DropEvent, self.bpf[b"layout_drop_event"].Leaf)
        prefill_overflow(self.bpf[b"drops"], len(CLASS_IDS))
        self.set_policy(policy)
        return True

    def set_policy(self, policy: Policy) -> None:
        """Make the kernel's trie hold exactly this policy's entries (as tcp_flows')."""
        entries = lpm_entries(policy)
        if len(entries) > MAX_POLICY_PREFIXES:
            raise ValueError(f"policy has {len(entries)} prefixes; at most {MAX_POLICY_PREFIXES}")
        trie = self.bpf[b"policy"]
        for (plen, addr), cls in entries.items():
            trie[trie.Key(plen, (ctypes.c_uint8 * 16)(*addr))] = ctypes.c_uint8(cls)
        for plen, addr in self._policy_keys - set(entries):
            with contextlib.suppress(KeyError):
                del trie[trie.Key(plen, (ctypes.c_uint8 * 16)(*addr))]
        self._policy_keys = set(entries)

    def set_records(self, on: bool) -> None:
        """Let each drop into the ring buffer (a trace), or none (the agent)."""
        self.bpf[b"records_on"][ctypes.c_int(0)] = ctypes.c_uint32(int(on))

    def read(self) -> None:
        """The kernel's counts into the metric cache, labelled by the index as it is now."""
        if self.bpf is None:
            return
        if self.attributes_netns:  # first: this read's drops find the namespaces as they are
            self.read_listeners()
        with self._lock:
            for key, (grew,) in self.reader.read(self.bpf[b"drops"]):
                if grew:  # an overflow slot seen for the first time, still empty
                    self.cache.inc(DROPS, self.labels(key, self.enrich), grew)
            self.read_stats(b"stats")
        if self.listen is not None and not self.attributes_netns:
            self.read_listeners()

    def _pod_of(self, addresses: Iterable[str]) -> listeners.Who:
        """The pod that holds one of these addresses, by the cluster index."""
        lookup = self.enrich.lookup
        if lookup is not None:
            for addr in addresses:
                ident = lookup(addr)
                if ident is not None and ident.kind == "pod":
                    return (ident.namespace, ident.name, ident.workload_kind, ident.workload)
        return listeners.NOBODY

    def read_listeners(self) -> None:
        """Walk every network namespace: the pod each belongs to (by its addresses; the
        agent's own, the host's, is none) for the drops' labels, and with listen on, its
        ListenOverflows and its listeners' drops."""

        def look() -> listeners.Namespace | None:
            try:
                return listeners.look(listen=self.listen is not None)
            except OSError as exc:
                log.debug("%s: a namespace's listeners could not be read: %s", NAME, exc)
                return None

        own = os.stat("/proc/thread-self/ns/net").st_ino
        pods: dict[int, listeners.Who] = {}
        for ino, ns in netns.in_each(netns.namespaces(), look):
            if ns is None:
                self.listen_walks_failed += 1
                continue
            who = self._pod_of(ns.addresses)
            if ino != own and who != listeners.NOBODY:
                pods[ino] = who
            if self.listen is None:
                continue
            pod, overflows, _drops, ports = self.listen.take(ino, ns)
            if overflows:
                self.cache.inc(OVERFLOWS, pod, overflows)
            for port, grew in ports.items():
                if grew:
                    self.cache.inc(LISTEN_DROPS, (*pod, str(port)), grew)
        if self.listen is not None:
            self.listen.end_round()
        self.labels.netns_pods = pods

    def keys(self) -> int:
        return len(self.reader)


class DropsCollector(Collector):
    """The program's own counts: a full map, records lost, headers it could not read."""

    def __init__(self, drops: Drops) -> None:
        self._drops = drops

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        st = self._drops.kernel_stats
        yield counter(
            "lens_agent_drops_map_full",
            "Drops counted in an overflow slot (no reason, no address): the drops map was full",
            st["map_full"],
        )
        yield counter(
            "lens_agent_drops_listener_walks_failed",
            "Network namespaces whose listeners and counters could not be read (not entered, "
            "or sock_diag refused): their overflows show at a later walk",
            self._drops.listen_walks_failed,
        )
        yield counter(
            "lens_packet_drops_unread_headers",
            "Dropped IP packets whose header the program could not read (counted under no "
            "address)",
            st["no_header"],
        )
