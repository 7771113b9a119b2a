"""Agent configuration: shipped defaults, a YAML file, environment, flags (in that order)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

ENV_PREFIX = "LENS_"
ENV_SEPARATOR = "__"
# Names kept from the daemons lens-ebpf replaces.
ENV_ALIASES = {
    "NODE_NAME": ("node", "name"),
    "NODE_IP": ("node", "ip"),
    "APP__SERVER__HOST": ("server", "host"),
    "APP__SERVER__PORT": ("server", "port"),
}
ENV_NOT_KEYS = {"LENS_CONFIG"}


class ConfigError(Exception):
    """A configuration problem, worded for one line of output."""


def split_listen(value: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT, [V6]:PORT or :PORT (no host: every address)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected HOST:PORT with a port from 0 to 65535")
    return host.strip("[]") or "0.0.0.0", int(port)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class NodeConfig(_Section):
    name: str = ""
    ip: str = ""


class ServerConfig(_Section):
    host: str = "0.0.0.0"
    port: int = Field(9470, ge=0, le=65535)
    max_connections: int = Field(10000, ge=1, le=100_000)
    request_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    max_header_bytes: int = Field(65536, ge=1024, le=16 << 20)


class PolicyConfig(_Section):
    path: str = ""
    watch_interval_seconds: float = Field(2.0, gt=0)


class KernelConfig(_Section):
    headers_fallback_glob: str = "/usr/src/linux-headers-*-amd64"
    link_headers: bool = True
    host_root: str = ""


class BpfConfig(_Section):
    ringbuf_pages: int = Field(256, ge=1, le=65536)  # up to 256 MiB
    max_sockets: int = Field(65536, ge=16, le=1 << 22)
    max_flow_keys: int = Field(4096, ge=16, le=1 << 20)
    flow_key_idle_seconds: float = Field(900, gt=0)
    max_rtt_keys: int = Field(128, ge=16, le=1 << 18)
    max_processes: int = Field(65536, ge=16, le=1 << 22)
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


class EventsConfig(_Section):
    queue_size: int = Field(16384, ge=1, le=10_000_000)
    flow_records: Literal["auto", "always"] = "auto"
    flow_records_linger_seconds: float = Field(60.0, ge=0, le=86400)


class FamilyLimits(_Section):
    ttl_seconds: float | None = Field(None, gt=0)
    max_series: int | None = Field(None, ge=1)


class CacheConfig(_Section):
    ttl_seconds: float = Field(600, gt=0)
    max_series: int = Field(20000, ge=1, le=10_000_000)
    max_samples: int = Field(40000, ge=0, le=100_000_000)
    families: dict[str, FamilyLimits] = Field(default_factory=dict)


class CollectorsConfig(BaseModel):
    """collectors.<key>: one section per feature setting, each with the model its feature
    registered (lens_ebpf/feature.py), so a new feature brings its own keys."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _sections(cls, data: Any) -> dict[str, BaseModel]:
        from lens_ebpf.feature import collector_settings

        models = collector_settings()
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ValueError("must be a mapping of collector names")
        unknown = sorted(set(data) - set(models))
        if unknown:
            raise PydanticCustomError("nested", "{where}: {msg}",
                                      {"where": unknown[0], "msg": "unknown key"})  # fmt: skip
        out: dict[str, BaseModel] = {}
        for key, model in models.items():
            value = data.get(key)
            if isinstance(value, model):
                out[key] = value
                continue
            try:
                out[key] = model.model_validate(value if value is not None else {})
            except ValidationError as exc:
                where, msg = _describe(exc).split(": ", 1)
                ctx = {"where": f"{key}.{where}", "msg": msg}
                raise PydanticCustomError("nested", "{where}: {msg}", ctx) from None
        return out

    def section(self, key: str) -> BaseModel:
        got = (self.__pydantic_extra__ or {}).get(key)
        if got is None:
            raise KeyError(f"no collectors.{key}")
        return got


class ServerTlsConfig(_Section):
    cert: str = ""
    key: str = ""
    client_ca: str = ""  # set: clients must present a certificate it signed (mTLS)


