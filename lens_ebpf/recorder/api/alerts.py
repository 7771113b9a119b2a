"""The Alert pages' routes (the Primus-Lens API's alerts, alert-rule-advices and
notification-channels here; alert-silences in alert_silences.py, metric-alert-rules in
metric_rules.py, log-alert-rules and log-alert-rule-templates in log_rules.py), in the
shapes its nine pages read (docs/recorder/alerts.md), and the parameters they all read.

Their parameters as the pages send them: offset and limit (pageNum and pageSize too),
`cluster` (or cluster_name; "" and "all": every cluster; any name, for alerts name the
clusters they come from), flags as true/false, times RFC 3339. A write (POST, PUT, PATCH,
DELETE) needs the API's credentials (recorder.api; envelope.py's LensApi checks)."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.alerts import channels, correlate, overview
from lens_ebpf.recorder.alerts.model import SEVERITIES, SOURCES, STATUSES, parse_time
from lens_ebpf.recorder.alerts.service import Alerts
from lens_ebpf.recorder.api.envelope import Ask, bad, integer, param
from lens_ebpf.recorder.errors import NotFound, Unavailable

routes = RouteTable()
LIMIT_MAX = 1000
HOURS_MAX = 24 * 90
CLUSTER = Param(
    "cluster",
    doc='the cluster alerts come from (any name); "all" or none: every ' "cluster",
    also=("cluster_name",),
)
WINDOW = (  # window()'s: offset and limit, or page_num and page_size
    Param("offset", "integer", "rows skipped", default=0, minimum=0),
    Param("limit", "integer", "rows", default=20, minimum=1, maximum=LIMIT_MAX),
    Param(
        "page_num",
        "integer",
        "the page, from 1 (with page_size, for offset and limit)",
        minimum=1,
        maximum=inputs.INT_MAX // LIMIT_MAX,
    ),
    Param("page_size", "integer", "rows a page (with page_num)", minimum=1, maximum=LIMIT_MAX),
)
HOURS = Param("hours", "integer", "the last hours (0: 24)", default=24, maximum=HOURS_MAX)
ENABLED = Param("enabled", "boolean", "enabled ones (true) or not (false); none: both")
ID = Param("id", "integer", "its id")  # a rule's, a template's, a channel's


# -- parameters -----------------------------------------------------------------------------
def hub(ask: Ask) -> Alerts:
    if ask.app.alerts is None:
        raise Unavailable("alerts are not set up in this service")
    return ask.app.alerts


def window(ask: Ask, default: int = 20) -> tuple[int, int]:
    """(offset, limit): offset and limit as the pages send them, or pageNum and pageSize
    as the original reads them; limit from 1 to 1,000."""
    q = ask.query
    if param(q, "offset") is None and (param(q, "page_num") or param(q, "page_size")):
        size = integer(q, "page_size", default)
        num = integer(q, "page_num", 1)
        if not 1 <= num <= inputs.INT_MAX // LIMIT_MAX:  # (its offset within 64 bits)
            raise bad(f"pageNum={num}: from 1 to {inputs.INT_MAX // LIMIT_MAX}")
        offset, limit = (num - 1) * size, size
    else:
        offset, limit = integer(q, "offset", 0), integer(q, "limit", default)
    if offset < 0 or not 1 <= limit <= LIMIT_MAX:
        raise bad(
            f"offset={offset}, limit={limit}: offset 0 or more, limit from 1 to " f"{LIMIT_MAX}"
        )
    return offset, limit


def flag(ask: Ask, name: str) -> bool | None:
    raw = (param(ask.query, name) or "").strip().lower()
    if not raw:
        return None
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no"):
        return False
    raise bad(f"{name}={raw!r}: true or false")


def one_of(ask: Ask, name: str, allowed: tuple[str, ...]) -> str:
    raw = param(ask.query, name) or ""
    if raw and raw not in allowed:
        raise bad(f"{name}={raw!r}: one of {', '.join(allowed)}")
    return raw


def cluster(ask: Ask) -> str:
    """The cluster asked about; "" for every cluster (none asked, or "all")."""
    name = param(ask.query, "cluster") or param(ask.query, "cluster_name") or ""
    return "" if name == "all" else name


def ident(ask: Ask, name: str = "id") -> int:
    return inputs.whole(ask.arg(name), name)


def who(ask: Ask) -> str:
    """Who made a change, as its credentials say (WriteGuard.user: a proxy's user header
    only from recorder.api.forwarded_user_from's credentials)."""
    return ask.req.user or "api"


def hours(ask: Ask, default: int = 24) -> int:
    n = integer(ask.query, "hours", default) or default
    if not 1 <= n <= HOURS_MAX:
        raise bad(f"hours={n}: from 1 to {HOURS_MAX}")
    return n


# -- alerts ---------------------------------------------------------------------------------
@routes.get(
    "alerts",
    CLUSTER,
    Param("source", choices=SOURCES),
    Param("severity", choices=SEVERITIES),
    Param("status", choices=STATUSES),
    Param("alert_name", doc="a search of the name, workload, pod and node"),
    Param("workload_id", doc="a workload's uid"),
    Param("pod_name"),
    Param("node_name"),
    Param("starts_after", "date-time", "RFC 3339"),
    Param("starts_before", "date-time", "RFC 3339"),
    WINDOW,
)
def alert_list(ask: Ask) -> Any:
    """The alerts, newest first, filtered: {alerts, data (the same), total, offset,
    limit}."""
    q = ask.query
    filters: dict[str, Any] = {
        "cluster_name": cluster(ask),
        "source": one_of(ask, "source", SOURCES),
        "severity": one_of(ask, "severity", SEVERITIES),
        "status": one_of(ask, "status", STATUSES),
        **{k: param(q, k) or "" for k in ("alert_name", "workload_id", "pod_name", "node_name")},
        "starts_after": parse_time(param(q, "starts_after"), "starts_after"),
        "starts_before": parse_time(param(q, "starts_before"), "starts_before"),
    }
    offset, limit = window(ask)
    return overview.events(ask.conn, filters, offset, limit)


@routes.get("alerts/summary", CLUSTER)
def alert_summary(ask: Ask) -> Any:
    """The alerts firing by severity: {critical, high, warning, info: {count, change: of
    them begun within the hour}}."""
    return overview.summary(ask.conn, cluster(ask), ask.now())


@routes.get(
    "alerts/trend", CLUSTER, HOURS, Param("group_by", default="hour", choices=("hour", "day"))
)
def alert_trend(ask: Ask) -> Any:
    """How many alerts began each hour (or day) of the last hours, by severity."""
    by = one_of(ask, "group_by", ("hour", "day"))
    return overview.trend(ask.conn, cluster(ask), ask.now(), hours(ask), by == "day")


@routes.get(
    "alerts/top-sources",
    CLUSTER,
    HOURS,
    Param("limit", "integer", "names (0: 10)", default=10, maximum=LIMIT_MAX),
)
def alert_top_sources(ask: Ask) -> Any:
    """The alert names that fired most in the last hours: [{alert_name, count}]."""
    limit = integer(ask.query, "limit", 10) or 10
    if not 1 <= limit <= LIMIT_MAX:
        raise bad(f"limit={limit}: from 1 to {LIMIT_MAX}")
    return overview.top_sources(ask.conn, cluster(ask), ask.now(), hours(ask), limit)


@routes.get("alerts/by-cluster", HOURS)
def alert_by_cluster(ask: Ask) -> Any:
    """The alerts firing in each cluster followed: [{cluster_name, count}]."""
    known = [c["name"] for c in ask.app.clusters.listing()]
    return overview.by_cluster(ask.conn, ask.now(), hours(ask), known)


@routes.get("alerts/{id}")
def alert_detail(ask: Ask) -> Any:
    """One alert with its enriched_data (workload_info, pod_info, node_info, gpu_info)."""
    return overview.one(ask.conn, ask.arg("id"))


@routes.get("alerts/{id}/correlations")
def alert_correlations(ask: Ask) -> Any:
    """{correlations: [{correlation_id, alerts: [alert], correlation_type, correlation_score,
    reason}]}, within 30 minutes."""
    return correlate.correlations(ask.conn, ask.arg("id"))


# -- rule advices: none are made here; the page's calls answer its empty shapes ---------------
NO_ADVICE = "this service makes no rule advices"


@routes.get("alert-rule-advices", WINDOW)
def advices(ask: Ask) -> Any:
    """Rule advices: none are made here; {data: [], advices: [], total: 0, ...}."""
    offset, limit = window(ask)
    return {"data": [], "advices": [], "total": 0, "offset": offset, "limit": limit}


@routes.get("alert-rule-advices/summary")
def advices_summary(ask: Ask) -> Any:
    """Rule advices' summary: all zeros (none are made here), in the keys the page reads."""
    return {
        "pending": 0,
        "accepted": 0,
        "rejected": 0,
        "avg_confidence": 0,
        "total_count": 0,
        "pending_count": 0,
        "applied_count": 0,
        "rejected_count": 0,
        "expired_count": 0,
        "by_category": {},
        "by_severity": {},
    }


@routes.post("alert-rule-advices/refresh")
def advices_refresh(ask: Ask) -> Any:
    """{triggered: false}: this service makes no advices."""
    return {"triggered": False, "message": NO_ADVICE}


@routes.post("alert-rule-advices/{id}/status")
def advice_status(ask: Ask) -> Any:
    """404/4004: there are no advices."""
    raise NotFound(f"no advice {ask.arg('id')!r}: {NO_ADVICE}")


@routes.post("alert-rule-advices/{id}/apply")
def advice_apply(ask: Ask) -> Any:
    """404/4004: there are no advices."""
    raise NotFound(f"no advice {ask.arg('id')!r}: {NO_ADVICE}")


# -- notification channels ------------------------------------------------------------------
@routes.get(
    "notification-channels",
    Param("type", choices=tuple(channels.REQUIRED)),
    ENABLED,
    Param("search"),
    WINDOW,
)
def channel_list(ask: Ask) -> Any:
    """The notification channels (their secrets shown as <secret>), filtered: {items,
    channels (the same), total, ...}."""
    offset, limit = window(ask)
    return channels.page(
        ask.conn,
        one_of(ask, "type", tuple(channels.REQUIRED)),
        flag(ask, "enabled"),
        param(ask.query, "search") or "",
        offset,
        limit,
    )


@routes.get("notification-channels/types")
def channel_types(ask: Ask) -> Any:
    """The kinds of notification channel: [{type, name, description, config_schema}]."""
    return channels.TYPES


@routes.get("notification-channels/{id}", ID)
def channel(ask: Ask) -> Any:
    """One notification channel (its secrets shown as <secret>)."""
    return channels.json(channels.get(ask.conn, ident(ask)))


@routes.post("notification-channels")
def channel_create(ask: Ask) -> Any:
    """{name, type, enabled, description, config}: the channel."""
    return channels.create(ask.conn, ask.body(), ask.now(), who(ask))


@routes.put("notification-channels/{id}", ID)
def channel_update(ask: Ask) -> Any:
    """Only the fields given."""
    return channels.change(ask.conn, ident(ask), ask.body(), ask.now())


@routes.delete("notification-channels/{id}", ID)
def channel_delete(ask: Ask) -> Any:
    """{deleted: true}."""
    return channels.remove(ask.conn, ident(ask))


@routes.post("notification-channels/{id}/test", ID)
def channel_test(ask: Ask) -> Any:
    """A test notification through it: {success, message}."""
    return channels.test(ask.conn, ident(ask))


@routes.get("alert-rule-advices/{id}")
def advice(ask: Ask) -> Any:
    """404/4004: there are no advices."""
    raise NotFound(f"no advice {ask.arg('id')!r}: {NO_ADVICE}")
