"""The cluster's nodes (a Node watch).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("address", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("gpu_capacity", sa.JSON, nullable=False),
        sa.Column("gpu_allocatable", sa.JSON, nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("cpu_count", sa.Integer, nullable=False),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False),
        sa.Column("memory", sa.String(64), nullable=False),
        sa.Column("kernel", sa.String(253), nullable=False),
        sa.Column("os_image", sa.String(253), nullable=False),
        sa.Column("kubelet_version", sa.String(64), nullable=False),
        sa.Column("container_runtime", sa.String(253), nullable=False),
        sa.Column("taints", sa.Integer, nullable=False),
        sa.Column("deleted", sa.Boolean, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("nodes")
