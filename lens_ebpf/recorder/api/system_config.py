"""The System Config page's routes (system-config, registry): the recorder's settings, those
that change at run time changed here (checked, audited, applied at once), the rest shown
read-only and secrets never; the container registry the agent image comes from."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder.api.envelope import Ask, bad, param
from lens_ebpf.recorder.api.management import hub, who
from lens_ebpf.recorder.management import manifest
from lens_ebpf.recorder.management.settings import AGENT_IMAGE

routes = RouteTable()
CATEGORY = Param(
    "category", choices=("infrastructure", "detection", "notification", "integration", "general")
)


@routes.get("system-config", CATEGORY)
def configs(ask: Ask) -> Any:
    """?category: every setting as SystemConfig (its value its own type; is_readonly: only
    with a restart; is_encrypted: its value hidden)."""
    return hub(ask).settings.listing(ask.conn, param(ask.query, "category") or "")


@routes.get("system-config/{key}")
def config(ask: Ask) -> Any:
    """One setting: its value now (secrets hidden), whether it changes at run time."""
    return hub(ask).settings.get(ask.conn, ask.arg("key"))


@routes.put("system-config/{key}")
def config_set(ask: Ask) -> Any:
    """{value, description, category, change_reason}: a setting that changes at run time
    set (400 naming it when the value is not of its type; 403 for one that needs a
    restart), audited, applied without a restart."""
    return hub(ask).settings.set(ask.conn, ask.arg("key"), ask.body(), ask.now(), who(ask))


@routes.delete("system-config/{key}")
def config_delete(ask: Ask) -> Any:
    """The setting back to the value the service started with (audited)."""
    return hub(ask).settings.delete(ask.conn, ask.arg("key"), ask.now(), who(ask))


@routes.get("system-config/{key}/history")
def config_history(ask: Ask) -> Any:
    """Its last 20 changes (the audit): who, when, the old and the new value."""
    return hub(ask).settings.history(ask.conn, ask.arg("key"))


@routes.get("registry/config")
def registry(ask: Ask) -> Any:
    """{config: {registry, namespace, harbor_external_url, image_versions}, defaults,
    image_names}: where the agent image Initialize installs comes from."""
    return hub(ask).settings.registry()


def _text(b: dict[str, Any], name: str) -> str:
    v = b.get(name) or ""
    if not isinstance(v, str) or any(c in v for c in " @"):
        raise bad(f"{name}: a registry host or path is required")
    return v.strip().strip("/")


@routes.put("registry/config")
def registry_set(ask: Ask) -> Any:
    """{registry, namespace, image_versions: {lens-ebpf: tag}}: the agent image set to
    <registry>/<namespace>/lens-ebpf:<tag> (recorder.management.agent_image, audited)."""
    s, b = hub(ask).settings, ask.body()
    registry_, namespace = _text(b, "registry"), _text(b, "namespace")
    if not registry_:
        raise bad("registry is required")
    repo, tag = manifest.split_image(s.agent_image())
    name = repo.rsplit("/", 1)[-1]
    versions = b.get("image_versions") or {}
    if not isinstance(versions, dict):
        raise bad("image_versions: an object of image names and tags is required")
    tag = str(versions.get(name) or tag)
    image = "/".join(p for p in (registry_, namespace, name) if p) + f":{tag}"
    s.set(
        ask.conn,
        AGENT_IMAGE,
        {"value": image, "change_reason": "registry/config"},
        ask.now(),
        who(ask),
    )
    return {"message": "Registry configuration saved", "config": s.registry()["config"]}


@routes.post("registry/sync-from-harbor")
def registry_from_harbor(ask: Ask) -> Any:
    """{harbor_external_url}: the registry a Harbor's address names (not stored: the page
    saves it)."""
    url = str(ask.body().get("harbor_external_url") or "").strip()
    parts = urlsplit(url if "://" in url else f"https://{url}")
    if not url or not parts.hostname:
        raise bad(
            "harbor_external_url: a Harbor address (https://harbor.example.com) is " "required"
        )
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    cfg = hub(ask).settings.registry()["config"]
    return {
        "message": "Synced from Harbor",
        "config": {**cfg, "registry": host, "harbor_external_url": url},
    }


@routes.get(
    "registry/image-url",
    Param("image", doc="the image's name", default="lens-ebpf"),
    Param("tag", doc="its tag; none: the agent image's"),
)
def image_url(ask: Ask) -> Any:
    """?image, tag: the image's reference in the configured registry."""
    image = param(ask.query, "image") or "lens-ebpf"
    tag = param(ask.query, "tag") or manifest.split_image(hub(ask).settings.agent_image())[1]
    return hub(ask).settings.image_url(image, tag)
