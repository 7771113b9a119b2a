"""The container runtime's view, without BPF: which containers run (containerd's state,
watched with inotify and read each cycle), their pods and devices on /pods, and
container_start / container_exit events. The processes feature adds exec, exit and OOM
on top where BPF loads; this one runs where it does not.

Its section is collectors.container_runtime; where containerd keeps its state is the
top-level containers.containerd_state, which enrichment reads too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from prometheus_client.registry import Collector

from lens_ebpf.agent.containers.pods import ContainersCollector, container_event, pods_view
from lens_ebpf.agent.containers.runtime import ContainerInfo
from lens_ebpf.agent.containers.watch import RuntimeWatcher
from lens_ebpf.agent.feature import RUNNING, Feature, Settings, register
from lens_ebpf.core.http import Response, json_response

log = logging.getLogger(__name__)


@register("container_runtime", order=5, settings={"container_runtime": Settings})
class ContainerRuntimeFeature(Feature):
    watcher: RuntimeWatcher | None = None
    running = False

    def enabled(self) -> str:
        on = self.ctx.settings("container_runtime", Settings).enabled
        return "" if on else "disabled by config"

    def start(self) -> None:
        resolver = self.ctx.enrich.containers
        assert resolver is not None, "the agent's enrichment reads the container runtime"
        resolver.on_change = self._changed
        resolver.refresh()
        try:
            self.watcher = RuntimeWatcher(
                Path(self.ctx.containers.containerd_state), resolver.refresh
            )
            self.watcher.start()
        except OSError as exc:  # read cycles still find containers, a little later
            log.warning("no inotify on the containerd state: %s", exc)
        self.running = True
        self.state = {"state": RUNNING, "reason": ""}

    def _changed(self, started: list[ContainerInfo], exited: list[ContainerInfo]) -> None:
        for c in started:
            self.ctx.bus.publish(container_event("container_start", c))
        for c in exited:
            self.ctx.bus.publish(container_event("container_exit", c))

    def _containers(self) -> dict[str, ContainerInfo]:
        resolver = self.ctx.enrich.containers
        return resolver.containers if self.running and resolver is not None else {}

    def collectors(self) -> list[Collector]:
        return [ContainersCollector(self._containers)]

    def routes(self) -> dict[str, Callable[[], Response]]:
        return {"/pods": self._pods}

    def _pods(self) -> Response:
        """The node exporter serves /pods as a bare list, without the REST envelope."""
        gpus, rdma = self.ctx.offers.gpu_devices(), self.ctx.offers.rdma_devices()
        return json_response(200, pods_view(self._containers(), gpus, rdma))

    def read(self) -> None:
        if self.running and self.ctx.enrich.containers is not None:
            self.ctx.enrich.containers.refresh()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
