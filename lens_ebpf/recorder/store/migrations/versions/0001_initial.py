"""The recorder's first tables.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "gpu_pods",
        sa.Column("uid", sa.String(64), primary_key=True),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("gpu_resources", sa.JSON, nullable=False),
        sa.Column("phase", sa.String(32), nullable=False),
        sa.Column("running", sa.Boolean, nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.Column("workload_uid", sa.String(64), nullable=True),
        sa.Column("resource_version", sa.String(32), nullable=False),
        sa.Column("created_at", TS, nullable=True),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("deleted_at", TS, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_gpu_pods_workload_uid", "gpu_pods", ["workload_uid"])
    op.create_table(
        "pod_snapshots",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("resource_version", sa.String(32), nullable=False),
        sa.Column("taken_at", TS, nullable=False),
        sa.Column("pod_metadata", sa.JSON, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("status", sa.JSON, nullable=False),
        sa.UniqueConstraint("pod_uid", "resource_version", name="uq_pod_snapshots_version"),
    )
    op.create_index("ix_pod_snapshots_pod_uid", "pod_snapshots", ["pod_uid"])
    op.create_table(
        "gpu_pods_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("resource_version", sa.String(32), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(253), nullable=False),
        sa.Column("old_value", sa.String(64), nullable=False),
        sa.Column("new_value", sa.String(64), nullable=False),
        sa.UniqueConstraint(
            "pod_uid", "resource_version", "type", "subject", name="uq_gpu_pods_events_change"
        ),
    )
    op.create_index("ix_gpu_pods_events_pod_uid", "gpu_pods_events", ["pod_uid"])
    op.create_table(
        "pod_resources",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("container", sa.String(253), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("resource", sa.String(253), nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("model", sa.String(253), nullable=False),
        sa.Column("devices", sa.JSON, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.UniqueConstraint("pod_uid", "container", "source", name="uq_pod_resources_container"),
    )
    op.create_index("ix_pod_resources_pod_uid", "pod_resources", ["pod_uid"])
    op.create_table(
        "gpu_workloads",
        sa.Column("uid", sa.String(64), primary_key=True),
        sa.Column("api_version", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("parent_uid", sa.String(64), nullable=True),
        sa.Column("gpu_request", sa.Integer, nullable=False),
        sa.Column("gpu_resources", sa.JSON, nullable=False),
        sa.Column("status", sa.String(64), nullable=False),
        sa.Column("running", sa.Boolean, nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.Column("finalizer", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("resource_version", sa.String(32), nullable=False),
        sa.Column("created_at", TS, nullable=True),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("deleted_at", TS, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_index("ix_gpu_workloads_parent_uid", "gpu_workloads", ["parent_uid"])
    op.create_table(
        "workload_pod_references",
        sa.Column("workload_uid", sa.String(64), primary_key=True),
        sa.Column("pod_uid", sa.String(64), primary_key=True),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_workload_pod_references_pod_uid", "workload_pod_references", ["pod_uid"])
    op.create_table(
        "node_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("container", sa.String(253), nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.UniqueConstraint("node", "seq", name="uq_node_events_seq"),
    )
    op.create_index("ix_node_events_pod_uid", "node_events", ["pod_uid"])


def downgrade() -> None:
    for table in (
        "node_events",
        "workload_pod_references",
        "gpu_workloads",
        "pod_resources",
        "gpu_pods_events",
        "pod_snapshots",
        "gpu_pods",
    ):
        op.drop_table(table)
