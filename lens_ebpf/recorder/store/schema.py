"""The recorder's tables (SQLAlchemy Core). Their history lives in migrations/versions;
a test keeps a migrated database equal to these definitions."""

from __future__ import annotations

import functools

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Subquery,
    Table,
    Text,
    UniqueConstraint,
    false,
    select,
)

metadata = MetaData()

UID = 64
NAME = 253  # a DNS subdomain, the longest Kubernetes object name

# one row per pod that requested GPUs; kept after the pod is deleted
gpu_pods = Table(
    "gpu_pods", metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("uid", String(UID), primary_key=True),
    Column("namespace", String(NAME), nullable=False),
    Column("name", String(NAME), nullable=False),
    Column("node", String(NAME), nullable=False, default=""),
    Column("gpus", Integer, nullable=False),  # GPUs allocated, every configured resource
    Column("gpu_resources", JSON, nullable=False),  # {"nvidia.com/gpu": 2}
    Column("phase", String(32), nullable=False, default=""),
    Column("running", Boolean, nullable=False, default=False),
    Column("deleted", Boolean, nullable=False, default=False),
    Column("workload_uid", String(UID), nullable=True, index=True),  # the top owner
    Column("resource_version", String(32), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=True),  # metadata.creationTimestamp
    Column("started_at", DateTime(timezone=True), nullable=True),  # first seen Running
    Column("ended_at", DateTime(timezone=True), nullable=True),  # Succeeded/Failed, or deleted
    Column("deleted_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip
# a node's pods: remote write's index reads one node's again when a series names one it
# does not know (a pod just started)
Index("ix_gpu_pods_node", gpu_pods.c.cluster, gpu_pods.c.node)

# the pod as the API served it, each time something that matters changed (env values and
# secrets removed)
pod_snapshots = Table(
    "pod_snapshots", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pod_uid", String(UID), nullable=False, index=True),
    Column("resource_version", String(32), nullable=False),
    Column("taken_at", DateTime(timezone=True), nullable=False),
    Column("pod_metadata", JSON, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("status", JSON, nullable=False),
    UniqueConstraint("cluster", "pod_uid", "resource_version", name="uq_pod_snapshots_version"),
)  # fmt: skip

# what changed between two snapshots: created, phase, condition, restart, deleted
gpu_pods_events = Table(
    "gpu_pods_events", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pod_uid", String(UID), nullable=False, index=True),
    Column("resource_version", String(32), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("type", String(32), nullable=False),
    Column("subject", String(NAME), nullable=False, default=""),  # condition or container
    Column("old_value", String(64), nullable=False, default=""),
    Column("new_value", String(64), nullable=False, default=""),
    UniqueConstraint("cluster", "pod_uid", "resource_version", "type", "subject",
                     name="uq_gpu_pods_events_change"),
)  # fmt: skip

# GPUs per pod container: from the pod spec, and from the node agent's container_start
pod_resources = Table(
    "pod_resources", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pod_uid", String(UID), nullable=False, index=True),
    Column("container", String(NAME), nullable=False),
    Column("source", String(16), nullable=False),  # spec, agent
    Column("resource", String(NAME), nullable=False),
    Column("count", Integer, nullable=False),
    Column("model", String(NAME), nullable=False, default=""),
    Column("devices", JSON, nullable=False),  # device paths (agent) or [] (spec)
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("cluster", "pod_uid", "container", "source",
                     name="uq_pod_resources_container"),
)  # fmt: skip

# the workloads above GPU pods, every level (ReplicaSet and its Deployment, Job and its
# CronJob, custom resources)
gpu_workloads = Table(
    "gpu_workloads", metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("uid", String(UID), primary_key=True),
    Column("api_version", String(NAME), nullable=False),
    Column("kind", String(NAME), nullable=False),
    Column("namespace", String(NAME), nullable=False),
    Column("name", String(NAME), nullable=False),
    Column("parent_uid", String(UID), nullable=True, index=True),
    Column("gpu_request", Integer, nullable=False, default=0),
    Column("gpu_resources", JSON, nullable=False),
    Column("status", String(64), nullable=False, default=""),
    Column("running", Boolean, nullable=False, default=True),
    Column("deleted", Boolean, nullable=False, default=False),
    # the recorder's finalizer is on the object (set once added, cleared once removed)
    Column("finalizer", Boolean, nullable=False, default=False, server_default=false()),
    Column("labels", JSON, nullable=False),
    Column("resource_version", String(32), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=True),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("deleted_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip

workload_pod_references = Table(
    "workload_pod_references", metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("workload_uid", String(UID), primary_key=True),
    Column("pod_uid", String(UID), primary_key=True, index=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip

# the node agents' events, as the reporters deliver them; (node, seq) once
node_events = Table(
    "node_events", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("node", String(NAME), nullable=False),
    Column("seq", BigInteger, nullable=True),  # none for a gap
    Column("at", DateTime(timezone=True), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("namespace", String(NAME), nullable=False, default=""),
    Column("pod", String(NAME), nullable=False, default=""),
    Column("pod_uid", String(UID), nullable=False, default="", index=True),
    Column("container", String(NAME), nullable=False, default=""),
    Column("payload", JSON, nullable=False),
    UniqueConstraint("cluster", "node", "seq", name="uq_node_events_seq"),
)  # fmt: skip

# every node's GPUs and RDMA ports as its agent last reported them (device_change,
# device_inventory); one row per place a device sits (a GPU's BDF, an RDMA device/port),
# kept when it goes (present false)
node_devices = Table(
    "node_devices", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(NAME), nullable=False),
    Column("kind", String(16), nullable=False),  # gpu, rdma_port
    Column("slot", String(NAME), nullable=False),
    Column("key", String(NAME), nullable=False, index=True),  # UUID, unique id, serial, ...
    Column("idx", Integer, nullable=False, default=0),
    Column("vendor", String(32), nullable=False, default=""),
    Column("model", String(NAME), nullable=False, default=""),
    Column("uuid", String(NAME), nullable=False, default=""),
    Column("serial", String(NAME), nullable=False, default="", index=True),
    Column("bdf", String(32), nullable=False, default=""),
    Column("driver_version", String(64), nullable=False, default=""),
    Column("firmware_version", String(64), nullable=False, default=""),
    Column("vbios_version", String(64), nullable=False, default=""),
    Column("port_state", String(32), nullable=False, default=""),
    Column("link_layer", String(32), nullable=False, default=""),
    Column("rate", String(64), nullable=False, default=""),
    Column("retired_pages_pending", Boolean, nullable=False, default=False),
    Column("row_remap_pending", Boolean, nullable=False, default=False),
    Column("row_remap_failure", Boolean, nullable=False, default=False),
    Column("recovery_action", String(32), nullable=False, default=""),
    Column("holder", String(NAME), nullable=False, default=""),  # namespace/pod
    Column("present", Boolean, nullable=False, default=True),
    Column("first_seen", DateTime(timezone=True), nullable=False),
    Column("last_seen", DateTime(timezone=True), nullable=False),
    UniqueConstraint("cluster", "node", "kind", "slot", name="uq_node_devices_slot"),
)  # fmt: skip

# one row per field of a device that changed: serial, firmware, port state, health, ...
# ("present" when it appeared or went)
device_changelog = Table(
    "device_changelog", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("node", String(NAME), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("slot", String(NAME), nullable=False),
    Column("device_key", String(NAME), nullable=False, index=True),
    Column("field", String(32), nullable=False),
    Column("old_value", String(NAME), nullable=False, default=""),
    Column("new_value", String(NAME), nullable=False, default=""),
)  # fmt: skip
Index(
    "ix_device_changelog_node_at",
    device_changelog.c.cluster,
    device_changelog.c.node,
    device_changelog.c.at,
)

# the cluster's nodes as the API serves them (a Node watch): what the node pages show
nodes = Table(
    "nodes", metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("name", String(NAME), primary_key=True),
    Column("address", String(64), nullable=False, default=""),  # InternalIP
    Column("status", String(16), nullable=False, default=""),  # Ready, NotReady, Unknown
    Column("gpu_capacity", JSON, nullable=False),  # {"amd.com/gpu": 8}, configured resources
    Column("gpu_allocatable", JSON, nullable=False),
    Column("labels", JSON, nullable=False),  # the ones that matter: GPU product, type, zone
    Column("cpu_count", Integer, nullable=False, default=0),
    Column("memory_bytes", BigInteger, nullable=False, default=0),
    Column("memory", String(64), nullable=False, default=""),  # the capacity as served
    Column("kernel", String(NAME), nullable=False, default=""),
    Column("os_image", String(NAME), nullable=False, default=""),
    Column("kubelet_version", String(64), nullable=False, default=""),
    Column("container_runtime", String(NAME), nullable=False, default=""),
    Column("taints", Integer, nullable=False, default=0),  # how many (a tainted node is faulty)
    Column("deleted", Boolean, nullable=False, default=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip

# every jobs.allocation_seconds: per node (and node "" for the cluster) the GPUs allocatable
# and those running pods requested
allocation_snapshots = Table(
    "allocation_snapshots", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("node", String(NAME), nullable=False),
    Column("allocatable", Integer, nullable=False),
    Column("requested", Integer, nullable=False),
    Column("rate", Float, nullable=False),  # percent
)  # fmt: skip
Index(
    "ix_allocation_snapshots_node_at",
    allocation_snapshots.c.cluster,
    allocation_snapshots.c.node,
    allocation_snapshots.c.at,
)

# one row per completed hour: the cluster's GPU capacity, allocation and utilization
cluster_gpu_hourly_stats = Table(
    "cluster_gpu_hourly_stats", metadata,
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
)  # fmt: skip

# every jobs.allocation_seconds, per dimension (namespace, label, annotation, workload): the
# GPUs running pods requested; allocation_details holds what the hour's statistics need
gpu_allocation_snapshots = Table(
    "gpu_allocation_snapshots", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("cluster_name", String(NAME), nullable=False),
    Column("snapshot_time", DateTime(timezone=True), nullable=False),
    Column("dimension_type", String(16), nullable=False),  # cluster, namespace, label, ...
    Column("dimension_key", String(NAME), nullable=False, default=""),
    Column("dimension_value", String(NAME), nullable=False, default=""),
    Column("total_gpu_capacity", Integer, nullable=False),
    Column("allocated_gpu_count", Integer, nullable=False),
    Column("allocation_details", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip
Index(
    "ix_gpu_allocation_snapshots_type_time",
    gpu_allocation_snapshots.c.cluster_name,
    gpu_allocation_snapshots.c.dimension_type,
    gpu_allocation_snapshots.c.snapshot_time,
)

# one row per namespace and completed hour
namespace_gpu_hourly_stats = Table(
    "namespace_gpu_hourly_stats", metadata,
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
    UniqueConstraint("cluster_name", "namespace", "stat_hour",
                     name="uq_namespace_gpu_hourly_stats_hour"),
)  # fmt: skip
# the Statistics pages read every namespace's hours of a span
Index(
    "ix_namespace_gpu_hourly_stats_hour",
    namespace_gpu_hourly_stats.c.cluster_name,
    namespace_gpu_hourly_stats.c.stat_hour,
)

# one row per label or annotation value and completed hour
label_gpu_hourly_stats = Table(
    "label_gpu_hourly_stats", metadata,
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
    UniqueConstraint("cluster_name", "dimension_type", "dimension_key", "dimension_value",
                     "stat_hour", name="uq_label_gpu_hourly_stats_hour"),
)  # fmt: skip

# one row per top workload and completed hour
workload_gpu_hourly_stats = Table(
    "workload_gpu_hourly_stats", metadata,
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
    UniqueConstraint("cluster_name", "owner_uid", "stat_hour",
                     name="uq_workload_gpu_hourly_stats_hour"),
)  # fmt: skip
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
    "gpu_usage_weekly_reports", metadata,
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
)  # fmt: skip

# training progress from the pods' logs (POST /logs): one row per progress line a format
# parsed; line_key (the pod, the line's time and text) makes a line sent twice one row
training_points = Table(
    "training_points", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("workload_uid", String(UID), nullable=False),  # the pod's top workload
    Column("pod_uid", String(UID), nullable=False),
    Column("namespace", String(NAME), nullable=False),
    Column("pod", String(NAME), nullable=False),
    Column("node", String(NAME), nullable=False, default=""),
    Column("at", DateTime(timezone=True), nullable=False),  # the line's time
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("format", String(32), nullable=False),  # megatron, torchtitan, hf_trainer, ...
    Column("iteration", BigInteger, nullable=True),
    Column("target_iterations", BigInteger, nullable=True),
    Column("iteration_seconds", Float, nullable=True),
    Column("tokens_per_second", Float, nullable=True),  # per GPU
    Column("tflops_per_gpu", Float, nullable=True),
    Column("loss", Float, nullable=True),
    Column("skipped_iterations", Integer, nullable=True),
    Column("nan_iterations", Integer, nullable=True),
    Column("samples_per_second", Float, nullable=True),
    Column("line_key", String(64), nullable=False),
    UniqueConstraint("cluster", "line_key", name="uq_training_points_line"),
)  # fmt: skip
Index("ix_training_points_workload_at", training_points.c.workload_uid, training_points.c.at)

# what the service found in a workload's progress and signals: training_slowdown,
# training_stalled, outlier (a pod apart from the others on a signal)
training_events = Table(
    "training_events", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("workload_uid", String(UID), nullable=False),  # the top workload
    Column("namespace", String(NAME), nullable=False),
    Column("workload", String(NAME), nullable=False),  # its name
    Column("pod_uid", String(UID), nullable=False, default=""),  # "" for the whole workload
    Column("pod", String(NAME), nullable=False, default=""),
    Column("node", String(NAME), nullable=False, default=""),
    Column("kind", String(32), nullable=False),
    Column("signal", String(32), nullable=False, default=""),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("iteration", BigInteger, nullable=True),
    Column("value", Float, nullable=True),  # the iteration's seconds, the signal's value
    Column("baseline", Float, nullable=True),  # the median it was compared with
    Column("detail", JSON, nullable=False),
)  # fmt: skip
Index("ix_training_events_workload_at", training_events.c.workload_uid, training_events.c.at)

# leadership among replicas (recorder.leader_election): the current term of a Lease, the
# one row every leader write locks and checks (a write of an older term is refused), and
# every term's holder with when it began and when it wrote first and last
recorder_leader = Table(
    "recorder_leader", metadata,
    Column("name", String(NAME), primary_key=True),  # the Lease's name
    Column("term", BigInteger, nullable=False),
    Column("holder", String(NAME), nullable=False),
    Column("endpoint", String(NAME), nullable=False, default=""),  # its REST, host:port
    Column("since", DateTime(timezone=True), nullable=False),
)  # fmt: skip
leader_terms = Table(
    "leader_terms", metadata,
    Column("name", String(NAME), primary_key=True),
    Column("term", BigInteger, primary_key=True),
    Column("holder", String(NAME), nullable=False),
    Column("endpoint", String(NAME), nullable=False, default=""),
    Column("acquired_at", DateTime(timezone=True), nullable=False),
    Column("first_write_at", DateTime(timezone=True), nullable=True),
    Column("last_write_at", DateTime(timezone=True), nullable=True),
    Column("writes", BigInteger, nullable=False, default=0),  # transactions of the term
)  # fmt: skip

# -- alerts (docs/recorder/alerts.md): Alertmanager's and our own, kept with their history
# and what they concern; silences; metric and log rules and the log rules' templates;
# notification channels and what was sent through them. Service tables: each row names
# its cluster (cluster_name; "" = every cluster, where a rule or silence applies to all)
alert_events = Table(
    "alert_events", metadata,
    Column("id", String(64), primary_key=True),  # Alertmanager's fingerprint, or ours
    Column("source", String(20), nullable=False),  # metric, log, lens, webhook
    Column("alert_name", String(NAME), nullable=False),
    Column("severity", String(20), nullable=False),  # critical, high, warning, info
    Column("status", String(20), nullable=False),  # firing, resolved, silenced
    Column("starts_at", DateTime(timezone=True), nullable=False),
    Column("ends_at", DateTime(timezone=True), nullable=True),
    Column("labels", JSON, nullable=False),
    Column("annotations", JSON, nullable=False),
    Column("workload_id", String(UID), nullable=False, default=""),  # the top workload's uid
    Column("workload_name", String(NAME), nullable=False, default=""),
    Column("pod_name", String(NAME), nullable=False, default=""),
    Column("pod_id", String(UID), nullable=False, default=""),
    Column("node_name", String(NAME), nullable=False, default=""),
    Column("cluster_name", String(NAME), nullable=False, default=""),
    Column("raw_data", JSON, nullable=False),
    Column("enriched_data", JSON, nullable=False),
    Column("route_key", String(NAME), nullable=False, default=""),  # the log rule's group
    Column("notified_at", DateTime(timezone=True), nullable=True),
    Column("notification_status", String(20), nullable=False, default=""),  # sent, failed
    Column("fired", Integer, nullable=False, default=1),  # times it fired (again after resolved)
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip
Index("ix_alert_events_starts", alert_events.c.starts_at)
Index("ix_alert_events_workload", alert_events.c.workload_id, alert_events.c.starts_at)
Index("ix_alert_events_node", alert_events.c.node_name, alert_events.c.starts_at)
Index("ix_alert_events_status", alert_events.c.status, alert_events.c.severity)

alert_silences = Table(
    "alert_silences", metadata,
    Column("id", String(64), primary_key=True),  # a UUID
    Column("name", String(NAME), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("cluster_name", String(NAME), nullable=False, default=""),  # "": every cluster
    Column("enabled", Boolean, nullable=False, default=True),
    Column("silence_type", String(32), nullable=False),  # resource, label, alert_name
    Column("resource_filters", JSON, nullable=False),  # [{resource_type, operator, value}]
    Column("label_matchers", JSON, nullable=False),  # [{name, operator, value}]
    Column("alert_names", JSON, nullable=False),  # [name]
    Column("match_expression", Text, nullable=False, default=""),
    Column("starts_at", DateTime(timezone=True), nullable=False),
    Column("ends_at", DateTime(timezone=True), nullable=True),  # None: permanent
    Column("reason", Text, nullable=False, default=""),
    Column("ticket_url", String(500), nullable=False, default=""),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("alertmanager_id", String(64), nullable=False, default=""),  # its silence there
    Column("alertmanager_error", Text, nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip
silenced_alerts = Table(
    "silenced_alerts", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("silence_id", String(64), nullable=False, index=True),
    Column("alert_id", String(64), nullable=False, index=True),
    Column("alert_name", String(NAME), nullable=False),
    Column("cluster_name", String(NAME), nullable=False, default=""),
    Column("silenced_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("silence_id", "alert_id", name="uq_silenced_alerts"),
)  # fmt: skip

metric_alert_rules = Table(
    "metric_alert_rules", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("name", String(NAME), nullable=False),
    Column("cluster_name", String(NAME), nullable=False),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("groups", JSON, nullable=False),  # Prometheus rule groups: [{name, interval, rules}]
    Column("description", Text, nullable=False, default=""),
    Column("labels", JSON, nullable=False),
    # built_in: a group deploy/prometheus-operator/prometheusrule.yaml ships (read only)
    Column("built_in", Boolean, nullable=False, default=False),
    Column("sync_status", String(20), nullable=False, default="pending"),  # synced, failed
    Column("sync_message", Text, nullable=False, default=""),
    Column("last_sync_at", DateTime(timezone=True), nullable=True),
    Column("alert_routing", JSON, nullable=True),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("name", "cluster_name", name="uq_metric_alert_rules_name"),
)  # fmt: skip

log_alert_rules = Table(
    "log_alert_rules", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("name", String(NAME), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("cluster_name", String(NAME), nullable=False),
    Column("enabled", Boolean, nullable=False, default=True),
    Column("priority", Integer, nullable=False, default=50),
    Column("label_selectors", JSON, nullable=False),  # [{key, operator, value}]
    Column("match_type", String(32), nullable=False),  # pattern, threshold
    Column("match_config", JSON, nullable=False),
    Column("severity", String(20), nullable=False, default="warning"),
    Column("alert_template", JSON, nullable=False),  # {summary, description, labels}
    Column("group_by", JSON, nullable=False),  # what one alert is per: workload, pod, node
    Column("group_wait", Integer, nullable=False, default=30),  # seconds
    Column("repeat_interval", Integer, nullable=False, default=3600),  # seconds
    Column("template_id", BigInteger, nullable=True),  # the shipped template it came from
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("last_triggered_at", DateTime(timezone=True), nullable=True),
    Column("trigger_count", BigInteger, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("name", "cluster_name", name="uq_log_alert_rules_name"),
)  # fmt: skip
log_alert_rule_templates = Table(
    "log_alert_rule_templates", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("name", String(NAME), nullable=False, unique=True),
    Column("category", String(50), nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("template_config", JSON, nullable=False),  # a log rule's fields
    Column("tags", JSON, nullable=False),
    Column("is_builtin", Boolean, nullable=False, default=False),
    Column("usage_count", BigInteger, nullable=False, default=0),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip

notification_channels = Table(
    "notification_channels", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("name", String(NAME), nullable=False, unique=True),
    Column("type", String(50), nullable=False),  # webhook, alertmanager (ours send); others kept
    Column("enabled", Boolean, nullable=False, default=True),
    Column("config", JSON, nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip
alert_notifications = Table(
    "alert_notifications", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("alert_id", String(64), nullable=False, index=True),
    Column("channel", String(NAME), nullable=False),  # "alertmanager", or a channel's name
    Column("status", String(20), nullable=False),  # firing or resolved
    Column("sent_at", DateTime(timezone=True), nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("error_message", Text, nullable=False, default=""),
)  # fmt: skip

# -- management (docs/recorder/management.md) -----------------------------------------------
# every run of a recorder job the leader ran: when, how it ended, its error and the writes
# it made; kept recorder.job_history.retention_days
job_execution_history = Table(
    "job_execution_history", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
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
)  # fmt: skip
Index("ix_job_execution_history_started", job_execution_history.c.started_at)
Index("ix_job_execution_history_job", job_execution_history.c.job_name,
      job_execution_history.c.started_at)  # fmt: skip
Index("ix_job_execution_history_status", job_execution_history.c.status,
      job_execution_history.c.started_at)  # fmt: skip

# a workload's training or inference framework, as its evidence says (frameworks.py): one
# row per top workload, and one row per piece of evidence (a log format seen, an image, a
# command line, an environment name, a label), kept as it was last seen
workload_detections = Table(
    "workload_detections", metadata,
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
)  # fmt: skip
workload_detection_evidence = Table(
    "workload_detection_evidence", metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
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
)  # fmt: skip

# the clusters the Management pages manage: what the multi-cluster Secret does not hold
# (its kubeconfig stays there, never here): names and notes, the default, the release
managed_clusters = Table(
    "managed_clusters", metadata,
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
)  # fmt: skip
# what was done to a cluster on the pages' asking: the agent's objects installed
# (initialize, deploy, rollback), each object's outcome in its logs
cluster_tasks = Table(
    "cluster_tasks", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
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
)  # fmt: skip
# the settings changed at run time (settings.py) and every change made (the audit)
system_config = Table(
    "system_config", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("key", String(NAME), nullable=False, unique=True),
    Column("value", JSON, nullable=False),
    Column("description", Text, nullable=False, default=""),
    Column("category", String(64), nullable=False, default=""),
    Column("version", Integer, nullable=False, default=1),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("updated_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)  # fmt: skip
system_config_history = Table(
    "system_config_history", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("config_id", BigInteger, nullable=False),
    Column("key", String(NAME), nullable=False, index=True),
    Column("old_value", JSON, nullable=True),  # none: set for the first time
    Column("new_value", JSON, nullable=True),  # none: deleted (back to its default)
    Column("version", Integer, nullable=False),
    Column("change_reason", Text, nullable=False, default=""),
    Column("changed_at", DateTime(timezone=True), nullable=False),
    Column("changed_by", String(NAME), nullable=False, default=""),
)  # fmt: skip
# lens-ebpf versions the Release page offers (an image registry and tag each)
release_versions = Table(
    "release_versions", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
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
)  # fmt: skip
# a log rule as it was before each change (its versions; a rollback restores one)
log_alert_rule_versions = Table(
    "log_alert_rule_versions", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
           autoincrement=True),
    Column("rule_id", BigInteger, nullable=False),
    Column("version", Integer, nullable=False),
    Column("config", JSON, nullable=False),
    Column("status", String(16), nullable=False, default="active"),  # active, superseded
    Column("deployed_at", DateTime(timezone=True), nullable=True),
    Column("created_by", String(NAME), nullable=False, default=""),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("rule_id", "version", name="uq_log_alert_rule_versions"),
)  # fmt: skip

# py-spy runs the API asked for (pyspy/sample) or a stall took (the rank's stack): the
# task's lifecycle (pending, running, completed, failed, cancelled) and py-spy's output
pyspy_tasks = Table(
    "pyspy_tasks", metadata,
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
)  # fmt: skip
Index("ix_pyspy_tasks_created", pyspy_tasks.c.cluster, pyspy_tasks.c.created_at)

# PyTorch profiler traces the agents found in a workload's containers (issue 71): listed as
# found, their bytes fetched from the agent on request, kept in chunks until the retention
profiler_files = Table(
    "profiler_files", metadata,
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
)  # fmt: skip
Index("ix_profiler_files_place", profiler_files.c.cluster, profiler_files.c.pod_uid,
      profiler_files.c.container_id, profiler_files.c.path, profiler_files.c.mtime,
      unique=True)  # fmt: skip
profiler_file_chunks = Table(
    "profiler_file_chunks", metadata,
    Column("file_id", Integer, primary_key=True),
    Column("chunk_index", Integer, primary_key=True),
    Column("content", LargeBinary, nullable=False),
)  # fmt: skip
# a TraceLens analysis or a trace viewer over fetched traces (the pages' sessions)
profiler_sessions = Table(
    "profiler_sessions", metadata,
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
)  # fmt: skip

# the service's own tables (not scoped by cluster: a leader's, or the alerts', whose rows
# name their cluster_name themselves)
SERVICE_TABLES = ("recorder_leader", "leader_terms", "alert_events", "alert_silences",
                  "silenced_alerts", "metric_alert_rules", "log_alert_rules",
                  "log_alert_rule_templates", "notification_channels",
                  "alert_notifications", "job_execution_history", "managed_clusters",
                  "cluster_tasks", "system_config", "system_config_history",
                  "release_versions", "log_alert_rule_versions",
                  "profiler_file_chunks")  # fmt: skip
TABLES = ("gpu_pods", "pod_snapshots", "gpu_pods_events", "pod_resources", "gpu_workloads",
          "workload_pod_references", "node_events", "node_devices",
          "device_changelog", "nodes", "allocation_snapshots",
          "cluster_gpu_hourly_stats", "training_points", "training_events",
          "gpu_allocation_snapshots", "namespace_gpu_hourly_stats", "label_gpu_hourly_stats",
          "workload_gpu_hourly_stats", "gpu_usage_weekly_reports", "workload_detections",
          "workload_detection_evidence", "pyspy_tasks", "profiler_files",
          "profiler_sessions")  # fmt: skip


class Scoped:
    """Every table as one cluster sees it: a subquery of that cluster's rows under the
    table's name, with the table's columns, so a read written against these reads one
    cluster only (the cluster API's `?cluster=`); the databases fold such a subquery into
    the query around it. Writes name the cluster themselves."""

    gpu_pods: Subquery
    pod_snapshots: Subquery
    gpu_pods_events: Subquery
    pod_resources: Subquery
    gpu_workloads: Subquery
    workload_pod_references: Subquery
    node_events: Subquery
    node_devices: Subquery
    device_changelog: Subquery
    nodes: Subquery
    allocation_snapshots: Subquery
    cluster_gpu_hourly_stats: Subquery
    training_points: Subquery
    training_events: Subquery
    gpu_allocation_snapshots: Subquery
    namespace_gpu_hourly_stats: Subquery
    label_gpu_hourly_stats: Subquery
    workload_gpu_hourly_stats: Subquery
    gpu_usage_weekly_reports: Subquery
    workload_detections: Subquery
    workload_detection_evidence: Subquery
    pyspy_tasks: Subquery
    profiler_files: Subquery
    profiler_sessions: Subquery

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        for name in TABLES:
            tab = metadata.tables[name]
            mine = tab.c.cluster if "cluster" in tab.c else tab.c.cluster_name
            setattr(self, name, select(tab).where(mine == cluster).subquery(name))


@functools.lru_cache(maxsize=256)
def scoped(cluster: str) -> Scoped:
    """The tables as cluster sees them (built once per cluster name)."""
    return Scoped(cluster)
