"""The agent's settings: shipped defaults (agent/defaults.yaml), a YAML file, the
environment, flags, in that order (core/settings.py). Each feature's section
(`collectors.<key>`) has the model its module registered (agent/registry.py)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from lens_ebpf.agent.registry import FEATURES
from lens_ebpf.core import settings
from lens_ebpf.core.settings import Section, Sections, ServerConfig
from lens_ebpf.k8s.client import KubernetesClientConfig
from lens_ebpf.protocol.stream_auth import SubscriberAuthConfig
from lens_ebpf.protocol.tls import ClientTlsConfig, ServerTlsConfig

# Names kept from the daemons lens-ebpf replaces.
ENV_ALIASES = {
    "NODE_NAME": ("node", "name"),
    "NODE_IP": ("node", "ip"),
    "APP__SERVER__HOST": ("server", "host"),
    "APP__SERVER__PORT": ("server", "port"),
}


class NodeConfig(Section):
    name: str = ""
    ip: str = ""
    cluster: str = ""  # the cluster the reporter tells the recorder; "": its home one


class PolicyConfig(Section):
    path: str = ""
    watch_interval_seconds: float = Field(2.0, gt=0)


class KernelConfig(Section):
    headers_fallback_glob: str = "/usr/src/linux-headers-*-amd64"
    link_headers: bool = True
    host_root: str = ""


class BpfConfig(Section):
    ringbuf_pages: int = Field(256, ge=1, le=65536)  # up to 256 MiB
    # how records leave the ring buffers: "mapped", a pass over the ring's own mapping
    # (x86-64; elsewhere the callback), or "callback", BCC's callback per record
    ring_reader: Literal["mapped", "callback"] = "mapped"
    max_sockets: int = Field(65536, ge=16, le=1 << 22)
    max_flow_keys: int = Field(4096, ge=16, le=1 << 20)
    flow_key_idle_seconds: float = Field(900, gt=0)
    max_rtt_keys: int = Field(256, ge=16, le=1 << 18)
    max_processes: int = Field(65536, ge=16, le=1 << 22)
    max_known_cgroups: int = Field(4096, ge=16, le=1 << 20)
    read_interval_seconds: float = Field(2.0, gt=0)
    reconcile_interval_seconds: float = Field(10.0, gt=0)
    reconcile_grace_seconds: float = Field(2.0, ge=0)
    run_stats: bool = False

    @field_validator("ringbuf_pages")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError("must be a power of two")
        return v


class EventsConfig(Section):
    queue_size: int = Field(16384, ge=1, le=10_000_000)
    flow_records: Literal["auto", "always"] = "auto"
    flow_records_linger_seconds: float = Field(60.0, ge=0, le=86400)
    # flow and process records to the bytes the streams send: "compiled" (agent/native,
    # built by scripts/setup.sh; the Python path where it is not built) or "python"
    encoder: Literal["compiled", "python"] = "compiled"


class FamilyLimits(Section):
    ttl_seconds: float | None = Field(None, gt=0)
    max_series: int | None = Field(None, ge=1)


class CacheConfig(Section):
    ttl_seconds: float = Field(600, gt=0)
    max_series: int = Field(20000, ge=1, le=10_000_000)
    max_samples: int = Field(48000, ge=0, le=100_000_000)
    families: dict[str, FamilyLimits] = Field(default_factory=dict)


class GrpcConfig(Section):
    enabled: bool = True
    listen: str = "0.0.0.0:9471"
    subscriber_queue: int = Field(10000, ge=1, le=10_000_000)
    history: int = Field(100000, ge=0, le=10_000_000)
    max_subscribers: int = Field(1000, ge=1, le=100_000)
    tls: ServerTlsConfig = Field(default_factory=ServerTlsConfig)
    auth: SubscriberAuthConfig = Field(default_factory=SubscriberAuthConfig)  # who may call


class ReporterConfig(Section):
    target: str = ""  # host:port of a collector; empty: no reporter
    buffer: int = Field(100000, ge=1, le=10_000_000)
    backoff_max_seconds: float = Field(30.0, gt=0)
    tls: ClientTlsConfig = Field(default_factory=ClientTlsConfig)
    token_file: str = ""  # the bearer token it presents, read at each connect; "": none
    kinds: list[str] = Field(default_factory=list)  # event kinds it pushes; empty: all

    @field_validator("kinds")
    @classmethod
    def _known_kinds(cls, v: list[str]) -> list[str]:
        from lens_ebpf.agent.events import KINDS

        unknown = [k for k in v if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown event kind(s) {unknown}; known: {', '.join(KINDS)}")
        return v


class ContainersConfig(Section):
    containerd_state: str = "/run/containerd"


class DevicesConfig(Section):
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    etc_root: str = "/etc"
    dev_root: str = "/dev"
    # other exporters' GPU families, written too from the same readings: amd (AMD
    # device-metrics-exporter), dcgm (dcgm-exporter). Empty: none (no duplicate series
    # where those exporters still run).
    compat: list[Literal["amd", "dcgm"]] = Field(default_factory=list)


class KubeletConfig(Section):
    enabled: bool = True
    url: str = ""  # empty: https://<node.ip or node name>:10250
    interval_seconds: float = Field(15.0, gt=0)
    timeout_seconds: float = Field(5.0, gt=0)
    ca_file: str = ""  # empty: the service account's CA (the cluster CA)
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    insecure_skip_verify: bool = False
    gpu_resources: list[str] = Field(default_factory=lambda: ["amd.com/gpu", "nvidia.com/gpu"])


class PodResourcesConfig(Section):
    enabled: bool = True
    socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    interval_seconds: float = Field(15.0, gt=0)
    timeout_seconds: float = Field(5.0, gt=0)


class KubernetesConfig(KubernetesClientConfig):
    """The agent's: the client's settings, the cluster index, the kubelet's views."""

    max_pods: int = Field(100_000, ge=1, le=10_000_000)
    max_services: int = Field(50_000, ge=1, le=10_000_000)
    owner_cache_seconds: float = Field(600.0, gt=0)
    cluster_cidrs: bool = True
    cidr_refresh_seconds: float = Field(600.0, gt=0)
    kubelet: KubeletConfig = Field(default_factory=KubeletConfig)
    pod_resources: PodResourcesConfig = Field(default_factory=PodResourcesConfig)


