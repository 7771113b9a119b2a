"""Loads bpf/programs/tcp_flows.c and turns its maps and records into metrics and events
(the program's own counts: lens_ebpf/agent/tcp/tcp_flows_stats.py)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from lens_ebpf.agent.bpf import layouts
from lens_ebpf.agent.bpf.loader import BTF_TP_PREFIX, BpfLoader, plan_for
from lens_ebpf.agent.bpf.map_reader import DeltaReader, prefill_overflow
from lens_ebpf.agent.bpf.program import Records, RingProgram
from lens_ebpf.agent.bpf.spec import (
    BTF,
    BTF_TRACEPOINT,
    ITER,
    KPROBE,
    RAW_TRACEPOINT,
    TRACEPOINT,
    BtfField,
    Field,
    Kernel,
    Need,
    ProbePath,
    ProgramSpec,
)
from lens_ebpf.agent.config import BpfConfig, EventsConfig
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus, FlowClosed
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net import identity, netns, proc_tcp
from lens_ebpf.agent.net.policy import CLASS_IDS, MAX_PREFIXES, Policy, abnormal, lpm_entries
from lens_ebpf.agent.tcp import connect_latency, decode, tcp_rtt
from lens_ebpf.agent.tcp.attribution import Unattributed
from lens_ebpf.agent.tcp.flow_families import apply_deltas, attribute, register_families

log = logging.getLogger(__name__)

NAME = "tcp_flows"
RTT = "rtt"  # the need that feeds the tcp_rtt feature
# What tcp_flows.c needs and the ways to get it, in order of preference (bpf/spec.py).
_SET_STATE = "sock:inet_sock_set_state"
# the lifecycle BTF-typed: no trace record built, the socket's fields read with plain
# loads where the running kernel's BTF places them (tcp_flows.c, LENS_LIFECYCLE_BTF)
_LIFECYCLE_BTF = ProbePath(
    BTF_TRACEPOINT,
    (_SET_STATE,),
    "LENS_LIFECYCLE_BTF",
    args=("struct sock *", "int", "int"),
    btf=tuple(
        BtfField(*f)
        for f in (
            ("LENS_SK_FAMILY_OFF", "sock.__sk_common.skc_family", 2),
            ("LENS_INET_SPORT_OFF", "inet_sock.inet_sport", 2),
            ("LENS_SK_DPORT_OFF", "sock.__sk_common.skc_dport", 2),
            ("LENS_INET_SADDR_OFF", "inet_sock.inet_saddr", 4),
            ("LENS_SK_DADDR_OFF", "sock.__sk_common.skc_daddr", 4),
            ("LENS_SK_V6_RCV_SADDR_OFF", "sock.__sk_common.skc_v6_rcv_saddr", 16),
            ("LENS_SK_V6_DADDR_OFF", "sock.__sk_common.skc_v6_daddr", 16),
        )
    ),
    btf_types=(("tcp_sock", "the TCP socket's type"),),
    quiet=True,  # the classic tracepoint gives the same, at a little more per run
)
_BYTES_TP = ("sock:sock_send_length", "sock:sock_recv_length")
# the raw path's arguments, and the two fields that tell an untracked socket's protocol
_BYTES_RAW = ProbePath(
    RAW_TRACEPOINT,
    _BYTES_TP,
    "LENS_BYTES_RAW",
    args=("struct sock *", "int", "int"),
    btf=(
        BtfField("LENS_SK_FAMILY_OFF", "sock.__sk_common.skc_family", 2),
        BtfField("LENS_SK_PROTOCOL_OFF", "sock.sk_protocol", 2),
    ),
)
# no program per message: the socket's own counters, folded at close transitions and by
# the TCP socket iterator each read cycle (tcp_flows.c, LENS_BYTES_COUNTERS)
_COUNTER_FIELDS = (
    ("LENS_TCP_BYTES_ACKED_OFF", "tcp_sock.bytes_acked", 8),
    ("LENS_TCP_WRITE_SEQ_OFF", "tcp_sock.write_seq", 4),
    ("LENS_TCP_SND_UNA_OFF", "tcp_sock.snd_una", 4),
    ("LENS_TCP_BYTES_RECEIVED_OFF", "tcp_sock.bytes_received", 8),
    ("LENS_TCP_RCV_NXT_OFF", "tcp_sock.rcv_nxt", 4),
    ("LENS_TCP_COPIED_SEQ_OFF", "tcp_sock.copied_seq", 4),
    ("LENS_SK_FLAGS_OFF", "sock.__sk_common.skc_flags", 8),
    ("LENS_SK_RCVQ_LEN_OFF", "sock.sk_receive_queue.qlen", 4),
    ("LENS_SK_STATE_OFF", "sock.__sk_common.skc_state", 1),
    ("LENS_SK_FAMILY_OFF", "sock.__sk_common.skc_family", 2),
    ("LENS_SK_PORTPAIR_OFF", "sock.__sk_common.skc_portpair", 4),
)
_ITER_TYPES = (
    ("bpf_iter__tcp", "the TCP socket iterator (Linux 5.9+)"),
    ("bpf_tcp_iter_state", "a TCP iterator that locks each socket (Linux 5.15+)"),
)
_BYTES_COUNTERS = ProbePath(
    ITER,
    ("tcp",),
    "LENS_BYTES_COUNTERS",
    btf=tuple(BtfField(*f) for f in _COUNTER_FIELDS),
    btf_types=_ITER_TYPES,
)
_BYTES_KP = (
    "tcp_sendmsg",
    "tcp_sendmsg:return",
    "tcp_recvmsg",
    "tcp_recvmsg:return",
    "inet_recvmsg",
    "inet6_recvmsg",
)
_RESETS = ("tcp:tcp_send_reset", "tcp:tcp_receive_reset")
SPEC = ProgramSpec(
    NAME,
    needs=(
        Need("lifecycle", (_LIFECYCLE_BTF, ProbePath(TRACEPOINT, (_SET_STATE,)))),
        Need(
            "bytes",
            (
                _BYTES_COUNTERS,
                _BYTES_RAW,
                ProbePath(TRACEPOINT, _BYTES_TP, "LENS_BYTES_TRACEPOINT"),
                ProbePath(KPROBE, _BYTES_KP, "LENS_BYTES_KPROBE"),
            ),
        ),
        Need(
            "retransmits",
            (ProbePath(TRACEPOINT, ("tcp:tcp_retransmit_skb",), "LENS_RETRANS"),),
            optional=True,
            what_is_lost="no retransmit counts",
        ),
        Need(
            "resets",
            (ProbePath(TRACEPOINT, _RESETS, "LENS_RESETS"),),
            optional=True,
            what_is_lost="no reset counts",
        ),
        # sampled where the bytes path runs (every path has the socket) where BTF places
        # srtt_us, else tcp_probe on every received segment
        Need(
            RTT,
            (
                ProbePath(BTF, (), tcp_rtt.SAMPLED, btf=(tcp_rtt.SRTT_FIELD,)),
                ProbePath(TRACEPOINT, (tcp_rtt.TRACEPOINT,), "LENS_RTT"),
            ),
            optional=True,
            what_is_lost="no RTT histograms",
        ),
    ),
    fields=(
        # older kernels trace only retransmits that were sent: nothing to skip there
        Field("tcp:tcp_retransmit_skb", "err", "LENS_TP_RETRANSMIT_ERR", ""),
        Field(
            tcp_rtt.TRACEPOINT,
            "skaddr",
            "LENS_TP_TCP_PROBE_SKADDR",
            "RTT samples find their socket by 4-tuple",
        ),
    ),
)
MAX_POLICY_PREFIXES = MAX_PREFIXES + 64  # room for the cluster's pod and service CIDRs
# Index of the program's stats array (ST_* in tcp_flows.c).
STATS = (
    "ringbuf_full",
    "sock_map_full",
    "flow_map_full",
    "untracked_sent_bytes",
    "untracked_recv_bytes",
    "untracked_retransmits",
    "reset_no_socket",
    "events",
    "rtt_untracked",
    "rtt_map_full",
    "connect_map_full",
)

VAL_FIELDS = tuple(f[0] for f in layouts.FlowVal._fields_)


class TcpFlows(RingProgram):
    """The tcp_flows program: policy trie in, flow counters and closed-flow events out."""

    NAME = NAME
    STATS = STATS

    def __init__(
        self,
        bpf: BpfConfig,
        events: EventsConfig,
        cache: MetricCache,
        bus: EventBus,
        loader: BpfLoader,
        clock: Callable[[], float] = time.monotonic,
        rtt: bool = True,
        enrich: Enrichment | None = None,
        rtt_sample_seconds: float = tcp_rtt.SAMPLE_SECONDS,
        kernel: Kernel | None = None,
    ) -> None:
        super().__init__(loader)
        self.bpf_cfg, self.events_cfg = bpf, events
        self.cache = cache
        self.bus = bus
        self.clock = clock
        self.flows_reader = DeltaReader(
            lambda v: tuple(getattr(v, f) for f in VAL_FIELDS),
            bpf.flow_key_idle_seconds,
            clock,
            pinned=lambda key: bool(key.overflow),
        )
        self._policy_keys: set[tuple[int, bytes]] = set()
        self._lock = threading.Lock()
        self._gate_lock = threading.Lock()
        self.records_on = False
        self._wanted_at = -float("inf")
        self.repaired = 0
        self.policy = Policy()
        # who is behind each address (a null index standalone)
        self.enrich = enrich or Enrichment()
        register_families(cache)
        opened = cache.family("lens_tcp_connections_opened_total")
        # keys counted before the index knew their remote: moved to it once it does
        self.unattributed = Unattributed(
            functools.partial(attribute, cache), opened.ttl, opened.max_series, clock
        )
        # RTT needs BTF's srtt_us or tcp:tcp_probe; without either the flows still load
        self._disabled = () if rtt else (RTT,)
        self._kernel = kernel
        self.plan = plan_for(SPEC, self._disabled, kernel)
        rtt_choice = self.plan.choices[RTT]
        self.rtt_off_reason = "" if rtt_choice.path else rtt_choice.reason
        self.rtt: tcp_rtt.TcpRtt | None = None
        # the TCP socket iterator that folds open sockets' bytes (the counters path)
        self._walk: Callable[[], bytes] | None = None
        self.walks_failed = 0
        self.walks = 0  # namespaces walked
        self.walks_skipped = 0  # namespaces passed over: no TCP socket in them
        self.rtt_sample_seconds = rtt_sample_seconds
        self._rtt_period = 0  # 0: every send and receive; else the kernel's current period
        self._rtt_period_at = 0.0
        if rtt_choice.path is not None:
            sampled = rtt_choice.path.kind == BTF
            self.rtt = tcp_rtt.TcpRtt(bpf, cache, clock, sampled=sampled)
        # connect latency: every kernel, whatever paths the needs took
        self.connects = connect_latency.ConnectLatency(bpf, cache, clock)

    def defines(self) -> dict[str, int | str]:
        return self.static_defines(self.bpf_cfg, self.rtt is not None)

    @staticmethod
    def static_defines(b: BpfConfig, rtt: bool) -> dict[str, int | str]:
        """The cflags tcp_flows.c is compiled with (the RTT's bounds and key count, which
        the connect-latency histograms use too, whether RTT is on or not)."""
        return tcp_rtt.defines(b) | {
            "MAX_SOCKETS": b.max_sockets,
            # room for the 14 overflow slots on top of the configured keys
            "MAX_FLOW_KEYS": b.max_flow_keys + 2 * len(CLASS_IDS),
            "MAX_POLICY_PREFIXES": MAX_POLICY_PREFIXES,
            "RINGBUF_PAGES": b.ringbuf_pages,
        }

    def _load_without(self, btf_tracepoints: bool, why: str) -> None:
        """Load again on a kernel taken as one without BTF-typed tracepoints (else without
        BPF iterators): what failed to load."""
        what = "BTF-typed lifecycle" if btf_tracepoints else "socket-counter path"
        log.warning("%s: the %s failed to load (%s): loading without it", NAME, what, why)
        kernel = self._kernel or Kernel.running((SPEC,))
        failed = f"failed to load: {why}"
        if btf_tracepoints:
            kernel = dataclasses.replace(
                kernel, btf_tracepoints=False, no_btf_tracepoints_why=failed
            )
        else:
            kernel = dataclasses.replace(kernel, iterators=False, no_iterators_why=failed)
        self._kernel = kernel
        self.plan = plan_for(SPEC, self._disabled, kernel)
        self.bpf = self.loader.load(self.plan, self.defines())

    def start(self, policy: Policy) -> bool:
        """Load and attach; False (status recorded by the loader) when it cannot. Where
        the BTF-typed lifecycle is refused (the error names tp_btf__), the program loads
        again on the classic tracepoint; where the counters path (a BPF iterator) fails
        (a BCC or kernel that refuses the program or its link), again with a program per
        message; and if it still fails, without the BTF-typed lifecycle as well. The
        plan says why for the bytes; the log for both."""
        self.bpf = self.loader.load(self.plan, self.defines())

        def why() -> str:
            return self.loader.status[NAME].reason

        if self.bpf is None and self.plan.btf_tracepoints() and BTF_TP_PREFIX in why():
            self._load_without(True, why())
        if self.bpf is None and self.plan.iterators():
            self._load_without(False, why())
        if self.bpf is None and self.plan.btf_tracepoints():
            self._load_without(True, why())
        if self.bpf is None:
            return False
        layouts.check_layout("flow_key", layouts.FlowKey, self.bpf[b"flows"].Key)
        layouts.check_layout("flow_val", layouts.FlowVal, self.bpf[b"flows"].Leaf)
        layouts.check_layout("lpm_key", layouts.LpmKey, self.bpf[b"policy"].Key)
        layouts.check_layout("flow_event", layouts.FlowEvent, self.bpf[b"layout_flow_event"].Leaf)
        layouts.check_layout("sock_info", layouts.SockInfo, self.bpf[b"socks"].Leaf)
        prefill_overflow(self.bpf[b"flows"], len(CLASS_IDS))
        layouts.check_layout("connects key", layouts.RttKey, self.bpf[b"connects"].Key)
        layouts.check_layout("connects val", layouts.RttVal, self.bpf[b"connects"].Leaf)
        prefill_overflow(self.bpf[b"connects"], len(CLASS_IDS))
        if self.rtt is not None:
            layouts.check_layout("rtt_key", layouts.RttKey, self.bpf[b"rtt"].Key)
            layouts.check_layout("rtt_val", layouts.RttVal, self.bpf[b"rtt"].Leaf)
            prefill_overflow(self.bpf[b"rtt"], len(CLASS_IDS))
            if self.rtt.sampled:
                self.set_rtt_sampling(self.rtt_sample_seconds)
        self.set_policy(policy)
        if self.plan.iterators():
            self._walk = self.loader.iterator(NAME, "tcp").run
            # at once: sockets opened before the agent are counted from their first sight
            self._walk_open_sockets()
        self.open_records(
            b"flow_events",
            self._on_event,
            self.bpf_cfg.ring_reader,
            self.events_cfg.encoder,
            decode.compiled_flows,
            self._on_records,
            ctypes.sizeof(layouts.FlowEvent),
            self.bus.node,
        )
        self.bus.on_change(self.gate_records)
        self.gate_records()
        return True

    def set_rtt_sampling(self, seconds: float) -> None:
        """Sample each socket's RTT once per period of this many seconds (0: at every
        send and receive), a new period starting now; on the sampled RTT path only."""
        if self.bpf is None or self.rtt is None or not self.rtt.sampled:
            raise ValueError("RTT is not sampled on this kernel (no BTF srtt_us)")
        self.rtt_sample_seconds = seconds
        self._next_rtt_period(0 if seconds == 0 else self._rtt_period + 1)

    def _next_rtt_period(self, period: int) -> None:
        assert self.bpf is not None
        self.bpf[b"rtt_period"][ctypes.c_int(0)] = ctypes.c_uint64(period)
        self._rtt_period = period
        self._rtt_period_at = self.clock()

    def gate_records(self) -> None:
        """Let closed-flow records into the ring buffer while some consumer can take them
        (events.flow_records), and for the linger after the last one leaves."""
        if self.bpf is None:
            return
        ev = self.events_cfg
        with self._gate_lock:
            now = self.clock()
            if ev.flow_records == "always" or self.bus.wants(frozenset(FlowClosed.KINDS)):
                self._wanted_at = now
            on = now - self._wanted_at <= ev.flow_records_linger_seconds
            if on != self.records_on:
                table = self.bpf[b"records_on"]
                table[ctypes.c_int(0)] = ctypes.c_uint32(int(on))
                self.records_on = on
                log.info("closed-flow records %s", "on" if on else "off: no consumer wants them")

    def set_policy(self, policy: Policy) -> None:
        """Make the kernel's trie hold exactly this policy's entries."""
        entries = lpm_entries(policy)
        if len(entries) > MAX_POLICY_PREFIXES:
            raise ValueError(f"policy has {len(entries)} prefixes; at most {MAX_POLICY_PREFIXES}")
        trie = self.bpf[b"policy"]
        for (plen, addr), cls in entries.items():
            key = trie.Key(plen, (ctypes.c_uint8 * 16)(*addr))
            trie[key] = ctypes.c_uint8(cls)
        self.policy = policy
        for plen, addr in self._policy_keys - set(entries):
            key = trie.Key(plen, (ctypes.c_uint8 * 16)(*addr))
            with contextlib.suppress(KeyError):
                del trie[key]
        self._policy_keys = set(entries)

    def _on_event(self, rec: bytes) -> None:
        self.events_received += 1
        self._publish(decode.flow_record(rec))

    def _on_records(self, records: Records) -> None:
        """A pass's records through the compiled path (native.flows): each closed flow
        published as its wire bytes, numbered under the bus's lock; enrichment and the
        policy's lists asked as _publish asks them. A record it cannot handle is counted
        and the first error of the pass logged."""
        self.events_received += self.count(records)
        assert self.native is not None
        lookup = self.enrich.lookup
        enrich = None if lookup is None else functools.partial(identity.flow_fields, lookup)
        policy = self.policy
        check = functools.partial(abnormal, policy) if policy.black_list else None
        flows, head = self.native.flows, self.head
        failed: list[Any] = [0, None]

        def make(seq: int, ts: int) -> list[Any]:
            events: list[Any]
            events, failed[0], failed[1] = flows(records, seq, ts, head, enrich, check)
            return events

        self.bus.publish_batch(make)
        if failed[0]:
            self.records_lost(failed[0], failed[1])

    def _publish(self, event: FlowClosed) -> None:
        """A closed flow (made for this call: decoded, or the agent's own), and an
        abnormal_flow event when the policy's lists say so."""
        event = self.enrich.flow(event)
        self.bus.publish(event, owned=True)
        if abnormal(self.policy, event.raddr):
            self.bus.publish(dataclasses.replace(event, kind="abnormal_flow"), owned=True)

    def read(self) -> None:
        """Read the kernel aggregates into the metric cache, and age out idle keys."""
        if self.bpf is None:
            return
        with self._lock:
            if self._walk is not None:
                self._walk_open_sockets()
            for key, grew in self.flows_reader.read(self.bpf[b"flows"]):
                self._count(decode.flow_key_labels(key), dict(zip(VAL_FIELDS, grew, strict=True)))
            self.unattributed.settle(self.enrich)
            self.connects.read(self.bpf[b"connects"], self.enrich)
            if self.rtt is not None:
                self.rtt.read(self.bpf[b"rtt"], self.enrich)
                # periods begin on this read cycle: at least bpf.read_interval_seconds long
                if self._rtt_period and self.clock() - self._rtt_period_at >= (
                    self.rtt_sample_seconds
                ):
                    self._next_rtt_period(self._rtt_period + 1)
            self.read_stats(b"stats")
        self.gate_records()

    def _count(self, key_labels: tuple[str, ...], grew: dict[str, int]) -> None:
        """One flow key's growth into the cache, labelled by the index as it is now."""
        labels, who = self.enrich.flow_key(key_labels)
        apply_deltas(self.cache, labels, who, grew)
        self.unattributed.note(key_labels, who)

    def _walk_open_sockets(self) -> None:
        """Fold open sockets' bytes into their flows, before the flows are read: one
        walk per network namespace (the iterator walks the namespace it starts in; pods
        have their own). A walk scans the kernel's whole established hash whatever the
        namespace holds, so a namespace with no TCP socket at all (sockstat's per-namespace
        count) is passed over: nothing there to fold, and no socket to see first. A walk
        that fails, or a namespace that cannot be entered, is counted
        (lens_agent_tcp_walks_failed_total) and the read goes on: what those sockets
        moved shows at a later walk or at their close."""
        for _ino, ok in netns.in_each(netns.namespaces(), self._walk_one):
            if not ok:
                self.walks_failed += 1
                if self.walks_failed == 1 or self.walks_failed % 1000 == 0:
                    log.warning(
                        "%s: a walk of a namespace's TCP sockets failed (%d so far)",
                        NAME,
                        self.walks_failed,
                    )

    def _walk_one(self) -> bool:
        """Walk the calling thread's namespace, unless it holds no TCP socket; False when
        the walk failed."""
        assert self._walk is not None
        if proc_tcp.tcp_in_use() == 0:  # None (unreadable): walk
            self.walks_skipped += 1
            return True
        try:
            self._walk()
        except OSError as exc:
            log.debug("%s: walk failed: %s", NAME, exc)
            return False
        self.walks += 1
        return True

    def reconcile(self, live: set[proc_tcp.Tuple] | None = None) -> int:
        """Finish tracked sockets that no namespace holds any more; how many.

        The kernel skips a tracepoint program when another BPF program is running
        on that CPU (lens_agent_bpf_program_missed_total), so a CLOSE can go
        unseen. Whoever deletes the map entry first, the kernel or this sweep,
        counts the close, so nothing is counted twice.
        """
        if self.bpf is None:
            return 0
        socks = self.bpf[b"socks"]
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        grace = int(self.bpf_cfg.reconcile_grace_seconds * 1e9)
        candidates = [
            (int(getattr(key, "value", key)), layouts.SockInfo.from_buffer_copy(bytes(si)))
            for key, si in socks.items_lookup_batch()
            if now - si.start_ns > grace
        ]
        if not candidates:
            return 0
        live = proc_tcp.live_sockets() if live is None else live
        finished = 0
        for sk, si in candidates:
            tup = (
                decode.format_addr(si.family, bytes(si.laddr)),
                si.lport,
                decode.format_addr(si.family, bytes(si.key.raddr)),
                si.rport,
            )
            if tup in live:
                continue
            key = socks.Key(sk)
            current = socks.get(key)
            if current is None or current.start_ns != si.start_ns:
                continue  # closed meanwhile, or the address now holds a new socket
            try:
                del socks[key]
            except KeyError:
                continue  # the kernel closed it first and counted it
            self._finish(si)
            finished += 1
        self.repaired += finished
        return finished

    def _finish(self, si: layouts.SockInfo) -> None:
        """A socket the kernel never saw close: counted through the same path as the
        kernel map's deltas (closed, or failed when it never established)."""
        keyed = bool(si.keyed)
        grew = dict.fromkeys(VAL_FIELDS, 0) | {"closed" if keyed else "failed": 1}
        if keyed:  # what the kernel's finish would have taken into the flow (take_pre)
            grew |= {"sent": si.pre_sent, "recv": si.pre_recv}
        with self._lock:  # the attribution's keys are read's too
            self._count(decode.flow_key_labels(si.key), grew)
        self._publish(decode.sock_info_event(si, keyed))

    def tracked_keys(self) -> int:
        return len(self.flows_reader)

    def keys_missed(self) -> dict[str, int]:
        """Per map read as deltas: keys a batch read did not return though the map held
        them (each then read alone: DeltaReader)."""
        out = {"flows": self.flows_reader.missed, "connects": self.connects.keys_missed()}
        if self.rtt is not None:
            out["rtt"] = self.rtt.keys_missed()
        return out
