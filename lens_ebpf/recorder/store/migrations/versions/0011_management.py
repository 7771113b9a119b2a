"""Management: every job run (job_execution_history), workloads' frameworks and their
evidence, the managed clusters and the tasks run on them, the settings changed at run
time and their audit, release versions, log rules' versions.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")
NAME = sa.String(253)


def upgrade() -> None:
    _job_history_and_detections()
    _clusters()
    _settings_and_releases()


def _job_history_and_detections() -> None:
    """Job runs; workloads' frameworks."""
    op.create_table(
        "job_execution_history",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("job_name", NAME, nullable=False),
        sa.Column("job_type", NAME, nullable=False),
        sa.Column("schedule", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=False),
        sa.Column("duration_seconds", sa.Float, nullable=False),
        sa.Column("error_message", sa.Text, nullable=False),
        sa.Column("error_stack", sa.Text, nullable=False),
        sa.Column("cluster_name", NAME, nullable=False),
        sa.Column("hostname", NAME, nullable=False),
        sa.Column("rows_touched", sa.BigInteger, nullable=False),
        sa.Column("metadata", sa.JSON, nullable=False),
        sa.Column("execution_stats", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_job_execution_history_started", "job_execution_history", ["started_at"])
    op.create_index(
        "ix_job_execution_history_job", "job_execution_history", ["job_name", "started_at"]
    )
    op.create_index(
        "ix_job_execution_history_status", "job_execution_history", ["status", "started_at"]
    )
    op.create_table(
        "workload_detections",
        sa.Column("cluster", NAME, primary_key=True),
        sa.Column("workload_uid", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("detection_state", sa.String(16), nullable=False),
        sa.Column("framework", sa.String(64), nullable=False),
        sa.Column("frameworks", sa.JSON, nullable=False),
        sa.Column("workload_type", sa.String(16), nullable=False),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.Column("framework_layer", sa.String(16), nullable=False),
        sa.Column("wrapper_framework", sa.String(64), nullable=False),
        sa.Column("base_framework", sa.String(64), nullable=False),
        sa.Column("evidence_count", sa.Integer, nullable=False),
        sa.Column("evidence_sources", sa.JSON, nullable=False),
        sa.Column("attempt_count", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("last_attempt_at", TS, nullable=True),
        sa.Column("next_attempt_at", TS, nullable=True),
        sa.Column("confirmed_at", TS, nullable=True),
        sa.Column("conflicts", sa.JSON, nullable=False),
        sa.Column("coverage", sa.JSON, nullable=False),
        sa.Column("task", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )


def _clusters() -> None:
    """Frameworks' evidence, managed clusters and their tasks."""
    op.create_table(
        "workload_detection_evidence",
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("workload_uid", sa.String(64), nullable=False),
        sa.Column("key", NAME, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("source_type", sa.String(16), nullable=False),
        sa.Column("framework", sa.String(64), nullable=False),
        sa.Column("workload_type", sa.String(16), nullable=False),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.Column("framework_layer", sa.String(16), nullable=False),
        sa.Column("wrapper_framework", sa.String(64), nullable=False),
        sa.Column("base_framework", sa.String(64), nullable=False),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("detected_at", TS, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("cluster", "workload_uid", "key", name="uq_detection_evidence_key"),
    )
    op.create_table(
        "managed_clusters",
        sa.Column("cluster_name", NAME, primary_key=True),
        sa.Column("display_name", NAME, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("is_default", sa.Boolean, nullable=False),
        sa.Column("release_version_id", sa.BigInteger, nullable=True),
        sa.Column("values_override", sa.JSON, nullable=False),
        sa.Column("deployed_version_id", sa.BigInteger, nullable=True),
        sa.Column("deployed_values", sa.JSON, nullable=False),
        sa.Column("deployed_at", TS, nullable=True),
        sa.Column("created_by", NAME, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "cluster_tasks",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("cluster_name", NAME, nullable=False),
        sa.Column("task_type", sa.String(32), nullable=False),
        sa.Column("install_scope", sa.String(32), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("current_stage", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_message", sa.Text, nullable=False),
        sa.Column("retry_count", sa.Integer, nullable=False),
        sa.Column("max_retries", sa.Integer, nullable=False),
        sa.Column("job_name", NAME, nullable=False),
        sa.Column("job_namespace", NAME, nullable=False),
        sa.Column("image", sa.String(512), nullable=False),
        sa.Column("release_version_id", sa.BigInteger, nullable=True),
        sa.Column("values_snapshot", sa.JSON, nullable=False),
        sa.Column("triggered_by", NAME, nullable=False),
        sa.Column("logs", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("completed_at", TS, nullable=True),
    )
    op.create_index("ix_cluster_tasks_cluster_name", "cluster_tasks", ["cluster_name"])


def _settings_and_releases() -> None:
    """Run-time settings and their audit, releases, log rules' versions."""
    op.create_table(
        "system_config",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("key", NAME, nullable=False, unique=True),
        sa.Column("value", sa.JSON, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("category", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_by", NAME, nullable=False),
        sa.Column("updated_by", NAME, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "system_config_history",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("config_id", sa.BigInteger, nullable=False),
        sa.Column("key", NAME, nullable=False),
        sa.Column("old_value", sa.JSON, nullable=True),
        sa.Column("new_value", sa.JSON, nullable=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("change_reason", sa.Text, nullable=False),
        sa.Column("changed_at", TS, nullable=False),
        sa.Column("changed_by", NAME, nullable=False),
    )
    op.create_index("ix_system_config_history_key", "system_config_history", ["key"])
    op.create_table(
        "release_versions",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("version_name", NAME, nullable=False, unique=True),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("chart_repo", sa.String(512), nullable=False),
        sa.Column("chart_version", sa.String(64), nullable=False),
        sa.Column("image_registry", sa.String(512), nullable=False),
        sa.Column("image_tag", sa.String(128), nullable=False),
        sa.Column("default_values", sa.JSON, nullable=False),
        sa.Column("values_schema", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("release_notes", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "log_alert_rule_versions",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("rule_id", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("deployed_at", TS, nullable=True),
        sa.Column("created_by", NAME, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("rule_id", "version", name="uq_log_alert_rule_versions"),
    )


def downgrade() -> None:
    for table in (
        "log_alert_rule_versions",
        "release_versions",
        "system_config_history",
        "system_config",
        "cluster_tasks",
        "managed_clusters",
        "workload_detection_evidence",
        "workload_detections",
        "job_execution_history",
    ):
        op.drop_table(table)
