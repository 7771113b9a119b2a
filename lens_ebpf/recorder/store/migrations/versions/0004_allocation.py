"""Allocation snapshots and the cluster's hourly GPU statistics.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "allocation_snapshots",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("at", TS, nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("allocatable", sa.Integer, nullable=False),
        sa.Column("requested", sa.Integer, nullable=False),
        sa.Column("rate", sa.Float, nullable=False),
    )
    op.create_index("ix_allocation_snapshots_node_at", "allocation_snapshots", ["node", "at"])
    op.create_table(
        "cluster_gpu_hourly_stats",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cluster_name", sa.String(253), nullable=False),
        sa.Column("stat_hour", TS, nullable=False),
        sa.Column("total_gpu_capacity", sa.Integer, nullable=False),
        sa.Column("allocated_gpu_count", sa.Float, nullable=False),
        sa.Column("allocation_rate", sa.Float, nullable=False),
        sa.Column("avg_utilization", sa.Float, nullable=False),
        sa.Column("max_utilization", sa.Float, nullable=False),
        sa.Column("min_utilization", sa.Float, nullable=False),
        sa.Column("p50_utilization", sa.Float, nullable=False),
        sa.Column("p95_utilization", sa.Float, nullable=False),
        sa.Column("sample_count", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("cluster_name", "stat_hour", name="uq_cluster_gpu_hourly_stats_hour"),
    )


def downgrade() -> None:
    op.drop_table("cluster_gpu_hourly_stats")
    op.drop_table("allocation_snapshots")
