"""node_events.instance: the agent process that numbered an event's seq (each numbers from
1), in the unique key, so a restarted agent's events are stored beside its predecessor's
rather than taken as duplicates of them. Rows stored before are instance "" (what an agent
that does not say its instance reports as).

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("node_events") as batch:
        batch.add_column(sa.Column("instance", sa.String(64), nullable=False, server_default=""))
    # the default stays: a replica not yet upgraded (a rolling update) writes rows
    # without the column, as an agent that does not say its instance
    with op.batch_alter_table("node_events") as batch:
        batch.drop_constraint("uq_node_events_seq", type_="unique")
        batch.create_unique_constraint("uq_node_events_seq", ["cluster", "node", "instance", "seq"])


def downgrade() -> None:
    raise NotImplementedError("0014 keeps every agent instance's rows: their seqs collide")
