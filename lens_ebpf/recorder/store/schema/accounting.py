"""GPU accounting: allocation snapshots, the hourly statistics per cluster, namespace,
label or annotation value and workload, and the weekly usage reports."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from lens_ebpf.recorder.store.schema.meta import NAME, UID, metadata

# every jobs.allocation_seconds: per node (and node "" for the cluster) the GPUs allocatable
# and those running pods requested
allocation_snapshots = Table(
    "allocation_snapshots",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("node", String(NAME), nullable=False),
    Column("allocatable", Integer, nullable=False),
    Column("requested", Integer, nullable=False),
    Column("rate", Float, nullable=False),  # percent
)
Index(
    "ix_allocation_snapshots_node_at",
    allocation_snapshots.c.cluster,
    allocation_snapshots.c.node,
    allocation_snapshots.c.at,
)

# one row per completed hour: the cluster's GPU capacity, allocation and utilization
cluster_gpu_hourly_stats = Table(
    "cluster_gpu_hourly_stats",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster_name", String(NAME), nullable=False),
    Column("stat_hour", DateTime(timezone=True), nullable=False),
    Column("total_gpu_capacity", Integer, nullable=False),
    Column("allocated_gpu_count", Float, nullable=False),
    Column("allocation_rate", Float, nullable=False),
    # utilization: None while Prometheus could not answer for the hour (filled in later)
    Column("avg_utilization", Float, nullable=True),
    Column("max_utilization", Float, nullable=True),
    Column("min_utilization", Float, nullable=True),
    Column("p50_utilization", Float, nullable=True),
    Column("p95_utilization", Float, nullable=True),
    Column("sample_count", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("cluster_name", "stat_hour", name="uq_cluster_gpu_hourly_stats_hour"),
)

# every jobs.allocation_seconds, per dimension (namespace, label, annotation, workload): the
# GPUs running pods requested; allocation_details holds what the hour's statistics need
gpu_allocation_snapshots = Table(
    "gpu_allocation_snapshots",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("cluster_name", String(NAME), nullable=False),
    Column("snapshot_time", DateTime(timezone=True), nullable=False),
    Column("dimension_type", String(16), nullable=False),  # cluster, namespace, label, ...
    Column("dimension_key", String(NAME), nullable=False, default=""),
    Column("dimension_value", String(NAME), nullable=False, default=""),
    Column("total_gpu_capacity", Integer, nullable=False),
    Column("allocated_gpu_count", Integer, nullable=False),
    Column("allocation_details", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)
Index(
    "ix_gpu_allocation_snapshots_type_time",
    gpu_allocation_snapshots.c.cluster_name,
    gpu_allocation_snapshots.c.dimension_type,
    gpu_allocation_snapshots.c.snapshot_time,
)

# one row per namespace and completed hour
namespace_gpu_hourly_stats = Table(
    "namespace_gpu_hourly_stats",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster_name", String(NAME), nullable=False),
    Column("namespace", String(NAME), nullable=False),
    Column("stat_hour", DateTime(timezone=True), nullable=False),
    Column("total_gpu_capacity", Integer, nullable=False),  # the namespace's GPU quota
    Column("allocated_gpu_count", Float, nullable=False),
    Column("allocation_rate", Float, nullable=False),
    Column("avg_utilization", Float, nullable=True),
    Column("max_utilization", Float, nullable=True),
    Column("min_utilization", Float, nullable=True),
    Column("active_workload_count", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint(
        "cluster_name", "namespace", "stat_hour", name="uq_namespace_gpu_hourly_stats_hour"
    ),
)
# the Statistics pages read every namespace's hours of a span
Index(
    "ix_namespace_gpu_hourly_stats_hour",
    namespace_gpu_hourly_stats.c.cluster_name,
    namespace_gpu_hourly_stats.c.stat_hour,
)

# one row per label or annotation value and completed hour
label_gpu_hourly_stats = Table(
    "label_gpu_hourly_stats",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster_name", String(NAME), nullable=False),
    Column("dimension_type", String(16), nullable=False),  # label, annotation
    Column("dimension_key", String(NAME), nullable=False),
    Column("dimension_value", String(NAME), nullable=False),
    Column("stat_hour", DateTime(timezone=True), nullable=False),
    Column("allocated_gpu_count", Float, nullable=False),
    Column("avg_utilization", Float, nullable=True),
    Column("max_utilization", Float, nullable=True),
    Column("min_utilization", Float, nullable=True),
    Column("active_workload_count", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint(
        "cluster_name",
        "dimension_type",
        "dimension_key",
        "dimension_value",
        "stat_hour",
        name="uq_label_gpu_hourly_stats_hour",
    ),
)

# one row per top workload and completed hour
workload_gpu_hourly_stats = Table(
    "workload_gpu_hourly_stats",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("cluster_name", String(NAME), nullable=False),
    Column("namespace", String(NAME), nullable=False),
    Column("workload_name", String(NAME), nullable=False),
    Column("workload_type", String(NAME), nullable=False),  # its kind
    Column("stat_hour", DateTime(timezone=True), nullable=False),
    Column("allocated_gpu_count", Float, nullable=False),
    Column("requested_gpu_count", Float, nullable=False),
    Column("avg_utilization", Float, nullable=True),
    Column("max_utilization", Float, nullable=True),
    Column("min_utilization", Float, nullable=True),
    Column("p50_utilization", Float, nullable=True),
    Column("p95_utilization", Float, nullable=True),
    Column("avg_gpu_memory_used", Float, nullable=True),  # GB
    Column("max_gpu_memory_used", Float, nullable=True),
    Column("avg_gpu_memory_total", Float, nullable=True),
    Column("avg_replica_count", Float, nullable=False),
    Column("max_replica_count", Integer, nullable=False),
    Column("min_replica_count", Integer, nullable=False),
    Column("workload_status", String(64), nullable=False, default=""),
    Column("sample_count", Integer, nullable=False),
    Column("owner_uid", String(UID), nullable=False, default=""),  # the workload's UID
    Column("owner_name", String(NAME), nullable=False, default=""),
    Column("labels", JSON, nullable=False),
    Column("annotations", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint(
        "cluster_name", "owner_uid", "stat_hour", name="uq_workload_gpu_hourly_stats_hour"
    ),
)
Index(
    "ix_workload_gpu_hourly_stats_ns_hour",
    workload_gpu_hourly_stats.c.cluster_name,
    workload_gpu_hourly_stats.c.namespace,
    workload_gpu_hourly_stats.c.stat_hour,
)
Index(
    "ix_workload_gpu_hourly_stats_hour",
    workload_gpu_hourly_stats.c.cluster_name,
    workload_gpu_hourly_stats.c.stat_hour,
)

# the weekly GPU usage report, one per cluster and period
gpu_usage_weekly_reports = Table(
    "gpu_usage_weekly_reports",
    metadata,
    Column("id", String(NAME), primary_key=True),
    Column("cluster_name", String(NAME), nullable=False),
    Column("period_start", DateTime(timezone=True), nullable=False),
    Column("period_end", DateTime(timezone=True), nullable=False),
    Column("generated_at", DateTime(timezone=True), nullable=False),
    Column("status", String(32), nullable=False, default="pending"),
    Column("html_content", LargeBinary, nullable=True),
    Column("pdf_content", LargeBinary, nullable=True),
    Column("json_content", JSON, nullable=True),
    Column("metadata", JSON, nullable=True),
    Column("error_message", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("cluster_name", "period_start", name="uq_gpu_usage_weekly_reports_period"),
)
