"""The node exporter's REST contract, route by route: our JSON read by a consumer written
from its documented examples (tests/rest_contract.py), the documented part compared with
what the node exporter reports for the same devices (tests/golden/rest/*.json), and what
lens-ebpf adds beside it listed."""

import json
from pathlib import Path

import pytest

from lens_ebpf.agent.containers.pods import pods_view
from lens_ebpf.agent.containers.runtime import ContainerInfo, Device
from lens_ebpf.agent.devices.gpu import amd
from lens_ebpf.agent.devices.gpu.collector import GpuCollector, nvml_source
from lens_ebpf.agent.devices.rdma.collector import RdmaCollector
from tests import rest_contract
from tests.golden import check_golden

FIX = Path(__file__).parent.parent / "fixtures"
EXAMPLES = json.loads((FIX / "rest" / "node_exporter_examples.json").read_text())
EXTRAS = {
    "/gpus": {
        "[].vendor",
        "[].uuid",
        "[].unique_id",
        "[].driver_version",
        "[].memory_total_bytes",
        "[].source",
        "[].allocated_to",
    },
    "/cardMetrics": {
        "[].vendor",
        "[].bdf",
        "[].memory_used_bytes",
        "[].memory_total_bytes",
        "[].temperature_celsius",
        "[].temperatures",
        "[].power_draw_watts",
        "[].power_limit_watts",
        "[].stale",
    },
    "/driMapping": {"{}.gpu", "{}.vendor"},
    "/rdma": {"[].port", "[].state", "[].netdev"},
    "/pods": {
        "[].container_name",
        "[].control_devices",
        "[].devices.gpu[].vendor",
        "[].devices.gpu[].host_path",
        "[].devices.gpu[].major",
        "[].devices.gpu[].minor",
        "[].devices.infiniband[].host_path",
        "[].devices.infiniband[].major",
        "[].devices.infiniband[].minor",
    },
    "/gpuDriverVersion": set(),
}


def envelope(data) -> dict:
    return {"code": 0, "data": data, "message": "success"}


@pytest.mark.parametrize("path", sorted(rest_contract.ROUTES))
def test_the_consumer_reads_the_documented_examples(path: str) -> None:
    """The consumer is right about the documentation before it judges us."""
    got = rest_contract.route(path, EXAMPLES[path])
    assert got == (EXAMPLES[path]["data"] if rest_contract.ROUTES[path][1] else EXAMPLES[path])


def test_the_consumer_is_strict() -> None:
    row = EXAMPLES["/gpus"]["data"][0]
    with pytest.raises(rest_contract.ContractError, match="missing asic"):
        rest_contract.route("/gpus", envelope([{k: v for k, v in row.items() if k != "asic"}]))
    with pytest.raises(rest_contract.ContractError, match=r"\$?/gpus\[0\]\.gpu: want int"):
        rest_contract.route("/gpus", envelope([{**row, "gpu": "0"}]))
    with pytest.raises(rest_contract.ContractError, match="want a list"):
        rest_contract.route("/pods", envelope([]))  # /pods has no envelope


