"""GPU faults from the kernel log: Xid and RAS lines as the drivers print them, each
attributed to the pod that held the GPU, counted, and on the event stream."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from lens_ebpf.agent.devices.gpu import faults
from lens_ebpf.agent.devices.gpu.collector import GpuCollector, nvml_source
from lens_ebpf.agent.events import GpuFault
from tests.conftest import hang_guard

FIX = Path(__file__).resolve().parents[1] / "fixtures"

# as the drivers print them (NVIDIA's Xid catalogue; amdgpu_ras.c)
XID_79 = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, GPU has fallen off the " "bus."
XID_48 = (
    "NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
    "double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
    "subpartition 0."
)
AMD_UE = "amdgpu 0000:c1:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block"
AMD_CE = "amdgpu 0000:c1:00.0: amdgpu: 1 correctable hardware errors detected in gfx block"


def test_kernel_log_lines_parse_to_faults() -> None:
    f = faults.parse_fault(XID_79)
    assert f == faults.Fault("nvidia", "0000:18:00.0", "xid", "79", XID_79, 1, 4242)
    f = faults.parse_fault(XID_48)
    assert (f.bdf, f.code, f.pid) == ("0000:18:00.0", "48", 0) if f else False
    f = faults.parse_fault(AMD_UE)
    assert f is not None and (f.vendor, f.bdf, f.kind, f.code, f.count) == (
        "amd",
        "0000:c1:00.0",
        "ras_uncorrectable",
        "umc",
        2,
    )
    f = faults.parse_fault(AMD_CE)
    assert f is not None and (f.kind, f.code, f.count) == ("ras_correctable", "gfx", 1)
    for other in (
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
        "NVRM: Xid (PCI:garbage): x",
        "amdgpu 0000:c1:00.0: ring gfx timeout",
        "",
    ):
        assert faults.parse_fault(other) is None, other
    assert faults.parse_record(b"4,1234,5678901,-;" + XID_79.encode() + b"\n SUBSYSTEM=pci\n") == (
        1234,
        XID_79,
    )
    assert faults.parse_record(b"garbage") is None


def collector(fake_nvml, allocated=None) -> tuple[GpuCollector, list[GpuFault]]:
    pods = {
        4242: {"pod": "train-0", "namespace": "ml", "container": "t", "workload": "train"},
        4343: {"pod": "eval-0", "namespace": "ml", "container": "e"},
    }
    c = GpuCollector(
        5,
        "gpu-7",
        {"nvidia": [nvml_source(fake_nvml)]},
        dev_root=FIX / "dev",
        identify=lambda pid: pods.get(pid, {}),
        allocated=allocated,
    )
    c.run_once()
    events: list[GpuFault] = []
    c.publish = events.append
    return c, events


def samples(c: GpuCollector) -> dict:
    c.run_once()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for m in c.snapshot() for s in m.samples
    }


def test_a_fault_names_the_pod_that_held_the_gpu(fake_nvml) -> None:
    c, events = collector(fake_nvml)
    c.fault(faults.parse_fault(XID_79))  # type: ignore[arg-type]
    # the Xid names the process: its pod
    assert [(e.gpu_index, e.uuid, e.fault, e.code, e.pod, e.workload, e.pid) for e in events] == [
        (0, "GPU-11111111-2222-3333-4444-555555555555", "xid", "79", "train-0", "train", 4242)
    ]
    # no process named: every pod with a process on the GPU (GPU 0 runs 4242 and 4343)
    c.fault(faults.parse_fault(XID_48))  # type: ignore[arg-type]
    assert sorted(e.pod for e in events[1:]) == ["eval-0", "train-0"]
    got = samples(c)
    key = (
        "lens_gpu_faults_total",
        (
            ("code", "79"),
            ("gpu", "0"),
            ("kind", "xid"),
            ("namespace", "ml"),
            ("pod", "train-0"),
            ("workload", "train"),
        ),
    )
    assert got[key] == 1
    # an AMD GPU this node does not have: counted under its BDF, nobody held it
    c.fault(faults.parse_fault(AMD_UE))  # type: ignore[arg-type]
    assert (events[-1].bdf, events[-1].pod, events[-1].gpu_index) == ("0000:c1:00.0", "", 0)
    got = samples(c)
    key = (
        "lens_gpu_faults_total",
        (
            ("code", "umc"),
            ("gpu", "0000:c1:00.0"),
            ("kind", "ras_uncorrectable"),
            ("namespace", ""),
            ("pod", ""),
            ("workload", ""),
        ),
    )
    assert got[key] == 2  # the report said two errors


def test_the_kubelets_allocation_wins_over_processes(fake_nvml) -> None:
    class Owner:
        def labels(self) -> dict[str, str]:
            return {"namespace": "ml", "pod": "owner-0", "container": "main"}

    c, events = collector(
        fake_nvml, allocated=lambda: {"gpu-11111111-2222-3333-4444-555555555555": Owner()}
    )
    c.fault(faults.parse_fault(XID_48))  # type: ignore[arg-type]
    assert [e.pod for e in events] == ["owner-0"]


def test_fault_series_are_bounded(fake_nvml, monkeypatch) -> None:
    from lens_ebpf.agent.devices.gpu import collector as mod

    monkeypatch.setattr(mod, "MAX_FAULT_SERIES", 2)
    c, _ = collector(fake_nvml)
    for code in range(5):
        c.fault(faults.Fault("nvidia", "0000:18:00.0", "xid", str(code), "m", 1, 4242))
    got = samples(c)
    assert sum(v for (n, _), v in got.items() if n == "lens_gpu_faults_total") == 2
    assert got[("lens_gpu_faults_unattributed_total", (("node", "gpu-7"),))] == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="writing to /dev/kmsg needs root")
def test_a_line_written_to_the_real_kernel_log_is_parsed_and_attributed(fake_nvml) -> None:
    """Through /dev/kmsg itself: the watcher reads from the end, and the Xid it finds
    names the stand-in NVML's GPU 0 and a process of pod ml/train-0."""
    c, events = collector(fake_nvml)
    w = faults.KmsgWatcher("/dev/kmsg", c.fault)
    fd = w.open()  # at the end: what is logged from here on
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop, fd))
    t.start()
    line = (
        "NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=lens-ebpf-test, written by the "
        "lens-ebpf test suite, not a driver"
    )
    try:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(line + "\n")
        assert wait_for(lambda: bool(events))
    finally:
        stop.set()
        t.join(5)
    assert [
        (e.gpu_index, e.bdf, e.fault, e.code, e.pid, e.namespace, e.pod, e.workload) for e in events
    ] == [(0, "0000:18:00.0", "xid", "13", 4242, "ml", "train-0", "train")]
    assert events[0].message == line
    assert w.records >= 1 and w.faults == 1
    got = samples(c)
    key = (
        "lens_gpu_faults_total",
        (
            ("code", "13"),
            ("gpu", "0"),
            ("kind", "xid"),
            ("namespace", "ml"),
            ("pod", "train-0"),
            ("workload", "train"),
        ),
    )
    assert got[key] == 1


