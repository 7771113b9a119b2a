"""exec, exit and OOM of every process, attributed to containers: bpf/programs/proc_events.c
as a feature, on top of the container runtime's view (features/container_runtime.py)."""

from __future__ import annotations

from lens_ebpf.agent.bpf.loader import feature_view
from lens_ebpf.agent.bpf.spec import Kernel, Plan, resolve
from lens_ebpf.agent.feature import Feature, Settings, register
from lens_ebpf.agent.processes.proc_events import NAME, SPEC, ProcEvents


@register("processes", order=11, settings={"processes": Settings})
class ProcessesFeature(Feature):
    specs = (SPEC,)
    procs: ProcEvents | None = None

    def enabled(self) -> str:
        return "" if self.ctx.settings("processes", Settings).enabled else "disabled by config"

    def start(self) -> None:
        ctx = self.ctx
        procs = ProcEvents(ctx.bpf, ctx.cache, ctx.bus, ctx.loader, ctx.enrich, ctx.events.encoder)
        if procs.start():
            self.procs = procs
            ctx.spawn("ringbuf-proc", lambda: procs.poll_until(ctx.stop))
        self.state = feature_view(ctx.loader.status[NAME])

    def read(self) -> None:
        if self.procs is not None:
            self.procs.read()

    @classmethod
    def plans(cls, kernel: Kernel) -> dict[str, tuple[Plan, list[str]]]:
        return {"processes": (resolve(SPEC, kernel), [n.name for n in SPEC.needs])}
