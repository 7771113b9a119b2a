"""The followed pods and workloads: GPU pods, their snapshots, changes and GPUs per
container, the workloads above them and which pods each holds."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
    false,
)

from lens_ebpf.recorder.store.schema.meta import NAME, UID, metadata

# one row per pod that requested GPUs; kept after the pod is deleted
gpu_pods = Table(
    "gpu_pods",
    metadata,
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
)
# a node's pods: remote write's index reads one node's again when a series names one it
# does not know (a pod just started)
Index("ix_gpu_pods_node", gpu_pods.c.cluster, gpu_pods.c.node)

# the pod as the API served it, each time something that matters changed (env values and
# secrets removed)
pod_snapshots = Table(
    "pod_snapshots",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pod_uid", String(UID), nullable=False, index=True),
    Column("resource_version", String(32), nullable=False),
    Column("taken_at", DateTime(timezone=True), nullable=False),
    Column("pod_metadata", JSON, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("status", JSON, nullable=False),
    UniqueConstraint("cluster", "pod_uid", "resource_version", name="uq_pod_snapshots_version"),
)

# what changed between two snapshots: created, phase, condition, restart, deleted
gpu_pods_events = Table(
    "gpu_pods_events",
    metadata,
    Column("cluster", String(NAME), nullable=False),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("pod_uid", String(UID), nullable=False, index=True),
    Column("resource_version", String(32), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("type", String(32), nullable=False),
    Column("subject", String(NAME), nullable=False, default=""),  # condition or container
    Column("old_value", String(64), nullable=False, default=""),
    Column("new_value", String(64), nullable=False, default=""),
    UniqueConstraint(
        "cluster",
        "pod_uid",
        "resource_version",
        "type",
        "subject",
        name="uq_gpu_pods_events_change",
    ),
)

# GPUs per pod container: from the pod spec, and from the node agent's container_start
pod_resources = Table(
    "pod_resources",
    metadata,
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
    UniqueConstraint(
        "cluster", "pod_uid", "container", "source", name="uq_pod_resources_container"
    ),
)

# the workloads above GPU pods, every level (ReplicaSet and its Deployment, Job and its
# CronJob, custom resources)
gpu_workloads = Table(
    "gpu_workloads",
    metadata,
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
)

workload_pod_references = Table(
    "workload_pod_references",
    metadata,
    Column("cluster", String(NAME), primary_key=True),
    Column("workload_uid", String(UID), primary_key=True),
    Column("pod_uid", String(UID), primary_key=True, index=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)