def wait_for(cond, seconds: float = 5.0) -> bool:
    """cond() once it holds, or its last value when the hang guard runs out."""
    deadline = time.monotonic() + hang_guard(seconds)
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(cond())


def raise_xid(state: Path, gpu: int, xid: int) -> None:
    """Tells the stand-in NVML to raise an Xid event (renamed into place: it reads and
    removes the file whenever it looks)."""
    (state / "xid.tmp").write_text(f"{gpu} {xid}\n")
    (state / "xid.tmp").rename(state / "xid")


def test_nvml_xid_events_reach_the_collector_once_with_the_kernel_log(
    fake_nvml, tmp_path, monkeypatch
) -> None:
    """An Xid through NVML's event API (GPU 0 registers; GPU 1 refuses, as GPUs without
    event support do) becomes a fault; the same Xid in the kernel log counts once."""
    from lens_ebpf.agent.devices.gpu import nvidia

    monkeypatch.setenv("FAKE_NVML_STATE", str(tmp_path))
    c, events = collector(fake_nvml)
    xids = nvidia.XidEvents(fake_nvml, c.fault)
    stop = threading.Event()
    t = threading.Thread(target=xids.run, args=(stop,))
    t.start()
    try:
        assert wait_for(lambda: len(xids.gpus) == 1)
        assert list(xids.gpus.values()) == ["0000:18:00.0"]
        raise_xid(tmp_path, 0, 79)
        assert wait_for(lambda: len(events) == 2)  # two pods run processes on GPU 0
        c.fault(faults.parse_fault(XID_79.replace("pid=4242", "pid=7")))  # type: ignore[arg-type]
        raise_xid(tmp_path, 0, 79)  # a second Xid 79: counted
        assert wait_for(lambda: xids.events == 2)
    finally:
        stop.set()
        t.join(5)
    assert xids.errors == 0
    assert {(e.fault, e.code, e.bdf, e.pod) for e in events} == {
        ("xid", "79", "0000:18:00.0", "train-0"),
        ("xid", "79", "0000:18:00.0", "eval-0"),
    }
    assert events[0].message == "NVML Xid event: 79"
    got = samples(c)
    total = sum(v for (n, lbl), v in got.items() if n == "lens_gpu_faults_total")
    assert total == 4  # two Xids, each to two pods; the kernel log's copy not again
    assert got[("lens_gpu_faults_duplicate_total", (("node", "gpu-7"),))] == 1


