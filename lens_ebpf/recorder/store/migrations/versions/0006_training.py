"""Training progress from logs (training_points) and what was found in it and in the
workloads' signals (training_events).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
ID = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "training_points",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("workload_uid", sa.String(64), nullable=False),
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("received_at", TS, nullable=False),
        sa.Column("format", sa.String(32), nullable=False),
        sa.Column("iteration", sa.BigInteger, nullable=True),
        sa.Column("target_iterations", sa.BigInteger, nullable=True),
        sa.Column("iteration_seconds", sa.Float, nullable=True),
        sa.Column("tokens_per_second", sa.Float, nullable=True),
        sa.Column("tflops_per_gpu", sa.Float, nullable=True),
        sa.Column("loss", sa.Float, nullable=True),
        sa.Column("skipped_iterations", sa.Integer, nullable=True),
        sa.Column("nan_iterations", sa.Integer, nullable=True),
        sa.Column("samples_per_second", sa.Float, nullable=True),
        sa.Column("line_key", sa.String(64), nullable=False),
        sa.UniqueConstraint("line_key", name="uq_training_points_line"),
    )
    op.create_index("ix_training_points_workload_at", "training_points", ["workload_uid", "at"])
    op.create_table(
        "training_events",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("workload_uid", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("workload", sa.String(253), nullable=False),
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("pod", sa.String(253), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("signal", sa.String(32), nullable=False),
        sa.Column("at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("iteration", sa.BigInteger, nullable=True),
        sa.Column("value", sa.Float, nullable=True),
        sa.Column("baseline", sa.Float, nullable=True),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_index("ix_training_events_workload_at", "training_events", ["workload_uid", "at"])


def downgrade() -> None:
    op.drop_index("ix_training_events_workload_at", "training_events")
    op.drop_table("training_events")
    op.drop_index("ix_training_points_workload_at", "training_points")
    op.drop_table("training_points")
