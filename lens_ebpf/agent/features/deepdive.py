"""The deep dive into a pod, for the recorder: its process tree and py-spy against one of
its processes, served as lens.v1.DeepDiveService on the agent's gRPC port
(agent/deepdive/service.py). Its section is collectors.deepdive."""

from __future__ import annotations

from pathlib import Path

import grpc
from prometheus_client.registry import Collector
from pydantic import Field

from lens_ebpf.agent.containers.runtime import ContainerInfo
from lens_ebpf.agent.deepdive.pyspy import PySpy, find_pyspy
from lens_ebpf.agent.deepdive.service import DeepDive, DeepDiveCollector
from lens_ebpf.agent.feature import RUNNING, Feature, Settings, register
from lens_ebpf.protocol.stream_auth import Guard


class DeepDiveSettings(Settings):
    # who may call DeepDiveService, among those grpc.auth admits: namespace/name, or a
    # name (a ServiceAccount's of any namespace grpc.auth allows, a tokens_file line's)
    callers: list[str] = Field(default_factory=lambda: ["lens-ebpf-recorder"])
    pyspy: str = ""  # py-spy's path; "": the one beside the agent's Python, else on PATH
    max_duration_seconds: int = Field(300, ge=1, le=3600)  # a record's longest
    max_output_bytes: int = Field(64 << 20, ge=1 << 16)  # a run's output, at most
    max_running: int = Field(4, ge=1, le=64)  # py-spy runs at once on this node
    dump_timeout_seconds: float = Field(10.0, gt=0, le=120)  # a dump's longest


@register("deepdive", order=50, settings={"deepdive": DeepDiveSettings})
class DeepDiveFeature(Feature):
    dd: DeepDive | None = None

    def settings(self) -> DeepDiveSettings:
        return self.ctx.settings("deepdive", DeepDiveSettings)

    def enabled(self) -> str:
        return "" if self.settings().enabled else "disabled by config"

    def grpc_handlers(self, guard: Guard | None) -> list[grpc.GenericRpcHandler]:
        if self.enabled():
            return []
        s = self.settings()
        procfs = Path(self.ctx.devices.procfs_root)
        resolver = self.ctx.enrich.containers

        def containers() -> dict[str, ContainerInfo]:
            if resolver is None:
                return {}
            resolver.refresh()  # a pod started a moment ago is found
            return dict(resolver.containers)

        spy = PySpy(
            find_pyspy(s.pyspy),
            procfs,
            s.max_duration_seconds,
            s.max_output_bytes,
            s.max_running,
            s.dump_timeout_seconds,
        )
        self.dd = DeepDive(
            self.ctx.node.name, procfs, containers, self._gpu_pids, spy, s.callers, guard
        )
        return [self.dd.handlers()]

    def _gpu_pids(self) -> dict[int, list[int]]:
        """pid -> the GPU indexes the vendor library lists it on (where it has a list)."""
        return self.ctx.offers.gpu_processes()

    def start(self) -> None:
        why = "" if self.dd is None or self.dd.pyspy.binary else "py-spy not found"
        self.state = {"state": RUNNING, "reason": why}

    def collectors(self) -> list[Collector]:
        return [DeepDiveCollector(self.dd)] if self.dd is not None else []