class GrpcConfig(_Section):
    enabled: bool = True
    listen: str = "0.0.0.0:9471"
    subscriber_queue: int = Field(10000, ge=1, le=10_000_000)
    history: int = Field(100000, ge=0, le=10_000_000)
    max_subscribers: int = Field(1000, ge=1, le=100_000)
    tls: ServerTlsConfig = Field(default_factory=ServerTlsConfig)


class ClientTlsConfig(_Section):
    ca: str = ""
    cert: str = ""
    key: str = ""


class ReporterConfig(_Section):
    target: str = ""  # host:port of a collector; empty: no reporter
    buffer: int = Field(100000, ge=1, le=10_000_000)
    backoff_max_seconds: float = Field(30.0, gt=0)
    tls: ClientTlsConfig = Field(default_factory=ClientTlsConfig)


class ContainersConfig(_Section):
    containerd_state: str = "/run/containerd"


class DevicesConfig(_Section):
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    etc_root: str = "/etc"
    dev_root: str = "/dev"


class KubeletConfig(_Section):
    enabled: bool = True
    url: str = ""  # empty: https://<node.ip or node name>:10250
    interval_seconds: float = Field(15.0, gt=0)
    timeout_seconds: float = Field(5.0, gt=0)
    ca_file: str = ""  # empty: the service account's CA (the cluster CA)
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    insecure_skip_verify: bool = False
    gpu_resources: list[str] = Field(default_factory=lambda: ["amd.com/gpu", "nvidia.com/gpu"])


class PodResourcesConfig(_Section):
    enabled: bool = True
    socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    interval_seconds: float = Field(15.0, gt=0)
    timeout_seconds: float = Field(5.0, gt=0)


class KubernetesConfig(_Section):
    mode: str = "auto"
    kubeconfig: str = ""
    request_timeout_seconds: float = Field(10.0, gt=0)
    watch_timeout_seconds: float = Field(300.0, ge=1)
    backoff_max_seconds: float = Field(30.0, gt=0)
    max_pods: int = Field(100_000, ge=1, le=10_000_000)
    max_services: int = Field(50_000, ge=1, le=10_000_000)
    owner_cache_seconds: float = Field(600.0, gt=0)
    cluster_cidrs: bool = True
    cidr_refresh_seconds: float = Field(600.0, gt=0)
    kubelet: KubeletConfig = Field(default_factory=KubeletConfig)
    pod_resources: PodResourcesConfig = Field(default_factory=PodResourcesConfig)

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        return "off" if v is False else v  # YAML 1.1 reads a bare off as false

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str) -> str:
        if v not in ("auto", "in-cluster", "kubeconfig", "off"):
            raise ValueError("must be one of auto, in-cluster, kubeconfig, off")
        return v


class KubeletServiceConfig(_Section):
    enabled: bool = False
    namespace: str = "kube-system"
    name: str = "kubelet"
    interval_seconds: float = Field(30.0, gt=0)
    ports: dict[str, int] = Field(
        default_factory=lambda: {"https-metrics": 10250, "http-metrics": 10255, "cadvisor": 4194}
    )


class RecorderConfig(_Section):
    database_url: str = "sqlite:///lens-recorder.db"
    listen: str = "0.0.0.0:9480"  # REST (/workloads, /pods) and /metrics
    collect_listen: str = "0.0.0.0:9472"  # reporters' collector protocol; empty: off
    gpu_resources: list[str] = Field(default_factory=lambda: ["amd.com/gpu", "nvidia.com/gpu"])
    finalizers: bool = True
    queue_max: int = Field(100_000, ge=1, le=10_000_000)
    db_retry_max_seconds: float = Field(10.0, gt=0)
    page_max: int = Field(1000, ge=1, le=100_000)
    kubelet_service: KubeletServiceConfig = Field(default_factory=KubeletServiceConfig)

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        split_listen(v)
        return v


