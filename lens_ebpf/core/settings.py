"""Settings for either service: shipped defaults, a YAML file, the environment, flags (in
that order), validated by the service's pydantic model into one line per problem.

The models a service registers for a section of its own (the agent's features, each
`collectors.<key>`) are given to load() as input: this module imports no service.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

ENV_PREFIX = "LENS_"
ENV_SEPARATOR = "__"
ENV_NOT_KEYS = {"LENS_CONFIG"}
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)

# The kubelet's service-link variables (a Service named lens-ebpf-recorder gives every pod
# of its namespace LENS_EBPF_RECORDER_SERVICE_HOST, ..._PORT=tcp://..., ...), each name's
# ending with the form of the value it carries.
_LINK_NAME = re.compile(
    r"[A-Z0-9_]+?_(?:(?P<host>SERVICE_HOST)|(?P<sport>SERVICE_PORT(?:_[A-Z0-9_]+)?)"
    r"|(?P<url>PORT(?:_\d+_(?:TCP|UDP|SCTP))?)|PORT_\d+_(?:TCP|UDP|SCTP)_(?:(?P<proto>PROTO)"
    r"|(?P<port>PORT)|(?P<addr>ADDR)))"
)
_LINK_URL = re.compile(r"(?:tcp|udp|sctp)://\[?[0-9A-Fa-f:.]+\]?:\d{1,5}")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def service_link(name: str, value: str) -> bool:
    """Whether NAME=value is one of the kubelet's service-link variables: the name of that
    form (never with our separator, "__") and the value of that form, so that a mistyped
    setting of ours is still refused."""
    m = _LINK_NAME.fullmatch(name)
    if m is None or ENV_SEPARATOR in name:
        return False
    if m["host"] or m["addr"]:
        return _is_ip(value)
    if m["sport"] or m["port"]:
        return value.isdigit()
    if m["proto"]:
        return value in ("TCP", "UDP", "SCTP", "tcp", "udp", "sctp")
    return _LINK_URL.fullmatch(value) is not None


class ConfigError(Exception):
    """A configuration problem, worded for one line of output."""


def split_listen(value: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT, [V6]:PORT or :PORT (no host: every address)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("expected HOST:PORT with a port from 0 to 65535")
    return host.strip("[]") or "0.0.0.0", int(port)


def log_level(v: str) -> str:
    """A log_level setting's value, checked."""
    if v.lower() not in {"debug", "info", "warning", "error"}:
        raise ValueError("must be one of debug, info, warning, error")
    return v.lower()


class Section(BaseModel):
    """A settings section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerConfig(Section):
    """An HTTP front (core/http.py)."""

    host: str = "0.0.0.0"
    port: int = Field(9470, ge=0, le=65535)
    max_connections: int = Field(10000, ge=1, le=100_000)
    request_timeout_seconds: float = Field(10.0, gt=0, le=3600)
    max_header_bytes: int = Field(65536, ge=1024, le=16 << 20)
    listen_backlog: int = Field(4096, ge=1, le=65535)  # capped by net.core.somaxconn
    body_timeout_seconds: float = Field(30.0, gt=0, le=3600)  # a write's body, whole
    max_writes_in_hand: int = Field(64, ge=1, le=10000)  # writes read or handled at once
    max_body_bytes_in_hand: int = Field(64 << 20, ge=1 << 20, le=1 << 36)  # their bodies


class Sections(BaseModel):
    """Named sections whose models come with the validation (load(sections=...)), so a
    new feature brings its own keys: `collectors.<key>` in the agent."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _sections(cls, data: Any, info: ValidationInfo) -> dict[str, BaseModel]:
        models: Mapping[str, type[BaseModel]] = (info.context or {}).get("sections", {})
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ValueError("must be a mapping of section names")
        unknown = sorted(set(data) - set(models))
        if unknown:
            raise PydanticCustomError(
                "nested", "{where}: {msg}", {"where": unknown[0], "msg": "unknown key"}
            )
        out: dict[str, BaseModel] = {}
        for key, model in models.items():
            value = data.get(key)
            if isinstance(value, model):
                out[key] = value
                continue
            try:
                out[key] = model.model_validate(value if value is not None else {})
            except ValidationError as exc:
                where, msg = describe(exc).split(": ", 1)
                ctx = {"where": f"{key}.{where}", "msg": msg}
                raise PydanticCustomError("nested", "{where}: {msg}", ctx) from None
        return out

    def section(self, key: str) -> BaseModel:
        # _sections made every extra value a model (validated, or given as one)
        sections: dict[str, BaseModel] = self.__pydantic_extra__ or {}
        got = sections.get(key)
        if got is None:
            raise KeyError(f"no section {key}")
        return got


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
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


