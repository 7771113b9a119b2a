"""Alerts (docs/recorder/alerts.md): events, silences, rules and their versions,
templates, notification channels and what was sent."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from lens_ebpf.recorder.store.schema.meta import NAME, UID, metadata

# -- alerts (docs/recorder/alerts.md): Alertmanager's and our own, kept with their history
# and what they concern; silences; metric and log rules and the log rules' templates;
# notification channels and what was sent through them. Service tables: each row names
# its cluster (cluster_name; "" = every cluster, where a rule or silence applies to all)
alert_events = Table(
    "alert_events",
    metadata,
    Column("id", String(64), primary_key=True),  # Alertmanager's fingerprint, or ours
    Column("source", String(20), nullable=False),  # metric, log, lens, webhook
    Column("alert_name", String(NAME), nullable=False),
    Column("severity", String(20), nullable=False),  # critical, high, warning, info
    Column("status", String(20), nullable=False),  # firing, resolved, silenced
    Column("starts_at", DateTime(timezone=True), nullable=False),
    Column("ends_at", DateTime(timezone=True), nullable=True),
    Column("labels", JSON, nullable=False),
    Column("annotations", JSON, nullable=False),
    Column("workload_id", String(UID), nullable=False, default=""),  # the top workload's uid
    Column("workload_name", String(NAME), nullable=False, default=""),
    Column("pod_name", String(NAME), nullable=False, default=""),
    Column("pod_id", String(UID), nullable=False, default=""),
    Column("node_name", String(NAME), nullable=False, default=""),
    Column("cluster_name", String(NAME), nullable=False, default=""),
    Column("raw_data", JSON, nullable=False),
    Column("enriched_data", JSON, nullable=False),
    Column("route_key", String(NAME), nullable=False, default=""),  # the log rule's group
    Column("notified_at", DateTime(timezone=True), nullable=True),
    Column("notification_status", String(20), nullable=False, default=""),  # sent, failed
    Column("fired", Integer, nullable=False, default=1),  # times it fired (again after resolved)
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
Index("ix_alert_events_starts", alert_events.c.starts_at)
Index("ix_alert_events_workload", alert_events.c.workload_id, alert_events.c.starts_at)
Index("ix_alert_events_node", alert_events.c.node_name, alert_events.c.starts_at)
Index("ix_alert_events_status", alert_events.c.status, alert_events.c.severity)

alert_silences = Table(
    "alert_silences",
    metadata,
    Column("id", String(64), primary_key=True),  # a UUID
    Column("name", String(NAME), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("cluster_name", String(NAME), nullable=False, default=""),  # "": every cluster
    Column("enabled", Boolean, nullable=False, default=True),
    Column("silence_type", String(32), nullable=False),  # resource, label, alert_name
    Column("resource_filters", JSON, nullable=False),  # [{resource_type, operator, value}]
    Column("label_matchers", JSON, nullable=False),  # [{name, operator, value}]
    Column("alert_names", JSON, nullable=False),  # [name]
    Column("match_expression", Text, nullable=False, default=""),
    Column("starts_at", DateTime(timezone=True), nullable=False),
    Column("ends_at", DateTime(timezone=True), nullable=True),  # None: permanent
    Column("reason", Text, nullable=False, default=""),
    Column("ticket_url", String(500), nullable=False, default=""),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("alertmanager_id", String(64), nullable=False, default=""),  # its silence there
    Column("alertmanager_error", Text, nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
silenced_alerts = Table(
    "silenced_alerts",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("silence_id", String(64), nullable=False, index=True),
    Column("alert_id", String(64), nullable=False, index=True),
    Column("alert_name", String(NAME), nullable=False),
    Column("cluster_name", String(NAME), nullable=False, default=""),
    Column("silenced_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("silence_id", "alert_id", name="uq_silenced_alerts"),
)

metric_alert_rules = Table(
    "metric_alert_rules",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("name", String(NAME), nullable=False),
    Column("cluster_name", String(NAME), nullable=False),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("groups", JSON, nullable=False),  # Prometheus rule groups: [{name, interval, rules}]
    Column("description", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False),
    # built_in: a group deploy/prometheus-operator/prometheusrule.yaml ships (read only)
    Column("built_in", Boolean, nullable=False, default=False),
    Column("sync_status", String(20), nullable=False, default="pending"),  # synced, failed
    Column("sync_message", Text, nullable=False, default=""),
    Column("last_sync_at", DateTime(timezone=True), nullable=True),
    Column("alert_routing", JSON, nullable=True),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("name", "cluster_name", name="uq_metric_alert_rules_name"),
)

log_alert_rules = Table(
    "log_alert_rules",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("name", String(NAME), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("cluster_name", String(NAME), nullable=False),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("priority", Integer, nullable=False, default=50),
    Column("label_selectors", JSON, nullable=False),  # [{key, operator, value}]
    Column("match_type", String(32), nullable=False),  # pattern, threshold
    Column("match_config", JSON, nullable=False),
    Column("severity", String(20), nullable=False, default="warning"),
    Column("alert_template", JSON, nullable=False),  # {summary, description, labels}
    Column("group_by", JSON, nullable=False),  # what one alert is per: workload, pod, node
    Column("group_wait", Integer, nullable=False, default=30),  # seconds
    Column("repeat_interval", Integer, nullable=False, default=3600),  # seconds
    Column("template_id", BigInteger, nullable=True),  # the shipped template it came from
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("last_triggered_at", DateTime(timezone=True), nullable=True),
    Column("trigger_count", BigInteger, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("name", "cluster_name", name="uq_log_alert_rules_name"),
)
log_alert_rule_templates = Table(
    "log_alert_rule_templates",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("name", String(NAME), nullable=False, unique=True),
    Column("category", String(50), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("template_config", JSON, nullable=False),  # a log rule's fields
    Column("tags", JSON, nullable=False),
    Column("is_builtin", Boolean, nullable=False, default=False),
    Column("usage_count", BigInteger, nullable=False, default=0),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

notification_channels = Table(
    "notification_channels",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("name", String(NAME), nullable=False, unique=True),
    Column("type", String(50), nullable=False),  # webhook, alertmanager (ours send); others kept
    Column("enabled", Boolean, nullable=False, default=True),
    Column("config", JSON, nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
alert_notifications = Table(
    "alert_notifications",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("alert_id", String(64), nullable=False, index=True),
    Column("channel", String(NAME), nullable=False),  # "alertmanager", or a channel's name
    Column("status", String(20), nullable=False),  # firing or resolved
    Column("sent_at", DateTime(timezone=True), nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("error_message", Text, nullable=False, default=""),
)

# a log rule as it was before each change (its versions; a rollback restores one)
log_alert_rule_versions = Table(
    "log_alert_rule_versions",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("rule_id", BigInteger, nullable=False),
    Column("version", Integer, nullable=False),
    Column("config", JSON, nullable=False),
    Column("status", String(16), nullable=False, default="active"),  # active, superseded
    Column("deployed_at", DateTime(timezone=True), nullable=True),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("rule_id", "version", name="uq_log_alert_rule_versions"),
)
