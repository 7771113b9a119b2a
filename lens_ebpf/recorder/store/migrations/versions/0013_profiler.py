"""Profiler traces and their analysis sessions (issue 71): the files the agents found, their
bytes in chunks, the TraceLens and trace-viewer sessions over them.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
NAME = sa.String(253)
UID = sa.String(64)


def upgrade() -> None:
    op.create_table(
        "profiler_files",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("workload_uid", UID, nullable=False),
        sa.Column("pod_uid", UID, nullable=False),
        sa.Column("pod_name", NAME, nullable=False),
        sa.Column("pod_namespace", NAME, nullable=False),
        sa.Column("node_name", NAME, nullable=False),
        sa.Column("container_id", UID, nullable=False),
        sa.Column("container", NAME, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("file_name", NAME, nullable=False),
        sa.Column("file_type", sa.String(32), nullable=False),
        sa.Column("file_size", sa.BigInteger, nullable=False),
        sa.Column("mtime", TS, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("found_by", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("stored_bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("fetched_at", TS, nullable=True),
    )
    op.create_index("ix_profiler_files_workload_uid", "profiler_files", ["workload_uid"])
    place = ["cluster", "pod_uid", "container_id", "path", "mtime"]
    op.create_index("ix_profiler_files_place", "profiler_files", place, unique=True)
    op.create_table(
        "profiler_file_chunks",
        sa.Column("file_id", sa.Integer, primary_key=True),
        sa.Column("chunk_index", sa.Integer, primary_key=True),
        sa.Column("content", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "profiler_sessions",
        sa.Column("cluster", NAME, nullable=False),
        sa.Column("session_id", UID, primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("workload_uid", UID, nullable=False),
        sa.Column("profiler_file_id", sa.Integer, nullable=False),
        sa.Column("file_ids", sa.JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("status_message", sa.Text, nullable=False),
        sa.Column("resource_profile", sa.String(16), nullable=False),
        sa.Column("result", sa.JSON, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("ready_at", TS, nullable=True),
        sa.Column("expires_at", TS, nullable=False),
        sa.Column("last_accessed_at", TS, nullable=True),
    )
    op.create_index("ix_profiler_sessions_workload_uid", "profiler_sessions", ["workload_uid"])


def downgrade() -> None:
    op.drop_table("profiler_sessions")
    op.drop_table("profiler_file_chunks")
    op.drop_table("profiler_files")
