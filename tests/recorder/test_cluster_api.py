"""The cluster API's first Primus-Lens routes: the response of each has the original's field
names, nesting and JSON types (its Go structs' json tags, written here as a schema with the
file they come from), the numbers are exact, against the API stand-in's nodes and GPU pods,
with SQLite and PostgreSQL; and the Node watch keeps the `nodes` table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from lens_ebpf.core.times import aware
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually, pod
from tests.recorder.conftest import example, recorded, rows

GO = "AMD-AGI/Primus-SaFE@c946dc3d Lens/modules"


def paginated(row: Any) -> dict[str, Any]:
    """PaginatedResponse (api/pkg/api/gpu_aggregation.go) of rows."""
    return {
        "total": "integer",
        "page": "integer",
        "page_size": "integer",
        "total_pages": "integer",
        "data": [row],
    }


# the database models' json tags (core/pkg/database/model/*.gen.go); "object": a JSON object
# of any keys (their ExtType), a time.Time a string
CLUSTER_HOUR = {
    **dict.fromkeys(("cluster_name", "stat_hour", "created_at", "updated_at"), "string"),
    **dict.fromkeys(("id", "total_gpu_capacity", "sample_count"), "integer"),
    **dict.fromkeys(
        (
            "allocated_gpu_count",
            "allocation_rate",
            "avg_utilization",
            "max_utilization",
            "min_utilization",
            "p50_utilization",
            "p95_utilization",
        ),
        "number",
    ),
}
NAMESPACE_HOUR = {
    **dict.fromkeys(
        ("cluster_name", "namespace", "stat_hour", "created_at", "updated_at"), "string"
    ),
    **dict.fromkeys(("id", "total_gpu_capacity", "active_workload_count"), "integer"),
    **dict.fromkeys(
        (
            "allocated_gpu_count",
            "avg_utilization",
            "max_utilization",
            "min_utilization",
            "allocation_rate",
        ),
        "number",
    ),
}
LABEL_HOUR = {
    **dict.fromkeys(
        (
            "cluster_name",
            "dimension_type",
            "dimension_key",
            "dimension_value",
            "stat_hour",
            "created_at",
            "updated_at",
        ),
        "string",
    ),
    **dict.fromkeys(("id", "active_workload_count"), "integer"),
    **dict.fromkeys(
        ("allocated_gpu_count", "avg_utilization", "max_utilization", "min_utilization"), "number"
    ),
}
WORKLOAD_HOUR = {
    **dict.fromkeys(
        (
            "cluster_name",
            "namespace",
            "workload_name",
            "workload_type",
            "stat_hour",
            "workload_status",
            "owner_uid",
            "owner_name",
            "created_at",
            "updated_at",
        ),
        "string",
    ),
    **dict.fromkeys(("id", "max_replica_count", "min_replica_count", "sample_count"), "integer"),
    **dict.fromkeys(
        (
            "allocated_gpu_count",
            "requested_gpu_count",
            "avg_utilization",
            "max_utilization",
            "min_utilization",
            "p50_utilization",
            "p95_utilization",
            "avg_gpu_memory_used",
            "max_gpu_memory_used",
            "avg_gpu_memory_total",
            "avg_replica_count",
        ),
        "number",
    ),
    "labels": "object",
    "annotations": "object",
}
SNAPSHOT = {
    **dict.fromkeys(
        (
            "cluster_name",
            "snapshot_time",
            "dimension_type",
            "dimension_key",
            "dimension_value",
            "created_at",
        ),
        "string",
    ),
    **dict.fromkeys(("id", "total_gpu_capacity", "allocated_gpu_count"), "integer"),
    "allocation_details": "object",
}
METRICS_GRAPH = {
    "serial": "integer",
    "series": [{"labels": "object", "values": [{"timestamp": "integer", "value": "number"}]}],
    "config": {"y_axis_unit": "string"},
}
# route -> (where the response type is, its schema: a JSON type, or a list of one schema,
# or {field: schema})
CONTRACTS: dict[str, tuple[str, Any]] = {
    "gpu-aggregation/clusters": (
        f"{GO}/api/pkg/api/unified_gpu_aggregation.go " "GpuAggClustersResponse []string",
        ["string"],
    ),
    "nodes/gpuAllocation": (
        f"{GO}/api/pkg/api/unified_node.go GPUAllocationResponse "
        "[]model.GpuAllocation (core/pkg/model/gpu.go)",
        [
            {
                "node": "string",
                "vendor": "string",
                "capacity": "integer",
                "allocated": "integer",
                "allocationRate": "number",
            }
        ],
    ),
    **{
        f"gpu-aggregation/{r}": (
            f"{GO}/api/pkg/api/unified_gpu_aggregation.go {t} []string",
            ["string"],
        )
        for r, t in (
            ("namespaces", "GpuAggNamespacesResponse"),
            ("dimension-keys", "GpuAggDimensionKeysResponse"),
            ("dimension-values", "GpuAggDimensionValuesResponse"),
        )
    },
    **{
        f"gpu-aggregation/{r}/hourly-stats": (
            f"{GO}/api/pkg/api/gpu_aggregation.go PaginatedResponse of {t} "
            f"(core/pkg/database/model/{f}.gen.go)",
            paginated(row),
        )
        for r, t, f, row in (
            ("cluster", "ClusterGpuHourlyStats", "cluster_gpu_hourly_stats", CLUSTER_HOUR),
            ("namespaces", "NamespaceGpuHourlyStats", "namespace_gpu_hourly_stats", NAMESPACE_HOUR),
            ("labels", "LabelGpuHourlyStats", "label_gpu_hourly_stats", LABEL_HOUR),
            ("workloads", "WorkloadGpuHourlyStats", "workload_gpu_hourly_stats", WORKLOAD_HOUR),
        )
    },
    "gpu-aggregation/snapshots": (
        f"{GO}/api/pkg/api/unified_gpu_aggregation.go "
        "[]*dbmodel.GpuAllocationSnapshots "
        "(core/pkg/database/model/gpu_allocation_snapshots.gen.go)",
        [SNAPSHOT],
    ),
    "gpu-aggregation/snapshots/latest": (
        f"{GO}/api/pkg/api/unified_gpu_aggregation.go " "dbmodel.GpuAllocationSnapshots",
        SNAPSHOT,
    ),
    **{
        f"workloads/{r}": (
            f"{GO}/api/pkg/api/unified_workload.go WorkloadStatisticsResponse "
            "model.WorkloadStatisticResp (core/pkg/model/workload.go)",
            {
                "running_workloads_count": "integer",
                "avg_gpu_allocated": "number",
                "avg_gpu_utilization": "number",
                "low_utilization_workloads_count": "integer",
            },
        )
        for r in ("statistic", "statistics")
    },
    "workloads/gpuUtilizationHistory": (
        f"{GO}/api/pkg/api/unified_workload.go "
        "WorkloadGPUHistoryResponse model.MetricsGraph "
        "(core/pkg/model/common.go)",
        METRICS_GRAPH,
    ),
}
# the routes the first test asks with no parameters
PLAIN = ("gpu-aggregation/clusters", "nodes/gpuAllocation")
GPU_NODE = {
    "name": "string",
    "ip": "string",
    "gpu_name": "string",
    "gpu_count": "integer",
    "gpu_allocation": "integer",
    "gpu_utilization": "number",
    "status": "string",
    "status_color": "string",
}  # model.GPUNode, core/pkg/model/nodes.go
# model.GpuClusterOverview (core/pkg/model/gpu.go) with its embedded StorageStat
# (storage.go) and RdmaClusterStat (rdma.go): Go's JSON flattens embedded structs
OVERVIEW = {
    **{
        k: "number"
        for k in (
            "total_space",
            "used_space",
            "usage_percentage",
            "total_inodes",
            "used_inodes",
            "inodes_usage_percentage",
            "read_bandwidth",
            "write_bandwidth",
            "total_tx",
            "total_rx",
            "allocationRate",
            "utilization",
        )
    },
    **{
        k: "integer"
        for k in (
            "totalNodes",
            "healthyNodes",
            "faultyNodes",
            "fullyIdleNodes",
            "partiallyIdleNodes",
            "busyNodes",
        )
    },
}
# routes that read Prometheus too
METRIC_CONTRACTS: dict[str, tuple[str, Any]] = {
    "nodes?page_num=1&page_size=10&status=&name=&gpu_name=&order_by=&desc=false": (
        f"{GO}/api/pkg/api/unified_node.go NodeListResponse",
        {"data": [GPU_NODE], "total": "integer", "cluster_name": "string"},
    ),
    "nodes/gpu-1": (
        f"{GO}/api/pkg/api/unified_node.go NodeDetailResponse "
        "(model.GpuNodeDetail, core/pkg/model/nodes.go, and cluster_name)",
        {
            "name": "string",
            "health": "string",
            "cpu": "string",
            "memory": "string",
            "os": "string",
            "gpu_driver_version": "string",
            "static_gpu_details": "string",
            "kubelet_version": "string",
            "containerd_version": "string",
            "cluster_name": "string",
        },
    ),
    "nodes/fragmentation-analysis": (
        f"{GO}/api/pkg/api/node_fragmentation.go " "FragmentationAnalysisResponse",
        {
            "cluster": "string",
            "cluster_fragmentation_score": "number",
            "total_nodes": "integer",
            "node_fragmentations": [
                {
                    "node_name": "string",
                    "total_gpus": "integer",
                    "allocated_gpus": "integer",
                    "available_gpus": "integer",
                    "fragmentation_score": "number",
                    "status": "string",
                    "utilization": "number",
                }
            ],
            "recommendations": ["string"],
            "summary": {
                "healthy_nodes": "integer",
                "fragmented_nodes": "integer",
                "critical_nodes": "integer",
                "total_wasted_gpus": "integer",
                "waste_percentage": "number",
            },
        },
    ),
    "nodes/load-balance-analysis": (
        f"{GO}/api/pkg/api/node_fragmentation.go " "LoadBalanceAnalysisResponse",
        {
            "cluster": "string",
            "load_balance_score": "number",
            "node_load_distribution": [
                {
                    "node_name": "string",
                    "allocation_rate": "number",
                    "utilization_rate": "number",
                    "load_score": "number",
                }
            ],
            "hotspot_nodes": ["string"],
            "idle_nodes": ["string"],
            "recommendations": ["string"],
            "statistics": {
                "avg_allocation_rate": "number",
                "stddev_allocation": "number",
                "max_allocation": "number",
                "min_allocation": "number",
                "variance": "number",
            },
        },
    ),
    "nodes/gpu-1/fragmentation": (
        f"{GO}/api/pkg/api/node_fragmentation.go " "NodeFragmentationDetail",
        {
            "node_name": "string",
            "total_gpus": "integer",
            "allocated_gpus": "integer",
            "available_gpus": "integer",
            "fragmentation_score": "number",
            "status": "string",
            "allocation_pattern": {
                "fully_allocated_pods": "integer",
                "partially_allocated_pods": "integer",
                "gpu_sharing_enabled": "boolean",
                "largest_contiguous_gpu": "integer",
            },
            "running_pods": [
                {"pod_name": "string", "namespace": "string", "allocated_gpus": "integer"}
            ],
            "recommendations": ["string"],
        },
    ),
}


def shape(value: Any) -> Any:
    """The JSON type of a value, as the schema writes it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        kinds = {repr(shape(v)) for v in value}
        assert len(kinds) <= 1, f"a list of mixed types: {kinds}"
        return [shape(value[0])] if value else []
    assert isinstance(value, dict), value
    return {k: shape(v) for k, v in value.items()}