class Config(Section):
    node: NodeConfig = Field(default_factory=NodeConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    log_level: str = "info"
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    kernel: KernelConfig = Field(default_factory=KernelConfig)
    bpf: BpfConfig = Field(default_factory=BpfConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    # its models come with the validation (load): validated even when left out
    collectors: Sections = Field(default_factory=dict, validate_default=True)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    containers: ContainersConfig = Field(default_factory=ContainersConfig)
    grpc: GrpcConfig = Field(default_factory=GrpcConfig)
    reporter: ReporterConfig = Field(default_factory=ReporterConfig)
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        return settings.log_level(v)

    @property
    def node_name(self) -> str:
        return self.node.name or socket.gethostname()


def shipped() -> str:
    """agent/defaults.yaml: every key with its default, documented."""
    return resources.files("lens_ebpf.agent").joinpath("defaults.yaml").read_text()


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[tuple[str, ...], Any] | None = None,
) -> Config:
    """The agent's effective settings; ConfigError naming the key and the reason."""
    return settings.load(
        Config, [shipped()], path, env, overrides, sections=FEATURES.settings(), aliases=ENV_ALIASES
    )


def defaults() -> dict[str, Any]:
    """Every key with its default: the models' (every feature's too) and defaults.yaml."""
    return settings.defaults(Config, [shipped()], FEATURES.settings())


def policy_path(cfg: Config) -> Path:
    """The policy file in force: the configured one or the shipped default."""
    if cfg.policy.path:
        return Path(cfg.policy.path)
    return Path(str(resources.files("lens_ebpf.agent.net").joinpath("policy.yaml")))
