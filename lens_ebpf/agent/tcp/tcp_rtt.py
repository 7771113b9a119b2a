"""RTT histograms binned in the kernel (the rtt map of tcp_flows.c).

The samples are each socket's smoothed RTT: where the running kernel's BTF places
tcp_sock.srtt_us, read when an application sends or receives on the socket, once per
socket per sampling period (collectors.rtt.sample_seconds; no program runs per segment); else
tcp:tcp_probe's, one per segment received. The kernel bins each sample into
RTT_BOUNDS_US. The seed histogram's buckets (SEED_BOUNDS_US) are a subset of those,
so both histograms are exact sums of kernel bins, never an approximation.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from lens_ebpf.agent.bpf import layouts
from lens_ebpf.agent.bpf.map_reader import DeltaReader
from lens_ebpf.agent.bpf.spec import BtfField
from lens_ebpf.agent.config import BpfConfig
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.metrics.cache import HISTOGRAM, MetricCache
from lens_ebpf.agent.net import identity
from lens_ebpf.agent.tcp import decode
from lens_ebpf.agent.tcp.attribution import Unattributed

# Kernel bin boundaries, microseconds: 10 us to 10 s (lens_tcp_rtt_seconds buckets).
RTT_BOUNDS_US = (
    10,
    25,
    50,
    100,
    200,
    300,
    500,
    700,
    1000,
    1300,
    1600,
    2000,
    2500,
    3000,
    4000,
    5000,
    7000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
)
# primus_lens_network_tcp_flow_rtt buckets (docs/reference/metric-conventions.md), in µs.
SEED_BOUNDS_US = (
    50,
    100,
    200,
    300,
    500,
    700,
    1000,
    1300,
    1600,
    2000,
    2500,
    3000,
    4000,
    5000,
    7000,
    10000,
)
SEED = "primus_lens_network_tcp_flow_rtt"
LENS = "lens_tcp_rtt_seconds"
TRACEPOINT = "tcp:tcp_probe"
# the sampled path's switch and the field it reads (microseconds << 3, as the kernel keeps it)
SAMPLED = "LENS_RTT_SAMPLED"
SRTT_FIELD = BtfField("LENS_TCP_SRTT_OFF", "tcp_sock.srtt_us", 4)
SAMPLE_SECONDS = 1.0  # collectors.rtt.sample_seconds' default
# what one sample is, per path, for the families' help
PER_SAMPLE = {
    True: "each socket's, once per collectors.rtt.sample_seconds period it moves bytes in",
    False: "per received segment",
}


def defines(bpf: BpfConfig) -> dict[str, int | str]:
    """cflags the RTT part of tcp_flows.c is compiled with (LENS_RTT_SAMPLED or LENS_RTT
    itself comes from the program's spec: BTF's srtt_us, else tcp:tcp_probe)."""
    return {
        "LENS_RTT_NBOUNDS": len(RTT_BOUNDS_US),
        "LENS_RTT_BOUNDS": ",".join(str(b) for b in RTT_BOUNDS_US),
        "MAX_RTT_KEYS": bpf.max_rtt_keys + 14,  # plus the overflow slots
    }


def _seed_groups() -> list[list[int]]:
    """Which kernel bins add up to each seed bucket (the last: above 10 ms)."""
    groups: list[list[int]] = [[] for _ in range(len(SEED_BOUNDS_US) + 1)]
    j = 0
    for i, bound in enumerate((*RTT_BOUNDS_US, float("inf"))):
        while j < len(SEED_BOUNDS_US) and bound > SEED_BOUNDS_US[j]:
            j += 1
        groups[j].append(i)
    return groups


SEED_GROUPS = _seed_groups()
assert set(SEED_BOUNDS_US) <= set(RTT_BOUNDS_US), "seed buckets must be kernel bounds"
assert len(RTT_BOUNDS_US) + 1 == layouts.RTT_BINS, "bpf/layouts.py RttVal is out of date"


def register_families(cache: MetricCache, sampled: bool = True) -> None:
    """Both histograms; sampled: which path feeds them (their help says what a sample is)."""
    cache.register(
        SEED,
        HISTOGRAM,
        f"Smoothed TCP RTT in microseconds, {PER_SAMPLE[sampled]}",
        ("raddr", "direction"),
        buckets=SEED_BOUNDS_US,
    )
    cache.register(
        LENS,
        HISTOGRAM,
        f"Smoothed TCP RTT in seconds, {PER_SAMPLE[sampled]}",
        ("direction", "type", "raddr", *identity.REMOTE_LABELS),
        buckets=tuple(b / 1e6 for b in RTT_BOUNDS_US),
    )


def apply_rtt(
    cache: MetricCache, labels: tuple[str, ...], who: tuple[str, ...], grew: tuple[int, ...]
) -> None:
    """One rtt-map key's growth (count, sum_us, bins...) into both histograms; labels
    and who as enrichment gives them (Enrichment.flow_key of decode.remote_labels)."""
    _, sum_us, *bins = grew
    direction, _, raddr = labels
    cache.observe(LENS, (*labels, *who), bins, sum_us / 1e6)
    seed = [sum(bins[i] for i in group) for group in SEED_GROUPS]
    cache.observe(SEED, (raddr, direction), seed, float(sum_us))


def attribute(
    cache: MetricCache, key_labels: tuple[str, ...], labels: tuple[str, ...], who: tuple[str, ...]
) -> None:
    """Move what an rtt-map key's samples made without an identity to the series of the
    identity the index now gives it (attribution.Unattributed); the seed histogram has
    no identity or class: it stays."""
    cache.move(LENS, (*key_labels, *identity.NO_IDENTITY), LENS, (*labels, *who))


class TcpRtt:
    """Reads the rtt map of a loaded tcp_flows program into the metric cache."""

    def __init__(
        self,
        bpf: BpfConfig,
        cache: MetricCache,
        clock: Callable[[], float] = time.monotonic,
        sampled: bool = True,
    ) -> None:
        self.cache = cache
        self.sampled = sampled
        self._reader = DeltaReader(
            lambda v: (v.count, v.sum_us, *v.bins),
            bpf.flow_key_idle_seconds,
            clock,
            pinned=lambda key: bool(key.overflow),
        )
        register_families(cache, sampled)
        lens = cache.family(LENS)
        # keys sampled before the index knew their remote: moved to it once it does
        self.unattributed = Unattributed(
            functools.partial(attribute, cache), lens.ttl, lens.max_series, clock
        )

    def read(self, table: Any, enrich: Enrichment) -> None:
        for key, grew in self._reader.read(table):
            key_labels = decode.remote_labels(key)
            labels, who = enrich.flow_key(key_labels)
            apply_rtt(self.cache, labels, who, grew)
            self.unattributed.note(key_labels, who)
        self.unattributed.settle(enrich)

    def keys(self) -> int:
        return len(self._reader)

    def keys_missed(self) -> int:
        return self._reader.missed
