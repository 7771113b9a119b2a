"""The agent's features: a BPF program, or a device or cluster collector.

Its module declares it with `@register(name, order=..., settings={...})`
(agent/registry.py, core/registry.py): its config models (each one the section
`collectors.<key>`, switched by `enabled` and `--no-collector.<key>`), and a class that
the Agent builds with a Context (its own sections, the shared ones it may read, the
agent's parts; never the whole config), starts when enabled, asks for its collectors,
routes and status, reads each cycle, and stops in reverse order. Modules are found in
the registry's packages, so no list names a feature: adding one touches its module, its
test and fixture, defaults.yaml, its docs and the generated metric reference; a BPF
program adds its C file and layout mirror (docs/contributing/feature.md).
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry
from pydantic import BaseModel

from lens_ebpf.agent.bpf.loader import ATTACHED
from lens_ebpf.agent.registry import FEATURES
from lens_ebpf.core.collector import PeriodicCollector
from lens_ebpf.core.exposition import gauge
from lens_ebpf.core.http import Response, envelope
from lens_ebpf.core.registry import Registered
from lens_ebpf.core.settings import Section, Sections

if TYPE_CHECKING:
    import grpc

    from lens_ebpf.agent.bpf.loader import BpfLoader
    from lens_ebpf.agent.bpf.spec import Kernel, Plan, ProgramSpec
    from lens_ebpf.agent.config import (
        BpfConfig,
        ContainersConfig,
        DevicesConfig,
        EventsConfig,
        KubernetesConfig,
        NodeConfig,
    )
    from lens_ebpf.agent.enrich import Enrichment
    from lens_ebpf.agent.events import EventBus
    from lens_ebpf.agent.inventory import DeviceWatch
    from lens_ebpf.agent.metrics.cache import MetricCache
    from lens_ebpf.agent.net.policy_watch import PolicyWatcher
    from lens_ebpf.core.collector import CollectorSet
    from lens_ebpf.protocol.stream_auth import Guard

RUNNING, OFF, ERROR = "running", "off", "error"  # a BPF feature's running state: ATTACHED
S = TypeVar("S", bound=BaseModel)


class Settings(Section):
    """A feature's config section: collectors.<key>; unknown keys are errors."""

    enabled: bool = True


def _none() -> dict[str, Any]:
    return {}


@dataclass
class Offers:
    """What one feature offers the others, each asked at the time of use (the offering
    feature may start after the one that asks); the defaults answer for a feature that
    is off."""

    gpu_count: Callable[[], int] = lambda: 0
    gpu_devices: Callable[[], dict[str, Any]] = _none  # GPU index -> its device record
    gpu_assignments: Callable[[], dict[str, Any]] = _none  # GPU -> pod (kubelet's view)
    rdma_devices: Callable[[], dict[str, Any]] = _none  # RDMA device -> its record
    # pid -> the GPU indexes the vendor library lists it on (deepdive's process tree)
    gpu_processes: Callable[[], dict[int, list[int]]] = dict


@dataclass
class Context:
    """What the Agent hands a feature at construction: its own sections of the config
    (settings()), the shared sections a feature may read, each typed, and the agent's
    parts. Never the whole config: a feature reads what it declares."""

    node: NodeConfig  # name resolved: node.name, else the host's
    bpf: BpfConfig
    events: EventsConfig
    devices: DevicesConfig  # the roots (sysfs, procfs, /etc, /dev) and compat
    containers: ContainersConfig
    kubernetes: KubernetesConfig
    cache: MetricCache
    bus: EventBus
    loader: BpfLoader
    enrich: Enrichment
    policy: PolicyWatcher
    periodic: CollectorSet  # periodic collectors, each refreshed on its own interval
    stop: threading.Event
    spawn: Callable[[str, Callable[[], None]], None]
    watch: DeviceWatch  # the device collectors' records: device_change and device_inventory
    registry: CollectorRegistry  # what /metrics serves (the OTLP exporter reads it)
    offers: Offers = field(default_factory=Offers)
    sections: Mapping[str, BaseModel] = field(default_factory=dict)  # collectors.<key>: its own

    def settings(self, key: str, model: type[S]) -> S:
        """This feature's typed section collectors.<key>; only its own are here."""
        got = self.sections.get(key)
        assert isinstance(got, model), f"collectors.{key} is not this feature's {model.__name__}"
        return got

    def own(self, keys: Iterable[str], collectors: Sections) -> Context:
        """This context for one feature: the same parts, its own sections (keys) only."""
        return dataclasses.replace(self, sections={k: collectors.section(k) for k in keys})


