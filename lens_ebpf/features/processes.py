"""exec, exit and OOM of every process, attributed to containers: bpf_programs/proc_events.c
as a feature, with the container runtime watch and the /pods route."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from prometheus_client.registry import Collector

from lens_ebpf.api.http import Response, json_response
from lens_ebpf.bpf.loader import feature_view
from lens_ebpf.bpf.spec import Kernel, Plan, resolve
from lens_ebpf.containers.proc_events import (
    NAME,
    SPEC,
    ProcEvents,
    ProcEventsCollector,
    pods_view,
)
from lens_ebpf.containers.watch import RuntimeWatcher
from lens_ebpf.feature import Feature, Settings, register

log = logging.getLogger(__name__)


@register("processes", order=11, settings={"processes": Settings})
class ProcessesFeature(Feature):
    specs = (SPEC,)
    procs: ProcEvents | None = None
    watcher: RuntimeWatcher | None = None

    def enabled(self) -> str:
        return "" if self.ctx.settings("processes", Settings).enabled else "disabled by config"

    def start(self) -> None:
        ctx = self.ctx
        procs = ProcEvents(ctx.cfg, ctx.cache, ctx.bus, ctx.loader, ctx.enrich)
        if procs.start():
            self.procs = procs
            try:
                self.watcher = RuntimeWatcher(Path(ctx.cfg.containers.containerd_state),
                                              procs.resolver.refresh)  # fmt: skip
                self.watcher.start()
            except OSError as exc:  # read cycles still find containers, a little later
                log.warning("no inotify on the containerd state: %s", exc)
            ctx.spawn("ringbuf-proc", lambda: procs.poll_until(ctx.stop))
        self.state = feature_view(ctx.loader.status[NAME])

    def collectors(self) -> list[Collector]:
        return [ProcEventsCollector(self.procs)] if self.procs is not None else []

    def routes(self) -> dict[str, Callable[[], Response]]:
        return {"/pods": self._pods}

    def _pods(self) -> Response:
        """The node exporter serves /pods as a bare list, without the REST envelope."""
        containers = self.procs.resolver.containers if self.procs else {}
        gpus, rdma = self.ctx.offered("gpu_devices", {}), self.ctx.offered("rdma_devices", {})
        return json_response(200, pods_view(containers, gpus, rdma))

    def read(self) -> None:
        if self.procs is not None:
            self.procs.read()

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    @classmethod
    def plans(cls, kernel: Kernel) -> dict[str, tuple[Plan, list[str]]]:
        return {"processes": (resolve(SPEC, kernel), [n.name for n in SPEC.needs])}
