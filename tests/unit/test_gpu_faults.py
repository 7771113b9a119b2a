"""GPU faults from the kernel log: Xid and RAS lines as the drivers print them, each
attributed to the pod that held the GPU, counted, and on the event stream."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from lens_ebpf.devices.gpu import faults
from lens_ebpf.devices.gpu.collector import GpuCollector, nvml_source
from lens_ebpf.events import GpuFault

FIX = Path(__file__).resolve().parents[1] / "fixtures"

# as the drivers print them (NVIDIA's Xid catalogue; amdgpu_ras.c)
XID_79 = ("NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, GPU has fallen off the "
          "bus.")  # fmt: skip
XID_48 = ("NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
          "double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
          "subpartition 0.")  # fmt: skip
AMD_UE = "amdgpu 0000:c1:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block"
AMD_CE = "amdgpu 0000:c1:00.0: amdgpu: 1 correctable hardware errors detected in gfx block"


def test_kernel_log_lines_parse_to_faults() -> None:
    f = faults.parse_fault(XID_79)
    assert f == faults.Fault("nvidia", "0000:18:00.0", "xid", "79", XID_79, 1, 4242)
    f = faults.parse_fault(XID_48)
    assert (f.bdf, f.code, f.pid) == ("0000:18:00.0", "48", 0) if f else False
    f = faults.parse_fault(AMD_UE)
    assert f is not None and (f.vendor, f.bdf, f.kind, f.code, f.count) == (
        "amd", "0000:c1:00.0", "ras_uncorrectable", "umc", 2)  # fmt: skip
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
        1234, XID_79)  # fmt: skip
    assert faults.parse_record(b"garbage") is None


def collector(fake_nvml, allocated=None) -> tuple[GpuCollector, list[GpuFault]]:
    pods = {4242: {"pod": "train-0", "namespace": "ml", "container": "t", "workload": "train"},
            4343: {"pod": "eval-0", "namespace": "ml", "container": "e"}}  # fmt: skip
    c = GpuCollector(5, "gpu-7", {"nvidia": [nvml_source(fake_nvml)]}, dev_root=FIX / "dev",
                     identify=lambda pid: pods.get(pid, {}),
                     allocated=allocated)  # fmt: skip
    c.run_once()
    events: list[GpuFault] = []
    c.publish = events.append
    return c, events


def samples(c: GpuCollector) -> dict:
    c.run_once()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in c.snapshot() for s in m.samples}  # fmt: skip


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
    key = ("lens_gpu_faults_total", (("code", "79"), ("gpu", "0"), ("kind", "xid"),
                                     ("namespace", "ml"), ("pod", "train-0"),
                                     ("workload", "train")))  # fmt: skip
    assert got[key] == 1
    # an AMD GPU this node does not have: counted under its BDF, nobody held it
    c.fault(faults.parse_fault(AMD_UE))  # type: ignore[arg-type]
    assert (events[-1].bdf, events[-1].pod, events[-1].gpu_index) == ("0000:c1:00.0", "", 0)
    got = samples(c)
    key = ("lens_gpu_faults_total", (("code", "umc"), ("gpu", "0000:c1:00.0"),
                                     ("kind", "ras_uncorrectable"), ("namespace", ""),
                                     ("pod", ""), ("workload", "")))  # fmt: skip
    assert got[key] == 2  # the report said two errors


def test_the_kubelets_allocation_wins_over_processes(fake_nvml) -> None:
    class Owner:
        def labels(self) -> dict[str, str]:
            return {"namespace": "ml", "pod": "owner-0", "container": "main"}

    c, events = collector(fake_nvml, allocated=lambda: {
        "gpu-11111111-2222-3333-4444-555555555555": Owner()})  # fmt: skip
    c.fault(faults.parse_fault(XID_48))  # type: ignore[arg-type]
    assert [e.pod for e in events] == ["owner-0"]


def test_fault_series_are_bounded(fake_nvml, monkeypatch) -> None:
    from lens_ebpf.devices.gpu import collector as mod

    monkeypatch.setattr(mod, "MAX_FAULT_SERIES", 2)
    c, _ = collector(fake_nvml)
    for code in range(5):
        c.fault(faults.Fault("nvidia", "0000:18:00.0", "xid", str(code), "m", 1, 4242))
    got = samples(c)
    assert sum(v for (n, _), v in got.items() if n == "lens_gpu_faults_total") == 2
    assert got[("lens_gpu_faults_unattributed_total", (("node", "gpu-7"),))] == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="writing to /dev/kmsg needs root")
def test_watcher_reads_the_real_kernel_log() -> None:
    got: list[faults.Fault] = []
    w = faults.KmsgWatcher("/dev/kmsg", got.append)
    fd = w.open()  # at the end: what is logged from here on
    stop = threading.Event()
    t = threading.Thread(target=w.run, args=(stop, fd))
    t.start()
    line = ("NVRM: Xid (PCI:ffff:ff:1f): 13, pid=1, name=lens-ebpf-test, written by the "
            "lens-ebpf test suite, not a driver")  # fmt: skip
    try:
        with open("/dev/kmsg", "w") as kmsg:
            kmsg.write(line + "\n")
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(5)
    assert [(f.bdf, f.kind, f.code, f.pid) for f in got] == [("ffff:ff:1f.0", "xid", "13", 1)]
    assert w.records >= 1 and w.faults == 1