def conforms(value: Any, schema: Any) -> bool:
    """Field names, nesting and types equal the schema's (a number may be whole)."""
    got = shape(value)
    if schema == "number" and got == "integer":
        return True
    if schema == "object":
        return isinstance(value, dict)
    if isinstance(schema, list):
        return isinstance(value, list) and all(conforms(v, schema[0]) for v in value)
    if isinstance(schema, dict):
        return (
            isinstance(value, dict)
            and value.keys() == schema.keys()
            and all(conforms(value[k], s) for k, s in schema.items())
        )
    return got == schema


def node(name: str, ready: str, capacity: dict[str, str], ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": "gpu.8x",
                "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
            },
        },
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": ready},
            ],
            "addresses": [
                {"type": "Hostname", "address": name},
                {"type": "InternalIP", "address": ip},
            ],
            "capacity": {"cpu": "128", "memory": "2113474560Ki", **capacity},
            "allocatable": {"cpu": "127500m", "memory": "2113372160Ki", **capacity},
            "nodeInfo": {
                "kernelVersion": "6.8.0-45-generic",
                "osImage": "Ubuntu 22.04.5 LTS",
                "kubeletVersion": "v1.31.2",
                "containerRuntimeVersion": "containerd://1.7.22",
            },
        },
    }


def gpu_pod(name: str, node_name: str, resource: str, n: int, phase: str) -> dict[str, Any]:
    return pod(
        name,
        "",
        "ml",
        node=node_name,
        phase=phase,
        containers=[
            {"name": "main", "image": "trainer:1", "resources": {"limits": {resource: str(n)}}}
        ],
    )


def two_gpu_nodes(api: FakeApiServer) -> None:
    """gpu-1 (8 AMD GPUs, a running pod holding 2) and gpu-2 (4 NVIDIA, a pod holding 1)."""
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    api.put("nodes", node("gpu-2", "True", {"nvidia.com/gpu": "4"}, "10.0.0.12"))
    api.put("pods", gpu_pod("a", "gpu-1", "amd.com/gpu", 2, "Running"))
    api.put("pods", gpu_pod("c", "gpu-2", "nvidia.com/gpu", 1, "Running"))


def get(app: Any, path: str) -> Any:
    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))
    body = r.json()
    example(path, body)
    assert r.status_code == 200 and body["meta"] == {"code": 2000, "message": "OK"}, body
    return body["data"]