class Feature:
    """Base: a feature that does nothing; subclasses override what they have."""

    name: ClassVar[str] = ""
    specs: ClassVar[tuple[ProgramSpec, ...]] = ()  # the BPF programs it loads (bpf/spec.py)

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.state: dict[str, Any] = {"state": OFF, "reason": "not started"}

    def enabled(self) -> str:
        """Why this feature stays off by configuration; "" when it should start."""
        return ""

    def start(self) -> None:
        """Start; set self.state (raise only for what should stop the agent)."""
        self.state = {"state": RUNNING, "reason": ""}

    def views(self) -> dict[str, dict[str, Any]]:
        """Feature name -> its state as /readyz shows it (one program may feed two)."""
        return {self.name: self.state}

    def collectors(self) -> list[Collector]:
        return []

    def report(self) -> dict[str, Any]:
        """Top-level /readyz sections this feature adds (kubernetes: its watches)."""
        return {}

    def routes(self) -> dict[str, Callable[[], Response]]:
        """REST path -> handler() answering whole (the node exporter's envelope,
        core.http.envelope); Agent.rest() mounts them in one RouteTable, served whether or
        not the feature runs (empty data when off)."""
        return {}

    def grpc_handlers(self, guard: Guard | None) -> list[grpc.GenericRpcHandler]:
        """gRPC services it serves on the agent's port beside EventService, behind guard
        (grpc.auth); asked once, when the port is bound (before start)."""
        return []

    def read(self) -> None:
        """Each read cycle of the agent (BPF maps into the cache)."""

    def stop(self) -> None:
        """Release what start took."""

    @classmethod
    def plans(cls, kernel: Kernel) -> dict[str, tuple[Plan, list[str]]]:
        """BPF features: feature -> (its program's plan on kernel, the needs it covers)."""
        return {}


register = FEATURES.register


def registered() -> list[Registered]:
    """Every feature, in start order, after importing the modules that declare them."""
    return FEATURES.registered()


def feature_classes() -> list[type[Feature]]:
    """Every feature's class, in start order."""
    return [cast(type[Feature], info.cls) for info in registered()]


def build_features(ctx: Context, collectors: Sections) -> list[Feature]:
    """Every feature, in start order, each built with ctx holding its own sections."""
    return [
        cast(type[Feature], info.cls)(ctx.own(info.settings, collectors)) for info in registered()
    ]


def collector_settings() -> dict[str, type[BaseModel]]:
    """collectors.<key> -> its model, in start order (config and --no-collector flags)."""
    return FEATURES.settings()


class CollectorFeature(Feature, abc.ABC):
    """A periodic collector as a feature: built by make(), refreshed in the agent's
    CollectorSet; VIEWS maps each REST route to (its JSON view, the answer when off)."""

    VIEWS: ClassVar[dict[str, tuple[str, Any]]] = {}

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.collector: PeriodicCollector | None = None

    def enabled(self) -> str:
        return "" if self.ctx.settings(self.name, Settings).enabled else "disabled by config"

    @abc.abstractmethod
    def make(self) -> PeriodicCollector:
        """The collector, from this feature's settings."""

    def start(self) -> None:
        self.collector = self.make()
        self.ctx.periodic.add(self.collector)
        self.state = {"state": RUNNING, "reason": ""}

    def view(self, name: str) -> Any:
        return self.collector.views.get(name) if self.collector is not None else None

    def routes(self) -> dict[str, Callable[[], Response]]:
        def route(view: str, empty: Any) -> Callable[[], Response]:
            def answer() -> Response:
                got = self.view(view)
                return envelope(empty if got is None else got)

            return answer

        return {path: route(view, empty) for path, (view, empty) in self.VIEWS.items()}


class FeatureCollector(Collector):
    """Agent self metrics: build info, and which features run (by which probe path)."""

    def __init__(self, views: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self._views = views

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        from lens_ebpf import __version__

        info = gauge("lens_agent_build_info", "Agent version")
        info.add({"version": __version__}, 1)
        yield info
        up = gauge("lens_agent_feature_up", "1 when a feature is running")
        for name, f in self._views().items():
            # path: tracepoint or kprobe for BPF features; "" for the others
            up.add(
                {"feature": name, "path": f.get("path", "")},
                1 if f["state"] in (ATTACHED, RUNNING) else 0,
            )
        yield up
