"""Notification channels: where alerts are sent besides Alertmanager. This service sends
through webhook channels (each alert once per state: jobs.py) and alertmanager
channels (their test); the other types the pages offer (email, DingTalk, Slack, WeChat)
are kept and listed, and their test says this service does not send through them: the
user's Alertmanager routes and receivers do.

Credentials in a config (passwords, secrets, tokens, header values, a URL's userinfo and
query, a robot's webhook URL) are `<secret>` in every read (secrets.py), and an update
that sends `<secret>` back keeps the stored value."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

from sqlalchemy import Connection, delete, func, or_, select, update

from lens_ebpf.recorder.alerts import secrets
from lens_ebpf.recorder.alerts.model import need_name, new_id, row_dict
from lens_ebpf.recorder.alerts.notify import Alertmanager, SendError, webhook
from lens_ebpf.recorder.errors import BadRequest, Conflict, NotFound
from lens_ebpf.recorder.store import schema as t

TYPES = [
    {
        "type": "webhook",
        "name": "Webhook",
        "description": "Send notifications to a webhook URL",
        "config_schema": {
            "url": "string",
            "method": "string",
            "headers": "object",
            "timeout": "number",
        },
    },
    {
        "type": "alertmanager",
        "name": "AlertManager",
        "description": "Forward alerts to AlertManager",
        "config_schema": {"url": "string", "timeout": "number", "api_path": "string"},
    },
    {
        "type": "email",
        "name": "Email",
        "description": "Send notifications via email using SMTP",
        "config_schema": {
            "smtp_host": "string",
            "smtp_port": "number",
            "username": "string",
            "password": "string",
            "from": "string",
            "from_name": "string",
            "use_starttls": "boolean",
            "skip_verify": "boolean",
        },
    },
    {
        "type": "dingtalk",
        "name": "DingTalk",
        "description": "Send notifications to DingTalk robot",
        "config_schema": {"webhook_url": "string", "secret": "string"},
    },
    {
        "type": "wechat",
        "name": "WeChat Work",
        "description": "Send notifications via WeChat Work",
        "config_schema": {
            "corp_id": "string",
            "agent_id": "number",
            "secret": "string",
            "to_user": "string",
            "to_party": "string",
            "to_tag": "string",
        },
    },
    {
        "type": "slack",
        "name": "Slack",
        "description": "Send notifications to Slack channel",
        "config_schema": {"webhook_url": "string", "channel": "string", "username": "string"},
    },
]
REQUIRED = {
    "webhook": ("url",),
    "alertmanager": ("url",),
    "email": ("smtp_host", "smtp_port", "from"),
    "dingtalk": ("webhook_url",),
    "slack": ("webhook_url",),
    "wechat": ("corp_id", "agent_id", "secret"),
}
SENT_HERE = ("webhook", "alertmanager")


def _config(kind: str, config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise BadRequest("config: an object is required")
    for key in REQUIRED[kind]:
        if config.get(key) in (None, ""):
            raise BadRequest(f"config.{key} is required for a {kind} channel")
    for key in ("url", "webhook_url"):  # the page draws a URL's host: it must parse
        if key in config:
            u = urlparse(str(config[key]))
            if u.scheme not in ("http", "https") or not u.netloc:
                raise BadRequest(f"config.{key}={config[key]!r}: an http(s) URL is required")
    return dict(config)


def _fields(body: dict[str, Any], old: Any | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if old is None or "name" in body:
        out["name"] = need_name(body)
    kind = str(body.get("type") or (old.type if old is not None else ""))
    if kind not in REQUIRED:
        raise BadRequest(f"type={kind!r}: one of {', '.join(REQUIRED)}")
    if old is None or "type" in body:
        out["type"] = kind
    if old is None or "config" in body or "type" in body:
        out["config"] = _config(kind, body.get("config", old.config if old is not None else None))
    if old is None or "description" in body:
        out["description"] = str(body.get("description") or "")
    if old is None or "enabled" in body:
        out["enabled"] = bool(body.get("enabled", True))
    return out


def page(
    conn: Connection, kind: str, enabled: bool | None, search: str, offset: int, limit: int
) -> dict[str, Any]:
    ch = t.notification_channels
    cond: list[Any] = []
    if kind:
        cond.append(ch.c.type == kind)
    if enabled is not None:
        cond.append(ch.c.enabled.is_(enabled))
    if search:
        like = f"%{search.lower()}%"
        cond.append(or_(func.lower(ch.c.name).like(like), func.lower(ch.c.description).like(like)))
    total = int(conn.execute(select(func.count()).select_from(ch).where(*cond)).scalar_one())
    rows = [
        json(r)
        for r in conn.execute(
            select(ch)
            .where(*cond)
            .order_by(ch.c.created_at.desc(), ch.c.id)
            .offset(offset)
            .limit(limit)
        )
    ]
    return {"items": rows, "channels": rows, "total": total, "offset": offset, "limit": limit}


def json(row: Any) -> dict[str, Any]:
    """A channel as every read shows it: its credentials `<secret>`."""
    out = row_dict(t.notification_channels, row)
    out["config"] = secrets.shown(out.get("config") or {})
    return out


def get(conn: Connection, cid: int) -> Any:
    ch = t.notification_channels
    row = conn.execute(select(ch).where(ch.c.id == cid)).first()
    if row is None:
        raise NotFound(f"no notification channel {cid}")
    return row


def _free(conn: Connection, name: str, other: int = 0) -> None:
    ch = t.notification_channels
    if conn.execute(select(ch.c.id).where(ch.c.name == name, ch.c.id != other)).first():
        raise Conflict(f"a notification channel {name!r} exists")


def create(conn: Connection, body: dict[str, Any], now: datetime, who: str) -> dict[str, Any]:
    if "config" in body:  # (<secret> stands for a stored value: a new channel has none)
        body = {**body, "config": secrets.kept(body["config"], {})}
    fields = _fields(body, None)
    _free(conn, fields["name"])
    ch = t.notification_channels
    cid = new_id(
        conn.execute(ch.insert().values(**fields, created_by=who, created_at=now, updated_at=now))
    )
    return json(get(conn, cid))


def change(conn: Connection, cid: int, body: dict[str, Any], now: datetime) -> dict[str, Any]:
    old = get(conn, cid)
    if "config" in body:  # what was shown as <secret> and comes back: the stored value
        body = {**body, "config": secrets.kept(body["config"], old.config)}
    fields = _fields(body, old)
    if "name" in fields:
        _free(conn, fields["name"], cid)
    ch = t.notification_channels
    conn.execute(update(ch).where(ch.c.id == cid).values(**fields, updated_at=now))
    return json(get(conn, cid))


def remove(conn: Connection, cid: int) -> dict[str, Any]:
    get(conn, cid)
    conn.execute(delete(t.notification_channels).where(t.notification_channels.c.id == cid))
    return {"deleted": True}


def test(conn: Connection, cid: int) -> dict[str, Any]:
    """A test notification through the channel: {success, message}."""
    row = get(conn, cid)
    cfg = row.config or {}
    now = datetime.now(UTC)
    if row.type not in SENT_HERE:
        return {
            "success": False,
            "message": f"this service does not send {row.type} "
            "notifications: route alerts to it in Alertmanager",
        }
    try:
        if row.type == "webhook":
            webhook(
                str(cfg["url"]),
                {
                    "alert_name": "LensTestNotification",
                    "status": "firing",
                    "severity": "info",
                    "test": True,
                    "starts_at": now.isoformat(),
                },
                str(cfg.get("method") or "POST"),
                {str(k): str(v) for k, v in (cfg.get("headers") or {}).items()},
                float(cfg.get("timeout") or 10),
            )
        else:
            Alertmanager(str(cfg["url"]), float(cfg.get("timeout") or 10)).post_alerts(
                [
                    {
                        "labels": {"alertname": "LensTestNotification", "severity": "info"},
                        "annotations": {"summary": f"a test notification from channel {row.name}"},
                        "starts_at": now,
                        "ends_at": None,
                    }
                ]
            )
    except SendError as exc:
        return {"success": False, "message": str(exc)}
    return {"success": True, "message": "Test notification sent successfully"}