def test_nodes_and_gpu_allocation_exact_and_shaped_as_the_original(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    api.put("nodes", node("gpu-2", "False", {"nvidia.com/gpu": "4"}, "10.0.0.12"))
    api.put("nodes", node("cpu-1", "Unknown", {}, "10.0.0.13"))
    api.put("pods", gpu_pod("a", "gpu-1", "amd.com/gpu", 2, "Running"))
    api.put("pods", gpu_pod("b", "gpu-1", "amd.com/gpu", 4, "Pending"))  # not allocated yet
    api.put("pods", gpu_pod("c", "gpu-2", "nvidia.com/gpu", 1, "Running"))
    app = recorder_app(db_url, cluster_name="mi300-east")
    eventually(
        lambda: len(rows(db_url, "nodes")) == 3
        and sum(r["running"] for r in rows(db_url, "gpu_pods")) == 2,
        timeout=15,
    )
    got = {r["name"]: r for r in rows(db_url, "nodes")}
    one = got["gpu-1"]
    assert (
        one["status"],
        one["address"],
        one["gpu_capacity"],
        one["cpu_count"],
        one["memory_bytes"],
        one["kernel"],
        one["container_runtime"],
    ) == (
        "Ready",
        "10.0.0.11",
        {"amd.com/gpu": 8},
        128,
        2113474560 * 1024,
        "6.8.0-45-generic",
        "containerd://1.7.22",
    )
    assert one["labels"] == {
        "node.kubernetes.io/instance-type": "gpu.8x",
        "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
    }
    assert (got["gpu-2"]["status"], got["cpu-1"]["status"]) == ("NotReady", "Unknown")

    answers = {route: get(app, f"/v1/{route}?cluster=mi300-east") for route in PLAIN}
    for route in PLAIN:
        source, schema = CONTRACTS[route]
        assert conforms(answers[route], schema), (route, source, answers[route])
    assert answers["gpu-aggregation/clusters"] == ["mi300-east"]
    assert answers["nodes/gpuAllocation"] == [
        {"node": "gpu-1", "vendor": "amd", "capacity": 8, "allocated": 2, "allocationRate": 0.25},
        {
            "node": "gpu-2",
            "vendor": "NVIDIA",
            "capacity": 4,
            "allocated": 1,
            "allocationRate": 0.25,
        },
    ]
    assert get(app, "/api/nodes/gpuAllocation") == answers["nodes/gpuAllocation"]
    assert get(app, "/lens/v1/nodes/gpuAllocation") == answers["nodes/gpuAllocation"]
    # the node goes: kept, marked deleted, no longer listed
    api.delete("nodes", "", "gpu-2")
    eventually(
        lambda: {r["name"]: r["deleted"] for r in rows(db_url, "nodes")}["gpu-2"], timeout=15
    )
    assert [a["node"] for a in get(app, "/v1/nodes/gpuAllocation")] == ["gpu-1"]


def test_a_schema_catches_a_renamed_or_missing_field() -> None:
    _, schema = CONTRACTS["nodes/gpuAllocation"]
    row = {"node": "n", "vendor": "amd", "capacity": 8, "allocated": 2, "allocationRate": 0.25}
    assert conforms([row], schema)
    assert not conforms([{**row, "allocation_rate": 0.25}], schema)
    assert not conforms([{k: v for k, v in row.items() if k != "vendor"}], schema)
    assert not conforms([{**row, "capacity": "8"}], schema)


def test_every_statistics_route_has_a_contract() -> None:
    """The Statistics pages' routes (issue 57) each have the original's schema."""
    from lens_ebpf.recorder.api import aggregation

    pages = {r.path for r in aggregation.routes.routes}
    pages |= {
        "workloads/statistic",
        "workloads/statistics",
        "workloads/gpuUtilizationHistory",
        "nodes/fragmentation-analysis",
        "nodes/load-balance-analysis",
    }
    assert pages - CONTRACTS.keys() - METRIC_CONTRACTS.keys() == set()
    _, schema = CONTRACTS["gpu-aggregation/snapshots/latest"]
    row = {k: 0 if v == "integer" else {} if v == "object" else "x" for k, v in schema.items()}
    assert conforms(row, schema) and conforms({**row, "allocation_details": {"a": [1]}}, schema)
    assert not conforms({**row, "allocation_details": "{}"}, schema)


def openmetrics(t0: int) -> str:
    """Ten minutes of the agents' series, one sample a minute, values a test can add up."""
    fams = {
        "gpu_utilization": [
            ('node="gpu-1",gpu_id="0",vendor="amd"', 80),
            ('node="gpu-1",gpu_id="1",vendor="amd"', 40),
            ('node="gpu-2",gpu_id="0",vendor="nvidia"', 30),
        ],
        "node_k8s_gpu_allocation_rate": [('node="gpu-1"', 25), ('node="gpu-2"', 35)],
        "gpu_memory_used_bytes": [
            ('node="gpu-1",gpu_index="0",vendor="amd"', 50),
            ('node="gpu-2",gpu_index="0",vendor="nvidia"', 20),
        ],
        "gpu_memory_total_bytes": [
            ('node="gpu-1",gpu_index="0",vendor="amd"', 100),
            ('node="gpu-2",gpu_index="0",vendor="nvidia"', 100),
        ],
        "gpu_temperature_celsius": [
            ('node="gpu-1",gpu_index="0",vendor="amd"', 61),
            ('node="gpu-1",gpu_index="1",vendor="amd"', 55),
            ('node="gpu-2",gpu_index="0",vendor="nvidia"', 70),
        ],
        "gpu_power_draw_watts": [
            ('node="gpu-1",gpu_index="0",vendor="amd"', 700),
            ('node="gpu-2",gpu_index="0",vendor="nvidia"', 350),
        ],
        "hw_node_info": [
            (
                'node="gpu-1",os="ubuntu",os_version="22.04",kernel="6.8.0",'
                'cpu_model="AMD EPYC 9654 96-Core Processor"',
                1,
            )
        ],
    }
    out = []
    for name, series in fams.items():
        out.append(f"# TYPE {name} gauge\n")
        for labels, value in series:
            out += [f"{name}{{{labels}}} {value} {t0 + 60 * m}\n" for m in range(11)]
    # RDMA port counters: 6,000 bytes a minute sent (100 B/s), 12,000 received (200 B/s)
    port = 'node="gpu-1",device="mlx5_0",port="1"'
    for family, per_minute in (
        ("lens_rdma_port_transmit_bytes", 6000),
        ("lens_rdma_port_receive_bytes", 12000),
    ):
        out.append(f"# TYPE {family} counter\n")
        out += [f"{family}_total{{{port}}} {per_minute * m} {t0 + 60 * m}\n" for m in range(11)]
    return "".join(out) + "# EOF\n"


def test_utilization_routes_from_a_real_prometheus(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    from datetime import UTC, datetime

    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    t0 = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600  # three hours ago, whole
    prometheus = Prometheus([], openmetrics=openmetrics(t0))
    try:
        two_gpu_nodes(api)
        url = db_url
        at = datetime.fromtimestamp(t0 + 300, UTC)
        app = recorder_app(url, clock=lambda: at, prometheus__url=prometheus.base)
        eventually(
            lambda: len(rows(url, "nodes")) == 2
            and sum(r["running"] for r in rows(url, "gpu_pods")) == 2,
            timeout=15,
        )
        now = get(app, "/v1/nodes/gpuUtilization?cluster=local")
        assert conforms(now, {"allocationRate": "number", "utilization": "number"})
        assert now == {"allocationRate": 25.0, "utilization": 50.0}  # 3 of 12; (80+40+30)/3
        node_hist = get(app, f"/v1/nodes/gpu-1/gpuMetrics?start={t0}&end={t0 + 240}&step=60")
        graph = {
            "serial": "integer",
            "series": [
                {
                    "labels": {"gpu_id": "string"},
                    "values": [{"timestamp": "integer", "value": "number"}],
                }
            ],
            "config": {"y_axis_unit": "string"},
        }
        assert conforms(node_hist["gpu_utilization"], graph)
        assert {
            s["labels"]["gpu_id"]: [p["value"] for p in s["values"]]
            for s in node_hist["gpu_utilization"]["series"]
        } == {"0": [80.0] * 5, "1": [40.0] * 5}
        assert node_hist["gpu_allocation_rate"]["series"] == [
            {"labels": {}, "values": [{"timestamp": t0 + 60 * m, "value": 25.0} for m in range(5)]}
        ]
        hist = get(app, f"/v1/nodes/gpuUtilizationHistory?start={t0}&end={t0 + 240}&step=60")
        point = {"timestamp": "integer", "value": "number"}
        assert conforms(
            hist, {"allocationRate": [point], "utilization": [point], "vramUtilization": [point]}
        )
        times = [t0 + 60 * m for m in range(5)]
        assert hist["utilization"] == [{"timestamp": ts, "value": 50.0} for ts in times]
        assert hist["allocationRate"] == [{"timestamp": ts, "value": 30.0} for ts in times]
        assert hist["vramUtilization"] == [{"timestamp": ts, "value": 0.35} for ts in times]
        # a day at one point a second is more than max_points: refused, not run
        r = requests.get(
            f"http://127.0.0.1:{app.http.port}/v1/nodes/gpuUtilizationHistory"
            f"?start={t0}&end={t0 + 86400}&step=1",
            timeout=hang_guard(5),
        )
        assert r.status_code == 400 and r.json()["meta"]["code"] == 4001
        assert "max_points" in r.json()["meta"]["message"]
        answers = {route: get(app, f"/v1/{route}") for route in METRIC_CONTRACTS}
        for route, (source, schema) in METRIC_CONTRACTS.items():
            assert conforms(answers[route], schema), (route, source, answers[route])
        # gpu-1: 2 of 8 GPUs held, at 60 %; gpu-2: 1 of 4, at 30 %: each 30 points for its
        # unallocated GPUs (0.75 x 40), none for idle allocated ones (utilization above
        # the allocation rate), none for small allocations (one pod each)
        assert answers["nodes/fragmentation-analysis"] == {
            "cluster": "local",
            "cluster_fragmentation_score": 30.0,
            "total_nodes": 2,
            "node_fragmentations": [
                {
                    "node_name": "gpu-1",
                    "total_gpus": 8,
                    "allocated_gpus": 2,
                    "available_gpus": 6,
                    "fragmentation_score": 30.0,
                    "status": "fragmented",
                    "utilization": 60.0,
                },
                {
                    "node_name": "gpu-2",
                    "total_gpus": 4,
                    "allocated_gpus": 1,
                    "available_gpus": 3,
                    "fragmentation_score": 30.0,
                    "status": "fragmented",
                    "utilization": 30.0,
                },
            ],
            "recommendations": [
                "Some nodes have fragmented GPU allocation. Consider using pod "
                "affinity/anti-affinity rules."
            ],
            "summary": {
                "healthy_nodes": 0,
                "fragmented_nodes": 2,
                "critical_nodes": 0,
                "total_wasted_gpus": 9,
                "waste_percentage": 75.0,
            },
        }
        # load: allocation 60 %, utilization 40 %; both nodes 25 % allocated: even (100)
        assert answers["nodes/load-balance-analysis"] == {
            "cluster": "local",
            "load_balance_score": 100.0,
            "node_load_distribution": [
                {
                    "node_name": "gpu-1",
                    "allocation_rate": 25.0,
                    "utilization_rate": 60.0,
                    "load_score": 25.0 * 0.6 + 60.0 * 0.4,
                },
                {
                    "node_name": "gpu-2",
                    "allocation_rate": 25.0,
                    "utilization_rate": 30.0,
                    "load_score": 25.0 * 0.6 + 30.0 * 0.4,
                },
            ],
            "hotspot_nodes": [],
            "idle_nodes": [],
            "recommendations": [
                "Overall cluster GPU allocation is low. Consider optimizing " "resource requests."
            ],
            "statistics": {
                "avg_allocation_rate": 25.0,
                "stddev_allocation": 0.0,
                "max_allocation": 25.0,
                "min_allocation": 25.0,
                "variance": 0.0,
            },
        }
        assert answers["nodes/gpu-1/fragmentation"] == {
            "node_name": "gpu-1",
            "total_gpus": 8,
            "allocated_gpus": 2,
            "available_gpus": 6,
            "fragmentation_score": 30.0,
            "status": "fragmented",
            "allocation_pattern": {
                "fully_allocated_pods": 0,
                "partially_allocated_pods": 1,
                "gpu_sharing_enabled": False,
                "largest_contiguous_gpu": 6,
            },
            "running_pods": [{"pod_name": "a", "namespace": "ml", "allocated_gpus": 2}],
            "recommendations": ["Node GPU allocation is healthy"],
        }
        listed = answers[next(iter(METRIC_CONTRACTS))]
        assert listed == {
            "total": 2,
            "cluster_name": "local",
            "data": [
                {
                    "name": "gpu-1",
                    "ip": "10.0.0.11",
                    "gpu_name": "AMD_Instinct_MI300X_OAM",
                    "gpu_count": 8,
                    "gpu_allocation": 2,
                    "gpu_utilization": 60.0,
                    "status": "Ready",
                    "status_color": "green",
                },
                {
                    "name": "gpu-2",
                    "ip": "10.0.0.12",
                    "gpu_name": "AMD_Instinct_MI300X_OAM",
                    "gpu_count": 4,
                    "gpu_allocation": 1,
                    "gpu_utilization": 30.0,
                    "status": "Ready",
                    "status_color": "green",
                },
            ],
        }
        by_use = get(app, "/v1/nodes?order_by=gpu_utilization&desc=true&page_size=1&pageNum=2")
        assert [n["name"] for n in by_use["data"]] == ["gpu-2"] and by_use["total"] == 2
        assert get(app, "/v1/nodes?name=gpu-2&status=Ready,NotReady")["total"] == 1
        assert answers["nodes/gpu-1"] == {
            "name": "gpu-1",
            "health": "Ready",
            "cpu": "128 X AMD EPYC 9654 96-Core Processor",
            "memory": "2113474560Ki",
            "os": "Ubuntu 22.04.5 LTS",
            "gpu_driver_version": "",
            "static_gpu_details": "8 X AMD_Instinct_MI300X_OAM",
            "kubelet_version": "v1.31.2",
            "containerd_version": "1.7.22",
            "cluster_name": "local",
        }
        # a third GPU node, Ready but tainted: faulty; its GPUs counted as the node list and
        # the statistics count them (issue 70: one allocation figure on every route)
        tainted = node("gpu-3", "True", {"amd.com/gpu": "2"}, "10.0.0.13")
        tainted["spec"] = {"taints": [{"key": "amd.com/gpu-unhealthy", "effect": "NoSchedule"}]}
        api.put("nodes", tainted)
        eventually(lambda: len(rows(url, "nodes")) == 3, timeout=15)
        devices = get(app, "/v1/nodes/gpu-2/gpuDevices")
        assert devices == {"node_name": "gpu-2", "cluster_name": "local", "devices": []}
        # gpu-1's agent reports its two AMD GPUs; their figures now, from Prometheus
        from lens_ebpf.agent.devices import inventory as records
        from lens_ebpf.agent.devices.gpu import amd
        from lens_ebpf.agent.inventory import DeviceWatch
        from tests.recorder.test_node_events import reporting

        sysfs = Path(__file__).parent.parent / "fixtures" / "gpu" / "sys"
        readings = sorted(amd.read_sysfs(sysfs), key=lambda r: r.bdf)
        for i, r in enumerate(readings):  # numbered in BDF order, as the collector does
            r.index = i
        with reporting(app) as (bus, reporter):  # node gpu-1
            DeviceWatch(bus.publish).update("gpu", records.gpu_records(readings, "gpu-1"))
            eventually(lambda: reporter.acked == 1, timeout=15)
            assert app.writer.flush(10)
        devices = get(app, "/v1/nodes/gpu-1/gpuDevices")
        info = {
            "deviceId": "integer",
            "model": "string",
            "memory": "string",
            "utilization": "number",
            "temperature": "number",
            "power": "number",
        }
        assert conforms(
            devices, {"node_name": "string", "cluster_name": "string", "devices": [info]}
        )  # model.GpuDeviceInfo
        assert devices["devices"] == [
            {
                "deviceId": 0,
                "model": "AMD Instinct MI300X",
                "memory": "0GB",
                "utilization": 80.0,
                "temperature": 61.0,
                "power": 700.0,
            },
            {
                "deviceId": 1,
                "model": "",
                "memory": "",
                "utilization": 40.0,
                "temperature": 55.0,
                "power": 0.0,
            },
        ]
        heat = get(app, "/v1/clusters/gpuHeatmap?cluster=local")
        item = {"node_name": "string", "gpu_id": "integer", "value": "number"}
        axis = {
            "serial": "integer",
            "unit": "string",
            "yaxis_max": "number",
            "yaxis_min": "number",
            "Data": [item],
        }  # model.Heatmap: no json tag on Data
        assert conforms(heat, {"utilization": axis, "temperature": axis, "power": axis})
        assert heat["utilization"] == {
            "serial": 1,
            "unit": "%",
            "yaxis_max": 100,
            "yaxis_min": 0,
            "Data": [
                {"node_name": "gpu-1", "gpu_id": 0, "value": 80.0},
                {"node_name": "gpu-1", "gpu_id": 1, "value": 40.0},
                {"node_name": "gpu-2", "gpu_id": 0, "value": 30.0},
            ],
        }
        assert [(i["node_name"], i["gpu_id"], i["value"]) for i in heat["temperature"]["Data"]] == [
            ("gpu-1", 0, 61.0),
            ("gpu-1", 1, 55.0),
            ("gpu-2", 0, 70.0),
        ]
        assert (heat["temperature"]["unit"], heat["power"]["yaxis_max"]) == ("℃", 850)
        assert [i["value"] for i in heat["power"]["Data"]] == [700.0, 350.0]
        overview = get(app, "/v1/clusters/overview?cluster=local")
        assert conforms(overview, OVERVIEW)
        assert overview == {
            "total_space": 0.0,
            "used_space": 0.0,
            "usage_percentage": 0.0,
            "total_inodes": 0.0,
            "used_inodes": 0.0,
            "inodes_usage_percentage": 0.0,
            "read_bandwidth": 0.0,
            "write_bandwidth": 0.0,
            "total_tx": 100.0,
            "total_rx": 200.0,
            "totalNodes": 3,
            "healthyNodes": 2,
            "faultyNodes": 1,
            "fullyIdleNodes": 1,
            "partiallyIdleNodes": 2,
            "busyNodes": 0,
            "allocationRate": 100 * 3 / 14,
            "utilization": 50.0,
        }
        # the dashboard's figure is the same: 3 of 14 GPUs
        assert get(app, "/v1/nodes/gpuUtilization")["allocationRate"] == 100 * 3 / 14
        for path, names in (
            ("nodes?order_by=colour", "order_by"),
            ("nodes?desc=maybe", "desc"),
            ("nodes/gpu-9", "gpu-9"),
        ):
            r = requests.get(f"http://127.0.0.1:{app.http.port}/v1/{path}", timeout=hang_guard(5))
            assert r.json()["meta"]["code"] in (4001, 4004) and names in r.json()["meta"]["message"]
        bad = requests.get(
            f"http://127.0.0.1:{app.http.port}/v1/nodes/gpuUtilizationHistory" f"?end={t0}",
            timeout=hang_guard(5),
        ).json()
        assert bad["meta"]["code"] == 4001 and "start" in bad["meta"]["message"]
    finally:
        prometheus.stop()
    # Prometheus gone: the routes of its figures alone say so (503); those that mix them
    # with stored facts answer those, its figures null (tests/recorder/test_degrade.py)
    r = requests.get(
        f"http://127.0.0.1:{app.http.port}/v1/nodes/gpuUtilizationHistory"
        f"?start={t0}&end={t0 + 240}&step=60",
        timeout=hang_guard(15),
    )
    assert r.status_code == 503 and r.json()["meta"]["code"] == 5003
    assert "unavailable" in r.json()["meta"]["message"]
    r = requests.get(
        f"http://127.0.0.1:{app.http.port}/v1/nodes/gpuUtilization", timeout=hang_guard(15)
    )
    assert r.status_code == 200 and r.json()["meta"]["code"] == 2000
    assert "unavailable" in r.json()["meta"]["message"]
    assert r.json()["data"] == {"allocationRate": 100 * 3 / 14, "utilization": 0.0}
    assert get(app, "/v1/nodes/gpuAllocation")[0]["allocated"] == 2


def test_without_prometheus_the_metric_routes_say_so(
    api: FakeApiServer, recorder_app: Any, tmp_path: Any
) -> None:
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}")
    r = requests.get(
        f"http://127.0.0.1:{app.http.port}/api/nodes/gpuUtilizationHistory" "?start=0&end=60",
        timeout=hang_guard(5),
    )
    body = r.json()
    assert r.status_code == 503 and body["meta"]["code"] == 5003
    assert "recorder.prometheus.url is not set" in body["meta"]["message"]
    assert get(app, "/v1/gpu-aggregation/clusters") == ["local"]
    # the node detail without Prometheus: the CPU count alone (the model is the agents'),
    # and the message says what is missing
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    eventually(lambda: get_or_none(app, "/v1/nodes/gpu-1") is not None, timeout=15)
    r = requests.get(f"http://127.0.0.1:{app.http.port}/v1/nodes/gpu-1", timeout=hang_guard(5))
    assert r.json()["meta"] == {
        "code": 2000,
        "message": "OK; figures unknown, answered as " "0: recorder.prometheus.url is not set",
    }
    assert r.json()["data"]["cpu"] == "128"
    # the node analyses mix stored allocation with Prometheus's utilization: answered
    # without it (0, the original's float64), saying so; the scores from the allocation
    # alone
    for route in ("nodes/fragmentation-analysis", "nodes/load-balance-analysis"):
        r = requests.get(f"http://127.0.0.1:{app.http.port}/v1/{route}", timeout=hang_guard(5))
        body = r.json()
        assert r.status_code == 200 and body["meta"]["code"] == 2000, body
        assert "figures unknown, answered as 0" in body["meta"]["message"]
        assert "recorder.prometheus.url is not set" in body["meta"]["message"]
        if route == "nodes/fragmentation-analysis":
            assert body["data"]["node_fragmentations"] == [
                {
                    "node_name": "gpu-1",
                    "total_gpus": 8,
                    "allocated_gpus": 0,
                    "available_gpus": 8,
                    "fragmentation_score": 40.0,
                    "status": "fragmented",
                    "utilization": 0.0,
                }
            ]
        else:
            assert body["data"]["node_load_distribution"] == [
                {
                    "node_name": "gpu-1",
                    "allocation_rate": 0.0,
                    "utilization_rate": 0.0,
                    "load_score": 0.0,
                }
            ]


def get_or_none(app: Any, path: str) -> Any:
    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))
    return r.json()["data"] if r.status_code == 200 else None


