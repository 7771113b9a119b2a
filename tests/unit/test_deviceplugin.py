"""The test device plugin's own side of the kubelet's device plugin API v1beta1, over real
gRPC on its unix socket: the fixture's AMD GPUs by PCI address, their nodes on Allocate."""

from __future__ import annotations

import filecmp
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from lens_ebpf.agent.devices.gpu import amd
from lens_ebpf.agent.pods.podresources import device_key
from lens_ebpf.k8s.gen import deviceplugin_v1beta1_pb2 as pb
from lens_ebpf.k8s.gen import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from tests.kube.deviceplugin import AmdGpu, AmdGpuPlugin, sysfs_gpus

ROOT = Path(__file__).parent.parent.parent
GPU_FIX = ROOT / "tests" / "fixtures" / "gpu"
GPUS = [
    AmdGpu("0000:c1:00.0", "/dev/dri/card1", "/dev/dri/renderD128"),
    AmdGpu("0001:03:00.0", "/dev/dri/card2", "/dev/dri/renderD129"),
]


def spec(path: str) -> pb.DeviceSpec:
    return pb.DeviceSpec(container_path=path, host_path=path, permissions="rw")


@pytest.fixture
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AmdGpuPlugin]:
    p = AmdGpuPlugin(sysfs_gpus(GPU_FIX / "sys", GPU_FIX / "dev"), poll_seconds=0.05)
    p.start(tmp_path_factory.mktemp("kubelet"))  # short: a unix socket path has 107 bytes
    yield p
    p.stop()


@pytest.fixture
def stub(plugin: AmdGpuPlugin) -> Iterator[pb_grpc.DevicePluginStub]:
    with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
        yield pb_grpc.DevicePluginStub(ch)


def test_devices_are_the_fixture_gpus_keyed_as_the_agent_keys_them() -> None:
    gpus = sysfs_gpus(GPU_FIX / "sys", GPU_FIX / "dev")
    assert gpus == GPUS  # card0 is not amdgpu
    agent_keys = [r.bdf for r in amd.read_sysfs(GPU_FIX / "sys")]
    assert [g.bdf for g in gpus] == agent_keys == [device_key(g.bdf) for g in gpus]


def test_host_nodes_are_drm_char_devices() -> None:
    assert AmdGpuPlugin(GPUS).host_nodes() == [
        ("/dev/dri/card1", 226, 1),
        ("/dev/dri/renderD128", 226, 128),
        ("/dev/dri/card2", 226, 2),
        ("/dev/dri/renderD129", 226, 129),
    ]


def test_serves_without_a_kubelet_and_offers_preferred_allocation(
    plugin: AmdGpuPlugin, stub: pb_grpc.DevicePluginStub
) -> None:
    assert plugin.socket.is_socket() and plugin.registrations == 0
    opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert opts == pb.DevicePluginOptions(get_preferred_allocation_available=True)
    req = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=["0001:03:00.0", "0000:c1:00.0"],
        must_include_deviceIDs=["0001:03:00.0"],
        allocation_size=1,
    )
    resp = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[req]))
    assert [list(r.deviceIDs) for r in resp.container_responses] == [["0001:03:00.0"]]
    assert (
        stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["0000:c1:00.0"]), timeout=5)
        == pb.PreStartContainerResponse()
    )


def test_list_and_watch_lists_the_gpus_and_sends_health_changes(
    plugin: AmdGpuPlugin, stub: pb_grpc.DevicePluginStub
) -> None:
    stream = stub.ListAndWatch(pb.Empty(), timeout=10)
    first = [(d.ID, d.health) for d in next(stream).devices]
    assert first == [("0000:c1:00.0", "Healthy"), ("0001:03:00.0", "Healthy")]
    plugin.set_health("0001:03:00.0", False)
    second = [(d.ID, d.health) for d in next(stream).devices]
    assert second == [("0000:c1:00.0", "Healthy"), ("0001:03:00.0", "Unhealthy")]
    stream.cancel()


def test_allocate_gives_kfd_and_each_gpus_card_and_render_node(
    plugin: AmdGpuPlugin, stub: pb_grpc.DevicePluginStub
) -> None:
    req = pb.AllocateRequest(
        container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["0001:03:00.0"]),
            pb.ContainerAllocateRequest(devices_ids=["0000:c1:00.0", "0001:03:00.0"]),
        ]
    )
    resp = stub.Allocate(req, timeout=5)
    first, second = resp.container_responses
    assert list(first.devices) == [
        spec("/dev/kfd"),
        spec("/dev/dri/card2"),
        spec("/dev/dri/renderD129"),
    ]
    assert list(second.devices) == [
        spec("/dev/kfd"),
        spec("/dev/dri/card1"),
        spec("/dev/dri/renderD128"),
        spec("/dev/dri/card2"),
        spec("/dev/dri/renderD129"),
    ]
    assert dict(first.envs) == {} and not first.mounts and dict(first.annotations) == {}
    assert plugin.allocate_calls == 1
    assert plugin.allocated == [["0001:03:00.0"], ["0000:c1:00.0", "0001:03:00.0"]]


def test_allocate_without_kfd(tmp_path_factory: pytest.TempPathFactory) -> None:
    plugin = AmdGpuPlugin(GPUS, kfd=None)
    plugin.start(tmp_path_factory.mktemp("kubelet"))
    try:
        with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
            req = pb.ContainerAllocateRequest(devices_ids=["0000:c1:00.0"])
            resp = pb_grpc.DevicePluginStub(ch).Allocate(
                pb.AllocateRequest(container_requests=[req]), timeout=5
            )
    finally:
        plugin.stop()
    assert list(resp.container_responses[0].devices) == [
        spec("/dev/dri/card1"),
        spec("/dev/dri/renderD128"),
    ]
    assert not plugin.socket.exists()


def test_allocate_of_an_unknown_id_is_not_found(
    plugin: AmdGpuPlugin, stub: pb_grpc.DevicePluginStub
) -> None:
    req = pb.AllocateRequest(
        container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["0000:c1:00.0", "0000:99:00.0"])
        ]
    )
    with pytest.raises(grpc.RpcError) as exc:
        stub.Allocate(req, timeout=5)
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    assert "0000:99:00.0" in exc.value.details()
    assert plugin.allocate_calls == 1 and plugin.allocated == []


def test_serves_again_when_its_socket_is_removed(plugin: AmdGpuPlugin) -> None:
    """A starting kubelet empties device-plugins/, the plugin's socket with it."""
    plugin.socket.unlink()
    deadline = time.monotonic() + 5
    while not plugin.socket.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
        resp = pb_grpc.DevicePluginStub(ch).GetDevicePluginOptions(pb.Empty(), timeout=5)
    assert resp.get_preferred_allocation_available


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)], check=True)
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
        name = f"deviceplugin_v1beta1{suffix}"
        assert filecmp.cmp(
            tmp_path / "k8s" / name, ROOT / "lens_ebpf" / "k8s" / "gen" / name, shallow=False
        ), f"{name} is stale: run make protos"
