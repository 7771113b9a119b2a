"""The System Config page: the recorder's settings, those that may change at run time
(RUNTIME) stored and changed here, the rest shown read-only (secrets never shown).

A change is checked as the settings file is (the setting's own type and bounds: a wrong
one is a 400 naming it, nothing stored), stored with its version, put in the audit
(system_config_history: who, when, old and new value), and applied to the live settings
at once (the parts read them as they go, or are told: hooks); every replica applies what
the database holds every few seconds (apply_stored, a job of every replica), so a change
made on one is everywhere without a restart. Deleting a key sets it back to what the
service started with (its file, environment and flags)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy import Connection, delete, select, update

from lens_ebpf.recorder.alerts.model import when
from lens_ebpf.recorder.config import Config
from lens_ebpf.recorder.errors import BadRequest, Forbidden, NotFound
from lens_ebpf.recorder.management import manifest
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import redact

log = logging.getLogger(__name__)
SC, HISTORY = t.system_config, t.system_config_history
HIDDEN = "******"
SECRET_WORDS = ("password", "token", "secret", "key", "credential", "cert", "client_ca")
INSTALLER = "installer.image"  # the Cluster page's installer image: the agent's image
REGISTRY = "container_registry"  # the System Config page's registry: the agent's image too
AGENT_IMAGE = "recorder.management.agent_image"
HISTORY_MAX = 20


@dataclass(frozen=True)
class Setting:
    key: str  # its path in the settings (recorder.training.slowdown_factor)
    category: str  # the page's: infrastructure, detection, notification, integration, general
    description: str


RUNTIME = {
    s.key: s
    for s in (
        Setting("log_level", "general", "the service's log level (debug, info, warning, error)"),
        Setting(
            "recorder.retention.days",
            "general",
            "days snapshots, the device changelog, " "training points and events are kept",
        ),
        Setting("recorder.job_history.enabled", "general", "the leader records each job run"),
        Setting("recorder.job_history.retention_days", "general", "days job runs are kept"),
        Setting(
            "recorder.training.slowdown_factor",
            "detection",
            "an iteration this many medians " "long is a training slowdown",
        ),
        Setting(
            "recorder.training.stall_factor",
            "detection",
            "no progress for this many medians: " "training stalled",
        ),
        Setting(
            "recorder.training.series_ttl_seconds",
            "detection",
            "a workload's lens_training_* " "series go this long after its last line",
        ),
        Setting(
            "recorder.timeline.regression_factor",
            "detection",
            "a signal this many times its " "baseline is a regression on the timeline",
        ),
        Setting("recorder.timeline.regression_minutes", "detection", "for at least this long"),
        Setting(
            "recorder.timeline.baseline_seconds",
            "detection",
            "the baseline: the median of " "this long before",
        ),
        Setting(
            "recorder.detection.max_attempts",
            "detection",
            "framework detection: runs with " "no evidence before a workload rests",
        ),
        Setting(
            "recorder.detection.batch",
            "detection",
            "framework detection: workloads " "detected again per run, at most",
        ),
        Setting(
            "recorder.prometheus.timeout_seconds", "integration", "Prometheus's answer, " "seconds"
        ),
        Setting(
            "recorder.reports.top_workloads",
            "general",
            "the weekly report: the most idle " "workloads listed",
        ),
        Setting(
            "recorder.reports.low_utilization_percent",
            "general",
            "the weekly report: a " "workload below this utilization counts as low",
        ),
        Setting(
            "recorder.alerts.external_url",
            "notification",
            "the web UI's address our alerts " "link to",
        ),
        Setting(
            AGENT_IMAGE,
            "infrastructure",
            "the agent image Initialize and Deploy install " '("": deploy/agent\'s)',
        ),
    )
}


def hidden(key: str) -> bool:
    last = key.rsplit(".", 1)[-1].lower()
    return any(w in last for w in SECRET_WORDS) and key != "multicluster.secret"


def flatten(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf setting as (its dotted key, its value)."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            yield from flatten(value, key + ".")
        elif (
            isinstance(value, dict)
            and value
            and all(isinstance(v, BaseModel) for v in value.values())
        ):
            for k, v in value.items():
                yield from flatten(v, f"{key}.{k}.")
        else:
            yield key, value


def shown(key: str, value: Any) -> Any:
    """A setting's value as the page may see it: secrets hidden, URLs without passwords."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, list):
        value = [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    if hidden(key):
        return HIDDEN if value not in ("", None, [], {}) else value
    if key.endswith("database_url") or key.endswith("_url"):
        return redact(str(value))
    return value


def section_of(cfg: Config, key: str) -> tuple[BaseModel, str]:
    *path, field = key.split(".")
    node: Any = cfg
    for part in path:
        node = getattr(node, part, None)
        if not isinstance(node, BaseModel):
            raise NotFound(f"no setting {key!r}")
    if field not in type(node).model_fields:
        raise NotFound(f"no setting {key!r}")
    return node, field


def checked(cfg: Config, key: str, value: Any) -> Any:
    """value as key's type and bounds take it (BadRequest naming the key and why)."""
    node, field = section_of(cfg, key)
    data = node.model_dump()
    data[field] = value
    try:
        got = type(node).model_validate(data)
    except ValidationError as exc:
        why = (
            "; ".join(e.get("msg", "") for e in exc.errors() if field in map(str, e["loc"]))
            or str(exc).splitlines()[-1]
        )
        raise BadRequest(f"{key}={value!r}: {why}") from None
    return getattr(got, field)


class Settings:
    """The live settings, what the service started with, and their stored changes."""

    def __init__(
        self,
        cfg: Config,
        hooks: dict[str, Callable[[Any], None]] | None = None,
    ) -> None:
        self.cfg = cfg
        self.base = cfg.model_copy(deep=True)  # the file's, environment's and flags' values
        self.hooks = hooks or {}
        self.applied: dict[str, Any] = {}  # key -> the stored value applied now
        self.applies = 0

    def started(self, key: str) -> Any:
        node, field = section_of(self.base, key)
        return getattr(node, field)

    def live(self, key: str) -> Any:
        node, field = section_of(self.cfg, key)
        return getattr(node, field)

    def apply(self, key: str, value: Any) -> None:
        """value (checked) into the live settings, and to the parts that hold a copy."""
        node, field = section_of(self.cfg, key)
        if getattr(node, field) != value:
            setattr(node, field, value)  # validate_assignment: checked again
            log.info("recorder: setting %s is now %r", key, shown(key, value))
        if key == "log_level":
            logging.getLogger().setLevel(str(value).upper())
        hook = self.hooks.get(key)
        if hook is not None:
            hook(value)
        self.applies += 1

    def apply_stored(self, conn: Connection) -> int:
        """What the database holds applied (a key gone back to its start value); the keys
        changed here."""
        stored = {
            r.key: r.value for r in conn.execute(select(SC.c.key, SC.c.value)) if r.key in RUNTIME
        }
        n = 0
        for key in RUNTIME:
            want = checked(self.cfg, key, stored[key]) if key in stored else self.started(key)
            changed = self.live(key) != want or self.applied.get(key) != want
            if (key in stored or key in self.applied) and changed:
                self.apply(key, want)
                n += 1
            if key in stored:
                self.applied[key] = want
            else:
                self.applied.pop(key, None)
        return n

    # -- the page ---------------------------------------------------------------------------
    def item(self, key: str, row: Any, value: Any = None, start: Any = None) -> dict[str, Any]:
        """SystemConfig: the setting's value (its own type), whether it may change here."""
        if value is None:
            value, start = self.live(key), self.started(key)
        s = RUNTIME.get(key)
        return {
            "id": int(row.id) if row is not None else 0,
            "key": key,
            "value": shown(key, value),
            "description": (
                row.description
                if row is not None and row.description
                else s.description
                if s
                else "set in the service's settings: " "changes with a restart"
            ),
            "category": (
                row.category
                if row is not None and row.category
                else s.category
                if s
                else "infrastructure"
            ),
            "is_encrypted": hidden(key),
            "version": int(row.version) if row is not None else 0,
            "is_readonly": s is None,
            "created_at": when(row.created_at) if row is not None else None,
            "updated_at": when(row.updated_at) if row is not None else None,
            "created_by": row.created_by if row is not None else "",
            "updated_by": row.updated_by if row is not None else "",
            "default_value": shown(key, start),
        }

    def listing(self, conn: Connection, category: str) -> list[dict[str, Any]]:
        rows = {r.key: r for r in conn.execute(select(SC))}
        base = dict(flatten(self.base))
        items = [self.item(k, rows.get(k)) for k in RUNTIME]
        items += [
            self.item(k, None, v, base.get(k)) for k, v in flatten(self.cfg) if k not in RUNTIME
        ]
        return [i for i in items if not category or i["category"] == category]

    def get(self, conn: Connection, key: str) -> dict[str, Any]:
        if key not in RUNTIME:
            got = next((i for i in self.listing(conn, "") if i["key"] == key), None)
            if got is None:
                raise NotFound(f"no setting {key!r}")
            return got
        return self.item(key, conn.execute(select(SC).where(SC.c.key == key)).first())

    def set(
        self, conn: Connection, key: str, body: dict[str, Any], now: datetime, who: str
    ) -> dict[str, Any]:
        """{value, description, category, change_reason}: stored, audited and applied."""
        if "value" not in body:
            raise BadRequest("value is required")
        section_of(self.cfg, key)
        if key not in RUNTIME:
            raise Forbidden(
                f"{key} changes only with a restart (the settings file, the "
                "environment or a flag); those that change here: "
                f"{', '.join(RUNTIME)}"
            )
        value = checked(self.cfg, key, body["value"])
        for name in ("description", "category", "change_reason"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise BadRequest(f"{name}: a string is required")
        row = conn.execute(select(SC).where(SC.c.key == key)).first()
        old = row.value if row is not None else self.live(key)
        if row is None:
            conn.execute(
                SC.insert(),
                {
                    "key": key,
                    "value": value,
                    "description": body.get("description") or "",
                    "category": body.get("category") or RUNTIME[key].category,
                    "version": 1,
                    "created_by": who,
                    "updated_by": who,
                    "created_at": now,
                    "updated_at": now,
                },
            )
            config_id: int = conn.execute(select(SC.c.id).where(SC.c.key == key)).scalar_one()
            version = 1
        else:
            config_id, version = row.id, int(row.version) + 1
            extra = {k: body[k] for k in ("description", "category") if body.get(k)}
            conn.execute(
                update(SC)
                .where(SC.c.key == key)
                .values(value=value, version=version, updated_by=who, updated_at=now, **extra)
            )
        conn.execute(
            HISTORY.insert(),
            {
                "config_id": config_id,
                "key": key,
                "old_value": old,
                "new_value": value,
                "version": version,
                "change_reason": body.get("change_reason") or "",
                "changed_at": now,
                "changed_by": who,
            },
        )
        self.apply(key, value)
        self.applied[key] = value
        return {
            "message": "Configuration saved",
            "key": key,
            "value": shown(key, value),
            "version": version,
        }

    def delete(self, conn: Connection, key: str, now: datetime, who: str) -> dict[str, Any]:
        """The stored change removed: back to the value the service started with."""
        section_of(self.cfg, key)
        row = conn.execute(select(SC).where(SC.c.key == key)).first()
        if row is None:
            raise NotFound(
                f"{key} is not changed here (it has the value the service started " "with)"
            )
        conn.execute(delete(SC).where(SC.c.key == key))
        back = self.started(key)
        conn.execute(
            HISTORY.insert(),
            {
                "config_id": row.id,
                "key": key,
                "old_value": row.value,
                "new_value": None,
                "version": int(row.version) + 1,
                "change_reason": "deleted: back to the start value",
                "changed_at": now,
                "changed_by": who,
            },
        )
        self.apply(key, back)
        self.applied.pop(key, None)
        return {"message": "Configuration deleted", "key": key}

    def history(self, conn: Connection, key: str) -> list[dict[str, Any]]:
        """SystemConfigHistory, newest first (the last 20 changes)."""
        section_of(self.cfg, key)
        q = (
            select(HISTORY)
            .where(HISTORY.c.key == key)
            .order_by(HISTORY.c.changed_at.desc(), HISTORY.c.id.desc())
            .limit(HISTORY_MAX)
        )
        return [
            {
                "id": int(r.id),
                "config_id": int(r.config_id),
                "key": r.key,
                "old_value": shown(key, r.old_value),
                "new_value": shown(key, r.new_value),
                "version": int(r.version),
                "change_reason": r.change_reason,
                "changed_at": when(r.changed_at),
                "changed_by": r.changed_by,
            }
            for r in conn.execute(q)
        ]

    # -- the agent's image: the installer's (Cluster page), the registry's (System Config) ----
    def agent_image(self) -> str:
        return str(self.cfg.recorder.management.agent_image or manifest.agent_image())

    def installer(self) -> dict[str, Any]:
        repo, tag = manifest.split_image(self.agent_image())
        return {"repository": repo, "tag": tag, "full_image": f"{repo}:{tag}"}

    def registry(self) -> dict[str, Any]:
        repo, tag = manifest.split_image(self.agent_image())
        head, _, name = repo.rpartition("/")
        registry, _, namespace = (
            head.partition("/")
            if "." in head.split("/")[0] or ":" in head.split("/")[0]
            else ("docker.io", "", head)
        )
        dflt_repo, dflt_tag = manifest.split_image(manifest.agent_image())
        return {
            "config": {
                "registry": registry,
                "namespace": namespace,
                "harbor_external_url": "",
                "image_versions": {name: tag},
            },
            "defaults": {"registry": "docker.io", "namespace": ""},
            "image_names": {name: name},
            "default_image": f"{dflt_repo}:{dflt_tag}",
        }

    def image_url(self, image: str, tag: str) -> dict[str, Any]:
        cfg = self.registry()["config"]
        parts = [p for p in (cfg["registry"], cfg["namespace"], image) if p]
        return {"image_name": image, "tag": tag, "image_url": f"{'/'.join(parts)}:{tag}"}