def _field_type(model: Any, path: tuple[str, ...], sections: Mapping[str, type[BaseModel]]) -> Any:
    """The annotation of the setting at path (None when there is no such setting)."""
    for i, part in enumerate(path):
        if model is Sections:
            model = sections.get(part)
            if model is None or i == len(path) - 1:
                return model
            continue
        info = getattr(model, "model_fields", {}).get(part)
        if info is None:
            return None
        model = info.annotation
    return model


class _Loader:
    def __init__(
        self,
        model: type[BaseModel],
        sections: Mapping[str, type[BaseModel]],
        aliases: Mapping[str, tuple[str, ...]],
    ) -> None:
        self.model, self.sections, self.aliases = model, sections, aliases

    def env_value(self, raw: str, path: tuple[str, ...]) -> Any:
        """A value from the environment, read as its setting's type: a string setting
        takes the text as it is (NODE_NAME=on, LENS_KUBERNETES__MODE=off); others are
        YAML (numbers, booleans, lists)."""
        if _field_type(self.model, path, self.sections) is str or not raw.strip():
            return raw
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError:
            return raw

    def apply_env(self, tree: dict[str, Any], env: Mapping[str, str]) -> None:
        for name, path in self.aliases.items():
            if name in env:
                _set_path(tree, path, self.env_value(env[name], path), f"environment {name}")
        for name, raw in sorted(env.items()):
            if not name.startswith(ENV_PREFIX) or name in ENV_NOT_KEYS:
                continue
            key = tuple(p.lower() for p in name[len(ENV_PREFIX) :].split(ENV_SEPARATOR))
            if key[0] not in tree and service_link(name, raw):
                log.debug("environment %s: a Service's link variable, not a setting", name)
                continue
            _set_path(tree, key, self.env_value(raw, key), f"environment {name}")


def describe(err: ValidationError) -> str:
    """A validation error as `where: what (got value)`, the first of them."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    if first["type"] == "nested":  # a registered section: its own key and message
        ctx = first.get("ctx") or {}
        return f"{where}.{ctx['where']}: {ctx['msg']}{more}"
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    value = first.get("input")
    # a section's own check (a model validator) names what it needs: not the whole section
    plain = first["type"] != "extra_forbidden" and not isinstance(value, dict)
    shown = f" (got {value!r})" if plain else ""
    return f"{where}: {msg}{shown}{more}"


def defaults(
    model: type[M], shipped: Sequence[str], sections: Mapping[str, type[BaseModel]] | None = None
) -> dict[str, Any]:
    """Every key with its default: the model's (each registered section's too), with the
    shipped defaults files (YAML texts that document them) on top."""
    tree = model.model_validate({}, context={"sections": sections or {}}).model_dump()
    for text in shipped:
        tree = merge(tree, yaml.safe_load(text) or {})
    return tree


def load(
    model: type[M],
    shipped: Sequence[str],
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[tuple[str, ...], Any] | None = None,
    *,
    sections: Mapping[str, type[BaseModel]] | None = None,
    aliases: Mapping[str, tuple[str, ...]] | None = None,
) -> M:
    """Build the effective settings; raise ConfigError naming the key and the reason."""
    sections = sections or {}
    context = {"sections": sections}
    loader = _Loader(model, sections, aliases or {})
    env = os.environ if env is None else env
    tree = defaults(model, shipped, sections)
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
            model.model_validate(merge(tree, loaded or {}), context=context)
        except ValidationError as exc:
            raise ConfigError(f"config file {path}: {describe(exc)}") from exc
        tree = merge(tree, loaded or {})
    loader.apply_env(tree, env)
    for key, value in (overrides or {}).items():
        _set_path(tree, key, value, "flag")
    try:
        return model.model_validate(tree, context=context)
    except ValidationError as exc:
        raise ConfigError(f"config: {describe(exc)}") from exc


def _yaml_where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"line {mark.line + 1} column {mark.column + 1}: {problem}"
    return str(problem)