WORKLOAD_ITEM = {
    "kind": "string",
    "name": "string",
    "namespace": "string",
    "uid": "string",
    "gpu_allocated": "integer",
    "gpu_allocation": {"MI300X": "number"},
    "status": "string",
    "status_color": "string",
    "start_at": "integer",
    "end_at": "integer",
    "source": "string",
    "instant_gpu_utilization": "number",
    "avg_gpu_utilization": "number",
    "p50_gpu_utilization": "number",
    "p90_gpu_utilization": "number",
    "p95_gpu_utilization": "number",
}
POD = {
    "podUid": "string",
    "podNamespace": "string",
    "podName": "string",
    "nodeName": "string",
    "phase": "string",
    "running": "boolean",
    "gpuAllocated": "integer",
    "createdAt": "integer",
    "updatedAt": "integer",
}  # model.WorkloadInfoPod (ip omitted)


def put_trainer(api: FakeApiServer, started: str) -> None:
    """The Deployment trainer (2 replicas of 1 GPU) and its ReplicaSet trainer-5d9f."""
    from tests.recorder.objects import template, workload

    spec = {"replicas": 2, "template": template("amd.com/gpu", 1)}
    dep = workload("trainer", spec, {"replicas": 2, "readyReplicas": 2})
    rs = workload("trainer-5d9f", spec, {"replicas": 2, "readyReplicas": 2}, "trainer")
    for obj in (dep, rs):
        obj["metadata"]["creationTimestamp"] = started
    api.put("deployments", dep)
    api.put("replicasets", rs)


