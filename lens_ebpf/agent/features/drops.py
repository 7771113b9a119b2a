"""Packets the kernel dropped, per pod and reason: bpf/programs/drops.c as a feature."""

from __future__ import annotations

from prometheus_client.registry import Collector
from pydantic import Field

from lens_ebpf.agent.bpf.loader import feature_view
from lens_ebpf.agent.bpf.spec import Kernel, Plan, resolve
from lens_ebpf.agent.drops.drops import NAME, SPEC, Drops, DropsCollector
from lens_ebpf.agent.feature import Feature, Settings, register


class DropsSettings(Settings):
    """collectors.drops: max_keys bounds the kernel's map of (address, class, protocol,
    reason) keys; past it drops are counted per direction and class only."""

    max_keys: int = Field(4096, ge=16, le=1 << 20)
    # listen-queue overflows and listeners' SYN drops, each read cycle, per namespace
    listeners: bool = True


@register(NAME, order=12, settings={"drops": DropsSettings})
class DropsFeature(Feature):
    specs = (SPEC,)
    drops: Drops | None = None

    def enabled(self) -> str:
        return "" if self.ctx.settings("drops", DropsSettings).enabled else "disabled by config"

    def start(self) -> None:
        ctx = self.ctx
        s = ctx.settings("drops", DropsSettings)
        drops = Drops(ctx.bpf, ctx.cache, ctx.loader, ctx.enrich, s.max_keys, listen=s.listeners)
        if drops.start(ctx.policy.effective()):
            self.drops = drops
            ctx.policy.subscribe(drops.set_policy)
        self.state = feature_view(ctx.loader.status[NAME])

    def read(self) -> None:
        if self.drops is not None:
            self.drops.read()

    def collectors(self) -> list[Collector]:
        return [DropsCollector(self.drops)] if self.drops is not None else []

    @classmethod
    def plans(cls, kernel: Kernel) -> dict[str, tuple[Plan, list[str]]]:
        return {NAME: (resolve(SPEC, kernel), [n.name for n in SPEC.needs])}
