"""py-spy tasks (issue 71): the runs the API asked for or a stall took, with their output.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
NAME = sa.String(253)
UID = sa.String(64)


def upgrade() -> None:
    op.create_table(
        "pyspy_tasks",
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("task_id", UID, primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("workload_uid", UID, nullable=False),
        sa.Column("pod_uid", UID, nullable=False),
        sa.Column("pod_name", NAME, nullable=False),
        sa.Column("pod_namespace", NAME, nullable=False),
        sa.Column("node_name", NAME, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("action", sa.String(8), nullable=False),
        sa.Column("options", sa.JSON, nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("output_file", NAME, nullable=False),
        sa.Column("file_size", sa.BigInteger, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=True),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("completed_at", TS, nullable=True),
    )
    op.create_index("ix_pyspy_tasks_workload_uid", "pyspy_tasks", ["workload_uid"])
    op.create_index("ix_pyspy_tasks_created", "pyspy_tasks", ["cluster", "created_at"])


def downgrade() -> None:
    op.drop_table("pyspy_tasks")
