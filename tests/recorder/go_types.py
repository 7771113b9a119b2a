"""Every route of the Primus-Lens API the recorder serves, its answer's types as the
original's Go structs declare them (AMD-AGI/Primus-SaFE at dd69b3c, `Lens/modules`;
lens-ebpf's own routes as docs/recorder/ says them), for tests/recorder/test_types.py.

A schema is a type, a list of one schema, or {field: schema} (a struct: every field
present, never null; fields beyond them are lens-ebpf's additions, not checked), or
{"*": schema} (a map: any keys). Types: "number" (float64: a whole number is one too),
"integer", "string", "boolean" (never null: a Go non-pointer); TIME (a time.Time: an
RFC 3339 string, or null where the pages read a zero time as none: no end, never
synced); MAP (a map or dbmodel.ExtType: an object of any keys, or null); ANY. A type
ending in "?" is a pointer field (`*float64`): null allowed. A list is never null.
"""

from __future__ import annotations

from typing import Any

from tests.recorder.test_cluster_api import CONTRACTS, METRIC_CONTRACTS, OVERVIEW, POD

GO = "Lens/modules"
NUM, INT, STR, BOOL = "number", "integer", "string", "boolean"
TIME, MAP, ANY = "time", "object", "any"


def nulls_allowed(t: str) -> bool:
    return t.endswith("?") or t in (TIME, MAP, ANY)


