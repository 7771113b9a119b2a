"""Every node's devices and their changelog (device_change, device_inventory).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "node_devices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("slot", sa.String(253), nullable=False),
        sa.Column("key", sa.String(253), nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("vendor", sa.String(32), nullable=False),
        sa.Column("model", sa.String(253), nullable=False),
        sa.Column("uuid", sa.String(253), nullable=False),
        sa.Column("serial", sa.String(253), nullable=False),
        sa.Column("bdf", sa.String(32), nullable=False),
        sa.Column("driver_version", sa.String(64), nullable=False),
        sa.Column("firmware_version", sa.String(64), nullable=False),
        sa.Column("vbios_version", sa.String(64), nullable=False),
        sa.Column("port_state", sa.String(32), nullable=False),
        sa.Column("link_layer", sa.String(32), nullable=False),
        sa.Column("rate", sa.String(64), nullable=False),
        sa.Column("retired_pages_pending", sa.Boolean, nullable=False),
        sa.Column("row_remap_pending", sa.Boolean, nullable=False),
        sa.Column("row_remap_failure", sa.Boolean, nullable=False),
        sa.Column("present", sa.Boolean, nullable=False),
        sa.Column("first_seen", TS, nullable=False),
        sa.Column("last_seen", TS, nullable=False),
        sa.UniqueConstraint("node", "kind", "slot", name="uq_node_devices_slot"),
    )
    op.create_index("ix_node_devices_key", "node_devices", ["key"])
    op.create_index("ix_node_devices_serial", "node_devices", ["serial"])
    op.create_table(
        "device_changelog",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("at", TS, nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("slot", sa.String(253), nullable=False),
        sa.Column("device_key", sa.String(253), nullable=False),
        sa.Column("field", sa.String(32), nullable=False),
        sa.Column("old_value", sa.String(253), nullable=False),
        sa.Column("new_value", sa.String(253), nullable=False),
    )
    op.create_index("ix_device_changelog_device_key", "device_changelog", ["device_key"])
    op.create_index("ix_device_changelog_node_at", "device_changelog", ["node", "at"])


def downgrade() -> None:
    op.drop_table("device_changelog")
    op.drop_table("node_devices")
