"""Management (docs/recorder/management.md): job runs, framework detections, managed
clusters and their tasks, run-time settings and releases."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from lens_ebpf.recorder.store.schema.meta import NAME, UID, metadata

# -- management (docs/recorder/management.md) -----------------------------------------------
# every run of a recorder job the leader ran: when, how it ended, its error and the writes
# it made; kept recorder.job_history.retention_days
job_execution_history = Table(
    "job_execution_history",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("job_name", String(NAME), nullable=False),  # storage_scan/<cluster>, snapshot, ...
    Column("job_type", String(NAME), nullable=False),  # the job without its cluster
    Column("schedule", String(64), nullable=False, default=""),  # @every 30s
    Column("status", String(16), nullable=False),  # success, failed
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=False),
    Column("duration_seconds", Float, nullable=False),
    Column("error_message", Text, nullable=False, default=""),
    Column("error_stack", Text, nullable=False, default=""),
    Column("cluster_name", String(NAME), nullable=False),
    Column("hostname", String(NAME), nullable=False, default=""),  # the replica that ran it
    Column("rows_touched", BigInteger, nullable=False, default=0),
    Column("metadata", JSON, nullable=False),
    Column("execution_stats", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)
Index("ix_job_execution_history_started", job_execution_history.c.started_at)
Index(
    "ix_job_execution_history_job",
    job_execution_history.c.job_name,
    job_execution_history.c.started_at,
)
Index(
    "ix_job_execution_history_status",
    job_execution_history.c.status,
    job_execution_history.c.started_at,
)

# a workload's training or inference framework, as its evidence says (detection/frameworks.py): one
# row per top workload, and one row per piece of evidence (a log format seen, an image, a
# command line, an environment name, a label), kept as it was last seen
workload_detections = Table(
    "workload_detections",
    metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("workload_uid", String(UID), primary_key=True),
    Column("status", String(16), nullable=False),  # unknown, suspected, confirmed, ...
    Column("detection_state", String(16), nullable=False),  # pending, completed, ...
    Column("framework", String(64), nullable=False, default=""),
    Column("frameworks", JSON, nullable=False),
    Column("workload_type", String(16), nullable=False, default=""),
    Column("confidence", Float, nullable=False, default=0.0),
    Column("framework_layer", String(16), nullable=False, default=""),
    Column("wrapper_framework", String(64), nullable=False, default=""),
    Column("base_framework", String(64), nullable=False, default=""),
    Column("evidence_count", Integer, nullable=False, default=0),
    Column("evidence_sources", JSON, nullable=False),
    Column("attempt_count", Integer, nullable=False, default=0),
    Column("max_attempts", Integer, nullable=False, default=0),
    Column("last_attempt_at", DateTime(timezone=True), nullable=True),
    Column("next_attempt_at", DateTime(timezone=True), nullable=True),
    Column("confirmed_at", DateTime(timezone=True), nullable=True),
    Column("conflicts", JSON, nullable=False),
    Column("coverage", JSON, nullable=False),  # per source: status, attempts, evidence
    Column("task", JSON, nullable=False),  # the detection task: status, who asked, when
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
workload_detection_evidence = Table(
    "workload_detection_evidence",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("workload_uid", String(UID), nullable=False),
    Column("key", String(NAME), nullable=False),  # what it is: log:megatron, image:<ref>, ...
    Column("source", String(16), nullable=False),  # log, process, image, label
    Column("source_type", String(16), nullable=False),  # passive (seen), active (asked)
    Column("framework", String(64), nullable=False),
    Column("workload_type", String(16), nullable=False),  # training, inference
    Column("confidence", Float, nullable=False),
    Column("framework_layer", String(16), nullable=False),  # wrapper, base, runtime, ...
    Column("wrapper_framework", String(64), nullable=False, default=""),
    Column("base_framework", String(64), nullable=False, default=""),
    Column("evidence", JSON, nullable=False),
    Column("detected_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("cluster", "workload_uid", "key", name="uq_detection_evidence_key"),
)

# the clusters the Management pages manage: what the multi-cluster Secret does not hold
# (its kubeconfig stays there, never here): names and notes, the default, the release
managed_clusters = Table(
    "managed_clusters",
    metadata,
    Column("cluster_name", String(NAME), primary_key=True),
    Column("display_name", String(NAME), nullable=False, default=""),
    Column("description", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False),
    Column("is_default", Boolean, nullable=False, default=False),
    Column("release_version_id", BigInteger, nullable=True),  # the version it should run
    Column("values_override", JSON, nullable=False),
    Column("deployed_version_id", BigInteger, nullable=True),
    Column("deployed_values", JSON, nullable=False),
    Column("deployed_at", DateTime(timezone=True), nullable=True),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
# what was done to a cluster on the pages' asking: the agent's objects installed
# (initialize, deploy, rollback), each object's outcome in its logs
cluster_tasks = Table(
    "cluster_tasks",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("cluster_name", String(NAME), nullable=False, index=True),
    Column("task_type", String(32), nullable=False),  # install
    Column("install_scope", String(32), nullable=False),  # infrastructure, apps
    Column("action", String(32), nullable=False),  # install, upgrade, rollback
    Column("current_stage", String(64), nullable=False, default=""),
    Column("status", String(16), nullable=False),  # pending, running, completed, failed
    Column("error_message", Text, nullable=False, default=""),
    Column("retry_count", Integer, nullable=False, default=0),
    Column("max_retries", Integer, nullable=False, default=0),
    Column("job_name", String(NAME), nullable=False, default=""),
    Column("job_namespace", String(NAME), nullable=False, default=""),
    Column("image", String(512), nullable=False, default=""),
    Column("release_version_id", BigInteger, nullable=True),
    Column("values_snapshot", JSON, nullable=False),
    Column("triggered_by", String(NAME), nullable=False, default=""),
    Column("logs", Text, nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("completed_at", DateTime(timezone=True), nullable=True),
)
# the settings changed at run time (settings.py) and every change made (the audit)
system_config = Table(
    "system_config",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("key", String(NAME), nullable=False, unique=True),
    Column("value", JSON, nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("category", String(64), nullable=False, default=""),
    Column("version", Integer, nullable=False, default=1),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("updated_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
system_config_history = Table(
    "system_config_history",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("config_id", BigInteger, nullable=False),
    Column("key", String(NAME), nullable=False, index=True),
    Column("old_value", JSON, nullable=True),  # none: set for the first time
    Column("new_value", JSON, nullable=True),  # none: deleted (back to its default)
    Column("version", Integer, nullable=False),
    Column("change_reason", Text, nullable=False, default=""),
    Column("changed_at", DateTime(timezone=True), nullable=False),
    Column("changed_by", String(NAME), nullable=False, default=""),
)
# lens-ebpf versions the Release page offers (an image registry and tag each)
release_versions = Table(
    "release_versions",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("version_name", String(NAME), nullable=False, unique=True),
    Column("channel", String(32), nullable=False, default="stable"),
    Column("chart_repo", String(512), nullable=False, default=""),
    Column("chart_version", String(64), nullable=False, default=""),
    Column("image_registry", String(512), nullable=False, default=""),
    Column("image_tag", String(128), nullable=False),
    Column("default_values", JSON, nullable=False),
    Column("values_schema", JSON, nullable=False),
    Column("status", String(16), nullable=False, default="draft"),  # draft, active, deprecated
    Column("release_notes", Text, nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