def test_workload_routes_as_the_ui_asks_them(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """A Deployment -> ReplicaSet -> 2 GPU pods on gpu-1; the pods' GPU utilization in a real
    Prometheus: the list's statistics, the hierarchy, the detail, exactly."""
    from datetime import UTC, datetime

    from tests.promserver import Prometheus, available
    from tests.recorder.objects import NS, gpu_pod, state

    if available():
        pytest.skip(available())
    t0 = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600
    # per minute, pod a's GPU: 10, 20, ... 100 (ten minutes); pod b's: 50 throughout;
    # another namespace's pod of the same name: 99 (not this workload's)
    lines = ["# TYPE gpu_utilization gauge\n"]
    for m in range(10):
        lines.append(
            f'gpu_utilization{{node="gpu-1",gpu_id="0",namespace="{NS}",'
            f'pod="trainer-5d9f-a"}} {10 * (m + 1)} {t0 + 60 * m}\n'
        )
        lines.append(
            f'gpu_utilization{{node="gpu-1",gpu_id="1",namespace="{NS}",'
            f'pod="trainer-5d9f-b"}} 50 {t0 + 60 * m}\n'
        )
        lines.append(
            f'gpu_utilization{{node="gpu-1",gpu_id="2",namespace="other",'
            f'pod="trainer-5d9f-a"}} 99 {t0 + 60 * m}\n'
        )
    own = 'node="gpu-1",remote_namespace="ml",remote_workload="trainer",direction="egress"'
    gauges = {
        "gpu_memory_used_bytes": (40, 60),
        "gpu_memory_total_bytes": (100, 100),
        "gpu_power_draw_watts": (300, 500),
    }  # pod a's, pod b's
    for family, (a, b) in gauges.items():
        lines.append(f"# TYPE {family} gauge\n")
        for m in range(10):
            lines.append(
                f'{family}{{node="gpu-1",gpu_index="0",namespace="{NS}",'
                f'pod="trainer-5d9f-a"}} {a} {t0 + 60 * m}\n'
            )
            lines.append(
                f'{family}{{node="gpu-1",gpu_index="1",namespace="{NS}",'
                f'pod="trainer-5d9f-b"}} {b} {t0 + 60 * m}\n'
            )
    for family, per_minute in (("lens_tcp_sent_bytes", 6000), ("lens_tcp_received_bytes", 3000)):
        lines.append(f"# TYPE {family} counter\n")
        lines += [f"{family}_total{{{own}}} {per_minute * m} {t0 + 60 * m}\n" for m in range(10)]
    lines.append("# TYPE lens_tcp_rtt_seconds histogram\n")
    for m in range(10):
        for le, n in (("0.001", 10), ("0.002", 20), ("+Inf", 20)):
            lines.append(f'lens_tcp_rtt_seconds_bucket{{{own},le="{le}"}} {n * m} {t0 + 60 * m}\n')
        lines.append(f"lens_tcp_rtt_seconds_count{{{own}}} {20 * m} {t0 + 60 * m}\n")
        lines.append(f"lens_tcp_rtt_seconds_sum{{{own}}} {0.02 * m} {t0 + 60 * m}\n")
    prometheus = Prometheus([], openmetrics="".join(lines) + "# EOF\n")
    try:
        started = datetime.fromtimestamp(t0, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        put_trainer(api, started)
        labels = {"amd.com/gpu.product-name": "MI300X"}
        api.put(
            "nodes",
            {
                **node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"),
                "metadata": {"name": "gpu-1", "labels": labels},
            },
        )
        made = {}
        for name in ("trainer-5d9f-a", "trainer-5d9f-b"):
            p = made[name] = gpu_pod(name, "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
            api.put("pods", p)
            api.put("pods", state(p, "Running", True))
        url = db_url
        at = datetime.fromtimestamp(t0 + 540, UTC)  # nine minutes in: every sample is in
        app = recorder_app(url, clock=lambda: at, prometheus__url=prometheus.base)
        eventually(
            lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 2
            and len(rows(url, "gpu_workloads")) == 2
            and len(rows(url, "nodes")) == 1,
            timeout=15,
        )
        listed = get(
            app,
            "/v1/workloads?page_num=1&page_size=10&name=&namespace=&kind=&" "order_by=&desc=false",
        )
        assert conforms(listed, {"data": [WORKLOAD_ITEM], "total": "integer"})
        (item,) = listed["data"]
        # per-minute means: 30, 35, ... 75 (a: 10..100 and b: 50); their average 52.5
        assert {
            k: item[k]
            for k in (
                "kind",
                "name",
                "namespace",
                "uid",
                "gpu_allocated",
                "gpu_allocation",
                "status",
                "status_color",
                "start_at",
                "source",
                "instant_gpu_utilization",
                "avg_gpu_utilization",
            )
        } == {
            "kind": "Deployment",
            "name": "trainer",
            "namespace": NS,
            "uid": "uid-dep-trainer",
            "gpu_allocated": 2,
            "gpu_allocation": {"MI300X": 2.0},
            "status": "Running",
            "status_color": "green",
            "start_at": t0,
            "source": "k8s",
            "instant_gpu_utilization": 75.0,
            "avg_gpu_utilization": 52.5,
        }
        # quantiles of the ten per-minute means 30..75, interpolated as Prometheus does
        assert (
            item["p50_gpu_utilization"],
            item["p90_gpu_utilization"],
            item["p95_gpu_utilization"],
        ) == (52.5, 70.5, 72.75)
        assert get(app, "/v1/workloads?kind=Job")["total"] == 0
        on_node = get(app, "/v1/nodes/gpu-1/workloads?page_num=1&page_size=10")
        assert on_node == {
            "total": 1,
            "data": [
                {
                    "kind": "Deployment",
                    "name": "trainer",
                    "namespace": NS,
                    "uid": "uid-dep-trainer",
                    "gpu_allocated": 2,
                    "gpu_allocated_node": 2,
                    "node_name": "gpu-1",
                    "status": "Running",
                }
            ],
        }
        assert get(app, "/v1/nodes/gpu-1/workloads?page_num=2")["data"] == []
        stored = next(
            r["gpu_request"] for r in rows(url, "gpu_workloads") if r["uid"] == "uid-dep-trainer"
        )
        consumers = get(app, "/v1/clusters/consumers?page_num=1&page_size=10")
        assert consumers == {
            "total": 1,
            "data": [
                {
                    "kind": "Deployment",
                    "name": "trainer",
                    "namespace": NS,
                    "uid": "uid-dep-trainer",
                    "stat": {"gpu_request": stored, "gpu_utilization": 75.0},
                    "pods": [],
                    "source": "k8s",
                }
            ],
        }
        assert get(app, "/v1/workloadMetadata") == {"namespaces": [NS], "kinds": ["Deployment"]}
        tree = get(app, "/v1/workloads/hierarchy?kind=Deployment&name=trainer")
        assert tree == {
            "kind": "Deployment",
            "name": "trainer",
            "namespace": NS,
            "uid": "uid-dep-trainer",
            "children": [
                {
                    "kind": "ReplicaSet",
                    "name": "trainer-5d9f",
                    "namespace": NS,
                    "uid": "uid-rs-trainer",
                    "children": [],
                }
            ],
        }
        assert get(app, "/v1/workloads/uid-rs-trainer/hierarchy")["name"] == "trainer-5d9f"
        detail = get(app, "/v1/workloads/uid-dep-trainer")
        assert conforms(
            detail,
            {
                "apiVersion": "string",
                "kind": "string",
                "name": "string",
                "namespace": "string",
                "uid": "string",
                "gpu_allocation": {"MI300X": "number"},
                "pods": [POD],
                "activePods": [POD],
                "startTime": "integer",
                "endTime": "integer",
                "source": "string",
            },
        )
        assert [
            (p["podName"], p["nodeName"], p["gpuAllocated"], p["running"])
            for p in detail["activePods"]
        ] == [("trainer-5d9f-a", "gpu-1", 1, True), ("trainer-5d9f-b", "gpu-1", 1, True)]
        graphs = get(
            app, f"/v1/workloads/uid-rs-trainer/metrics?start={t0}&end={t0 + 540}" "&step=60"
        )
        graph = {
            "serial": "integer",
            "series": [
                {
                    "labels": {"node": "string"},
                    "values": [{"timestamp": "integer", "value": "number"}],
                }
            ],
            "config": {"y_axis_unit": "string"},
        }  # model.MetricsGraph
        for title in ("GPU Utilization", "GPU Memory Utilization", "GPU Power"):
            assert conforms(graphs[title], graph), title

        def values(title: str) -> dict[str, list[float]]:
            return {
                ",".join(f"{k}={v}" for k, v in sorted(s["labels"].items())): [
                    p["value"] for p in s["values"]
                ]
                for s in graphs[title]["series"]
            }

        assert values("GPU Utilization") == {"node=gpu-1": [30.0 + 5 * m for m in range(10)]}
        assert values("GPU Memory Utilization") == {"node=gpu-1": [50.0] * 10}
        assert values("GPU Power") == {"node=gpu-1": [400.0] * 10}
        assert values("GPU Memory Used per Pod") == {
            "pod=trainer-5d9f-a": [40.0] * 10,
            "pod=trainer-5d9f-b": [60.0] * 10,
        }
        assert values("GPU Memory Used") == {"": [100.0] * 10}
        # TCP from the pods' node to the workload's own pods: 100 + 50 B/s; RTT median 1 ms
        assert values("TCP Bytes to Own Pods") == {"node=gpu-1": [150.0] * 9}
        assert values("TCP RTT to Own Pods") == {"node=gpu-1": [0.001] * 9}
        assert (graphs["GPU Power"]["serial"], graphs["GPU Power"]["config"]) == (
            3,
            {"y_axis_unit": "W"},
        )
        # every request the web UI's pages make on load, with their exact query strings
        rfc = "%Y-%m-%dT%H:%M:%SZ"
        span = (
            f"start_time={datetime.fromtimestamp(t0, UTC).strftime(rfc)}&end_time="
            f"{at.strftime(rfc)}"
        )
        ui = [
            "gpu-aggregation/clusters",
            "clusters/overview",
            f"gpu-aggregation/cluster/hourly-stats?{span}&order_by=time&order_direction=desc",
            "clusters/consumers?page_num=1&page_size=10",
            "nodes/gpuUtilization",
            "clusters/gpuHeatmap",
            f"nodes/gpuUtilizationHistory?start={t0}&end={t0 + 540}" "&step=60",
            "nodes?page_num=1&page_size=10&status=&name=&gpu_name=&order_by=&" "desc=false",
            "nodes/gpu-1",
            "nodes/gpu-1/workloads?page_num=1&page_size=10",
            "workloads?page_num=1&page_size=10&name=&namespace=&kind=&order_by=&desc=false",
            "workloadMetadata",
            "workloads/hierarchy?kind=Deployment&name=trainer",
            "workloads/uid-dep-trainer",
        ]
        for path in ui:
            sep = "&" if "?" in path else "?"
            r = requests.get(
                f"http://127.0.0.1:{app.http.port}/v1/{path}{sep}cluster=local",
                timeout=hang_guard(5),
            )
            assert r.status_code == 200 and r.json()["meta"]["code"] == 2000, (path, r.text)
            example(path, r.json())
        assert get(app, "/v1/nodes/gpu-1/workloadsHistory") == {"data": [], "total": 0}
        api.put("pods", state(made["trainer-5d9f-b"], "Succeeded", False))  # b is over
        eventually(lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 1, timeout=15)
        history = get(app, "/v1/nodes/gpu-1/workloadsHistory?page_num=1&page_size=10")
        assert [
            {k: v for k, v in h.items() if k not in ("start_time", "end_time")}
            for h in history["data"]
        ] == [
            {
                "kind": "Deployment",
                "name": "trainer",
                "namespace": NS,
                "uid": "uid-dep-trainer",
                "gpu_allocated": 1,
                "pod_name": "trainer-5d9f-b",
                "pod_namespace": NS,
            }
        ]
        assert history["total"] == 1 and conforms(
            history["data"][0],
            {
                "kind": "string",
                "name": "string",
                "namespace": "string",
                "uid": "string",
                "gpu_allocated": "integer",
                "pod_name": "string",
                "pod_namespace": "string",
                "start_time": "integer",
                "end_time": "integer",
            },
        )
        for path, code, names in (
            ("workloads/hierarchy?kind=Deployment", 4001, "name"),
            ("workloads/hierarchy?kind=Job&name=x", 4004, "Job/x"),
            ("workloads/nope", 4004, "nope"),
            ("workloads?order_by=size", 4001, "order_by"),
        ):
            r = requests.get(f"http://127.0.0.1:{app.http.port}/v1/{path}", timeout=hang_guard(5))
            assert r.json()["meta"]["code"] == code and names in r.json()["meta"]["message"]
    finally:
        prometheus.stop()


HOURLY = {
    "id": "integer",
    "cluster_name": "string",
    "stat_hour": "string",
    "total_gpu_capacity": "integer",
    "allocated_gpu_count": "number",
    "allocation_rate": "number",
    "avg_utilization": "number",
    "max_utilization": "number",
    "min_utilization": "number",
    "p50_utilization": "number",
    "p95_utilization": "number",
    "sample_count": "integer",
    "created_at": "string",
    "updated_at": "string",
}
# dbmodel.ClusterGpuHourlyStats (core/pkg/database/model), in PaginatedResponse


def test_hourly_stats_from_snapshots_and_prometheus(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    from datetime import UTC, datetime, timedelta

    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    hour = (int(datetime.now(UTC).timestamp()) // 3600 - 4) * 3600
    series = "".join(
        f'gpu_utilization{{node="gpu-1",gpu_id="0"}} {m} {hour + 60 * m}\n' for m in range(60)
    )  # 0, 1, ... 59 over the hour
    prometheus = Prometheus([], openmetrics=f"# TYPE gpu_utilization gauge\n{series}# EOF\n")
    try:
        two_gpu_nodes(api)
        url = db_url
        h = datetime.fromtimestamp(hour, UTC)
        later = h + timedelta(hours=2)
        app = recorder_app(
            url,
            clock=lambda: later,
            prometheus__url=prometheus.base,
            jobs__allocation_seconds=3600,
            retention__days=1,
        )
        eventually(
            lambda: recorded(url, 2, 2) and app.jobs.runs["hourly"] >= 1,
            timeout=15,
        )
        for minute in (10, 40):
            app.jobs.snapshot(h + timedelta(minutes=minute))
        assert app.writer.flush(10)
        snaps = sorted(
            (r["node"], r["allocatable"], r["requested"], r["rate"])
            for r in rows(url, "allocation_snapshots")
            if r["at"].minute == 10
        )
        assert snaps == [("", 12, 3, 25.0), ("gpu-1", 8, 2, 25.0), ("gpu-2", 4, 1, 25.0)]
        assert app.jobs.hourly(later) == 1  # hour h; the others had no snapshots
        assert app.writer.flush(10)
        assert app.jobs.hourly(later) == 0  # written once
        q = (
            f"start_time={h.strftime('%Y-%m-%dT%H:%M:%SZ')}&end_time="
            f"{later.strftime('%Y-%m-%dT%H:%M:%SZ')}&order_by=time&order_direction=desc"
        )
        got = get(app, f"/v1/gpu-aggregation/cluster/hourly-stats?{q}")
        assert conforms(
            got,
            {
                "data": [HOURLY],
                "total": "integer",
                "page": "integer",
                "page_size": "integer",
                "total_pages": "integer",
            },
        )
        (row,) = got["data"]
        assert {k: v for k, v in row.items() if k not in ("id", "created_at", "updated_at")} == {
            "cluster_name": "local",
            "stat_hour": h.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "total_gpu_capacity": 12,
            "allocated_gpu_count": 3.0,
            "allocation_rate": 25.0,
            "avg_utilization": 29.5,
            "max_utilization": 59.0,
            "min_utilization": 0.0,
            "p50_utilization": 29.5,
            "p95_utilization": 56.05,
            "sample_count": 60,
        }
        assert (got["total"], got["page"], got["page_size"], got["total_pages"]) == (1, 1, 20, 1)
        r = requests.get(
            f"http://127.0.0.1:{app.http.port}/v1/gpu-aggregation/cluster/"
            "hourly-stats?start_time=yesterday",
            timeout=hang_guard(5),
        )
        assert r.status_code == 400 and "start_time" in r.json()["meta"]["message"]
        alloc = get(app, f"/v1/clusters/allocation?start={hour}&end={hour + 3600}")
        assert alloc == {
            "points": [
                {"timestamp": hour + 600, "allocatable": 12, "requested": 3, "rate": 25.0},
                {"timestamp": hour + 2400, "allocatable": 12, "requested": 3, "rate": 25.0},
            ]
        }
        # retention: a day; what is older goes, counted (hour h's six; the start's stay)
        app.jobs.prune(h + timedelta(days=1, hours=1))
        assert app.writer.flush(10)
        assert {aware(r["at"]) for r in rows(url, "allocation_snapshots")} == {later}
        assert app.jobs.pruned["allocation_snapshots"] == 6
    finally:
        prometheus.stop()


def test_against_a_prometheus_that_scrapes_a_real_agent(
    api: FakeApiServer, recorder_app: Any, tmp_path: Any
) -> None:
    """The agent on the AMD sysfs fixture (35% and 0% busy), scraped by a real Prometheus
    with the `node` label the DaemonSet's ServiceMonitor adds: the cluster API's figures
    are the agent's."""
    from tests.agentproc import AgentProc
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    fix = Path(__file__).parent.parent / "fixtures" / "gpu"
    env = {
        "NODE_NAME": "gpu-1",
        "LENS_DEVICES__SYSFS_ROOT": str(fix / "sys"),
        "LENS_DEVICES__DEV_ROOT": str(fix / "dev"),
        "LENS_COLLECTORS__GPU__INTERVAL_SECONDS": "1",
        "LENS_COLLECTORS__GPU__NVIDIA_SMI": "lens-no-such-tool",
        "LENS_COLLECTORS__GPU__AMD_SMI": "lens-no-such-tool",
    }
    agent = AgentProc("--no-collector.tcp", "--no-collector.processes", env=env)
    prometheus = None
    try:
        agent.wait_ready()
        prometheus = Prometheus([agent.base.removeprefix("http://")], labels={"node": "gpu-1"})
        api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "2"}, "10.0.0.11"))
        app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}", prometheus__url=prometheus.base)
        prometheus.wait_value('gpu_utilization{node="gpu-1"}', lambda r: len(r) == 2)
        eventually(lambda: len(rows(f"sqlite:///{tmp_path / 'r.db'}", "nodes")) == 1, timeout=15)
        assert get(app, "/v1/nodes/gpuUtilization") == {"allocationRate": 0.0, "utilization": 17.5}
        listed = get(app, "/v1/nodes")["data"]
        assert [(n["name"], n["gpu_count"], n["gpu_utilization"]) for n in listed] == [
            ("gpu-1", 2, 17.5)
        ]
        heat = get(app, "/v1/clusters/gpuHeatmap")
        assert [(i["gpu_id"], i["value"]) for i in heat["utilization"]["Data"]] == [
            (0, 35.0),
            (1, 0.0),
        ]
    finally:
        if prometheus is not None:
            prometheus.stop()
        assert agent.stop() == 0