def test_a_rise_in_uncorrectable_ecc_is_a_fault(fake_nvml, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_NVML_STATE", str(tmp_path))
    c, events = collector(fake_nvml)  # the first reading: the baseline, no fault
    c.run_once()
    assert events == []
    (tmp_path / "ecc_uncorrected").write_text("3")
    c.run_once()
    assert {(e.fault, e.code, e.pod) for e in events} == {
        ("ecc_uncorrectable", "memory", "train-0"),
        ("ecc_uncorrectable", "memory", "eval-0"),
    }
    assert events[0].message == "3 uncorrectable ECC errors (NVML volatile count now 3)"
    got = samples(c)
    key = (
        "lens_gpu_faults_total",
        (
            ("code", "memory"),
            ("gpu", "0"),
            ("kind", "ecc_uncorrectable"),
            ("namespace", "ml"),
            ("pod", "train-0"),
            ("workload", "train"),
        ),
    )
    assert got[key] == 3
    (tmp_path / "ecc_uncorrected").write_text("0")  # the driver reloaded: a new baseline
    c.run_once()
    assert len(events) == 2


def test_amd_ras_in_the_kernel_log_and_the_counters_count_once() -> None:
    """amdgpu logs `2 uncorrectable hardware errors detected in umc block` and its RAS
    count rises by two: one fault of two errors."""
    from lens_ebpf.agent.devices.gpu.model import GpuReading

    ue = {"n": 5}

    def read() -> list[GpuReading]:
        r = GpuReading("amd", "0000:c1:00.0", source="test")
        r.ras_errors = {("umc", "uncorrectable"): ue["n"], ("umc", "correctable"): 40}
        return [r]

    c = GpuCollector(5, "gpu-7", {"amd": [("test", read)]})
    events: list[GpuFault] = []
    c.publish = events.append
    c.run_once()
    c.fault(faults.parse_fault(AMD_UE))  # type: ignore[arg-type]
    ue["n"] = 7
    got = samples(c)
    assert [(e.fault, e.code) for e in events] == [("ras_uncorrectable", "umc")]
    key = (
        "lens_gpu_faults_total",
        (
            ("code", "umc"),
            ("gpu", "0"),
            ("kind", "ras_uncorrectable"),
            ("namespace", ""),
            ("pod", ""),
            ("workload", ""),
        ),
    )
    assert got[key] == 2
    assert got[("lens_gpu_faults_duplicate_total", (("node", "gpu-7"),))] == 1
    ue["n"] = 8  # a rise nobody logged: a fault of its own
    got = samples(c)
    assert got[key] == 3 and len(events) == 2
