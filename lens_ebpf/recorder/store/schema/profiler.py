"""Profiling: py-spy tasks, the PyTorch profiler traces found and fetched, and the
analysis sessions over them."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
)

from lens_ebpf.recorder.store.schema.meta import NAME, UID, metadata

# py-spy runs the API asked for (pyspy/sample) or a stall took (the rank's stack): the
# task's lifecycle (pending, running, completed, failed, cancelled) and py-spy's output
pyspy_tasks = Table(
    "pyspy_tasks",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("task_id", String(UID), primary_key=True),
    Column("status", String(16), nullable=False),
    Column("workload_uid", String(UID), nullable=False, default="", index=True),
    Column("pod_uid", String(UID), nullable=False),
    Column("pod_name", String(NAME), nullable=False, default=""),
    Column("pod_namespace", String(NAME), nullable=False, default=""),
    Column("node_name", String(NAME), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("action", String(8), nullable=False),  # record, dump
    Column("options", JSON, nullable=False),  # duration, rate, format, native, subprocesses, locals
    Column("reason", String(32), nullable=False, default="requested"),  # requested, stall
    Column("output_file", String(NAME), nullable=False, default=""),
    Column("file_size", BigInteger, nullable=False, default=0),
    Column("content", LargeBinary, nullable=True),
    Column("error", Text, nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("completed_at", DateTime(timezone=True), nullable=True),
)
Index("ix_pyspy_tasks_created", pyspy_tasks.c.cluster, pyspy_tasks.c.created_at)

# PyTorch profiler traces the agents found in a workload's containers (issue 71): listed as
# found, their bytes fetched from the agent on request, kept in chunks until the retention
profiler_files = Table(
    "profiler_files",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster", String(NAME), nullable=False),
    Column("workload_uid", String(UID), nullable=False, index=True),
    Column("pod_uid", String(UID), nullable=False),
    Column("pod_name", String(NAME), nullable=False),
    Column("pod_namespace", String(NAME), nullable=False),
    Column("node_name", String(NAME), nullable=False),
    Column("container_id", String(UID), nullable=False),
    Column("container", String(NAME), nullable=False),
    Column("path", Text, nullable=False),
    Column("file_name", String(NAME), nullable=False),
    Column("file_type", String(32), nullable=False),
    Column("file_size", BigInteger, nullable=False),
    Column("mtime", DateTime(timezone=True), nullable=False),
    Column("rank", Integer, nullable=False),  # -1: not known
    Column("found_by", String(16), nullable=False),
    Column("status", String(16), nullable=False),  # listed, fetched, failed
    Column("error", Text, nullable=False, default=""),
    Column("stored_bytes", BigInteger, nullable=False, default=0),
    Column("sha256", String(64), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("fetched_at", DateTime(timezone=True), nullable=True),
)
Index(
    "ix_profiler_files_place",
    profiler_files.c.cluster,
    profiler_files.c.pod_uid,
    profiler_files.c.container_id,
    profiler_files.c.path,
    profiler_files.c.mtime,
    unique=True,
)
profiler_file_chunks = Table(
    "profiler_file_chunks",
    metadata,
    Column("file_id", Integer, primary_key=True),
    Column("chunk_index", Integer, primary_key=True),
    Column("content", LargeBinary, nullable=False),
)
# a TraceLens analysis or a trace viewer over fetched traces (the pages' sessions)
profiler_sessions = Table(
    "profiler_sessions",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("session_id", String(UID), primary_key=True),
    Column("kind", String(16), nullable=False),  # tracelens, perfetto
    Column("workload_uid", String(UID), nullable=False, index=True),
    Column("profiler_file_id", Integer, nullable=False),
    Column("file_ids", JSON, nullable=False),  # every rank analysed together
    Column("status", String(16), nullable=False),
    Column("status_message", Text, nullable=False, default=""),
    Column("resource_profile", String(16), nullable=False, default=""),
    Column("result", JSON, nullable=True),  # the analysis
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("ready_at", DateTime(timezone=True), nullable=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("last_accessed_at", DateTime(timezone=True), nullable=True),
)
