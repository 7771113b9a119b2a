"""Features plug in by name, as node_exporter's collectors do (registerCollector).

A feature is a BPF program or a device or cluster collector. Its module declares it with
`@register(name, order=..., settings={...})`: its config models (each one the section
`collectors.<key>`, switched by `enabled` and `--no-collector.<key>`), and a class that
the Agent builds with a Context (what it consumes), starts when enabled, asks for its
collectors, routes and status, reads each cycle, and stops in reverse order. Modules are
found under FEATURE_PACKAGES: adding a feature touches its own module, test and fixture.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict

from lens_ebpf.bpf.loader import ATTACHED

if TYPE_CHECKING:
    from lens_ebpf.api.http import Response
    from lens_ebpf.bpf.loader import BpfLoader
    from lens_ebpf.bpf.spec import Kernel, Plan, ProgramSpec
    from lens_ebpf.config import Config
    from lens_ebpf.devices.collector import CollectorSet
    from lens_ebpf.enrich import Enrichment
    from lens_ebpf.events import EventBus
    from lens_ebpf.metrics.cache import MetricCache
    from lens_ebpf.net.policy_watch import PolicyWatcher

FEATURE_PACKAGES = ("lens_ebpf.features", "lens_ebpf.devices")
RUNNING, OFF, ERROR = "running", "off", "error"  # a BPF feature's running state: ATTACHED
S = TypeVar("S", bound=BaseModel)


class Settings(BaseModel):
    """A feature's config section: collectors.<key>; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    enabled: bool = True


@dataclass
class Context:
    """What the Agent hands every feature at construction."""

    cfg: Config
    cache: MetricCache
    bus: EventBus
    loader: BpfLoader
    enrich: Enrichment
    policy: PolicyWatcher
    devices: CollectorSet  # device collectors, refreshed on their own intervals
    stop: threading.Event
    spawn: Callable[[str, Callable[[], None]], None]
    # what one feature offers others, by name (a GPU count, GPU -> pod assignments)
    offers: dict[str, Callable[[], Any]] = field(default_factory=dict)

    def offered(self, name: str, default: Any) -> Any:
        """What another feature offers under name, asked at the time of use."""
        fn = self.offers.get(name)
        return fn() if fn is not None else default

    def settings(self, key: str, model: type[S]) -> S:
        """This feature's typed section of the config."""
        got = self.cfg.collectors.section(key)
        assert isinstance(got, model), f"collectors.{key} is a {type(got).__name__}"
        return got


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
        """HTTP routes; served whether or not the feature runs (empty data when off)."""
        return {}

    def read(self) -> None:
        """Each read cycle of the agent (BPF maps into the cache)."""

    def stop(self) -> None:
        """Release what start took."""

    @classmethod
    def plans(cls, kernel: Kernel) -> dict[str, tuple[Plan, list[str]]]:
        """BPF features: feature -> (its program's plan on kernel, the needs it covers)."""
        return {}


@dataclass(frozen=True)
class FeatureInfo:
    name: str
    cls: type[Feature]
    order: int  # start order: enrichment sources, then programs, then collectors
    settings: dict[str, type[BaseModel]]


REGISTRY: dict[str, FeatureInfo] = {}


def register(
    name: str, *, order: int, settings: dict[str, type[BaseModel]] | None = None
) -> Callable[[type[Feature]], type[Feature]]:
    def wrap(cls: type[Feature]) -> type[Feature]:
        if name in REGISTRY and REGISTRY[name].cls is not cls:
            raise RuntimeError(f"feature {name} registered twice")
        cls.name = name
        REGISTRY[name] = FeatureInfo(name, cls, order, dict(settings or {}))
        return cls

    return wrap


_discovered = False


def registered() -> list[FeatureInfo]:
    """Every feature, in start order, after importing the modules that declare them."""
    global _discovered
    if not _discovered:
        for pkg_name in FEATURE_PACKAGES:
            pkg = importlib.import_module(pkg_name)
            for mod in pkgutil.walk_packages(pkg.__path__, f"{pkg_name}."):
                importlib.import_module(mod.name)
        _discovered = True
    return sorted(REGISTRY.values(), key=lambda f: (f.order, f.name))


def collector_settings() -> dict[str, type[BaseModel]]:
    """collectors.<key> -> its model, in start order (config and --no-collector flags)."""
    return {k: m for f in registered() for k, m in f.settings.items()}


class FeatureCollector(Collector):
    """Agent self metrics: build info, and which features run (by which probe path)."""

    def __init__(self, views: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self._views = views

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        from lens_ebpf import __version__

        info = GaugeMetricFamily("lens_agent_build_info", "Agent version", labels=("version",))
        info.add_metric((__version__,), 1)
        yield info
        up = GaugeMetricFamily("lens_agent_feature_up", "1 when a feature is running",
                               labels=("feature", "path"))  # fmt: skip
        for name, f in self._views().items():
            # path: tracepoint or kprobe for BPF features; "" for the others
            up.add_metric((name, f.get("path", "")), 1 if f["state"] in (ATTACHED, RUNNING) else 0)
        yield up
