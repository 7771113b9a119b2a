"""Alerts: Alertmanager's and our own with their history (alert_events), silences and
the alerts they silenced, metric and log rules, the log rules' templates, notification
channels and what was sent through them.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    _events_and_silences()
    _rules()
    _notifications()


def _events_and_silences() -> None:
    """Alert events, silences and the alerts they silenced."""
    op.create_table(
        "alert_events",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("source", sa.String(20), nullable=False),
        sa.Column("alert_name", sa.String(253), nullable=False),
        sa.Column("severity", sa.String(20), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("ends_at", TS, nullable=True),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("annotations", sa.JSON, nullable=False),
        sa.Column("workload_id", sa.String(64), nullable=False),
        sa.Column("workload_name", sa.String(253), nullable=False),
        sa.Column("pod_name", sa.String(253), nullable=False),
        sa.Column("pod_id", sa.String(64), nullable=False),
        sa.Column("node_name", sa.String(253), nullable=False),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("raw_data", sa.JSON, nullable=False),
        sa.Column("enriched_data", sa.JSON, nullable=False),
        sa.Column("route_key", sa.String(253), nullable=False),
        sa.Column("notified_at", TS, nullable=True),
        sa.Column("notification_status", sa.String(20), nullable=False),
        sa.Column("fired", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_alert_events_node", "alert_events", ["node_name", "starts_at"])
    op.create_index("ix_alert_events_starts", "alert_events", ["starts_at"])
    op.create_index("ix_alert_events_status", "alert_events", ["status", "severity"])
    op.create_index("ix_alert_events_workload", "alert_events", ["workload_id", "starts_at"])
    op.create_table(
        "alert_silences",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("silence_type", sa.String(32), nullable=False),
        sa.Column("resource_filters", sa.JSON, nullable=False),
        sa.Column("label_matchers", sa.JSON, nullable=False),
        sa.Column("alert_names", sa.JSON, nullable=False),
        sa.Column("match_expression", sa.Text, nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("ends_at", TS, nullable=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("ticket_url", sa.String(500), nullable=False),
        sa.Column("created_by", sa.String(253), nullable=False),
        sa.Column("alertmanager_id", sa.String(64), nullable=False),
        sa.Column("alertmanager_error", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "silenced_alerts",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("silence_id", sa.String(64), nullable=False),
        sa.Column("alert_id", sa.String(64), nullable=False),
        sa.Column("alert_name", sa.String(253), nullable=False),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("silenced_at", TS, nullable=False),
        sa.UniqueConstraint("silence_id", "alert_id", name="uq_silenced_alerts"),
    )
    op.create_index("ix_silenced_alerts_alert_id", "silenced_alerts", ["alert_id"])
    op.create_index("ix_silenced_alerts_silence_id", "silenced_alerts", ["silence_id"])


def _rules() -> None:
    """Metric and log rules, the log rules' templates."""
    op.create_table(
        "metric_alert_rules",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("groups", sa.JSON, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("built_in", sa.Boolean, nullable=False),
        sa.Column("sync_status", sa.String(20), nullable=False),
        sa.Column("sync_message", sa.Text, nullable=False),
        sa.Column("last_sync_at", TS, nullable=True),
        sa.Column("alert_routing", sa.JSON, nullable=True),
        sa.Column("created_by", sa.String(253), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("name", "cluster_name", name="uq_metric_alert_rules_name"),
    )
    op.create_table(
        "log_alert_rules",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False),
        sa.Column("label_selectors", sa.JSON, nullable=False),
        sa.Column("match_type", sa.String(32), nullable=False),
        sa.Column("match_config", sa.JSON, nullable=False),
        sa.Column("severity", sa.String(20), nullable=False),
        sa.Column("alert_template", sa.JSON, nullable=False),
        sa.Column("group_by", sa.JSON, nullable=False),
        sa.Column("group_wait", sa.Integer, nullable=False),
        sa.Column("repeat_interval", sa.Integer, nullable=False),
        sa.Column("template_id", sa.BigInteger, nullable=True),
        sa.Column("created_by", sa.String(253), nullable=False),
        sa.Column("last_triggered_at", TS, nullable=True),
        sa.Column("trigger_count", sa.BigInteger, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("name", "cluster_name", name="uq_log_alert_rules_name"),
    )
    op.create_table(
        "log_alert_rule_templates",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(253), nullable=False, unique=True),
        sa.Column("category", sa.String(50), nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("template_config", sa.JSON, nullable=False),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("is_builtin", sa.Boolean, nullable=False),
        sa.Column("usage_count", sa.BigInteger, nullable=False),
        sa.Column("created_by", sa.String(253), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )


def _notifications() -> None:
    """Notification channels and what was sent through them."""
    op.create_table(
        "notification_channels",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(253), nullable=False, unique=True),
        sa.Column("type", sa.String(50), nullable=False),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("created_by", sa.String(253), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "alert_notifications",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("alert_id", sa.String(64), nullable=False),
        sa.Column("channel", sa.String(253), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("sent_at", TS, nullable=False),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("error_message", sa.Text, nullable=False),
    )
    op.create_index("ix_alert_notifications_alert_id", "alert_notifications", ["alert_id"])


def downgrade() -> None:
    op.drop_table("alert_notifications")
    op.drop_table("notification_channels")
    op.drop_table("log_alert_rule_templates")
    op.drop_table("log_alert_rules")
    op.drop_table("metric_alert_rules")
    op.drop_table("silenced_alerts")
    op.drop_table("alert_silences")
    op.drop_table("alert_events")
