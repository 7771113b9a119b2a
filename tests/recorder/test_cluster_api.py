"""The cluster API's first Primus-Lens routes: the response of each has the original's field
names, nesting and JSON types (its Go structs' json tags, written here as a schema with the
file they come from), the numbers are exact, against the API stand-in's nodes and GPU pods,
with SQLite and PostgreSQL; and the Node watch keeps the `nodes` table."""

from __future__ import annotations

from typing import Any

import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually, pod
from tests.recorder.conftest import rows

GO = "AMD-AGI/Primus-SaFE@c946dc3d Lens/modules"
# route -> (where the response type is, its schema: a JSON type, or a list of one schema,
# or {field: schema})
CONTRACTS: dict[str, tuple[str, Any]] = {
    "gpu-aggregation/clusters": (f"{GO}/api/pkg/api/unified_gpu_aggregation.go "
                                 "GpuAggClustersResponse []string", ["string"]),
    "nodes/gpuAllocation": (f"{GO}/api/pkg/api/unified_node.go GPUAllocationResponse "
                            "[]model.GpuAllocation (core/pkg/model/gpu.go)",
                            [{"node": "string", "vendor": "string", "capacity": "integer",
                              "allocated": "integer", "allocationRate": "number"}]),
}  # fmt: skip


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
    if isinstance(schema, list):
        return isinstance(value, list) and all(conforms(v, schema[0]) for v in value)
    if isinstance(schema, dict):
        return (isinstance(value, dict) and value.keys() == schema.keys()
                and all(conforms(value[k], s) for k, s in schema.items()))  # fmt: skip
    return got == schema


def node(name: str, ready: str, capacity: dict[str, str], ip: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "gpu.8x",
                "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"}},
            "status": {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                      {"type": "Ready", "status": ready}],
                       "addresses": [{"type": "Hostname", "address": name},
                                     {"type": "InternalIP", "address": ip}],
                       "capacity": {"cpu": "128", "memory": "2113474560Ki", **capacity},
                       "allocatable": {"cpu": "127500m", "memory": "2113372160Ki", **capacity},
                       "nodeInfo": {"kernelVersion": "6.8.0-45-generic",
                                    "osImage": "Ubuntu 22.04.5 LTS",
                                    "kubeletVersion": "v1.31.2",
                                    "containerRuntimeVersion": "containerd://1.7.22"}}}  # fmt: skip


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


def get(app: Any, path: str) -> Any:
    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(5))
    body = r.json()
    assert r.status_code == 200 and body["meta"] == {"code": 2000, "message": "OK"}, body
    return body["data"]


def test_nodes_and_gpu_allocation_exact_and_shaped_as_the_original(
        api: FakeApiServer, recorder_app: Any, db_url: str) -> None:  # fmt: skip
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    api.put("nodes", node("gpu-2", "False", {"nvidia.com/gpu": "4"}, "10.0.0.12"))
    api.put("nodes", node("cpu-1", "Unknown", {}, "10.0.0.13"))
    api.put("pods", gpu_pod("a", "gpu-1", "amd.com/gpu", 2, "Running"))
    api.put("pods", gpu_pod("b", "gpu-1", "amd.com/gpu", 4, "Pending"))  # not allocated yet
    api.put("pods", gpu_pod("c", "gpu-2", "nvidia.com/gpu", 1, "Running"))
    app = recorder_app(db_url, cluster_name="mi300-east")
    eventually(lambda: len(rows(db_url, "nodes")) == 3 and sum(
        r["running"] for r in rows(db_url, "gpu_pods")) == 2, timeout=15)  # fmt: skip
    got = {r["name"]: r for r in rows(db_url, "nodes")}
    one = got["gpu-1"]
    assert (one["status"], one["address"], one["gpu_capacity"], one["cpu_count"],
            one["memory_bytes"], one["kernel"], one["container_runtime"]) == (
        "Ready", "10.0.0.11", {"amd.com/gpu": 8}, 128, 2113474560 * 1024, "6.8.0-45-generic",
        "containerd://1.7.22")  # fmt: skip
    assert one["labels"] == {
        "node.kubernetes.io/instance-type": "gpu.8x",
        "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM",
    }
    assert (got["gpu-2"]["status"], got["cpu-1"]["status"]) == ("NotReady", "Unknown")

    answers = {route: get(app, f"/v1/{route}?cluster=mi300-east") for route in CONTRACTS}
    for route, (source, schema) in CONTRACTS.items():
        assert conforms(answers[route], schema), (route, source, answers[route])
    assert answers["gpu-aggregation/clusters"] == ["mi300-east"]
    assert answers["nodes/gpuAllocation"] == [
        {"node": "gpu-1", "vendor": "amd", "capacity": 8, "allocated": 2,
         "allocationRate": 0.25},
        {"node": "gpu-2", "vendor": "NVIDIA", "capacity": 4, "allocated": 1,
         "allocationRate": 0.25}]  # fmt: skip
    assert get(app, "/api/nodes/gpuAllocation") == answers["nodes/gpuAllocation"]
    # the node goes: kept, marked deleted, no longer listed
    api.delete("nodes", "", "gpu-2")
    eventually(lambda: {r["name"]: r["deleted"] for r in rows(db_url, "nodes")}["gpu-2"],
               timeout=15)  # fmt: skip
    assert [a["node"] for a in get(app, "/v1/nodes/gpuAllocation")] == ["gpu-1"]


def test_a_schema_catches_a_renamed_or_missing_field() -> None:
    _, schema = CONTRACTS["nodes/gpuAllocation"]
    row = {"node": "n", "vendor": "amd", "capacity": 8, "allocated": 2, "allocationRate": 0.25}
    assert conforms([row], schema)
    assert not conforms([{**row, "allocation_rate": 0.25}], schema)
    assert not conforms([{k: v for k, v in row.items() if k != "vendor"}], schema)
    assert not conforms([{**row, "capacity": "8"}], schema)
