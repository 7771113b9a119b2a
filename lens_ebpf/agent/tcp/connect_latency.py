"""Connect latency histograms binned in the kernel (the connects map of tcp_flows.c).

Each active open's time from its SYN_SENT transition (connect(), just before the SYN
leaves) to ESTABLISHED, one sample per connection, binned in the kernel into the RTT's
bounds (tcp_rtt.RTT_BOUNDS_US) per (direction, class, remote), whichever paths the
program's needs took: no BTF or extra tracepoint is needed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from lens_ebpf.agent.bpf.map_reader import DeltaReader
from lens_ebpf.agent.config import BpfConfig
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.metrics.cache import HISTOGRAM, MetricCache
from lens_ebpf.agent.net import identity
from lens_ebpf.agent.tcp import decode
from lens_ebpf.agent.tcp.attribution import Unattributed
from lens_ebpf.agent.tcp.tcp_rtt import RTT_BOUNDS_US

LENS = "lens_tcp_connect_seconds"


def register_families(cache: MetricCache) -> None:
    cache.register(
        LENS,
        HISTOGRAM,
        "Time from an active open's SYN to ESTABLISHED, one sample per connection",
        ("direction", "type", "raddr", *identity.REMOTE_LABELS),
        buckets=tuple(b / 1e6 for b in RTT_BOUNDS_US),
    )


def attribute(
    cache: MetricCache, key_labels: tuple[str, ...], labels: tuple[str, ...], who: tuple[str, ...]
) -> None:
    """Move a key's samples counted without an identity to the identity the index now
    gives it (attribution.Unattributed)."""
    cache.move(LENS, (*key_labels, *identity.NO_IDENTITY), LENS, (*labels, *who))


class ConnectLatency:
    """Reads the connects map of a loaded tcp_flows program into the metric cache."""

    def __init__(
        self, bpf: BpfConfig, cache: MetricCache, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cache = cache
        self._reader = DeltaReader(
            lambda v: (v.count, v.sum_us, *v.bins),
            bpf.flow_key_idle_seconds,
            clock,
            pinned=lambda key: bool(key.overflow),
        )
        register_families(cache)
        fam = cache.family(LENS)
        self.unattributed = Unattributed(
            functools.partial(attribute, cache), fam.ttl, fam.max_series, clock
        )

    def read(self, table: Any, enrich: Enrichment) -> None:
        for key, grew in self._reader.read(table):
            _, sum_us, *bins = grew
            key_labels = decode.remote_labels(key)
            labels, who = enrich.flow_key(key_labels)
            self.cache.observe(LENS, (*labels, *who), bins, sum_us / 1e6)
            self.unattributed.note(key_labels, who)
        self.unattributed.settle(enrich)

    def keys_missed(self) -> int:
        return self._reader.missed