class Config(_Section):
    node: NodeConfig = Field(default_factory=NodeConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    log_level: str = "info"
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    kernel: KernelConfig = Field(default_factory=KernelConfig)
    bpf: BpfConfig = Field(default_factory=BpfConfig)
    events: EventsConfig = Field(default_factory=EventsConfig)
    cache: CacheConfig = Field(default_factory=CacheConfig)
    collectors: CollectorsConfig = Field(default_factory=CollectorsConfig)
    devices: DevicesConfig = Field(default_factory=DevicesConfig)
    containers: ContainersConfig = Field(default_factory=ContainersConfig)
    grpc: GrpcConfig = Field(default_factory=GrpcConfig)
    reporter: ReporterConfig = Field(default_factory=ReporterConfig)
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    recorder: RecorderConfig = Field(default_factory=RecorderConfig)

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        if v.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return v.lower()

    @property
    def node_name(self) -> str:
        return self.node.name or socket.gethostname()


def _defaults() -> dict[str, Any]:
    """Every key with its default: the models' (every registered feature's too), with the
    shipped defaults.yaml on top (it documents them; a test keeps the two equal)."""
    text = resources.files("lens_ebpf").joinpath("defaults.yaml").read_text()
    return _merge(Config().model_dump(), yaml.safe_load(text))


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any, origin: str) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: unknown key {'.'.join(path)}")
        node = child
    if path[-1] not in node:
        raise ConfigError(f"{origin}: unknown key {'.'.join(path)}")
    node[path[-1]] = value


def _field_type(path: tuple[str, ...]) -> Any:
    """The annotation of the setting at path (None when there is no such setting)."""
    from lens_ebpf.feature import collector_settings

    model: Any = Config
    for i, part in enumerate(path):
        if model is CollectorsConfig:
            model = collector_settings().get(part)
            if model is None or i == len(path) - 1:
                return model
            continue
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return None
        model = info.annotation
    return model


def _env_value(raw: str, path: tuple[str, ...]) -> Any:
    """A value from the environment, read as its setting's type: a string setting takes
    the text as it is (NODE_NAME=on, LENS_KUBERNETES__MODE=off); others are YAML
    (numbers, booleans, lists)."""
    if _field_type(path) is str or not raw.strip():
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _apply_env(tree: dict[str, Any], env: Mapping[str, str]) -> None:
    for name, path in ENV_ALIASES.items():
        if name in env:
            _set_path(tree, path, _env_value(env[name], path), f"environment {name}")
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or name in ENV_NOT_KEYS:
            continue
        key = tuple(p.lower() for p in name[len(ENV_PREFIX) :].split(ENV_SEPARATOR))
        _set_path(tree, key, _env_value(raw, key), f"environment {name}")


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "nested":  # a feature's section: its own key and message
        ctx = first.get("ctx") or {}
        more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
        return f"{where}.{ctx['where']}: {ctx['msg']}{more}"
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    value = first.get("input")
    shown = "" if first["type"] == "extra_forbidden" else f" (got {value!r})"
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{where}: {msg}{shown}{more}"


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[tuple[str, ...], Any] | None = None,
) -> Config:
    """Build the effective config; raise ConfigError naming the key and the reason."""
    env = os.environ if env is None else env
    tree = _defaults()
    path = path or env.get("LENS_CONFIG") or None
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML: {_yaml_where(exc)}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: top level must be a mapping")
        try:
            Config.model_validate(_merge(tree, loaded or {}))
        except ValidationError as exc:
            raise ConfigError(f"config file {path}: {_describe(exc)}") from exc
        tree = _merge(tree, loaded or {})
    _apply_env(tree, env)
    for key, value in (overrides or {}).items():
        _set_path(tree, key, value, "flag")
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(f"config: {_describe(exc)}") from exc


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"line {mark.line + 1} column {mark.column + 1}: {problem}"
    return str(problem)


def policy_path(cfg: Config) -> Path:
    """The policy file in force: the configured one or the shipped default."""
    if cfg.policy.path:
        return Path(cfg.policy.path)
    return Path(str(resources.files("policies").joinpath("policy.yaml")))
