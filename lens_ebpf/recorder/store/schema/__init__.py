"""The recorder's tables (SQLAlchemy Core), in one MetaData (meta.py), grouped by domain
into the modules beside this one; every table is read from here (`schema.gpu_pods`). Their
history lives in migrations/versions; a test keeps a migrated database equal to these
definitions."""

from __future__ import annotations

import functools

from sqlalchemy import Subquery, select

from lens_ebpf.recorder.store.schema.accounting import (
    allocation_snapshots,
    cluster_gpu_hourly_stats,
    gpu_allocation_snapshots,
    gpu_usage_weekly_reports,
    label_gpu_hourly_stats,
    namespace_gpu_hourly_stats,
    workload_gpu_hourly_stats,
)
from lens_ebpf.recorder.store.schema.alerts import (
    alert_events,
    alert_notifications,
    alert_silences,
    log_alert_rule_templates,
    log_alert_rule_versions,
    log_alert_rules,
    metric_alert_rules,
    notification_channels,
    silenced_alerts,
)
from lens_ebpf.recorder.store.schema.leadership import leader_terms, recorder_leader
from lens_ebpf.recorder.store.schema.management import (
    cluster_tasks,
    job_execution_history,
    managed_clusters,
    release_versions,
    system_config,
    system_config_history,
    workload_detection_evidence,
    workload_detections,
)
from lens_ebpf.recorder.store.schema.meta import NAME, UID, metadata
from lens_ebpf.recorder.store.schema.nodes import device_changelog, node_devices, node_events, nodes
from lens_ebpf.recorder.store.schema.pods import (
    gpu_pods,
    gpu_pods_events,
    gpu_workloads,
    pod_resources,
    pod_snapshots,
    workload_pod_references,
)
from lens_ebpf.recorder.store.schema.profiler import (
    profiler_file_chunks,
    profiler_files,
    profiler_sessions,
    pyspy_tasks,
)
from lens_ebpf.recorder.store.schema.training import training_events, training_points

__all__ = [
    "metadata",
    "UID",
    "NAME",
    "gpu_pods",
    "pod_snapshots",
    "gpu_pods_events",
    "pod_resources",
    "gpu_workloads",
    "workload_pod_references",
    "node_events",
    "node_devices",
    "device_changelog",
    "nodes",
    "allocation_snapshots",
    "cluster_gpu_hourly_stats",
    "gpu_allocation_snapshots",
    "namespace_gpu_hourly_stats",
    "label_gpu_hourly_stats",
    "workload_gpu_hourly_stats",
    "gpu_usage_weekly_reports",
    "training_points",
    "training_events",
    "recorder_leader",
    "leader_terms",
    "alert_events",
    "alert_silences",
    "silenced_alerts",
    "metric_alert_rules",
    "log_alert_rules",
    "log_alert_rule_templates",
    "notification_channels",
    "alert_notifications",
    "log_alert_rule_versions",
    "job_execution_history",
    "workload_detections",
    "workload_detection_evidence",
    "managed_clusters",
    "cluster_tasks",
    "system_config",
    "system_config_history",
    "release_versions",
    "pyspy_tasks",
    "profiler_files",
    "profiler_file_chunks",
    "profiler_sessions",
    "SERVICE_TABLES",
    "TABLES",
    "Scoped",
    "scoped",
]

# the service's own tables (not scoped by cluster: a leader's, or the alerts', whose rows
# name their cluster_name themselves)
SERVICE_TABLES = (
    "recorder_leader",
    "leader_terms",
    "alert_events",
    "alert_silences",
    "silenced_alerts",
    "metric_alert_rules",
    "log_alert_rules",
    "log_alert_rule_templates",
    "notification_channels",
    "alert_notifications",
    "job_execution_history",
    "managed_clusters",
    "cluster_tasks",
    "system_config",
    "system_config_history",
    "release_versions",
    "log_alert_rule_versions",
    "profiler_file_chunks",
)
TABLES = (
    "gpu_pods",
    "pod_snapshots",
    "gpu_pods_events",
    "pod_resources",
    "gpu_workloads",
    "workload_pod_references",
    "node_events",
    "node_devices",
    "device_changelog",
    "nodes",
    "allocation_snapshots",
    "cluster_gpu_hourly_stats",
    "training_points",
    "training_events",
    "gpu_allocation_snapshots",
    "namespace_gpu_hourly_stats",
    "label_gpu_hourly_stats",
    "workload_gpu_hourly_stats",
    "gpu_usage_weekly_reports",
    "workload_detections",
    "workload_detection_evidence",
    "pyspy_tasks",
    "profiler_files",
    "profiler_sessions",
)


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
