"""GPU faults through the running agent and through `trace gpu`: an Xid written to the
real /dev/kmsg and raised through NVML's event API (the stand-in libnvidia-ml.so.1 loaded by
the real pynvml), and a rise in uncorrectable ECC errors, reach /metrics, the gRPC stream
and trace with the pod the kubelet's PodResources gave the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from lens_ebpf.k8s.gen import podresources_v1_pb2_grpc as pr_grpc
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests.agentproc import LENS_CMD, AgentProc, free_port, parse_samples
from tests.conftest import hang_guard, wait_for
from tests.e2e.test_grpc import Reader, wait_subscribers
from tests.gpulab import build_nvml, missing_gcc
from tests.unit.test_gpu_faults import raise_xid
from tests.unit.test_podresources import Lister

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="writing to /dev/kmsg needs root"),
]
ROOT = Path(__file__).resolve().parents[2]
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"  # the stand-in's GPU 0, at 0000:18:00.0
POD = {"namespace": "default", "pod": "cuda-check"}  # PodResources gives it GPU 0


@pytest.fixture
def gpu_node(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The stand-in NVML where the agent's pynvml finds it, a kubelet PodResources socket,
    and the directory that tells the stand-in what faults to raise."""
    if missing_gcc():
        pytest.skip(missing_gcc())
    lib = tmp_path / "lib"
    build_nvml(lib)
    state = tmp_path / "nvml-state"
    state.mkdir()
    sock = str(tmp_path / "kubelet.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    yield {
        "LD_LIBRARY_PATH": str(lib),
        "FAKE_NVML_STATE": str(state),
        "LENS_KUBERNETES__POD_RESOURCES__SOCKET": sock,
        "LENS_KUBERNETES__POD_RESOURCES__INTERVAL_SECONDS": "1",
        "LENS_COLLECTORS__GPU__INTERVAL_SECONDS": "1",
        "LENS_COLLECTORS__GPU__NVIDIA_SMI": "lens-no-such-tool",
        "LENS_DEVICES__SYSFS_ROOT": str(tmp_path),  # no amdgpu cards
    }
    server.stop(0)


def wait_labelled(
    agent: AgentProc, name: str, labels: dict[str, str], timeout: float = 20
) -> float | None:
    """The first sample of name whose labels include these."""

    def find() -> tuple[float] | None:
        for sname, slabels, value in parse_samples(agent.metrics_text()):
            if sname == name and labels.items() <= slabels.items():
                return (value,)
        return None

    return wait_for(find, f"{name} with {labels}", timeout, every=0.2)[0]


def write_kmsg(xid: int, note: str) -> str:
    line = (
        f"NVRM: Xid (PCI:0000:18:00): {xid}, pid='<unknown>', name=<unknown>, {note}, "
        "written by the lens-ebpf test suite, not a driver"
    )
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(line + "\n")
    return line


def test_faults_reach_metrics_and_the_grpc_stream_with_the_pod(
    gpu_node: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    agent = AgentProc(
        "--no-collector.tcp",
        "--no-collector.processes",
        "--no-collector.drops",
        env={**gpu_node, "LENS_GRPC__LISTEN": f"127.0.0.1:{port}"},
    )
    state = Path(gpu_node["FAKE_NVML_STATE"])
    try:
        agent.wait_ready()
        assert (
            wait_labelled(
                agent, "hw_gpu_memory_total_bytes", {"gpu_index": "0", "gpu_uuid": UUID0, **POD}
            )
            == 80 * 2**30
        )
        stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        reader = Reader(stub, pb.SubscribeRequest(kinds=["gpu_fault"]))
        wait_subscribers(agent, 1)
        # Xid 79 in the kernel log and from NVML's events: one fault
        line = write_kmsg(79, "GPU has fallen off the bus")
        raise_xid(state, 0, 79)
        # three uncorrectable ECC errors: the next reading's count rises by three
        (state / "ecc_uncorrected").write_text("3")
        xid = {"gpu": "0", "kind": "xid", "code": "79", **POD, "workload": ""}
        ecc = {"gpu": "0", "kind": "ecc_uncorrectable", "code": "memory", **POD, "workload": ""}
        assert agent.wait_sample("lens_gpu_faults_total", ecc, 3, 20)
        assert agent.wait_sample("lens_gpu_faults_duplicate_total", None, 1, 20)
        assert agent.sample("lens_gpu_faults_total", xid) == 1
        wait_for(lambda: len(reader.events) >= 2, "two faults on the stream")
        time.sleep(1)  # nothing more comes (a window: a slower machine only widens it)
        got = reader.close()
    finally:
        assert agent.stop() == 0
    faults = sorted(
        (f.fault, f.code, f.bdf, f.uuid, f.identity.namespace, f.identity.pod)
        for f in (e.gpu_fault for e in got)
    )
    assert faults == [
        ("ecc_uncorrectable", "memory", "0000:18:00.0", UUID0, "default", "cuda-check"),
        ("xid", "79", "0000:18:00.0", UUID0, "default", "cuda-check"),
    ]
    messages = {e.gpu_fault.fault: e.gpu_fault.message for e in got}
    assert messages["xid"] in (line, "NVML Xid event: 79")  # whichever came first


def test_trace_gpu_shows_a_fault_live_with_the_pod(gpu_node: dict[str, str]) -> None:
    # the duration only ends a trace that would otherwise hang the test
    cmd = [*LENS_CMD, "trace", "gpu", "--json", "--duration", str(hang_guard(20))]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, **gpu_node},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        started = proc.stderr.readline()
        assert "tracing GPU faults on 2 GPUs" in started, started
        line = write_kmsg(48, "An uncorrectable double bit error")
        got = json.loads(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(hang_guard(10))
    assert (got["kind"], got["fault"], got["code"], got["gpu_index"], got["bdf"]) == (
        "gpu_fault",
        "xid",
        "48",
        0,
        "0000:18:00.0",
    )
    assert (got["namespace"], got["pod"], got["message"]) == ("default", "cuda-check", line)
