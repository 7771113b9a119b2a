"""The tcp_flows program's own counts (lens_ebpf/agent/tcp/tcp_flows.py): what its
kernel side lost or could not track (full maps, keys a batch read missed, bytes and
retransmits of sockets opened before the agent), and the agent's sweeps and walks."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.tcp.tcp_flows import NAME, TcpFlows
from lens_ebpf.core.exposition import counter, gauge


class TcpFlowsCollector(Collector):
    """The program's own counts: losses, full maps, bytes of sockets it never saw open."""

    def __init__(self, flows: TcpFlows) -> None:
        self._flows = flows

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        st, flows = self._flows.kernel_stats, self._flows
        full = counter("lens_agent_bpf_map_full", "Updates refused by a full BPF map")
        for map_name, stat in (
            ("socks", "sock_map_full"),
            ("flows", "flow_map_full"),
            ("rtt", "rtt_map_full"),
            ("connects", "connect_map_full"),
        ):
            full.add({"program": NAME, "map": map_name}, st[stat])
        yield full
        missed = counter(
            "lens_agent_bpf_map_keys_missed",
            "Keys a batch read of a counters map did not return though the map held them "
            "(a kernel that passes over a busy bucket): each read alone, counted once",
        )
        for map_name, n in flows.keys_missed().items():
            missed.add({"program": NAME, "map": map_name}, n)
        yield missed
        untracked = counter(
            "lens_tcp_untracked_bytes",
            "Bytes on TCP sockets opened before the agent started (no flow key known)",
        )
        untracked.add({"way": "sent"}, st["untracked_sent_bytes"])
        untracked.add({"way": "received"}, st["untracked_recv_bytes"])
        yield untracked
        for name, help_text, value in (
            (
                "lens_tcp_resets_without_socket",
                "Resets sent with no socket (a SYN to a closed port)",
                st["reset_no_socket"],
            ),
            (
                "lens_tcp_untracked_retransmits",
                "Retransmits on sockets opened before the agent started",
                st["untracked_retransmits"],
            ),
            (
                "lens_agent_tcp_closes_repaired",
                "Sockets finished by the agent's sweep because the kernel skipped their CLOSE",
                flows.repaired,
            ),
            (
                "lens_agent_tcp_walks",
                "Walks of a network namespace's open TCP sockets (bpf_iter__tcp, one per "
                "namespace that has TCP sockets, per read cycle)",
                flows.walks,
            ),
            (
                "lens_agent_tcp_walks_skipped",
                "Network namespaces a read cycle did not walk: they held no TCP socket",
                flows.walks_skipped,
            ),
            (
                "lens_agent_tcp_walks_failed",
                "Walks that failed, or namespaces that could not be entered: their sockets' "
                "bytes show at a later walk or at close",
                flows.walks_failed,
            ),
        ):
            yield counter(name, help_text, value)
        yield gauge(
            "lens_agent_tcp_flow_keys",
            "Flow keys held in the kernel map",
            flows.tracked_keys(),
        )
