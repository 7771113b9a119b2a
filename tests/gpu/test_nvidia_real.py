"""The NVIDIA path against a real GPU: the real libnvidia-ml through pynvml, the real
nvidia-smi, a real CUDA program holding memory and keeping the GPU busy.

Skipped where no NVIDIA GPU answers (every CI machine, this project's own); run where one
does (a GPU node, or the device machine the tool lends some sessions):
`python -m pytest -s -rs tests/gpu`. GPU_EVIDENCE_DIR=DIR writes what was read there
(the metrics text, nvidia-smi's CSV) for the closing note and the fixtures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lens_ebpf.agent.devices.gpu import nvidia
from lens_ebpf.agent.devices.gpu.collector import GpuCollector, nvml_source
from lens_ebpf.agent.devices.gpu.model import GpuReading
from tests.conftest import wait_for

MIB = 2**20
GIB = 2**30
HELD = 2 * GIB  # what the CUDA program allocates

# A CUDA program: 2 GiB held, then matrix products until stdin closes
BUSY = (
    """
import sys, threading, torch
held = torch.empty(%d, dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
while not stop.is_set():
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""
    % HELD
)


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        pytest.skip("pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA GPU answers here (NVML: {exc})")
    if count == 0:
        pytest.skip("NVML answers but sees no GPU")
    return pynvml


@pytest.fixture(scope="module")
def nvml() -> Any:
    return _nvml()


@pytest.fixture(scope="module")
def busy(nvml: Any) -> Iterator[subprocess.Popen[str]]:
    """A CUDA program on GPU 0 (PyTorch's), holding HELD bytes and computing."""
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("a CUDA program is needed: PyTorch is not installed")
    p = subprocess.Popen(
        [sys.executable, "-c", BUSY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    yield p
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=60)


def evidence(name: str, text: str) -> None:
    where = os.environ.get("GPU_EVIDENCE_DIR")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / name).write_text(text)


def smi() -> str:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        pytest.skip("nvidia-smi is not on PATH")
    return tool


def test_nvml_and_nvidia_smi_name_the_same_gpus(nvml: Any) -> None:
    """Both sources give each GPU the same key and identity: the agent may switch from
    one to the other (NVML failing) without a series changing its labels."""
    by_nvml = nvidia.read_nvml(nvml)
    gpus, apps = nvidia.run_nvidia_smi(smi(), 30)
    evidence("nvidia-smi-gpus.csv", gpus)
    by_smi = nvidia.parse_smi_csv(gpus, apps)
    assert [g.bdf for g in by_smi] == [g.bdf for g in by_nvml]
    for a, b in zip(by_nvml, by_smi, strict=True):
        print(
            f"\n{a.index} {a.bdf} {a.name} {a.uuid} driver {a.driver_version}: total "
            f"{a.memory_total} reserved {a.memory_reserved} used {a.memory_used}, "
            f"power limit {a.power_limit} W, {a.temperature} C, clocks {a.clocks_mhz}, "
            f"energy {a.energy_joules} J, ECC {a.ecc_errors}, remapped {a.remapped_rows}, "
            f"recovery {a.recovery_action}, NVLinks up "
            f"{sum(a.nvlink_up.values())}/{len(a.nvlink_up)}"
        )
        assert (a.index, a.uuid, a.name, a.driver_version) == (
            b.index,
            b.uuid,
            b.name,
            b.driver_version,
        )
        assert a.uuid.startswith("GPU-") and a.name.startswith("NVIDIA")
        # nvidia-smi gives MiB: NVML's bytes within one
        assert a.memory_total is not None and b.memory_total is not None
        assert abs(a.memory_total - b.memory_total) < MIB
        assert a.power_limit == pytest.approx(b.power_limit, abs=0.01)
        assert a.source == "nvml" and b.source == "nvidia-smi"


