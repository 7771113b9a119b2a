"""What collectors.otlp costs the agent: CPU to make one metrics snapshot of N cached series
(read from the cache, encoded, gzipped) beside a /metrics rendering of the same cache and
the registry's collection a snapshot also makes (where the cache is rendered again), and
CPU per event to make log records of closed flows.

    python -m bench.otlp_export [N ...]     # default 1000 5000 20000

Series are flows as the TCP feature writes them: six counter families and one RTT
histogram (29 buckets) per (direction, class, remote, port) key, remote pods named.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from lens_ebpf.agent.events import FlowClosed
from lens_ebpf.agent.metrics.cache import CacheCollector, MetricCache
from lens_ebpf.agent.otlp import semconv
from lens_ebpf.agent.otlp.exporter import compress
from lens_ebpf.agent.otlp.logs import LogsEncoder
from lens_ebpf.agent.otlp.metrics import MetricsEncoder, from_cache, from_prometheus
from lens_ebpf.agent.tcp import flow_families, tcp_rtt


def filled(series: int) -> MetricCache:
    """A cache of about `series` series: 7 per flow key (6 counters, 1 histogram)."""
    cache = MetricCache(max_series=10_000_000)
    flow_families.register_families(cache)
    tcp_rtt.register_families(cache)
    bins = len(cache.family(tcp_rtt.LENS).buckets)
    for i in range(max(1, series // 7)):
        key = ("egress", "k8sPod", f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", "8080")
        who = ("shop", f"web-{i}", "Deployment", "web", "")
        for name in flow_families.LENS_FAMILIES:
            cache.inc(name, (*key, *who), float(i + 1))
        cache.observe(tcp_rtt.LENS, (*key[:3], *who), [1] * bins, 0.001 * i)
    return cache


def cpu(fn: Callable[[], Any], rounds: int = 5) -> tuple[float, Any]:
    """The least thread CPU time of rounds calls (after one to warm up), and what it made."""
    got = fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        got = fn()
        best = min(best, time.thread_time() - t0)
    return best, got


def main(sizes: list[int]) -> None:
    node = semconv.node_attributes("node-a", "bench")
    print(
        f"{'series':>8} {'snapshot ms':>12} {'gzip ms':>8} {'bytes':>10} {'gzipped':>9} "
        f"{'/metrics ms':>12} {'registry ms':>13}"
    )
    for n in sizes:
        cache = filled(n)
        enc = MetricsEncoder(node, "bench", time.time_ns())
        t_snap, snap = cpu(
            lambda c=cache, e=enc: e.encode(from_cache(c.snapshot()), time.time_ns())
        )
        t_gz, body = cpu(lambda s=snap: compress(s.body, True))
        t_render, _ = cpu(lambda c=cache: c.render())
        registry = CollectorRegistry(auto_describe=False)
        registry.register(CacheCollector(cache))
        # what a snapshot pays for the registry's other families: the cache rendered there
        t_reg, _ = cpu(lambda r=registry: list(from_prometheus(r.collect())))
        print(
            f"{snap.points:>8} {t_snap * 1e3:>12.1f} {t_gz * 1e3:>8.1f} {len(snap.body):>10} "
            f"{len(body):>9} {t_render * 1e3:>12.1f} {t_reg * 1e3:>13.1f}"
        )
    flows = [
        FlowClosed(
            kind="flow_closed",
            seq=i,
            ts_unix_nano=time.time_ns(),
            ts_ns=i,
            pid=100,
            comm="python3",
            cgroup_id=1,
            family="ipv4",
            laddr="10.0.0.1",
            lport=40000 + i % 20000,
            raddr="10.0.1.2",
            rport=8080,
            direction="egress",
            cls="k8sPod",
            sent_bytes=4096,
            received_bytes=100,
            retransmits=0,
            duration_ns=1000,
            reason="close",
            remote_namespace="shop",
            remote_pod="web-0",
            remote_workload_kind="Deployment",
            remote_workload="web",
            namespace="team",
            pod="client-0",
            workload_kind="Job",
            workload="train",
        )
        for i in range(10000)
    ]
    logs = LogsEncoder(node, "bench")
    t_logs, snap = cpu(lambda: logs.encode(flows), rounds=3)
    t_gz, body = cpu(lambda: compress(snap.body, True), rounds=3)
    print(
        f"\nflow_closed log records: {t_logs / len(flows) * 1e6:.1f} us each, gzip "
        f"{t_gz / len(flows) * 1e6:.1f} us; {len(snap.body) / len(flows):.0f} bytes each, "
        f"{len(body) / len(flows):.0f} gzipped"
    )


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 5000, 20000])
