"""The cluster in every table and in its keys: two clusters may both have a node gpu-0,
and a pod's UID is unique in its cluster only. Rows already stored belong to the home
cluster (recorder.cluster_name, handed over by store.upgrade).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import warnings

import sqlalchemy as sa
from alembic import context, op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# table -> its primary key (with the cluster first), or None: an id keeps it
PRIMARY = {
    "gpu_pods": ["uid"],
    "gpu_workloads": ["uid"],
    "workload_pod_references": ["workload_uid", "pod_uid"],
    "nodes": ["name"],
}
# table -> (unique constraint, its columns without the cluster)
UNIQUE = {
    "pod_snapshots": ("uq_pod_snapshots_version", ["pod_uid", "resource_version"]),
    "gpu_pods_events": (
        "uq_gpu_pods_events_change",
        ["pod_uid", "resource_version", "type", "subject"],
    ),
    "pod_resources": ("uq_pod_resources_container", ["pod_uid", "container", "source"]),
    "node_events": ("uq_node_events_seq", ["node", "seq"]),
    "node_devices": ("uq_node_devices_slot", ["node", "kind", "slot"]),
    "training_points": ("uq_training_points_line", ["line_key"]),
}
INDEXES = {
    "device_changelog": ("ix_device_changelog_node_at", ["node", "at"]),
    "allocation_snapshots": ("ix_allocation_snapshots_node_at", ["node", "at"]),
}
PLAIN = ("device_changelog", "allocation_snapshots", "training_events")


def upgrade() -> None:
    home = str(context.config.attributes.get("cluster") or "local")
    pg = op.get_bind().dialect.name == "postgresql"
    for table in (*PRIMARY, *UNIQUE, *PLAIN):
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("cluster", sa.String(253), nullable=False, server_default=home)
            )
        with warnings.catch_warnings(), op.batch_alter_table(table) as batch:
            # SQLite's copy names the old key's columns primary too: the new key wins
            warnings.filterwarnings("ignore", "Table '_alembic_tmp_", sa.exc.SAWarning)
            batch.alter_column(
                "cluster",
                server_default=None,
                existing_type=sa.String(253),
                existing_nullable=False,
            )
            if table in PRIMARY:
                if pg:
                    batch.drop_constraint(f"{table}_pkey", type_="primary")
                batch.create_primary_key(f"{table}_pkey", ["cluster", *PRIMARY[table]])
            if table in UNIQUE:
                name, cols = UNIQUE[table]
                batch.drop_constraint(name, type_="unique")
                batch.create_unique_constraint(name, ["cluster", *cols])
            if table in INDEXES:
                name, cols = INDEXES[table]
                batch.drop_index(name)
                batch.create_index(name, ["cluster", *cols])


def downgrade() -> None:
    raise NotImplementedError("0007 keeps every cluster's rows: no way back to one cluster")
