"""node_devices.recovery_action (what an NVIDIA driver asks before a GPU is usable again)
and node_devices.holder (the pod the kubelet gave a GPU).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("node_devices") as batch:
        batch.add_column(
            sa.Column("recovery_action", sa.String(32), nullable=False, server_default="")
        )
        batch.add_column(sa.Column("holder", sa.String(253), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("node_devices") as batch:
        batch.drop_column("holder")
        batch.drop_column("recovery_action")
