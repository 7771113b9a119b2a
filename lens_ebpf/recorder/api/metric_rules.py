"""The Alert pages' metric rules (the Primus-Lens API's metric-alert-rules): PromQL rules
listed, made, changed, cloned, synced to the cluster as PrometheusRule objects and their
status there (recorder/alerts/rules.py), and every enabled one as one rules file for a
Prometheus without the Operator (`files`). Served as api/alerts.py's routes are, their
parameters read by its helpers."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder.alerts import rule_history
from lens_ebpf.recorder.alerts.model import row_dict
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
from lens_ebpf.recorder.api.envelope import Ask, bad, param
from lens_ebpf.recorder.store import schema as t

routes = RouteTable()
files = RouteTable()  # the rules file: text, its errors in the envelope


# -- metric rules ---------------------------------------------------------------------------
@routes.get(
    "metric-alert-rules",
    CLUSTER,
    ENABLED,
    Param("sync_status", choices=("pending", "synced", "failed")),
    Param("search", doc="a part of the name", also=("name",)),
    WINDOW,
)
def metric_rules(ask: Ask) -> Any:
    """The metric (PromQL) alert rules, filtered, one page."""
    offset, limit = window(ask)
    q = ask.query
    return hub(ask).metric_rules.page(
        ask.conn,
        cluster(ask),
        flag(ask, "enabled"),
        one_of(ask, "sync_status", ("pending", "synced", "failed")),
        param(q, "search") or param(q, "name") or "",
        offset,
        limit,
    )


@files.get("metric-alert-rules/rules-file", tool=False)  # a file for Prometheus
def metric_rules_file(ask: Ask) -> Any:
    """Every enabled rule as one Prometheus rules file (rule_files: where Prometheus runs
    without the Prometheus Operator)."""
    text = hub(ask).metric_rules.rules_text(ask.conn)
    return (
        200,
        "application/yaml",
        text.encode(),
        {"Content-Disposition": "inline; filename=lens-ebpf-rules.yaml"},
    )


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


# -- a rule's status (issue 70: served inside served sections) ---------------------------------
@routes.get("metric-alert-rules/{id}/status", ID)
def metric_rule_status(ask: Ask) -> Any:
    """{status, last_sync_time, error}: whether the rule is in the cluster as written."""
    rid = ident(ask)
    row = hub(ask).metric_rules.get(ask.conn, rid)
    return rule_history.metric_status(ask.conn, rid, hub(ask).metric_rules.object_name(row))
