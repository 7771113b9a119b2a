"""GPU accounting: allocation snapshots per dimension, hourly statistics per namespace,
label/annotation value and workload, the weekly report; the cluster's hourly utilization
may be missing (NULL) while Prometheus could not answer.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")
UTILIZATION = (
    "avg_utilization",
    "max_utilization",
    "min_utilization",
    "p50_utilization",
    "p95_utilization",
)


def upgrade() -> None:
    _snapshots()
    _namespace_and_label_hours()
    _workload_hours_and_reports()


def _snapshots() -> None:
    """Utilization unknown allowed in the cluster's hours; allocation snapshots."""
    with op.batch_alter_table("cluster_gpu_hourly_stats") as batch:
        for name in UTILIZATION:
            batch.alter_column(name, existing_type=sa.Float, nullable=True)
    op.create_table(
        "gpu_allocation_snapshots",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("snapshot_time", TS, nullable=False),
        sa.Column("dimension_type", sa.String(16), nullable=False),
        sa.Column("dimension_key", sa.String(253), nullable=False),
        sa.Column("dimension_value", sa.String(253), nullable=False),
        sa.Column("total_gpu_capacity", sa.Integer, nullable=False),
        sa.Column("allocated_gpu_count", sa.Integer, nullable=False),
        sa.Column("allocation_details", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index(
        "ix_gpu_allocation_snapshots_type_time",
        "gpu_allocation_snapshots",
        ["cluster_name", "dimension_type", "snapshot_time"],
    )


def _namespace_and_label_hours() -> None:
    """The hourly statistics per namespace and per label or annotation value."""
    op.create_table(
        "namespace_gpu_hourly_stats",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("stat_hour", TS, nullable=False),
        sa.Column("total_gpu_capacity", sa.Integer, nullable=False),
        sa.Column("allocated_gpu_count", sa.Float, nullable=False),
        sa.Column("allocation_rate", sa.Float, nullable=False),
        sa.Column("avg_utilization", sa.Float, nullable=True),
        sa.Column("max_utilization", sa.Float, nullable=True),
        sa.Column("min_utilization", sa.Float, nullable=True),
        sa.Column("active_workload_count", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint(
            "cluster_name", "namespace", "stat_hour", name="uq_namespace_gpu_hourly_stats_hour"
        ),
    )
    op.create_index(
        "ix_namespace_gpu_hourly_stats_hour",
        "namespace_gpu_hourly_stats",
        ["cluster_name", "stat_hour"],
    )
    op.create_table(
        "label_gpu_hourly_stats",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("dimension_type", sa.String(16), nullable=False),
        sa.Column("dimension_key", sa.String(253), nullable=False),
        sa.Column("dimension_value", sa.String(253), nullable=False),
        sa.Column("stat_hour", TS, nullable=False),
        sa.Column("allocated_gpu_count", sa.Float, nullable=False),
        sa.Column("avg_utilization", sa.Float, nullable=True),
        sa.Column("max_utilization", sa.Float, nullable=True),
        sa.Column("min_utilization", sa.Float, nullable=True),
        sa.Column("active_workload_count", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint(
            "cluster_name",
            "dimension_type",
            "dimension_key",
            "dimension_value",
            "stat_hour",
            name="uq_label_gpu_hourly_stats_hour",
        ),
    )


def _workload_hours_and_reports() -> None:
    """The hourly statistics per workload; the weekly reports."""
    op.create_table(
        "workload_gpu_hourly_stats",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("workload_name", sa.String(253), nullable=False),
        sa.Column("workload_type", sa.String(253), nullable=False),
        sa.Column("stat_hour", TS, nullable=False),
        sa.Column("allocated_gpu_count", sa.Float, nullable=False),
        sa.Column("requested_gpu_count", sa.Float, nullable=False),
        sa.Column("avg_utilization", sa.Float, nullable=True),
        sa.Column("max_utilization", sa.Float, nullable=True),
        sa.Column("min_utilization", sa.Float, nullable=True),
        sa.Column("p50_utilization", sa.Float, nullable=True),
        sa.Column("p95_utilization", sa.Float, nullable=True),
        sa.Column("avg_gpu_memory_used", sa.Float, nullable=True),
        sa.Column("max_gpu_memory_used", sa.Float, nullable=True),
        sa.Column("avg_gpu_memory_total", sa.Float, nullable=True),
        sa.Column("avg_replica_count", sa.Float, nullable=False),
        sa.Column("max_replica_count", sa.Integer, nullable=False),
        sa.Column("min_replica_count", sa.Integer, nullable=False),
        sa.Column("workload_status", sa.String(64), nullable=False),
        sa.Column("sample_count", sa.Integer, nullable=False),
        sa.Column("owner_uid", sa.String(64), nullable=False),
        sa.Column("owner_name", sa.String(253), nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("annotations", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint(
            "cluster_name", "owner_uid", "stat_hour", name="uq_workload_gpu_hourly_stats_hour"
        ),
    )
    op.create_index(
        "ix_workload_gpu_hourly_stats_ns_hour",
        "workload_gpu_hourly_stats",
        ["cluster_name", "namespace", "stat_hour"],
    )
    op.create_index(
        "ix_workload_gpu_hourly_stats_hour",
        "workload_gpu_hourly_stats",
        ["cluster_name", "stat_hour"],
    )
    op.create_table(
        "gpu_usage_weekly_reports",
        sa.Column("id", sa.String(253), primary_key=True),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("period_start", TS, nullable=False),
        sa.Column("period_end", TS, nullable=False),
        sa.Column("generated_at", TS, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("html_content", sa.LargeBinary, nullable=True),
        sa.Column("pdf_content", sa.LargeBinary, nullable=True),
        sa.Column("json_content", sa.JSON, nullable=True),
        sa.Column("metadata", sa.JSON, nullable=True),
        sa.Column("error_message", sa.Text, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint(
            "cluster_name", "period_start", name="uq_gpu_usage_weekly_reports_period"
        ),
    )


def downgrade() -> None:
    for name in (
        "gpu_usage_weekly_reports",
        "workload_gpu_hourly_stats",
        "label_gpu_hourly_stats",
        "namespace_gpu_hourly_stats",
        "gpu_allocation_snapshots",
    ):
        op.drop_table(name)
    with op.batch_alter_table("cluster_gpu_hourly_stats") as batch:
        for name in UTILIZATION:
            batch.alter_column(name, existing_type=sa.Float, nullable=False)
