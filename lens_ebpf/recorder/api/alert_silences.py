"""The Alert pages' silences (the Primus-Lens API's alert-silences): listed, the alerts
they held, made, changed, ended and removed, here and in Alertmanager
(recorder/alerts/silences.py). Served as api/alerts.py's routes are, their parameters read
by its helpers."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder.alerts import silences
from lens_ebpf.recorder.api.alerts import CLUSTER, ENABLED, WINDOW, cluster, flag, hub, who, window
from lens_ebpf.recorder.api.envelope import Ask, param

routes = RouteTable()


# -- silences -------------------------------------------------------------------------------
@routes.get(
    "alert-silences",
    CLUSTER,
    ENABLED,
    Param("silence_type", doc=", ".join(silences.TYPES)),
    Param("search"),
    WINDOW,
)
def silence_list(ask: Ask) -> Any:
    """The alert silences (a cluster's, and those of every cluster), filtered, one page."""
    offset, limit = window(ask)
    return hub(ask).silences.page(
        ask.conn,
        cluster(ask),
        flag(ask, "enabled"),
        param(ask.query, "silence_type") or "",
        param(ask.query, "search") or "",
        offset,
        limit,
    )


@routes.get(
    "alert-silences/silenced-alerts", Param("silence_id"), Param("alert_name"), CLUSTER, WINDOW
)
def silenced_alerts(ask: Ask) -> Any:
    """The alerts silences held, newest first: {data, total, offset, limit}."""
    q = ask.query
    silence, alert, name = param(q, "silence_id"), param(q, "alert_name"), cluster(ask)
    offset, limit = window(ask)
    return silences.silenced(ask.conn, silence or "", alert or "", name, offset, limit)


@routes.get("alert-silences/{id}")
def silence_detail(ask: Ask) -> Any:
    """One silence, with silenced_count."""
    return hub(ask).silences.get(ask.conn, ask.arg("id"))


@routes.post(
    "alert-silences",
    Param("name", doc="what the silence is called", required=True, body=True),
    Param(
        "silence_type",
        doc="what it matches alerts by",
        required=True,
        choices=silences.TYPES,
        body=True,
    ),
    Param("alert_names", "list", "the alert names it holds (silence_type alert_name)", body=True),
    Param(
        "label_matchers",
        "array",
        "[{name, operator (=, !=, =~, !~), value}] " "(silence_type label)",
        body=True,
    ),
    Param(
        "resource_filters",
        "array",
        "[{resource_type (cluster, node, namespace, "
        "workload, pod), operator, value}] (silence_type resource)",
        body=True,
    ),
    Param(
        "cluster_name", doc="the cluster whose alerts it holds; none: every " "cluster", body=True
    ),
    Param("starts_at", "date-time", "RFC 3339; none: now", body=True),
    Param("ends_at", "date-time", "RFC 3339; none: until it is ended", body=True),
    Param("reason", doc="why", body=True),
    Param("description", body=True),
    tool="lens_alert_silence_create",
)
def silence_create(ask: Ask) -> Any:
    """Silences alerts (by name, labels or resource) from starts_at to ends_at (none:
    until ended): {silence_id}; made in Alertmanager too. Needs the API's credentials."""
    return hub(ask).silences.create(ask.conn, ask.body(), ask.now(), who(ask))


@routes.put("alert-silences/{id}")
def silence_update(ask: Ask) -> Any:
    """The dialog's whole form (ends_at absent: permanent), or some fields."""
    return hub(ask).silences.update(ask.conn, ask.arg("id"), ask.body(), ask.now())


@routes.patch("alert-silences/{id}/disable", tool="lens_alert_silence_end")
def silence_disable(ask: Ask) -> Any:
    """Ends a silence now (the page's End now); expired in Alertmanager. Needs the API's
    credentials."""
    return hub(ask).silences.disable(ask.conn, ask.arg("id"), ask.now())


@routes.delete("alert-silences/{id}")
def silence_delete(ask: Ask) -> Any:
    """The silence removed here and expired in Alertmanager."""
    return hub(ask).silences.delete(ask.conn, ask.arg("id"), ask.now())