def violations(value: Any, schema: Any, where: str = "$") -> list[str]:
    """Where value breaks schema: a null where the Go type has none, a wrong type, a
    struct field missing."""
    if isinstance(schema, str):
        base = schema.rstrip("?")
        if value is None:
            return [] if nulls_allowed(schema) else [f"{where}: null, the original's {base}"]
        ok = {
            NUM: isinstance(value, int | float) and not isinstance(value, bool),
            INT: isinstance(value, int) and not isinstance(value, bool),
            STR: isinstance(value, str),
            BOOL: isinstance(value, bool),
            TIME: isinstance(value, str),
            MAP: isinstance(value, dict),
            ANY: True,
        }[base]
        return [] if ok else [f"{where}: {value!r}, not a {base}"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{where}: {value!r}, not a list"]
        return [
            v for i, item in enumerate(value) for v in violations(item, schema[0], f"{where}[{i}]")
        ]
    if set(schema) == {"*"}:
        if value is None:
            return []
        if not isinstance(value, dict):
            return [f"{where}: {value!r}, not a map"]
        return [
            v for k, item in value.items() for v in violations(item, schema["*"], f"{where}[{k!r}]")
        ]
    if not isinstance(value, dict):
        return [f"{where}: {value!r}, not an object"]
    out = [f"{where}.{k}: missing" for k in schema if k not in value]
    return out + [
        v for k, s in schema.items() if k in value for v in violations(value[k], s, f"{where}.{k}")
    ]


def from_test(schema: Any) -> Any:
    """A schema of test_cluster_api.py's (its "object" a map of any keys) as this
    module's."""
    if isinstance(schema, list):
        return [from_test(s) for s in schema]
    if isinstance(schema, dict):
        return {k: from_test(v) for k, v in schema.items()}
    return MAP if schema == "object" else schema


def paged(row: Any) -> dict[str, Any]:
    return {"data": [row], "total": INT}


POINT = {"timestamp": INT, "value": NUM}  # model.TimePoint
GRAPH = {
    "serial": INT,
    "series": [{"labels": {"*": STR}, "values": [POINT]}],
    "config": {"y_axis_unit": STR},
}  # model.MetricsGraph (core/pkg/model/common.go)
HIERARCHY: dict[str, Any] = {
    "kind": STR,
    "name": STR,
    "namespace": STR,
    "uid": STR,
    "children": [MAP],
}
HEAT_AXIS = {
    "serial": INT,
    "unit": STR,
    "yaxis_max": NUM,
    "yaxis_min": NUM,
    "Data": [{"node_name": STR, "gpu_id": INT, "value": NUM}],
}  # model.Heatmap
WORKLOAD_ITEM = {
    "kind": STR,
    "name": STR,
    "namespace": STR,
    "uid": STR,
    "gpu_allocated": INT,
    "gpu_allocation": {"*": NUM},
    "status": STR,
    "status_color": STR,
    "start_at": INT,
    "end_at": INT,
    "source": STR,
    "instant_gpu_utilization": NUM,
    "avg_gpu_utilization": NUM,
    "p50_gpu_utilization": NUM,
    "p90_gpu_utilization": NUM,
    "p95_gpu_utilization": NUM,
}  # model.WorkloadListItem
DEVICE = {
    "kind": STR,
    "slot": STR,
    "key": STR,
    "index": INT,
    "vendor": STR,
    "model": STR,
    "uuid": STR,
    "serial": STR,
    "bdf": STR,
    "driver_version": STR,
    "firmware_version": STR,
    "vbios_version": STR,
    "port_state": STR,
    "link_layer": STR,
    "rate": STR,
    "retired_pages_pending": BOOL,
    "row_remap_pending": BOOL,
    "row_remap_failure": BOOL,
    "recovery_action": STR,
    "holder": STR,
    "present": BOOL,
    "first_seen": INT,
    "last_seen": INT,
}
CHANGE = {
    "time": INT,
    "node": STR,
    "kind": STR,
    "slot": STR,
    "device_key": STR,
    "field": STR,
    "old": STR,
    "new": STR,
}
# dbmodel.AlertEvents (core/pkg/database/model/alert_events.gen.go); ends_at, notified_at
# time.Time (null: none yet); labels, annotations, raw_data, enriched_data ExtType
ALERT = {
    "id": STR,
    "source": STR,
    "alert_name": STR,
    "severity": STR,
    "status": STR,
    "starts_at": TIME,
    "ends_at": TIME,
    "created_at": TIME,
    "updated_at": TIME,
    "labels": MAP,
    "annotations": MAP,
    "workload_id": STR,
    "workload_name": STR,
    "pod_name": STR,
    "pod_id": STR,
    "node_name": STR,
    "cluster_name": STR,
    "raw_data": MAP,
    "enriched_data": MAP,
    "route_key": STR,
    "notified_at": TIME,
    "notification_status": STR,
}
# dbmodel.AlertSilences as the silence API answers it (resource_filters, label_matchers,
# alert_names: the lists the dialog edits); alertmanager_id/_error: lens-ebpf's (null
# where the silence is not made in Alertmanager)
SILENCE = {
    "id": STR,
    "name": STR,
    "description": STR,
    "cluster_name": STR,
    "enabled": BOOL,
    "silence_type": STR,
    "resource_filters": [MAP],
    "label_matchers": [MAP],
    "alert_names": [STR],
    "match_expression": STR,
    "starts_at": TIME,
    "ends_at": TIME,
    "reason": STR,
    "ticket_url": STR,
    "created_by": STR,
    "created_at": TIME,
    "updated_at": TIME,
    "silenced_count": INT,
    "alertmanager_id": "string?",
    "alertmanager_error": "string?",
}
# dbmodel.LogAlertRules (log_alert_rules.gen.go); template_id lens-ebpf's (none: null)
LOG_RULE = {
    "id": INT,
    "name": STR,
    "description": STR,
    "cluster_name": STR,
    "enabled": BOOL,
    "priority": INT,
    "label_selectors": ANY,
    "match_type": STR,
    "match_config": MAP,
    "severity": STR,
    "alert_template": MAP,
    "group_by": ANY,
    "group_wait": INT,
    "repeat_interval": INT,
    "created_at": TIME,
    "updated_at": TIME,
    "created_by": STR,
    "last_triggered_at": TIME,
    "trigger_count": INT,
    "template_id": "integer?",
}
# MetricAlertRuleResponse: dbmodel.MetricAlertRules (metric_alert_rules.gen.go)
METRIC_RULE = {
    "id": INT,
    "name": STR,
    "cluster_name": STR,
    "enabled": BOOL,
    "groups": ANY,
    "description": STR,
    "labels": MAP,
    "sync_status": STR,
    "sync_message": STR,
    "last_sync_at": TIME,
    "alert_routing": MAP,
    "created_at": TIME,
    "updated_at": TIME,
    "created_by": STR,
}
# LogAlertRuleTemplateResponse (api/pkg/api/log_alert_rule_template.go)
TEMPLATE = {
    "id": INT,
    "name": STR,
    "category": STR,
    "description": STR,
    "template_config": MAP,
    "tags": [STR],
    "is_builtin": BOOL,
    "usage_count": INT,
    "created_by": STR,
    "created_at": TIME,
    "updated_at": TIME,
}
# NotificationChannelResponse (api/pkg/api/notification_channel.go)
CHANNEL = {
    "id": INT,
    "name": STR,
    "type": STR,
    "enabled": BOOL,
    "config": MAP,
    "description": STR,
    "created_at": TIME,
    "updated_at": TIME,
    "created_by": STR,
}
REPORT = {
    "id": STR,
    "cluster_name": STR,
    "period_start": STR,
    "period_end": STR,
    "generated_at": STR,
    "status": STR,
    "has_html": BOOL,
    "has_pdf": BOOL,
    "has_json": BOOL,
    "metadata": MAP,
}  # WeeklyReportItem (api/pkg/api/weekly_report.go)
OFFSET = {"total": INT, "offset": INT, "limit": INT}
OURS = "lens-ebpf's own route"

CONTRACT: dict[str, tuple[str, Any]] = {
    # -- clusters, nodes, workloads (core/pkg/model, api/pkg/api/unified_*.go) -------------
    "GET clusters": (
        f"{OURS} (docs/recorder/clusters.md)",
        [{"name": STR, "source": STR, "up": BOOL, "error": STR, "home": BOOL}],
    ),
    "GET clusters/allocation": (
        f"{OURS} (docs/recorder/api.md)",
        {"points": [{"timestamp": INT, "allocatable": INT, "requested": INT, "rate": NUM}]},
    ),
    "GET clusters/consumers": (
        f"{GO}/core/pkg/model/resource.go TopLevelGpuResource",
        paged(
            {
                "kind": STR,
                "name": STR,
                "namespace": STR,
                "uid": STR,
                "stat": {"gpu_request": INT, "gpu_utilization": NUM},
                "pods": [MAP],
                "source": STR,
            }
        ),
    ),
    "GET clusters/gpuHeatmap": (
        f"{GO}/core/pkg/model model.Heatmap",
        {"utilization": HEAT_AXIS, "temperature": HEAT_AXIS, "power": HEAT_AXIS},
    ),
    "GET clusters/overview": (f"{GO}/core/pkg/model/gpu.go GpuClusterOverview", OVERVIEW),
    "GET nodes/gpuUtilization": (
        f"{GO}/core/pkg/model model.GPUUtilization",
        {"allocationRate": NUM, "utilization": NUM},
    ),
    "GET nodes/gpuUtilizationHistory": (
        f"{GO}/core/pkg/model model.GpuUtilizationHistory",
        {"allocationRate": [POINT], "utilization": [POINT], "vramUtilization": [POINT]},
    ),
    "GET nodes/{name}/gpuDevices": (
        f"{GO}/api/pkg/api/unified_node.go " "NodeGPUDevicesResponse (model.GpuDeviceInfo)",
        {
            "node_name": STR,
            "cluster_name": STR,
            "devices": [
                {
                    "deviceId": INT,
                    "model": STR,
                    "memory": STR,
                    "utilization": NUM,
                    "temperature": NUM,
                    "power": NUM,
                }
            ],
        },
    ),
    "GET nodes/{name}/gpuMetrics": (
        f"{GO}/api/pkg/api/node.go (two model.MetricsGraph)",
        {"gpu_utilization": GRAPH, "gpu_allocation_rate": GRAPH},
    ),
    "GET nodes/{name}/workloads": (
        f"{GO}/api/pkg/api/unified_node.go NodeWorkloadsResponse " "(model.WorkloadNodeView)",
        paged(
            {
                "kind": STR,
                "name": STR,
                "namespace": STR,
                "uid": STR,
                "gpu_allocated": INT,
                "gpu_allocated_node": INT,
                "node_name": STR,
                "status": STR,
            }
        ),
    ),
    "GET nodes/{name}/workloadsHistory": (
        f"{GO}/api/pkg/api/unified_node.go " "NodeWorkloadsHistoryResponse",
        paged(
            {
                "kind": STR,
                "name": STR,
                "namespace": STR,
                "uid": STR,
                "gpu_allocated": INT,
                "pod_name": STR,
                "pod_namespace": STR,
                "start_time": INT,
                "end_time": INT,
            }
        ),
    ),
    "GET workloadMetadata": (
        f"{GO}/api/pkg/api/unified_workload.go",
        {"namespaces": [STR], "kinds": [STR]},
    ),
    "GET workloads": (
        f"{GO}/api/pkg/api/unified_workload.go WorkloadListResponse",
        paged(WORKLOAD_ITEM),
    ),
    "GET workloads/hierarchy": (f"{GO}/core/pkg/model model.WorkloadHierarchyItem", HIERARCHY),
    "GET workloads/{uid}/hierarchy": (
        f"{GO}/core/pkg/model model.WorkloadHierarchyItem",
        HIERARCHY,
    ),
    "GET workloads/{uid}": (
        f"{GO}/core/pkg/model model.WorkloadInfo",
        {
            "apiVersion": STR,
            "kind": STR,
            "name": STR,
            "namespace": STR,
            "uid": STR,
            "gpu_allocation": {"*": NUM},
            "pods": [POD],
            "activePods": [POD],
            "startTime": INT,
            "endTime": INT,
            "source": STR,
        },
    ),
    "GET workloads/{uid}/metrics": (
        f"{GO}/api/pkg/api/unified_workload.go " "map of model.MetricsGraph",
        {"*": GRAPH},
    ),
    # -- a node's devices, storage, training, the cluster API's remote write maps ---------
    "GET nodes/{name}/devices": (
        f"{OURS} (docs/recorder/devices.md)",
        {"node_name": STR, "devices": [DEVICE]},
    ),
    "GET nodes/{name}/devices/changelog": (f"{OURS} (docs/recorder/devices.md)", paged(CHANGE)),
    "GET devices/{serial}/history": (
        f"{OURS} (docs/recorder/devices.md)",
        {"serial": STR, "places": [DEVICE], "changes": [CHANGE], "holders": [MAP], "faults": [MAP]},
    ),
    "GET storage/overview": (
        f"{OURS} (docs/recorder/storage.md: usage null where the scan " "could not read it)",
        {
            "scanned_at": INT,
            "incomplete": [STR],
            "backends": [
                {
                    "storage_class": STR,
                    "provisioner": STR,
                    "csi_driver": STR,
                    "default": BOOL,
                    "healthy": BOOL,
                    "reasons": [STR],
                    "pvs": INT,
                    "pvcs": INT,
                    "bound": INT,
                    "pending": INT,
                    "capacity_requested_bytes": INT,
                    "capacity_bytes": INT,
                    "used_bytes": "integer?",
                    "pods": "integer?",
                }
            ],
        },
    ),
    "GET storage/volumes": (
        f"{OURS} (docs/recorder/storage.md)",
        {
            "total": INT,
            "scanned_at": INT,
            "data": [
                {
                    "namespace": STR,
                    "name": STR,
                    "storage_class": STR,
                    "phase": STR,
                    "volume": STR,
                    "access_modes": [STR],
                    "requested_bytes": INT,
                    "capacity_bytes": INT,
                    "used_bytes": "integer?",
                    "available_bytes": "integer?",
                    "pods": ANY,
                    "nodes": ANY,
                }
            ],
        },
    ),
    "GET workloads/{uid}/timeline": (
        f"{OURS} (docs/recorder/training.md)",
        {
            "uid": STR,
            "kind": STR,
            "name": STR,
            "namespace": STR,
            "start": INT,
            "end": INT,
            "pods": [STR],
            "incomplete": [STR],
            "entries": [
                {
                    "time": NUM,
                    "type": STR,
                    "pod": STR,
                    "node": STR,
                    "device": STR,
                    "message": STR,
                    "detail": MAP,
                }
            ],
        },
    ),
    "GET workloads/{uid}/trainingPerformance": (
        f"{OURS}: its points and summary (docs/recorder/training.md; the original's "
        "[]GrafanaMetricsPoint is not served), a figure no line gave null",
        {
            "points": [{"time": NUM, "pod": STR, "node": STR, "format": STR}],
            "summary": {
                "iterations": INT,
                "mean_iteration_seconds": "number?",
                "p50_iteration_seconds": "number?",
                "p95_iteration_seconds": "number?",
                "tokens_per_second": "number?",
                "tflops_per_gpu": "number?",
                "last_loss": "number?",
            },
        },
    ),
    "GET pods/cache": (
        f"{GO}/telemetry-processor (its pods cache)",
        {"updated_at": INT, "cache": MAP, "since": MAP},
    ),
    "GET pods/workload/cache": (
        f"{GO}/telemetry-processor (its workload cache)",
        {"updated_at": INT, "cache": MAP, "by_uid": MAP},
    ),
    # -- weekly reports (api/pkg/api/unified_weekly_report.go) ------------------------------
    "GET weekly-reports/gpu_utilization": (
        "WeeklyReportsListResponse",
        {"total": INT, "page": INT, "size": INT, "reports": [REPORT]},
    ),
    "GET weekly-reports/gpu_utilization/latest": (
        "WeeklyReportDetailResponse",
        {**REPORT, "json_content": MAP},
    ),
    "GET weekly-reports/gpu_utilization/{id}": (
        "WeeklyReportDetailResponse",
        {**REPORT, "json_content": MAP},
    ),
    # -- alerts (api/pkg/api/unified_alert*.go, alert_*.go, *_alert_rule*.go) -------------
    "GET alerts": (
        "ListAlertEvents: dbmodel.AlertEvents",
        {"alerts": [ALERT], "data": [ALERT], **OFFSET},
    ),
    "GET alerts/{id}": ("dbmodel.AlertEvents", ALERT),
    "GET alerts/{id}/correlations": (
        "AlertCorrelationsResponse",
        {
            "correlations": [
                {
                    "correlation_id": STR,
                    "alerts": [ALERT],
                    "correlation_type": STR,
                    "correlation_score": NUM,
                    "reason": STR,
                }
            ]
        },
    ),
    "GET alerts/summary": (
        "AlertSummaryResponse",
        {s: {"count": INT, "change": INT} for s in ("critical", "high", "warning", "info")},
    ),
    "GET alerts/trend": (
        "AlertTrendResponse []*AlertTrendPoint",
        [{"timestamp": TIME, "critical": INT, "high": INT, "warning": INT, "info": INT}],
    ),
    "GET alerts/top-sources": ("AlertTopSourcesResponse", [{"alert_name": STR, "count": INT}]),
    "GET alerts/by-cluster": ("AlertsByClusterResponse", [{"cluster_name": STR, "count": INT}]),
    "GET alert-silences": ("silences: dbmodel.AlertSilences", {"data": [SILENCE], **OFFSET}),
    "GET alert-silences/{id}": ("dbmodel.AlertSilences", SILENCE),
    "GET alert-silences/silenced-alerts": (
        "dbmodel.SilencedAlerts",
        {
            "data": [
                {
                    "silence_id": STR,
                    "alert_id": STR,
                    "alert_name": STR,
                    "cluster_name": STR,
                    "silenced_at": TIME,
                }
            ],
            **OFFSET,
        },
    ),
    "POST alert-silences": ("{silence_id, message}", {"silence_id": STR, "message": STR}),
    "PUT alert-silences/{id}": ("{silence_id, message}", {"silence_id": STR, "message": STR}),
    "PATCH alert-silences/{id}/disable": (
        "{silence_id, message}",
        {"silence_id": STR, "message": STR},
    ),
    "DELETE alert-silences/{id}": ("{message}", {"message": STR}),
    "GET metric-alert-rules": ("MetricAlertRuleResponse", {"data": [METRIC_RULE], **OFFSET}),
    "GET metric-alert-rules/{id}": ("MetricAlertRuleResponse", METRIC_RULE),
    "POST metric-alert-rules": ("{rule_id, message}", {"rule_id": INT, "message": STR}),
    "PUT metric-alert-rules/{id}": ("{rule_id, message}", {"rule_id": INT, "message": STR}),
    "POST metric-alert-rules/{id}/clone": ("{rule_id, message}", {"rule_id": INT, "message": STR}),
    "POST metric-alert-rules/sync": (
        "the pages' {synced, failed}",
        {"total": INT, "synced": INT, "failed": INT, "message": STR},
    ),
    "DELETE metric-alert-rules/{id}": ("{message}", {"message": STR}),
    "GET log-alert-rules": (
        "dbmodel.LogAlertRules",
        {"data": [LOG_RULE], "rules": [LOG_RULE], **OFFSET},
    ),
    "GET log-alert-rules/{id}": ("dbmodel.LogAlertRules", LOG_RULE),
    "POST log-alert-rules": ("{rule_id}", {"rule_id": INT, "cluster_name": STR}),
    "PUT log-alert-rules/{id}": ("{rule_id, message}", {"rule_id": INT, "message": STR}),
    "DELETE log-alert-rules/{id}": ("{message}", {"message": STR}),
    "POST log-alert-rules/{id}/clone": ("{rule_id}", {"rule_id": INT, "cluster_name": STR}),
    "POST log-alert-rules/batch-update": ("{updated}", {"updated": INT}),
    "POST log-alert-rules/test": ("{matched, captures}", {"matched": BOOL, "captures": [STR]}),
    "GET log-alert-rule-templates": ("[]LogAlertRuleTemplateResponse", [TEMPLATE]),
    "GET log-alert-rule-templates/{id}": ("LogAlertRuleTemplateResponse", TEMPLATE),
    "POST log-alert-rule-templates": ("{template_id}", {"template_id": INT}),
    "POST log-alert-rule-templates/{id}/instantiate": ("{rule_id}", {"rule_id": INT}),
    "DELETE log-alert-rule-templates/{id}": ("{message}", {"message": STR}),
    "GET alert-rule-advices": (
        "advices (none are made here)",
        {"data": [MAP], "advices": [MAP], **OFFSET},
    ),
    "GET alert-rule-advices/summary": (
        "the advices' summary (all zeros here)",
        {
            "total_count": INT,
            "pending_count": INT,
            "applied_count": INT,
            "rejected_count": INT,
            "expired_count": INT,
            "avg_confidence": NUM,
            "by_category": MAP,
            "by_severity": MAP,
        },
    ),
    "POST alert-rule-advices/refresh": (
        "{triggered, message}",
        {"triggered": BOOL, "message": STR},
    ),
    "POST alert-rule-advices/{id}/status": ("404 only: there are no advices", ANY),
    "POST alert-rule-advices/{id}/apply": ("404 only: there are no advices", ANY),
    "GET notification-channels": (
        "NotificationChannelListResponse",
        {"items": [CHANNEL], "channels": [CHANNEL], **OFFSET},
    ),
    "GET notification-channels/types": (
        "GetChannelTypesResponse: []ChannelTypeInfo",
        [{"type": STR, "name": STR, "description": STR, "config_schema": MAP}],
    ),
    "GET notification-channels/{id}": ("NotificationChannelResponse", CHANNEL),
    "POST notification-channels": ("NotificationChannelResponse", CHANNEL),
    "PUT notification-channels/{id}": ("NotificationChannelResponse", CHANNEL),
    "DELETE notification-channels/{id}": ("{deleted}", {"deleted": BOOL}),
    "POST notification-channels/{id}/test": (
        "{success, message}",
        {"success": BOOL, "message": STR},
    ),
}
# the Statistics pages' and the node pages' routes, as test_cluster_api.py has them
CONTRACT |= {
    f"GET {route}": (source, from_test(schema))
    for route, (source, schema) in {**CONTRACTS, **METRIC_CONTRACTS}.items()
}
CONTRACT["GET nodes/{name}"] = CONTRACT.pop("GET nodes/gpu-1")
CONTRACT["GET nodes/{name}/fragmentation"] = CONTRACT.pop("GET nodes/gpu-1/fragmentation")
CONTRACT["GET nodes"] = CONTRACT.pop(
    "GET nodes?page_num=1&page_size=10&status=&name=&gpu_name=&order_by=&desc=false"
)

# -- the Management pages (api/pkg/api/unified_job_history.go, detection_status.go,
# sysconfig/, registry/, release/handler.go, cluster/handler.go, cpconfig/) -------------------
JOB_RUN = {
    "id": INT,
    "job_name": STR,
    "job_type": STR,
    "schedule": STR,
    "status": STR,
    "started_at": TIME,
    "ended_at": TIME,
    "duration_seconds": NUM,
    "error_message": STR,
    "error_stack": STR,
    "cluster_name": STR,
    "hostname": STR,
    "metadata": MAP,
    "execution_stats": MAP,
    "created_at": TIME,
}  # dbmodel.JobExecutionHistory
JOB_STATS = {
    "job_name": STR,
    "total_runs": INT,
    "success_count": INT,
    "failure_count": INT,
    "cancelled_count": INT,
    "timeout_count": INT,
    "avg_duration": NUM,
    "min_duration": NUM,
    "max_duration": NUM,
    "last_run_time": TIME,
    "last_status": STR,
}  # database.JobStatistics
COVERAGE = {"source": STR, "status": STR, "attempt_count": INT, "evidence_count": INT}
DETECTION_TASK = {"task_type": STR, "status": STR, "created_at": TIME, "updated_at": TIME}
DETECTION = {
    "workload_uid": STR,
    "status": STR,
    "detection_state": STR,
    "confidence": NUM,
    "evidence_count": INT,
    "evidence_sources": [STR],
    "attempt_count": INT,
    "max_attempts": INT,
    "created_at": TIME,
    "updated_at": TIME,
    "coverage": [COVERAGE],
    "tasks": [DETECTION_TASK],
    "has_conflicts": BOOL,
}  # DetectionStatusResponse
EVIDENCE = {
    "id": INT,
    "workload_uid": STR,
    "source": STR,
    "source_type": STR,
    "framework": STR,
    "workload_type": STR,
    "confidence": NUM,
    "framework_layer": STR,
    "evidence": MAP,
    "detected_at": TIME,
    "created_at": TIME,
}  # DetectionEvidenceItem
SYSCONFIG = {
    "id": INT,
    "key": STR,
    "value": ANY,
    "description": STR,
    "category": STR,
    "is_encrypted": BOOL,
    "version": INT,
    "is_readonly": BOOL,
    "created_at": TIME,
    "updated_at": TIME,
    "created_by": STR,
    "updated_by": STR,
}  # dbmodel.SystemConfig (its value the setting's own type: ANY)
REGISTRY = {"registry": STR, "namespace": STR}
VERSION = {
    "id": INT,
    "version_name": STR,
    "channel": STR,
    "chart_repo": STR,
    "chart_version": STR,
    "image_registry": STR,
    "image_tag": STR,
    "default_values": MAP,
    "values_schema": MAP,
    "status": STR,
    "release_notes": STR,
    "created_by": STR,
    "created_at": TIME,
    "updated_at": TIME,
}  # model.ReleaseVersion
RELEASE_CONFIG = {
    "id": INT,
    "cluster_name": STR,
    "release_version_id": "integer?",
    "values_override": MAP,
    "deployed_version_id": "integer?",
    "deployed_values": MAP,
    "deployed_at": TIME,
    "sync_status": STR,
    "last_sync_at": TIME,
    "last_sync_error": STR,
    "auto_upgrade": BOOL,
    "upgrade_channel": STR,
    "created_at": TIME,
    "updated_at": TIME,
}  # model.ClusterReleaseConfig
RELEASE_HISTORY = {
    "id": INT,
    "cluster_name": STR,
    "release_version_id": INT,
    "action": STR,
    "triggered_by": STR,
    "values_snapshot": MAP,
    "previous_version_id": "integer?",
    "status": STR,
    "error_message": STR,
    "stages_completed": [STR],
    "task_id": "integer?",
    "created_at": TIME,
    "started_at": TIME,
    "completed_at": TIME,
}  # model.ReleaseHistory
MESSAGE_KEY = {"message": STR, "key": STR}
RDS = "release/handler.go"
CONTRACT |= {
    "GET job-execution-histories": (
        "JobHistoriesListResponse",
        {"data": [JOB_RUN], "total": INT, "pageNum": INT, "pageSize": INT},
    ),
    "GET job-execution-histories/{id}": ("dbmodel.JobExecutionHistory", JOB_RUN),
    "GET job-execution-histories/recent-failures": ("[]*dbmodel.JobExecutionHistory", [JOB_RUN]),
    "GET job-execution-histories/statistics/{job_name}": ("database.JobStatistics", JOB_STATS),
    "GET job-execution-histories/statistics/{job_type}/{cluster}": (
        "database.JobStatistics (a job name holding a /)",
        JOB_STATS,
    ),
    "GET detection-status/summary": (
        "DetectionSummaryResponse",
        {
            "total_workloads": INT,
            "status_counts": {"*": INT},
            "detection_state_counts": {"*": INT},
            "recent_detections": [DETECTION],
        },
    ),
    "GET detection-status": (
        "DetectionStatusesListResponse",
        {"data": [DETECTION], "total": INT, "page": INT, "page_size": INT},
    ),
    "GET detection-status/{workload_uid}": ("DetectionStatusResponse", DETECTION),
    "GET detection-status/{workload_uid}/coverage": (
        "DetectionCoverageResponse",
        {"workload_uid": STR, "coverage": [COVERAGE], "total": INT},
    ),
    "GET detection-status/{workload_uid}/coverage/log-gap": (
        "DetectionLogGapResponse",
        {"workload_uid": STR, "has_gap": BOOL},
    ),
    "GET detection-status/{workload_uid}/tasks": (
        "DetectionTasksResponse",
        {"workload_uid": STR, "tasks": [DETECTION_TASK], "total": INT},
    ),
    "GET detection-status/{workload_uid}/evidence": (
        "DetectionEvidenceResponse",
        {"workload_uid": STR, "evidence": [EVIDENCE], "total": INT},
    ),
    "POST detection-status/{workload_uid}/coverage/initialize": (
        "{message, coverage, count}",
        {"message": STR, "count": INT},
    ),
    "POST detection-status/{workload_uid}/trigger": (
        "{message, workload_uid, task_type, status}",
        {"message": STR, "workload_uid": STR, "task_type": STR, "status": STR},
    ),
    "GET system-config": ("[]dbmodel.SystemConfig", [SYSCONFIG]),
    "GET system-config/{key}": ("dbmodel.SystemConfig", SYSCONFIG),
    "PUT system-config/{key}": ("{message, key}", MESSAGE_KEY),
    "DELETE system-config/{key}": ("{message, key}", MESSAGE_KEY),
    "GET system-config/{key}/history": (
        "[]dbmodel.SystemConfigHistory",
        [
            {
                "id": INT,
                "config_id": INT,
                "key": STR,
                "old_value": ANY,
                "new_value": ANY,
                "version": INT,
                "change_reason": STR,
                "changed_at": TIME,
                "changed_by": STR,
            }
        ],
    ),
    "GET registry/config": (
        "{config, defaults, image_names}",
        {"config": REGISTRY, "defaults": REGISTRY, "image_names": {"*": STR}},
    ),
    "PUT registry/config": ("{message, config}", {"message": STR, "config": REGISTRY}),
    "POST registry/sync-from-harbor": ("{message, config}", {"message": STR, "config": REGISTRY}),
    "GET registry/image-url": (
        "{image_name, tag, image_url}",
        {"image_name": STR, "tag": STR, "image_url": STR},
    ),
    "GET releases/versions": (RDS, [VERSION]),
    "POST releases/versions": (RDS, VERSION),
    "GET releases/versions/{id}": (RDS, VERSION),
    "PUT releases/versions/{id}": (RDS, VERSION),
    "DELETE releases/versions/{id}": (RDS, {"status": STR}),
    "PATCH releases/versions/{id}/status": (RDS, {"status": STR}),
    "GET releases/clusters": (RDS, [RELEASE_CONFIG]),
    "GET releases/clusters/default": (RDS, {"default_cluster": "string?", "cluster_id": INT}),
    "PUT releases/clusters/default": (RDS, {"message": STR, "default_cluster": STR}),
    "DELETE releases/clusters/default": (RDS, {"message": STR}),
    "GET releases/clusters/{cluster_name}": (RDS, RELEASE_CONFIG),
    "PUT releases/clusters/{cluster_name}/version": (RDS, {"status": STR}),
    "PUT releases/clusters/{cluster_name}/values": (RDS, RELEASE_CONFIG),
    "GET releases/clusters/{cluster_name}/history": (RDS, [RELEASE_HISTORY]),
    "POST releases/clusters/{cluster_name}/deploy": (
        RDS,
        {"message": STR, "history_id": INT, "task_id": INT},
    ),
    "POST releases/clusters/{cluster_name}/rollback": (
        RDS,
        {"message": STR, "history_id": INT, "rollback_to_version": INT},
    ),
    "GET releases/history/{id}": (RDS, RELEASE_HISTORY),
}
# the management surface (no envelope, as the original's cluster/ and cpconfig/ answer):
# not the typed surfaces' CONTRACT, checked by tests/recorder/test_management.py
CLUSTER_CONFIG = {
    "id": INT,
    "cluster_name": STR,
    "display_name": STR,
    "description": STR,
    "source": STR,
    "k8s_endpoint": STR,
    "k8s_configured": BOOL,
    "k8s_insecure_skip_verify": BOOL,
    "k8s_manual_mode": BOOL,
    "postgres_host": STR,
    "postgres_port": INT,
    "postgres_configured": BOOL,
    "opensearch_host": STR,
    "opensearch_port": INT,
    "opensearch_scheme": STR,
    "opensearch_configured": BOOL,
    "prometheus_read_host": STR,
    "prometheus_read_port": INT,
    "prometheus_write_host": STR,
    "prometheus_write_port": INT,
    "prometheus_configured": BOOL,
    "storage_manual_mode": BOOL,
    "storage_mode": STR,
    "infrastructure_status": STR,
    "infrastructure_message": STR,
    "dataplane_status": STR,
    "dataplane_version": STR,
    "dataplane_message": STR,
    "last_deploy_time": STR,
    "status": STR,
    "is_default": BOOL,
    "labels": {"*": STR},
    "created_at": STR,
    "updated_at": STR,
}  # ClusterConfigResponse
INSTALL_TASK = {
    "id": INT,
    "cluster_name": STR,
    "task_type": STR,
    "install_scope": STR,
    "current_stage": STR,
    "storage_mode": STR,
    "status": STR,
    "error_message": STR,
    "retry_count": INT,
    "max_retries": INT,
    "job_name": STR,
    "job_namespace": STR,
    "created_at": STR,
    "updated_at": STR,
}  # TaskResponse
CP_CONFIG = {
    "id": INT,
    "key": STR,
    "value": MAP,
    "description": STR,
    "category": STR,
    "version": INT,
    "updated_at": STR,
    "updated_by": STR,
}  # cpconfig.ConfigResponse
ONE_CLUSTER = "management/clusters/{cluster_name}"
MANAGEMENT: dict[str, tuple[str, Any]] = {
    "GET management/clusters": ("[]ClusterConfigResponse", [CLUSTER_CONFIG]),
    "POST management/clusters": ("ClusterConfigResponse", CLUSTER_CONFIG),
    f"GET {ONE_CLUSTER}": ("ClusterConfigResponse", CLUSTER_CONFIG),
    f"PUT {ONE_CLUSTER}": ("ClusterConfigResponse", CLUSTER_CONFIG),
    f"DELETE {ONE_CLUSTER}": ("204", ANY),
    f"PUT {ONE_CLUSTER}/default": (
        "{message, cluster_name}",
        {"message": STR, "cluster_name": STR},
    ),
    f"POST {ONE_CLUSTER}/test": (
        "{cluster_name, k8s_connected, storage_connected, k8s_version|k8s_error}",
        {"cluster_name": STR, "k8s_connected": BOOL, "storage_connected": BOOL},
    ),
    f"POST {ONE_CLUSTER}/initialize": (
        "{task_id, status, message}",
        {"task_id": INT, "status": STR, "message": STR},
    ),
    f"GET {ONE_CLUSTER}/infrastructure/status": (
        "GetInfrastructureStatus",
        {
            "cluster_name": STR,
            "initialized": BOOL,
            "storage_mode": STR,
            "status": STR,
            "message": STR,
        },
    ),
    f"GET {ONE_CLUSTER}/tasks": ("{data: []TaskResponse}", {"data": [INSTALL_TASK]}),
    f"GET {ONE_CLUSTER}/tasks/active": ("TaskResponse", INSTALL_TASK),
    f"GET {ONE_CLUSTER}/tasks/{{task_id}}": ("TaskResponse", INSTALL_TASK),
    f"GET {ONE_CLUSTER}/tasks/{{task_id}}/logs": (
        "GetTaskLogs",
        {"task_id": INT, "job_name": STR, "pod_name": STR, "logs": STR, "log_lines": INT},
    ),
    "GET management/config": ("[]ConfigResponse", [CP_CONFIG]),
    "GET management/config/installer": (
        "GetInstallerConfig",
        {"repository": STR, "tag": STR, "full_image": STR},
    ),
    "GET management/config/{key}": ("ConfigResponse", CP_CONFIG),
    "PUT management/config/{key}": ("{message, key}", MESSAGE_KEY),
    "DELETE management/config/{key}": ("204", ANY),
}
CONTRACT |= {  # the Alert pages' routes served since (issue 70)
    "GET metric-alert-rules/{id}/status": ("MetricRuleStatusResponse", {"status": STR}),
    "GET log-alert-rules/multi-cluster": (
        "LogRulesMultiClusterResponse",
        {"clusters": [{"cluster_name": STR, "rules": [LOG_RULE], "total": INT}]},
    ),
    "GET log-alert-rules/{id}/statistics": (
        "LogRuleStatisticsResponse (interface{} both)",
        {"summary": ANY, "statistics": ANY},
    ),
    "GET log-alert-rules/{id}/versions": (
        "LogRuleVersionsResponse",
        {"versions": ANY, "total": INT},
    ),
    "POST log-alert-rules/{id}/rollback/{version}": ("{message}", {"message": STR}),
    "GET alert-rule-advices/{id}": ("404 only: there are no advices", ANY),
}

# -- the workload page's remaining calls (issue 71, item 7): not in the original at dd69b3c
# (the UI's services/dashboard calls them; no page reads them yet) ---------------------------
WORKLOAD_STATS = {
    "uid": STR,
    "name": STR,
    "namespace": STR,
    "kind": STR,
    "start": INT,
    "end": INT,
    "instant_gpu_utilization": NUM,
    "avg_gpu_utilization": NUM,
    "p50_gpu_utilization": NUM,
    "p90_gpu_utilization": NUM,
    "p95_gpu_utilization": NUM,
    "max_gpu_utilization": NUM,
}
CONTRACT |= {
    "GET workloads/{uid}/events": (
        f"{OURS}: the timeline's entries (docs/recorder/training.md)",
        CONTRACT["GET workloads/{uid}/timeline"][1],
    ),
    "GET workloads/{uid}/gpuMetrics": (
        f"{OURS}: as workloads/{{uid}}/metrics",
        CONTRACT["GET workloads/{uid}/metrics"][1],
    ),
    "GET workloads/{uid}/stats": (f"{OURS} (docs/recorder/api.md)", WORKLOAD_STATS),
    "POST workloads/batchStats": (
        f"{OURS} (docs/recorder/api.md)",
        {"stats": {"*": WORKLOAD_STATS}, "missing": [STR]},
    ),
}
# -- the Py-Spy Profiler tab (api/pkg/api/pyspy/types.go at dd69b3c; omitempty fields left
# out where empty, so not required here) ------------------------------------------------------
PYSPY = f"{GO}/api/pkg/api/pyspy/types.go"
PYSPY_TASK = {
    "task_id": STR,
    "status": STR,
    "pod_uid": STR,
    "pod_name": STR,
    "pod_namespace": STR,
    "node_name": STR,
    "pid": INT,
    "duration": INT,
    "format": STR,
    "created_at": TIME,
}
CONTRACT |= {
    "POST workloads/{uid}/process-tree": (
        f"{PYSPY} PodProcessTree",
        {
            "pod_name": STR,
            "pod_namespace": STR,
            "pod_uid": STR,
            "node_name": STR,
            "containers": [
                {
                    "container_id": STR,
                    "container_name": STR,
                    "root_process": MAP,
                    "process_count": INT,
                    "python_count": INT,
                }
            ],
            "total_processes": INT,
            "total_python": INT,
            "collected_at": TIME,
        },
    ),
    "POST pyspy/sample": (f"{PYSPY} TaskResponse", PYSPY_TASK),
    "GET pyspy/task/{id}": (f"{PYSPY} TaskResponse", PYSPY_TASK),
    "GET pyspy/tasks": (
        f"{PYSPY} ListTasksResponse",
        {"tasks": [PYSPY_TASK], "total": INT, "limit": INT, "offset": INT},
    ),
    "POST pyspy/tasks": (
        f"{PYSPY} ListTasksResponse",
        {"tasks": [PYSPY_TASK], "total": INT, "limit": INT, "offset": INT},
    ),
    "GET pyspy/file/{id}": (
        f"{GO}/api/pkg/api/unified_pyspy.go PySpyTaskFilesResponse",
        {
            "task_id": STR,
            "files": [
                {
                    "task_id": STR,
                    "file_name": STR,
                    "format": STR,
                    "file_size": INT,
                    "storage_type": STR,
                    "storage_path": STR,
                    "download_url": STR,
                }
            ],
        },
    ),
    "POST pyspy/task/{id}/cancel": (
        f"{PYSPY} TaskStatusResponse",
        {"task_id": STR, "status": STR, "message": STR},
    ),
}

# -- the Profiler Files tab, the TraceLens and trace-viewer pages (issue 71, items 4-6):
# api/pkg/api/tracelens/profiler_file.go, tracelens/types.go, perfetto/types.go -------------
PROFILER_FILE = {
    "id": INT,
    "file_name": STR,
    "file_type": STR,
    "file_size": INT,
    "workload_uid": STR,
    "created_at": STR,
    "rank": INT,
    "pod_name": STR,
    "pod_namespace": STR,
    "node_name": STR,
    "container": STR,
    "path": STR,
    "modified_at": STR,
    "status": STR,
    "error": STR,
    "fetched_at": STR,
}  # ProfilerFileListItem, and ours beyond it
TRACE_SESSION = {
    "session_id": STR,
    "cluster_name": STR,
    "workload_uid": STR,
    "profiler_file_id": INT,
    "profiler_file_ids": [INT],
    "status": STR,
    "status_message": STR,
    "ui_path": STR,
    "pod_name": STR,
    "pod_ip": STR,
    "created_at": TIME,
    "ready_at": TIME,
    "expires_at": TIME,
    "last_accessed_at": TIME,
    "estimated_ready_seconds": INT,
}  # SessionResponse (both), and ours beyond it
TRACELENS_SESSION = {**TRACE_SESSION, "resource_profile": STR, "analysis": ANY}
PERFETTO_SESSION = {**TRACE_SESSION, "viewer_type": STR}
NO_TRACE = (
    "404 only here (no trace in this database); tests/recorder/"
    "test_profiler_files.py checks the shape"
)
CONTRACT |= {
    "GET workloads/{uid}/profiler-files": (
        "tracelens/profiler_file.go []ProfilerFileListItem",
        [PROFILER_FILE],
    ),
    "GET tracelens/resource-profiles": (
        "tracelens/types.go ResourceProfilesResponse",
        {
            "profiles": [
                {
                    "value": STR,
                    "label": STR,
                    "description": STR,
                    "memory": STR,
                    "memory_bytes": INT,
                    "cpu": INT,
                    "is_default": BOOL,
                }
            ]
        },
    ),
    "GET tracelens/sessions": (
        "tracelens/types.go ListSessionsResponse",
        {"sessions": [TRACELENS_SESSION], "total": INT},
    ),
    "GET tracelens/workloads/{workload_uid}/sessions": (
        "tracelens/types.go ListSessionsResponse",
        {"sessions": [TRACELENS_SESSION], "total": INT},
    ),
    "POST tracelens/sessions": (NO_TRACE, TRACELENS_SESSION),
    "GET tracelens/sessions/{session_id}": (NO_TRACE, TRACELENS_SESSION),
    "PATCH tracelens/sessions/{session_id}": (NO_TRACE, TRACELENS_SESSION),
    "DELETE tracelens/sessions/{session_id}": (NO_TRACE, ANY),
    "POST perfetto/sessions": (NO_TRACE, PERFETTO_SESSION),
    "GET perfetto/sessions/{session_id}": (NO_TRACE, PERFETTO_SESSION),
    "PATCH perfetto/sessions/{session_id}": (NO_TRACE, PERFETTO_SESSION),
    "DELETE perfetto/sessions/{session_id}": (NO_TRACE, ANY),
}