@pytest.fixture(scope="module")
def routes(fake_nvml) -> dict:
    """Every route's body, from the GPU (amd-smi and NVML) and RDMA fixtures and one pod
    container holding a GPU's render node, its card node and an RDMA device."""
    gfix = FIX / "gpu"
    smi = [(gfix / f"amd-smi-{k}.json").read_text() for k in ("static", "metric", "process")]
    gpu = GpuCollector(
        5,
        "gpu-7",
        {"amd": [("amd-smi", lambda: amd.parse_amd_smi(*smi))], "nvidia": [nvml_source(fake_nvml)]},
        dev_root=gfix / "dev",
    )
    gpu.run_once()
    rdma = RdmaCollector(
        5, FIX / "rdma" / "sys", runner=lambda: (FIX / "rdma" / "statistic.json").read_text()
    )
    rdma.run_once()
    assert gpu.success and rdma.success
    devices = [
        Device("/dev/dri/renderD128", "c", 226, 128, "/dev/dri/renderD128", "gpu"),
        Device("/dev/dri/card1", "c", 226, 1, "/dev/dri/card1", "gpu"),
        Device("/dev/kfd", "c", 511, 0, "/dev/kfd", "gpu"),
        Device("/dev/infiniband/uverbs0", "c", 231, 192, "", "infiniband"),
    ]
    pod = ContainerInfo(
        "4f" * 32,
        "k8s.io",
        "train-0",
        "ml",
        "0b5e9a4e-5f7c-4c1e-9d4a-6f2b",
        "trainer",
        devices=devices,
    )
    return {
        "/gpus": envelope(gpu.views["gpus"]),
        "/gpuDriverVersion": envelope(gpu.views["driver"]),
        "/cardMetrics": envelope(gpu.views["cards"]),
        "/driMapping": envelope(gpu.views["dri"]),
        "/rdma": envelope(rdma.views["rdma"]),
        "/pods": pods_view({pod.id: pod}, gpu.views["devices"], rdma.views["devices"]),
    }


@pytest.mark.parametrize("path", sorted(rest_contract.ROUTES))
def test_every_route_in_the_node_exporters_shape(routes: dict, path: str) -> None:
    got = rest_contract.route(path, routes[path])
    name = path.strip("/") + ".json"
    check_golden(f"rest/{name}", json.dumps(got, indent=1, sort_keys=True) + "\n")
    shape, wrapped = rest_contract.ROUTES[path]
    body = routes[path]["data"] if wrapped else routes[path]
    assert rest_contract.extras(body, shape) == EXTRAS[path]


def test_values_as_the_node_exporter_reports_them(routes: dict) -> None:
    gpus = {(g["vendor"], g["gpu"]): g for g in routes["/gpus"]["data"]}
    mi300 = gpus[("amd", 0)]
    assert mi300["asic"] == {
        "market_name": "AMD Instinct MI300X",
        "device_id": "0x74a1",
        "asic_serial": "0x18A96C02D4E1C0A3",
    }
    assert mi300["dri_device"] == {
        "card": "/dev/dri/card1",
        "render": "/dev/dri/renderD128",
        "pci_addr": "0000:c1:00.0",
    }
    # NVIDIA GPUs in the same shape: NVML's name, PCI device id and serial
    h100 = {
        "market_name": "NVIDIA H100 80GB HBM3",
        "device_id": "0x2330",
        "asic_serial": "1650923010481",
    }
    assert gpus[("nvidia", 0)]["asic"] == h100
    assert routes["/gpuDriverVersion"]["data"] == "6.7.0"
    cards = {(c["vendor"], c["gpu"]): c for c in routes["/cardMetrics"]["data"]}
    h100 = cards[("nvidia", 0)]
    assert (h100["gpu_use_percent"], h100["memory_use_percent"]) == (87.0, 50.0)
    assert routes["/driMapping"]["data"]["/dev/dri/card1"]["card_id"] == 1
    rdma = {r["if_name"]: r for r in routes["/rdma"]["data"]}
    assert rdma["mlx5_0"]["node_guid"] == "0c:42:a1:03:00:65:2a:3c"
    pod = routes["/pods"][0]
    # one entry per GPU: the card node's path, the GPU's index, device id, serial and slot
    assert pod["devices"]["gpu"] == [
        {
            "name": "AMD Instinct MI300X",
            "id": 0,
            "path": "/dev/dri/card1",
            "kind": "GPU",
            "uuid": "0x74a1",
            "serial": "0x18A96C02D4E1C0A3",
            "slot": "0000:c1:00.0",
            "vendor": "amd",
            "host_path": "/dev/dri/card1",
            "major": 226,
            "minor": 1,
        }
    ]
    assert pod["devices"]["infiniband"][0]["uuid"] == rdma["mlx5_0"]["node_guid"]
    assert pod["devices"]["infiniband"][0]["id"] == rdma["mlx5_0"]["if_index"]
    assert pod["control_devices"] == ["/dev/kfd"]
