"""The PyTorch profiler traces a pod's processes wrote, for the recorder: found in their
containers' filesystems and served as lens.v1.ProfilerService on the agent's gRPC port
(agent/profiler/service.py). Its section is collectors.profiler."""

from __future__ import annotations

from pathlib import Path

import grpc
from prometheus_client.registry import Collector
from pydantic import Field

from lens_ebpf.agent.containers.runtime import ContainerInfo
from lens_ebpf.agent.feature import RUNNING, Feature, Settings, register
from lens_ebpf.agent.profiler.discovery import NAMES
from lens_ebpf.agent.profiler.service import Profiler, ProfilerCollector
from lens_ebpf.protocol.stream_auth import Guard


class ProfilerSettings(Settings):
    # who may call ProfilerService, among those grpc.auth admits (as collectors.deepdive's)
    callers: list[str] = Field(default_factory=lambda: ["lens-ebpf-recorder"])
    patterns: list[str] = Field(default_factory=lambda: list(NAMES))  # trace file names
    globs: list[str] = Field(default_factory=list)  # absolute, in the container: more traces
    depth: int = Field(3, ge=0, le=10)  # directory levels below each place looked in
    max_files: int = Field(1000, ge=1, le=100000)  # a pod's listing, at most
    max_file_bytes: int = Field(1 << 30, ge=1 << 16)  # a trace sent, at most (1 GiB)


@register("profiler", order=51, settings={"profiler": ProfilerSettings})
class ProfilerFeature(Feature):
    p: Profiler | None = None

    def settings(self) -> ProfilerSettings:
        return self.ctx.settings("profiler", ProfilerSettings)

    def enabled(self) -> str:
        return "" if self.settings().enabled else "disabled by config"

    def grpc_handlers(self, guard: Guard | None) -> list[grpc.GenericRpcHandler]:
        if self.enabled():
            return []
        s = self.settings()
        resolver = self.ctx.enrich.containers

        def containers() -> dict[str, ContainerInfo]:
            if resolver is None:
                return {}
            resolver.refresh()
            return dict(resolver.containers)

        self.p = Profiler(
            self.ctx.node.name,
            Path(self.ctx.devices.procfs_root),
            containers,
            s.callers,
            s.patterns,
            s.globs,
            s.depth,
            s.max_files,
            s.max_file_bytes,
            guard,
        )
        return [self.p.handlers()]

    def start(self) -> None:
        self.state = {"state": RUNNING, "reason": ""}

    def collectors(self) -> list[Collector]:
        return [ProfilerCollector(self.p)] if self.p is not None else []
