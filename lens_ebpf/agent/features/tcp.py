"""TCP flows, bytes, retransmits, resets and RTT: bpf/programs/tcp_flows.c as a feature."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.registry import Collector
from pydantic import Field

from lens_ebpf.agent.bpf.loader import OFF, feature_view
from lens_ebpf.agent.bpf.spec import Kernel, Plan, resolve
from lens_ebpf.agent.feature import Context, Feature, Settings, register
from lens_ebpf.agent.tcp import tcp_rtt
from lens_ebpf.agent.tcp.tcp_flows import NAME, RTT, SPEC, TcpFlows
from lens_ebpf.agent.tcp.tcp_flows_stats import TcpFlowsCollector

RTT_FEATURE = "tcp_rtt"


class RttSettings(Settings):
    """collectors.rtt: where the kernel's BTF places srtt_us, each socket's smoothed RTT
    is sampled once per period of sample_seconds in which it sends or receives (0: at
    every send and receive); elsewhere tcp:tcp_probe gives one sample per received
    segment."""

    sample_seconds: float = Field(tcp_rtt.SAMPLE_SECONDS, ge=0, le=3600)


@register(NAME, order=10, settings={"tcp": Settings, "rtt": RttSettings})
class TcpFeature(Feature):
    """tcp_flows and, on the same program, tcp_rtt (collectors.rtt; needs tcp)."""

    specs = (SPEC,)
    flows: TcpFlows | None = None

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.rtt_state: dict[str, Any] = {"state": OFF, "reason": "not started"}

    def enabled(self) -> str:
        self.rtt_state = {"state": OFF, "reason": "needs the tcp collector"}
        return "" if self.ctx.settings("tcp", Settings).enabled else "disabled by config"

    def start(self) -> None:
        ctx = self.ctx
        rtt_cfg = ctx.settings("rtt", RttSettings)
        tcp = TcpFlows(
            ctx.bpf,
            ctx.events,
            ctx.cache,
            ctx.bus,
            ctx.loader,
            enrich=ctx.enrich,
            rtt=rtt_cfg.enabled,
            rtt_sample_seconds=rtt_cfg.sample_seconds,
        )
        if tcp.start(ctx.policy.effective()):
            self.flows = tcp
            ctx.policy.subscribe(tcp.set_policy)  # again: it may have changed while compiling
            ctx.spawn("ringbuf-tcp", lambda: tcp.poll_until(ctx.stop))
            self._next_sweep = time.monotonic() + ctx.bpf.reconcile_interval_seconds
        st = ctx.loader.status[NAME]
        self.state = feature_view(st, [n for n in st.paths if n != RTT])
        # RTT stands on the flows program (it needs each socket's state), whichever path
        # that program's bytes took
        rtt = feature_view(st, [RTT])
        if tcp.rtt is None or self.flows is None:
            reason = tcp.rtt_off_reason or f"needs the tcp_flows program: {st.reason}"
            rtt.update(state=OFF, reason=reason, path=OFF)
        rtt["detail"] = "; ".join(tcp.plan.degraded_for([RTT]))
        self.rtt_state = rtt

    def views(self) -> dict[str, dict[str, Any]]:
        return {NAME: self.state, RTT_FEATURE: self.rtt_state}

    def collectors(self) -> list[Collector]:
        return [TcpFlowsCollector(self.flows)] if self.flows is not None else []

    def read(self) -> None:
        if self.flows is None:
            return
        if time.monotonic() >= self._next_sweep:
            self.flows.reconcile()
            self._next_sweep = time.monotonic() + self.ctx.bpf.reconcile_interval_seconds
        self.flows.read()

    @classmethod
    def plans(cls, kernel: Kernel) -> dict[str, tuple[Plan, list[str]]]:
        flows = resolve(SPEC, kernel)
        return {
            NAME: (flows, [n.name for n in SPEC.needs if n.name != RTT]),
            RTT_FEATURE: (flows, [RTT]),
        }
