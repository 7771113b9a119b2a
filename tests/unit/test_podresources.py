"""PodResources v1 over real gRPC on a unix socket: two GPUs map to two pods, and GPU
series carry the pod that holds each GPU."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from lens_ebpf.agent.devices.gpu import amd, nvidia
from lens_ebpf.agent.devices.gpu.collector import GpuCollector
from lens_ebpf.agent.pods.podresources import DeviceOwner, PodResourcesCollector
from lens_ebpf.k8s.gen import podresources_v1_pb2 as pb
from lens_ebpf.k8s.gen import podresources_v1_pb2_grpc as pb_grpc

GPU_FIX = Path(__file__).parent.parent / "fixtures" / "gpu"
RESOURCES = ["amd.com/gpu", "nvidia.com/gpu"]


def answer() -> pb.ListPodResourcesResponse:
    """What a kubelet with the AMD and NVIDIA device plugins answers."""
    dev = pb.ContainerDevices
    numa = pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)])
    return pb.ListPodResourcesResponse(
        pod_resources=[
            pb.PodResources(
                name="train-0",
                namespace="ml",
                containers=[
                    pb.ContainerResources(
                        name="trainer",
                        cpu_ids=[4, 5],
                        devices=[
                            dev(
                                resource_name="amd.com/gpu",
                                device_ids=["0000:c1:00.0"],
                                topology=numa,
                            ),
                            dev(resource_name="rdma/hca", device_ids=["mlx5_0"]),
                        ],
                    ),
                    pb.ContainerResources(name="sidecar"),
                ],
            ),
            pb.PodResources(
                name="cuda-check",
                namespace="default",
                containers=[
                    pb.ContainerResources(
                        name="check",
                        devices=[
                            dev(
                                resource_name="nvidia.com/gpu",
                                device_ids=["GPU-11111111-2222-3333-4444-555555555555::1"],
                            )
                        ],
                    )
                ],
            ),
            pb.PodResources(
                name="cpu-only",
                namespace="default",
                containers=[pb.ContainerResources(name="c", cpu_ids=[1])],
            ),
        ]
    )


class Lister(pb_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.calls = 0
        self.fail = False

    def List(self, request, context):  # noqa: N802
        self.calls += 1
        if self.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        return answer()


@pytest.fixture
def kubelet_sock(tmp_path: Path) -> Iterator[tuple[str, Lister]]:
    sock = str(tmp_path / "kubelet.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    lister = Lister()
    pb_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    yield sock, lister
    server.stop(0)


def test_two_gpus_map_to_two_pods(kubelet_sock: tuple[str, Lister]) -> None:
    sock, lister = kubelet_sock
    prc = PodResourcesCollector(15, sock, 5, RESOURCES)
    prc.run_once()
    assert prc.success, prc.last_error
    assert prc.assigned == {
        "0000:c1:00.0": DeviceOwner("amd.com/gpu", "ml", "train-0", "trainer"),
        "gpu-11111111-2222-3333-4444-555555555555": DeviceOwner(
            "nvidia.com/gpu", "default", "cuda-check", "check"
        ),
    }
    allocated = {
        (s.labels["device_id"], s.labels["pod"]) for m in prc.snapshot() for s in m.samples
    }
    assert allocated == {
        ("0000:c1:00.0", "train-0"),
        ("gpu-11111111-2222-3333-4444-555555555555", "cuda-check"),
    }

    gpus = GpuCollector(
        5,
        "gpu-7",
        {
            "amd": [("sysfs", lambda: amd.read_sysfs(GPU_FIX / "sys"))],
            "nvidia": [
                (
                    "nvidia-smi",
                    lambda: nvidia.parse_smi_csv((GPU_FIX / "nvidia-smi-gpus.csv").read_text()),
                )
            ],
        },
        allocated=lambda: prc.assigned,
    )
    gpus.run_once()
    assert gpus.success
    util = {
        (s.labels.get("vendor"), s.labels.get("gpu_index")): s.labels
        for m in gpus.snapshot()
        if m.name == "hw_gpu_utilization_percent"
        for s in m.samples
    }
    assert util[("amd", "0")]["pod"] == "train-0" and util[("amd", "0")]["namespace"] == "ml"
    assert util[("amd", "0")]["container"] == "trainer"
    assert util[("nvidia", "0")]["pod"] == "cuda-check"
    assert "pod" not in util[("nvidia", "1")]  # not allocated: no pod labels
    view = {(g["vendor"], g["gpu"]): g["allocated_to"] for g in gpus.views["gpus"]}
    assert view[("amd", 0)] == {"namespace": "ml", "pod": "train-0", "container": "trainer"}
    assert view[("nvidia", 1)] is None


def test_kubelet_errors_are_counted_and_clear_the_mapping(
    kubelet_sock: tuple[str, Lister], tmp_path: Path
) -> None:
    sock, lister = kubelet_sock
    prc = PodResourcesCollector(15, sock, 5, RESOURCES)
    prc.run_once()
    assert len(prc.assigned) == 2
    lister.fail = True
    prc.run_once()
    assert not prc.success and prc.errors == {"unavailable": 1}
    assert prc.assigned == {}  # a stale owner would put the wrong pod on a GPU
    absent = PodResourcesCollector(15, str(tmp_path / "nope.sock"), 5, RESOURCES)
    absent.run_once()  # no kubelet socket on this node: no data, not an error
    assert absent.success and absent.errors == {} and absent.snapshot() == []
