"""The Alert pages' routes (the Primus-Lens API's alerts, alert-silences,
metric-alert-rules, log-alert-rules, log-alert-rule-templates, alert-rule-advices and
notification-channels), in the shapes its nine pages read (docs/recorder/alerts.md).

Their parameters as the pages send them: offset and limit (pageNum and pageSize too),
`cluster` (or cluster_name; "" and "all": every cluster; any name, for alerts name the
clusters they come from), flags as true/false, times RFC 3339. A write (POST, PUT, PATCH,
DELETE) needs the API's credentials (recorder.api; envelope.py's LensApi checks)."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.alerting import Alerts
from lens_ebpf.recorder.alerts import (
    channels,
    correlate,
    logrules,
    logstore,
    logtemplates,
    overview,
    silences,
)
from lens_ebpf.recorder.alerts import rule_history as rule_history
from lens_ebpf.recorder.alerts.model import SEVERITIES, SOURCES, STATUSES, parse_time, row_dict
from lens_ebpf.recorder.api.envelope import Ask, bad, integer, param
from lens_ebpf.recorder.errors import NotFound, Unavailable
from lens_ebpf.recorder.store import schema as t

routes = RouteTable()
files = RouteTable()  # the rules file: text, its errors in the envelope
LIMIT_MAX = 1000
HOURS_MAX = 24 * 90
CLUSTER = Param("cluster", doc='the cluster alerts come from (any name); "all" or none: every '
                "cluster", also=("cluster_name",))  # fmt: skip
WINDOW = (  # window()'s: offset and limit, or page_num and page_size
    Param("offset", "integer", "rows skipped", default=0, minimum=0),
    Param("limit", "integer", "rows", default=20, minimum=1, maximum=LIMIT_MAX),
    Param("page_num", "integer", "the page, from 1 (with page_size, for offset and limit)",
          minimum=1, maximum=inputs.INT_MAX // LIMIT_MAX),
    Param("page_size", "integer", "rows a page (with page_num)", minimum=1, maximum=LIMIT_MAX),
)  # fmt: skip
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
        raise bad(f"offset={offset}, limit={limit}: offset 0 or more, limit from 1 to "
                  f"{LIMIT_MAX}")  # fmt: skip
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
@routes.get("alerts", CLUSTER, Param("source", choices=SOURCES),
            Param("severity", choices=SEVERITIES), Param("status", choices=STATUSES),
            Param("alert_name", doc="a search of the name, workload, pod and node"),
            Param("workload_id", doc="a workload's uid"), Param("pod_name"), Param("node_name"),
            Param("starts_after", "date-time", "RFC 3339"),
            Param("starts_before", "date-time", "RFC 3339"), WINDOW)  # fmt: skip
def alert_list(ask: Ask) -> Any:
    """The alerts, newest first, filtered: {alerts, data (the same), total, offset,
    limit}."""
    q = ask.query
    filters: dict[str, Any] = {
        "cluster_name": cluster(ask), "source": one_of(ask, "source", SOURCES),
        "severity": one_of(ask, "severity", SEVERITIES),
        "status": one_of(ask, "status", STATUSES),
        **{k: param(q, k) or "" for k in ("alert_name", "workload_id", "pod_name",
                                          "node_name")},
        "starts_after": parse_time(param(q, "starts_after"), "starts_after"),
        "starts_before": parse_time(param(q, "starts_before"), "starts_before"),
    }  # fmt: skip
    offset, limit = window(ask)
    return overview.events(ask.conn, filters, offset, limit)


@routes.get("alerts/summary", CLUSTER)
def alert_summary(ask: Ask) -> Any:
    """The alerts firing by severity: {critical, high, warning, info: {count, change: of
    them begun within the hour}}."""
    return overview.summary(ask.conn, cluster(ask), ask.now())


@routes.get("alerts/trend", CLUSTER, HOURS,
            Param("group_by", default="hour", choices=("hour", "day")))  # fmt: skip
def alert_trend(ask: Ask) -> Any:
    """How many alerts began each hour (or day) of the last hours, by severity."""
    by = one_of(ask, "group_by", ("hour", "day"))
    return overview.trend(ask.conn, cluster(ask), ask.now(), hours(ask), by == "day")


@routes.get("alerts/top-sources", CLUSTER, HOURS,
            Param("limit", "integer", "names (0: 10)", default=10, maximum=LIMIT_MAX))  # fmt: skip
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


# -- silences -------------------------------------------------------------------------------
@routes.get("alert-silences", CLUSTER, ENABLED,
            Param("silence_type", doc=", ".join(silences.TYPES)), Param("search"),
            WINDOW)  # fmt: skip
def silence_list(ask: Ask) -> Any:
    """The alert silences (a cluster's, and those of every cluster), filtered, one page."""
    offset, limit = window(ask)
    return hub(ask).silences.page(ask.conn, cluster(ask), flag(ask, "enabled"),
                                  param(ask.query, "silence_type") or "",
                                  param(ask.query, "search") or "", offset, limit)  # fmt: skip


@routes.get("alert-silences/silenced-alerts", Param("silence_id"), Param("alert_name"),
            CLUSTER, WINDOW)  # fmt: skip
def silenced_alerts(ask: Ask) -> Any:
    """The alerts silences held, newest first: {data, total, offset, limit}."""
    from sqlalchemy import func, select

    sa, q = t.silenced_alerts, ask.query
    cond = [sa.c[k] == v for k, v in (("silence_id", param(q, "silence_id")),
                                      ("alert_name", param(q, "alert_name")),
                                      ("cluster_name", cluster(ask))) if v]  # fmt: skip
    offset, limit = window(ask)
    total = int(ask.conn.execute(select(func.count()).select_from(sa).where(*cond)).scalar_one())
    rows = ask.conn.execute(select(sa).where(*cond).order_by(sa.c.silenced_at.desc(), sa.c.id)
                            .offset(offset).limit(limit))  # fmt: skip
    return {"data": [row_dict(sa, r) for r in rows], "total": total, "offset": offset,
            "limit": limit}  # fmt: skip


@routes.get("alert-silences/{id}")
def silence_detail(ask: Ask) -> Any:
    """One silence, with silenced_count."""
    return hub(ask).silences.get(ask.conn, ask.arg("id"))


@routes.post("alert-silences",
             Param("name", doc="what the silence is called", required=True, body=True),
             Param("silence_type", doc="what it matches alerts by", required=True,
                   choices=silences.TYPES, body=True),
             Param("alert_names", "list", "the alert names it holds (silence_type alert_name)",
                   body=True),
             Param("label_matchers", "array", "[{name, operator (=, !=, =~, !~), value}] "
                   "(silence_type label)", body=True),
             Param("resource_filters", "array", "[{resource_type (cluster, node, namespace, "
                   "workload, pod), operator, value}] (silence_type resource)", body=True),
             Param("cluster_name", doc="the cluster whose alerts it holds; none: every "
                   "cluster", body=True),
             Param("starts_at", "date-time", "RFC 3339; none: now", body=True),
             Param("ends_at", "date-time", "RFC 3339; none: until it is ended", body=True),
             Param("reason", doc="why", body=True),
             Param("description", body=True),
             tool="lens_alert_silence_create")  # fmt: skip
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


# -- metric rules ---------------------------------------------------------------------------
@routes.get("metric-alert-rules", CLUSTER, ENABLED,
            Param("sync_status", choices=("pending", "synced", "failed")),
            Param("search", doc="a part of the name", also=("name",)), WINDOW)  # fmt: skip
def metric_rules(ask: Ask) -> Any:
    """The metric (PromQL) alert rules, filtered, one page."""
    offset, limit = window(ask)
    q = ask.query
    return hub(ask).metric_rules.page(
        ask.conn, cluster(ask), flag(ask, "enabled"),
        one_of(ask, "sync_status", ("pending", "synced", "failed")),
        param(q, "search") or param(q, "name") or "", offset, limit)  # fmt: skip


@files.get("metric-alert-rules/rules-file", tool=False)  # a file for Prometheus
def metric_rules_file(ask: Ask) -> Any:
    """Every enabled rule as one Prometheus rules file (rule_files: where Prometheus runs
    without the Prometheus Operator)."""
    text = hub(ask).metric_rules.rules_text(ask.conn)
    return 200, "application/yaml", text.encode(), {
        "Content-Disposition": "inline; filename=lens-ebpf-rules.yaml"}  # fmt: skip


@routes.get("metric-alert-rules/{id}", ID)
def metric_rule(ask: Ask) -> Any:
    """One metric alert rule: its groups of PromQL rules, labels, sync status."""
    return row_dict(t.metric_alert_rules, hub(ask).metric_rules.get(ask.conn, ident(ask)))


@routes.post("metric-alert-rules")
def metric_rule_create(ask: Ask) -> Any:
    """{name, cluster_name, groups: [{name, interval, rules: [{alert, expr, for, labels,
    annotations}]}], labels, description, enabled, auto_sync}: {rule_id}."""
    b = ask.body()
    got = hub(ask).metric_rules.create(ask.conn, b, ask.now(), who(ask))
    if b.get("auto_sync"):
        got["sync"] = hub(ask).metric_rules.sync(ask.conn, [got["rule_id"]], "", ask.now())
    return got


@routes.put("metric-alert-rules/{id}", ID)
def metric_rule_update(ask: Ask) -> Any:
    """Only the fields given; sync_status back to pending. A shipped rule is 403/4003: clone
    it."""
    return hub(ask).metric_rules.update(ask.conn, ident(ask), ask.body(), ask.now())


@routes.delete("metric-alert-rules/{id}", ID)
def metric_rule_delete(ask: Ask) -> Any:
    """The rule removed, and its PrometheusRule; a shipped one is 403/4003."""
    return hub(ask).metric_rules.delete(ask.conn, ident(ask))


@routes.post("metric-alert-rules/{id}/clone", ID)
def metric_rule_clone(ask: Ask) -> Any:
    """{target_cluster_name, new_name}: a copy (`<name>-copy` when unnamed)."""
    return hub(ask).metric_rules.clone(ask.conn, ident(ask), ask.body(), ask.now(), who(ask))


@routes.post("metric-alert-rules/sync", CLUSTER)
def metric_rules_sync(ask: Ask) -> Any:
    """{rule_ids} or {cluster} (or ?cluster_name=); none: every rule. The pages read
    {synced, failed}."""
    b = ask.body()
    ids = b.get("rule_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise bad(f"rule_ids={ids!r}: a list of whole numbers")
    where = str(b.get("cluster_name") or b.get("cluster") or cluster(ask))
    return hub(ask).metric_rules.sync(ask.conn, ids, "" if where == "all" else where, ask.now())


# -- log rules ------------------------------------------------------------------------------
@routes.get("log-alert-rules", CLUSTER, ENABLED, Param("match_type", choices=logrules.MATCH_TYPES),
            Param("severity", choices=SEVERITIES),
            Param("search", doc="a part of the name", also=("keyword", "name")),
            WINDOW)  # fmt: skip
def log_rules(ask: Ask) -> Any:
    """The log alert rules (a cluster's, and those of every cluster), filtered, one
    page."""
    q = ask.query
    offset, limit = window(ask)
    filters = {
        "cluster": cluster(ask),
        "enabled": flag(ask, "enabled"),
        "match_type": one_of(ask, "match_type", logrules.MATCH_TYPES),
        "severity": one_of(ask, "severity", SEVERITIES),
        "search": param(q, "search") or param(q, "keyword") or param(q, "name"),
    }
    return logstore.page(ask.conn, filters, offset, limit)


@routes.get("log-alert-rules/{id}", ID)
def log_rule(ask: Ask) -> Any:
    """One log alert rule: what it matches in which pods' logs, and the alert it makes."""
    return logstore.one(ask.conn, ident(ask))


def _changed(ask: Ask, got: Any) -> Any:
    hub(ask).log_rules.invalidate()
    if isinstance(got, dict) and isinstance(got.get("rule_id"), int):  # made or changed
        rule_history.record(ask.conn, got["rule_id"], ask.now(), who(ask))
    return got


@routes.post("log-alert-rules", CLUSTER)
def log_rule_create(ask: Ask) -> Any:
    """The rule's fields; its cluster cluster_name (else ?cluster=; "": every cluster)."""
    b = ask.body()
    b.setdefault("cluster_name", cluster(ask))
    rid = logrules.create_rule(ask.conn, b, ask.now(), who(ask))
    return _changed(ask, {"rule_id": rid, "cluster_name": b["cluster_name"] or ""})


@routes.put("log-alert-rules/{id}", ID)
def log_rule_update(ask: Ask) -> Any:
    """Only the fields given ({enabled} alone toggles it)."""
    return _changed(ask, logstore.change(ask.conn, ident(ask), ask.body(), ask.now()))


@routes.delete("log-alert-rules/{id}", ID)
def log_rule_delete(ask: Ask) -> Any:
    """The rule removed."""
    return _changed(ask, logstore.remove(ask.conn, ident(ask)))


@routes.post("log-alert-rules/{id}/clone", ID)
def log_rule_clone(ask: Ask) -> Any:
    """{new_name or name, target_cluster_name, enabled}: a copy (`<name>_copy` when unnamed)."""
    return _changed(ask, logstore.clone(ask.conn, ident(ask), ask.body(), ask.now(), who(ask)))


@routes.post("log-alert-rules/batch-update")
def log_rules_batch(ask: Ask) -> Any:
    """{rule_ids, enabled} or {rule_ids, updates: {enabled}}: {updated}."""
    return _changed(ask, logstore.batch_enable(ask.conn, ask.body(), ask.now()))


@routes.post("log-alert-rules/test")
def log_rule_test(ask: Ask) -> Any:
    """{pattern, sample_log, flags}: {matched, captures}; writes nothing."""
    return logrules.test_pattern(ask.body())


# -- log rule templates ---------------------------------------------------------------------
@routes.get("log-alert-rule-templates", Param("category"),
            Param("built_in", "boolean", "shipped ones (true) or one's own (false)"))  # fmt: skip
def templates(ask: Ask) -> Any:
    """The log alert rule templates, an array (the page groups it by category)."""
    return logstore.templates(ask.conn, param(ask.query, "category") or "",
                              flag(ask, "built_in"))  # fmt: skip


@routes.get("log-alert-rule-templates/{id}", ID)
def template(ask: Ask) -> Any:
    """One log alert rule template, flattened as the list's."""
    return logstore.template_json(logstore.template(ask.conn, ident(ask)))


@routes.post("log-alert-rule-templates")
def template_create(ask: Ask) -> Any:
    """{name, category, description, template_config (a rule's fields), tags}: {template_id}."""
    return logstore.create_template(ask.conn, ask.body(), ask.now(), who(ask))


@routes.post("log-alert-rule-templates/{id}/instantiate", ID)
def template_instantiate(ask: Ask) -> Any:
    """{name, cluster_name, overrides}: a rule made of the template."""
    return _changed(ask, logtemplates.instantiate(ask.conn, ident(ask), ask.body(), ask.now(),
                                                  who(ask)))  # fmt: skip


@routes.delete("log-alert-rule-templates/{id}", ID)
def template_delete(ask: Ask) -> Any:
    """A template of one's own; a shipped one is 403/4003."""
    return logstore.remove_template(ask.conn, ident(ask))


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
    return {"pending": 0, "accepted": 0, "rejected": 0, "avg_confidence": 0, "total_count": 0,
            "pending_count": 0, "applied_count": 0, "rejected_count": 0, "expired_count": 0,
            "by_category": {}, "by_severity": {}}  # fmt: skip


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
@routes.get("notification-channels", Param("type", choices=tuple(channels.REQUIRED)), ENABLED,
            Param("search"), WINDOW)  # fmt: skip
def channel_list(ask: Ask) -> Any:
    """The notification channels (their secrets shown as <secret>), filtered: {items,
    channels (the same), total, ...}."""
    offset, limit = window(ask)
    return channels.page(ask.conn, one_of(ask, "type", tuple(channels.REQUIRED)),
                         flag(ask, "enabled"), param(ask.query, "search") or "", offset,
                         limit)  # fmt: skip


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


# -- the rules' status, versions and statistics (issue 70: served inside served sections) ------
@routes.get("metric-alert-rules/{id}/status", ID)
def metric_rule_status(ask: Ask) -> Any:
    """{status, last_sync_time, error}: whether the rule is in the cluster as written."""
    rid = ident(ask)
    row = hub(ask).metric_rules.get(ask.conn, rid)
    return rule_history.metric_status(ask.conn, rid, hub(ask).metric_rules.object_name(row))


@routes.get("log-alert-rules/multi-cluster", WINDOW, ENABLED,
            Param("severity", choices=SEVERITIES), Param("name", doc="a part of the name"),
            Param("search", doc="a part of the name or description"))  # fmt: skip
def log_rules_multi_cluster(ask: Ask) -> Any:
    """?name, enabled, severity, pageNum, pageSize: {clusters: [{cluster_name, rules,
    total}]}, each followed cluster's rules (its own and those of every cluster)."""
    offset, limit = window(ask)
    filters = {"enabled": flag(ask, "enabled"), "severity": one_of(ask, "severity", SEVERITIES),
               "search": param(ask.query, "name") or param(ask.query, "search")}  # fmt: skip
    return rule_history.multi_cluster(ask.conn, ask.app.clusters.names(), filters, offset, limit)


@routes.get("log-alert-rules/{id}/statistics", ID,
            Param("date_from", doc="YYYY-MM-DD; none: 7 days ago"),
            Param("date_to", doc="YYYY-MM-DD; none: today"))  # fmt: skip
def log_rule_statistics(ask: Ask) -> Any:
    """?date_from, date_to (YYYY-MM-DD; the last 7 days): {summary, statistics}, the alerts
    it raised per day, hour and cluster."""
    q = ask.query
    return rule_history.statistics(ask.conn, ident(ask), param(q, "date_from") or "",
                                   param(q, "date_to") or "", ask.now())  # fmt: skip


@routes.get("log-alert-rules/{id}/versions", ID)
def log_rule_versions(ask: Ask) -> Any:
    """{versions, total}: the rule's fields after each change, newest first."""
    return rule_history.versions(ask.conn, ident(ask))


@routes.post("log-alert-rules/{id}/rollback/{version}", ID,
             Param("version", "integer", "the version to restore"))  # fmt: skip
def log_rule_rollback(ask: Ask) -> Any:
    """An older version's fields applied again (a new version of its own)."""
    got = rule_history.rollback(ask.conn, ident(ask), ident(ask, "version"), ask.now(),
                                who(ask))  # fmt: skip
    hub(ask).log_rules.invalidate()
    return got


@routes.get("alert-rule-advices/{id}")
def advice(ask: Ask) -> Any:
    """404/4004: there are no advices."""
    raise NotFound(f"no advice {ask.arg('id')!r}: {NO_ADVICE}")
