"""The Alert pages' log rules and their templates (the Primus-Lens API's log-alert-rules
and log-alert-rule-templates): listed, made, changed, cloned, tested on a sample line,
across clusters, their statistics, versions and rollbacks (recorder/alerts/logstore.py,
logrules.py, logtemplates.py, rule_history.py); each change makes the engine read the
rules again. Served as api/alerts.py's routes are, their parameters read by its helpers."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder.alerts import logrules, logstore, logtemplates
from lens_ebpf.recorder.alerts import rule_history as rule_history
from lens_ebpf.recorder.alerts.model import SEVERITIES
from lens_ebpf.recorder.api.alerts import (
    CLUSTER,
    ENABLED,
    ID,
    WINDOW,
    cluster,
    flag,
    hub,
    ident,
    one_of,
    who,
    window,
)
from lens_ebpf.recorder.api.envelope import Ask, param

routes = RouteTable()


# -- log rules ------------------------------------------------------------------------------
@routes.get(
    "log-alert-rules",
    CLUSTER,
    ENABLED,
    Param("match_type", choices=logrules.MATCH_TYPES),
    Param("severity", choices=SEVERITIES),
    Param("search", doc="a part of the name", also=("keyword", "name")),
    WINDOW,
)
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
@routes.get(
    "log-alert-rule-templates",
    Param("category"),
    Param("built_in", "boolean", "shipped ones (true) or one's own (false)"),
)
def templates(ask: Ask) -> Any:
    """The log alert rule templates, an array (the page groups it by category)."""
    return logstore.templates(ask.conn, param(ask.query, "category") or "", flag(ask, "built_in"))


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
    return _changed(
        ask, logtemplates.instantiate(ask.conn, ident(ask), ask.body(), ask.now(), who(ask))
    )


@routes.delete("log-alert-rule-templates/{id}", ID)
def template_delete(ask: Ask) -> Any:
    """A template of one's own; a shipped one is 403/4003."""
    return logstore.remove_template(ask.conn, ident(ask))


# -- across clusters, statistics, versions (issue 70: served inside served sections) -----------
@routes.get(
    "log-alert-rules/multi-cluster",
    WINDOW,
    ENABLED,
    Param("severity", choices=SEVERITIES),
    Param("name", doc="a part of the name"),
    Param("search", doc="a part of the name or description"),
)
def log_rules_multi_cluster(ask: Ask) -> Any:
    """?name, enabled, severity, pageNum, pageSize: {clusters: [{cluster_name, rules,
    total}]}, each followed cluster's rules (its own and those of every cluster)."""
    offset, limit = window(ask)
    filters = {
        "enabled": flag(ask, "enabled"),
        "severity": one_of(ask, "severity", SEVERITIES),
        "search": param(ask.query, "name") or param(ask.query, "search"),
    }
    return rule_history.multi_cluster(ask.conn, ask.app.clusters.names(), filters, offset, limit)


@routes.get(
    "log-alert-rules/{id}/statistics",
    ID,
    Param("date_from", doc="YYYY-MM-DD; none: 7 days ago"),
    Param("date_to", doc="YYYY-MM-DD; none: today"),
)
def log_rule_statistics(ask: Ask) -> Any:
    """?date_from, date_to (YYYY-MM-DD; the last 7 days): {summary, statistics}, the alerts
    it raised per day, hour and cluster."""
    q = ask.query
    return rule_history.statistics(
        ask.conn, ident(ask), param(q, "date_from") or "", param(q, "date_to") or "", ask.now()
    )


@routes.get("log-alert-rules/{id}/versions", ID)
def log_rule_versions(ask: Ask) -> Any:
    """{versions, total}: the rule's fields after each change, newest first."""
    return rule_history.versions(ask.conn, ident(ask))


@routes.post(
    "log-alert-rules/{id}/rollback/{version}",
    ID,
    Param("version", "integer", "the version to restore"),
)
def log_rule_rollback(ask: Ask) -> Any:
    """An older version's fields applied again (a new version of its own)."""
    got = rule_history.rollback(ask.conn, ident(ask), ident(ask, "version"), ask.now(), who(ask))
    hub(ask).log_rules.invalidate()
    return got
