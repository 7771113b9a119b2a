"""The node exporter's consumer (tests/rest_contract.py) against the running agent: GPU and
RDMA fixture trees, and a real containerd container holding a GPU and an RDMA device."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import rest_contract
from tests.agentproc import AgentProc
from tests.conftest import wait_for
from tests.containerlab import Containerd, gpu_and_rdma_nodes, private_containerd

pytestmark = pytest.mark.e2e
FIX = Path(__file__).parent.parent / "fixtures"


@pytest.fixture(scope="module")
def ctd() -> Iterator[Containerd]:
    yield from private_containerd("rest-")


@pytest.fixture(scope="module")
def host_devices() -> Iterator[tuple[str, str]]:
    """Device nodes standing in for the MI300X's render node and mlx5_0's uverbs0."""
    yield from gpu_and_rdma_nodes()


def test_every_route_reads_as_the_node_exporters(ctd, host_devices, tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"  # one sysfs holding the GPU fixture and the RDMA fixture
    for part in ("gpu", "rdma"):
        shutil.copytree(FIX / part / "sys", sysfs, symlinks=True, dirs_exist_ok=True)
    env = {
        "LENS_DEVICES__SYSFS_ROOT": str(sysfs),
        "LENS_DEVICES__DEV_ROOT": str(FIX / "gpu" / "dev"),
        "LENS_CONTAINERS__CONTAINERD_STATE": str(ctd.state),
        "LENS_COLLECTORS__GPU__NVIDIA_SMI": "lens-no-such-tool",
        "LENS_COLLECTORS__GPU__AMD_SMI": "lens-no-such-tool",
        "LENS_COLLECTORS__RDMA__TOOL": "lens-no-such-rdma-tool",
    }
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    pod_uid = str(uuid.uuid4())
    labels = {
        "io.kubernetes.pod.name": "train-0",
        "io.kubernetes.pod.namespace": "ml",
        "io.kubernetes.pod.uid": pod_uid,
        "io.kubernetes.container.name": "trainer",
    }
    agent = AgentProc("--no-collector.tcp", env=env)
    try:
        agent.wait_ready()
        res = ctd.run(
            cid,
            "/bin/sleep",
            "60",
            labels=labels,
            devices=host_devices,
            detach=True,
            cgroup=f"/kubepods/pod{pod_uid}/{cid}",
        )
        assert res.returncode == 0, res.stderr
        wait_for(
            lambda: any(p["id"] == cid for p in agent.json("/pods")[1]),
            f"container {cid} in /pods",
            every=0.3,
        )
        got = {
            path: rest_contract.route(path, agent.json(path)[1]) for path in rest_contract.ROUTES
        }
    finally:
        ctd.remove(cid)
        assert agent.stop() == 0
    pod = next(p for p in got["/pods"] if p["id"] == cid)
    assert (pod["pod_name"], pod["pod_namespace"], pod["pod_uuid"]) == ("train-0", "ml", pod_uid)
    assert pod["devices"] == {
        "gpu": [
            {
                "name": "AMD Instinct MI300X",
                "id": 0,
                "path": "/dev/dri/renderD128",
                "kind": "GPU",
                "uuid": "0x74a1",
                "serial": "0x18A96C02D4E1C0A3",
                "slot": "0000:c1:00.0",
            }
        ],
        # no rdma tool: mlx5_0's index is its position by name among the five devices
        "infiniband": [
            {
                "name": "mlx5_0",
                "id": 2,
                "path": "/dev/infiniband/uverbs0",
                "kind": "RDMA",
                "uuid": "0c:42:a1:03:00:65:2a:3c",
            }
        ],
    }
    gpus = {g["bus"]["bdf"]: g for g in got["/gpus"]}
    assert gpus["0000:c1:00.0"]["dri_device"] == {
        "card": "/dev/dri/card1",
        "render": "/dev/dri/renderD128",
        "pci_addr": "0000:c1:00.0",
    }
    assert got["/gpuDriverVersion"] == "6.7.0"
    assert set(got["/driMapping"]) == {"/dev/dri/card1", "/dev/dri/card2"}
    assert [c["gpu"] for c in got["/cardMetrics"]] == [0, 1]
    assert {r["if_name"]: r["if_index"] for r in got["/rdma"]}["mlx5_0"] == 2
