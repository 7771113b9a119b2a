"""The system tuner: keeps kernel settings at least where the cluster needs them.

Off by default (an observability agent changes a node only when asked:
`collectors.tuner.enabled: true` or `lens-ebpf run --tuner`). Every interval it reads
each desired sysctl under /proc/sys and raises it when it is lower; a value an
operator set higher is left alone, and nothing is ever lowered. `open_files` is the
open-file limit: it keeps fs.nr_open (the most one process may be allowed) and
fs.file-max (the whole system) at least that high. A running container's own
RLIMIT_NOFILE cannot be raised from outside; docs/agent/tuner.md says how to set it.

Sysctls that belong to a namespace (net.*, the IPC ones, ...) are refused: written
from the agent's namespaces they would not change what the workloads see.
"""

from __future__ import annotations

import errno
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from pydantic import Field, field_validator

from lens_ebpf.agent.events import EventBus, NodeTuned
from lens_ebpf.agent.feature import CollectorFeature, Settings, register
from lens_ebpf.core.collector import PeriodicCollector
from lens_ebpf.core.exposition import counter, gauge

log = logging.getLogger(__name__)

# sysctls a network, IPC or UTS namespace (or the user namespace) owns
NAMESPACED = re.compile(
    r"^(net\.|user\.|fs\.mqueue\.|kernel\.(shm|msg|sem\b|hostname$|domainname$))"
)
NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_-]+)+$")


class TunerSettings(Settings):
    enabled: bool = False
    interval_seconds: float = Field(30.0, gt=0, le=86400)
    sysctls: dict[str, int] = Field(default_factory=lambda: {"vm.max_map_count": 262144})
    open_files: int = Field(131072, ge=0, le=1 << 30)  # 0: leave the limits alone

    @field_validator("sysctls")
    @classmethod
    def _names(cls, v: dict[str, int]) -> dict[str, int]:
        for name, value in v.items():
            if not NAME.match(name):
                raise ValueError(f"{name!r} is not a sysctl name (dotted, like vm.max_map_count)")
            if NAMESPACED.match(name):
                raise ValueError(
                    f"{name} belongs to a namespace: setting it from the agent "
                    "would not change what the workloads see"
                )
            if value < 0:
                raise ValueError(f"{name}: the tuner only raises to non-negative values")
        return v


def desired_settings(s: TunerSettings) -> dict[str, int]:
    """Every sysctl the settings ask for, the open-file limit as its two sysctls."""
    out = dict(s.sysctls)
    if s.open_files:
        for name in ("fs.nr_open", "fs.file-max"):
            out[name] = max(out.get(name, 0), s.open_files)
    return out


class SettingError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def sysctl_path(root: Path, name: str) -> Path:
    return root / name.replace(".", "/")


def read_setting(root: Path, name: str) -> int:
    path = sysctl_path(root, name)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise SettingError("unknown", f"{name}: no such sysctl ({path})") from None
    except OSError as exc:
        raise SettingError("read_failed", f"{name}: cannot read {path}: {exc.strerror}") from None
    if not re.fullmatch(r"-?\d+", text):
        raise SettingError("not_a_number", f"{name}: holds {text[:40]!r}, not one integer")
    return int(text)


def write_setting(root: Path, name: str, value: int) -> None:
    path = sysctl_path(root, name)
    try:
        path.write_text(f"{value}\n")
    except OSError as exc:
        reason = (
            "read_only"
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
            else ("write_failed")
        )
        raise SettingError(
            reason, f"{name}: cannot write {value} to {path}: " f"{exc.strerror or exc}"
        ) from None


class Tuner(PeriodicCollector):
    """Reads each setting, raises the low ones, says what it did."""

    name = "tuner"

    def __init__(
        self,
        interval: float,
        root: Path,
        desired: dict[str, int],
        publish: Callable[[NodeTuned], object] = lambda _ev: None,
    ) -> None:
        super().__init__(interval)
        self.root = root
        self.desired = desired
        self.publish = publish
        self.current: dict[str, int] = {}
        self.changes: dict[str, int] = dict.fromkeys(desired, 0)
        self.failures: dict[tuple[str, str], int] = {}
        self.last: dict[str, str] = {}  # setting -> its last error, for check and /readyz

    def tune_once(self) -> None:
        for name, want in self.desired.items():
            try:
                now = self.current[name] = read_setting(self.root, name)
                if now < want:
                    write_setting(self.root, name, want)
                    got = read_setting(self.root, name)
                    if got < want:
                        raise SettingError("not_applied", f"{name}: wrote {want}, reads {got}")
                    self.changes[name] += 1
                    log.info("tuner: %s raised from %d to %d", name, now, got)
                    self.publish(NodeTuned(setting=name, old_value=now, new_value=got))
                    now = got
                self.current[name] = now
                self.last.pop(name, None)
            except SettingError as exc:
                key = (name, exc.reason)
                self.failures[key] = self.failures.get(key, 0) + 1
                if self.last.get(name) != str(exc):
                    log.warning("tuner: %s", exc)
                self.last[name] = str(exc)

    def refresh(self) -> list[Metric]:
        self.tune_once()
        desired = gauge(
            "lens_tuner_setting_desired", "The value the tuner keeps a " "setting at, at least"
        )
        current = gauge("lens_tuner_setting_current", "The setting's value as last " "read")
        changes = counter("lens_tuner_changes", "Times the tuner raised the setting")
        errors = counter(
            "lens_tuner_errors", "Settings the tuner could not read or raise, by reason"
        )
        for name, want in self.desired.items():
            desired.add({"setting": name}, want)
            if name in self.current:
                current.add({"setting": name}, self.current[name])
            changes.add({"setting": name}, self.changes[name])
        for (name, reason), n in sorted(self.failures.items()):
            errors.add({"setting": name, "reason": reason}, n)
        self.views["tuner"] = self.report()
        return [desired, current, changes, errors]

    def report(self) -> list[dict[str, Any]]:
        return [
            {
                "setting": name,
                "desired": want,
                "current": self.current.get(name),
                "changes": self.changes[name],
                "error": self.last.get(name, ""),
            }
            for name, want in self.desired.items()
        ]


def check_rows(root: Path, desired: dict[str, int]) -> Iterator[dict[str, Any]]:
    """Each setting as `lens-ebpf check` shows it: read only, nothing changed."""
    for name, want in desired.items():
        try:
            now: int | None = read_setting(root, name)
            note = "ok" if now is not None and now >= want else "would raise"
        except SettingError as exc:
            now, note = None, str(exc)
        yield {"setting": name, "desired": want, "current": now, "action": note}


@register("tuner", order=40, settings={"tuner": TunerSettings})
class TunerFeature(CollectorFeature):
    """Kernel settings kept at least at their desired values; off unless asked for."""

    VIEWS = {"/tuner": ("tuner", [])}

    def make(self) -> Tuner:
        s = self.ctx.settings("tuner", TunerSettings)
        bus: EventBus = self.ctx.bus
        return Tuner(
            s.interval_seconds,
            Path(self.ctx.devices.procfs_root) / "sys",
            desired_settings(s),
            bus.publish,
        )
