"""Replicas: the current leader term of a Lease (the row every leader write checks) and
every term's holder and writes; a node's pods indexed (remote write reads a node's again).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "recorder_leader",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("term", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.String(253), nullable=False),
        sa.Column("endpoint", sa.String(253), nullable=False),
        sa.Column("since", TS, nullable=False),
    )
    op.create_table(
        "leader_terms",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("term", sa.BigInteger, primary_key=True),
        sa.Column("holder", sa.String(253), nullable=False),
        sa.Column("endpoint", sa.String(253), nullable=False),
        sa.Column("acquired_at", TS, nullable=False),
        sa.Column("first_write_at", TS, nullable=True),
        sa.Column("last_write_at", TS, nullable=True),
        sa.Column("writes", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_gpu_pods_node", "gpu_pods", ["cluster", "node"])


def downgrade() -> None:
    op.drop_index("ix_gpu_pods_node", "gpu_pods")
    op.drop_table("leader_terms")
    op.drop_table("recorder_leader")