def test_health_fields_a_real_gpu_answers(nvml: Any) -> None:
    """Clocks and energy are read (the energy counter rises between two readings a
    second apart); what the GPU does not answer stays absent, never zero."""
    first = {g.bdf: g for g in nvidia.read_nvml(nvml)}
    time.sleep(1.0)
    for g in nvidia.read_nvml(nvml):
        assert g.clocks_mhz.get("sm", 0) > 0 and g.clocks_mhz.get("memory", 0) > 0
        before = first[g.bdf].energy_joules
        assert before is not None and g.energy_joules is not None
        assert g.energy_joules > before, "the energy counter did not rise in a second"
        assert g.memory_reserved is not None and g.memory_reserved > 0  # NVML v2
        assert all(n >= 0 for n in g.ecc_errors.values())
        assert set(g.clock_events) <= set(nvidia.CLOCK_EVENTS)


def test_a_cuda_program_is_seen_with_its_memory_and_its_pod(nvml: Any, busy: Any) -> None:
    """The program's pid and what it holds come through NVML, nvidia-smi and the
    collector's series (with the pod identify() gives that pid); the GPU reads busy."""

    def seen() -> GpuReading | None:
        g = nvidia.read_nvml(nvml)[0]
        mine = [p for p in g.processes if p.pid == busy.pid]
        return g if mine and (g.utilization or 0) > 0 else None

    g = wait_for(seen, "the CUDA program in NVML's process list with the GPU busy", 30)
    held = next(p.memory_bytes for p in g.processes if p.pid == busy.pid)
    assert held is not None and held >= HELD
    assert g.memory_used is not None and g.memory_used >= held
    _, apps = nvidia.run_nvidia_smi(smi(), 30)
    evidence("nvidia-smi-apps.csv", apps)
    rows = [line.split(", ") for line in apps.splitlines()]
    assert any(
        r[0] == g.uuid and int(r[1]) == busy.pid and int(r[2]) * MIB >= HELD for r in rows
    ), apps

    pod = {"namespace": "ml", "pod": "train-0", "container": "trainer"}
    c = GpuCollector(
        5,
        "gpu-node",
        {"nvidia": [nvml_source(nvml)]},
        identify=lambda pid: pod if pid == busy.pid else {},
        compat=("dcgm",),
    )
    c.run_once()
    assert c.success and c.errors == {}
    samples = [s for m in c.snapshot() for s in m.samples]

    def one(name: str, **labels: str) -> float:
        got = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
        assert len(got) == 1, (name, labels, got)
        return got[0]

    assert one("hw_gpu_count") == len(nvidia.read_nvml(nvml))
    assert one("gpu_process_memory_bytes", pid=str(busy.pid), **pod) >= HELD
    assert one("hw_gpu_memory_total_bytes", gpu_index="0", gpu_uuid=g.uuid) == g.memory_total
    assert one("hw_gpu_memory_used_bytes", gpu_index="0") >= HELD
    assert 0 <= one("hw_gpu_utilization_percent", gpu_index="0") <= 100
    # the DCGM exporter's names, keyed by the same UUID, memory in MiB
    assert one("DCGM_FI_DEV_FB_USED", UUID=g.uuid) >= HELD // MIB
    assert one("DCGM_FI_DEV_SM_CLOCK", UUID=g.uuid) > 0
    from prometheus_client.exposition import generate_latest

    class Snapshot:
        def collect(self) -> Any:
            return c.snapshot()

    evidence("metrics.txt", generate_latest(Snapshot()).decode())  # type: ignore[arg-type]


def test_xid_events_register_on_a_real_gpu(nvml: Any) -> None:
    """NVML's Xid event set takes every GPU by its BDF; a wait with no fault ends at its
    timeout without an error or an event."""
    faults: list[Any] = []
    x = nvidia.XidEvents(nvml, faults.append)
    evset = x.register()
    if evset is None:
        pytest.skip("no GPU here takes Xid events through NVML (the kernel log still has them)")
    try:
        assert sorted(x.gpus.values()) == sorted(g.bdf for g in nvidia.read_nvml(nvml))
        for _ in range(2):
            x.wait_once(evset)
        assert (x.events, x.errors, faults) == (0, 0, [])
    finally:
        nvml.nvmlEventSetFree(evset)
        nvml.nvmlShutdown()
