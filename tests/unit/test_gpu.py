import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lens_ebpf.agent.devices.gpu import amd, nvidia
from lens_ebpf.agent.devices.gpu.collector import GpuCollector, dri_mapping, nvml_source
from lens_ebpf.core.exposition import render_metrics
from tests.golden import check_golden

FIX = Path(__file__).parent.parent / "fixtures" / "gpu"
GiB = 1024**3


def values(c: GpuCollector) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for m in c.snapshot() for s in m.samples
    }


def by(name: str, v: dict, **labels: str) -> float | None:
    for (n, lbl), value in v.items():
        if n == name and all(dict(lbl).get(k) == x for k, x in labels.items()):
            return value
    return None


def test_sysfs_cards_keyed_by_bdf_connectors_and_other_drivers_skipped() -> None:
    cards = amd.read_sysfs(FIX / "sys")
    assert [c.bdf for c in cards] == ["0000:c1:00.0", "0001:03:00.0"]
    a, b = cards
    assert (a.utilization, a.memory_total, a.memory_used) == (35, 206141652992, GiB)
    assert a.temperatures == {"edge": 45.0, "junction": 60.0, "mem": 50.0}
    assert (a.temperature, a.power_draw, a.power_limit) == (45.0, 301.0, 750.0)
    assert (a.unique_id, a.name, a.device_id) == (
        "0x18a96c02d4e1c0a3",
        "AMD Instinct MI300X",
        "74a1",
    )
    # power1_input only (kernel 6.6+), junction only (no edge sensor)
    assert (b.power_draw, b.temperature, b.unique_id) == (125.0, 41.0, "")


def test_amd_ras_counts_and_pcie_replays_from_sysfs_whatever_the_source() -> None:
    """amdgpu's ras/<block>_err_count (`ue: N`, `ce: N`, `de: N` on newer kernels) and
    pcie_replay_count, added to readings from amd-smi as from sysfs; a card without them
    has none (absent, never zero)."""
    static, metric, process = (
        (FIX / f"amd-smi-{k}.json").read_text() for k in ("static", "metric", "process")
    )
    c = GpuCollector(
        5,
        "gpu-7",
        {"amd": [("amd-smi", lambda: amd.parse_amd_smi(static, metric, process))]},
        dev_root=FIX / "dev",
        sysfs=FIX / "sys",
    )
    c.run_once()
    assert c.success and c.errors == {}
    v = values(c)
    ras = "lens_gpu_ras_errors_total"
    assert by(ras, v, gpu_index="0", block="umc", type="uncorrectable") == 2
    assert by(ras, v, gpu_index="0", block="umc", type="correctable") == 17
    assert by(ras, v, gpu_index="0", block="gfx", type="correctable") == 3
    assert by(ras, v, gpu_index="0", block="sdma", type="deferred") == 1
    assert by(ras, v, block="features") is None  # ras/features is no counter
    assert by("lens_gpu_pcie_replays_total", v, gpu_index="0") == 5
    assert by(ras, v, gpu_index="1") is None
    assert by("lens_gpu_pcie_replays_total", v, gpu_index="1") is None
    assert amd.parse_ras_count("ue: 3\nce: x\ngarbage\n") == {"uncorrectable": 3}


def test_amd_smi_both_json_shapes() -> None:
    static = (FIX / "amd-smi-static.json").read_text()
    metric = (FIX / "amd-smi-metric.json").read_text()
    process = (FIX / "amd-smi-process.json").read_text()
    got = amd.parse_amd_smi(static, metric, process)
    assert [g.bdf for g in got] == ["0000:c1:00.0", "0001:03:00.0"]
    a, b = got
    assert (a.utilization, a.memory_total, a.memory_used) == (35, 196592 * 2**20, 1024 * 2**20)
    assert a.temperatures == {"edge": 45, "junction": 60, "mem": 50}
    assert (a.power_draw, a.power_limit, a.driver_version) == (301, 750, "6.7.0")
    assert [(p.pid, p.memory_bytes) for p in a.processes] == [(4242, GiB)]
    assert (b.temperature, b.power_limit, b.serial) == (41, None, "N/A")
    # the same with the older list shape for metric and the newer for static
    wrapped = '{"gpu_data": ' + static + "}"
    import json

    listed = json.dumps(json.loads(metric)["gpu_data"])
    assert amd.parse_amd_smi(wrapped, listed)[0].utilization == 35


@pytest.mark.parametrize("garbage", ["not json", '{"gpus": 1}', '[{"gpu": 0}]'])
def test_amd_smi_garbage_is_a_source_error(garbage: str) -> None:
    with pytest.raises(amd.SourceError):
        amd.parse_amd_smi(garbage, "[]")


def test_amdsmi_through_the_real_binding(fake_amdsmi) -> None:
    """PyPI's amdsmi loading a stand-in libamd_smi.so: every value exact, "N/A" and
    not-supported answers absent, never zero."""
    c = GpuCollector(
        5,
        "gpu-7",
        {"amd": [("amdsmi", lambda: amd.read_amdsmi(fake_amdsmi))]},
        identify=lambda pid: {"pod": "llm-0", "namespace": "ml", "container": "c"}
        if pid == 5151
        else {},
    )
    c.run_once()
    assert c.success and c.errors == {}
    v = values(c)
    a, b = c.readings()
    assert (a.bdf, a.name, a.device_id, a.serial, a.driver_version) == (
        "0001:29:00.0",
        "AMD Instinct MI250X",
        "740c",
        "0x5F1A2B3C4D5E6F70",
        "6.10.5",
    )
    assert (a.memory_total, a.memory_used, a.utilization) == (65520 * 2**20, 31337 * 2**20, 73)
    assert a.temperatures == {"edge": 43.0, "junction": 58.0, "mem": 49.0}
    assert (a.power_draw, a.power_limit) == (377, 560)
    assert by("gpu_process_memory_bytes", v, pid="5151", pod="llm-0") == 20 * GiB
    assert by("gpu_process_memory_bytes", v, pid="5252", pod="") == 6 * GiB
    ras = "lens_gpu_ras_errors_total"
    assert {
        (dict(lbl)["block"], dict(lbl)["type"]): n for (name, lbl), n in v.items() if name == ras
    } == {
        ("umc", "correctable"): 17,
        ("umc", "uncorrectable"): 2,
        ("umc", "deferred"): 0,
        ("gfx", "correctable"): 4,
        ("gfx", "uncorrectable"): 0,
        ("gfx", "deferred"): 0,
        ("sdma", "correctable"): 0,
        ("sdma", "uncorrectable"): 0,
        ("sdma", "deferred"): 0,
        ("xgmi_wafl", "correctable"): 6,
        ("xgmi_wafl", "uncorrectable"): 0,
        ("xgmi_wafl", "deferred"): 1,
    }
    assert by("lens_gpu_pcie_replays_total", v, gpu_index="0") == 13
    assert by("lens_gpu_energy_joules_total", v, gpu_index="0") == 1000.0
    assert by("lens_gpu_xgmi_error_status", v, gpu_index="0") == 1
    # clocks from the library's gpu_metrics (a v1.5 table here): gfx is the XCCs' mean
    clocks = {
        dict(lbl)["clock"]: mhz
        for (name, lbl), mhz in v.items()
        if name == "lens_gpu_clock_mhz" and dict(lbl)["gpu_index"] == "0"
    }
    assert clocks == {"gfx": 2087.5, "soc": 1143, "memory": 1300}
    # GPU 1: no edge sensor, activity "N/A", no RAS, replays, energy or XGMI state
    assert (b.bdf, b.utilization, b.temperature, b.processes) == ("0001:2f:00.0", None, 39.0, [])
    assert b.temperatures == {"junction": 39.0, "mem": 36.0}
    for name in (
        ras,
        "lens_gpu_pcie_replays_total",
        "lens_gpu_energy_joules_total",
        "lens_gpu_xgmi_error_status",
        "hw_gpu_utilization_percent",
        "lens_gpu_clock_mhz",
    ):
        assert by(name, v, gpu_index="1") is None, name
    assert by("hw_gpu_memory_used_bytes", v, gpu_index="1") == 0


def test_amdsmi_stand_in_answers_every_symbol_the_binding_resolves(fake_amdsmi) -> None:
    """The binding resolved all its symbols at import (a missing one raises there); those
    lens-ebpf does not call answer not-supported, as the real library does for absent
    features, and surface as the binding's own exception."""
    from tests.gpulab import amdsmi_symbols

    assert len(amdsmi_symbols() or []) >= 184
    (h, _) = fake_amdsmi.amdsmi_get_processor_handles()
    with pytest.raises(fake_amdsmi.AmdSmiLibraryException):
        fake_amdsmi.amdsmi_get_gpu_device_uuid(h)


def sysfs_with_metrics(tmp_path: Path) -> Path:
    """The sysfs fixture with gpu_metrics tables the compiler laid out: v1.3 (MI200-like)
    on card 2, a v1.5 header (MI300's layout) on card 1."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the gpu_metrics writer")
    sys_root = tmp_path / "sys"
    shutil.copytree(FIX / "sys", sys_root, symlinks=True)
    writer = tmp_path / "gpu_metrics"
    subprocess.run(["gcc", "-o", str(writer), str(FIX / "gpu_metrics.c")], check=True)
    devs = amd.card_dirs(sys_root)
    subprocess.run([str(writer), "1.3", str(devs["0001:03:00.0"] / "gpu_metrics")], check=True)
    subprocess.run([str(writer), "1.5", str(devs["0000:c1:00.0"] / "gpu_metrics")], check=True)
    return sys_root


def test_amd_gpu_metrics_table_clocks_and_throttling(tmp_path: Path) -> None:
    sys_root = sysfs_with_metrics(tmp_path)
    c = GpuCollector(
        5, "gpu-7", {"amd": [("sysfs", lambda: amd.read_sysfs(sys_root))]}, sysfs=sys_root
    )
    c.run_once()
    c.run_once()
    v = values(c)
    assert by("lens_gpu_clock_mhz", v, gpu_index="1", clock="gfx") == 1650
    assert by("lens_gpu_clock_mhz", v, gpu_index="1", clock="soc") == 1090
    assert by("lens_gpu_clock_mhz", v, gpu_index="1", clock="memory") == 1600
    active = {
        dict(lbl)["reason"]
        for (name, lbl), val in v.items()
        if name == "lens_gpu_clock_event_active" and dict(lbl)["gpu_index"] == "1" and val
    }
    assert active == {"ppt0", "temp_hotspot"}
    assert by("lens_gpu_clock_event_active", v, gpu_index="1", reason="temp_edge") == 0
    # card 1's v1.5 table is skipped, counted once per reading, and adds nothing
    assert by("lens_gpu_metrics_table_skipped_total", v, revision="1.5") == 2
    assert by("lens_gpu_clock_mhz", v, gpu_index="0") is None
    assert by("lens_gpu_clock_event_active", v, gpu_index="0") is None


@pytest.mark.parametrize(
    "data, revision",
    [
        (b"", "short"),
        (b"\x10\x00\x01", "short"),
        (b"\x78\x00\x01\x03" + b"\0" * 20, "1.3"),
        (b"\x50\x00\x02\x01" + b"\0" * 200, "2.1"),
    ],
)
def test_gpu_metrics_garbage_is_skipped_not_misread(data: bytes, revision: str) -> None:
    """A truncated table, or a layout other than 1.1-1.3, gives no values."""
    from lens_ebpf.agent.devices.gpu.model import GpuReading

    r = GpuReading("amd", "0000:01:00.0")
    amd.parse_gpu_metrics(data, r)
    assert r.metrics_table == (revision, False)
    assert (r.clocks_mhz, r.clock_events) == ({}, {})


def test_nvidia_smi_csv() -> None:
    got = nvidia.parse_smi_csv(
        (FIX / "nvidia-smi-gpus.csv").read_text(), (FIX / "nvidia-smi-apps.csv").read_text()
    )
    a, b = got
    assert (a.bdf, a.memory_total, a.utilization, a.power_draw) == (
        "0000:18:00.0",
        81559 * 2**20,
        87,
        312.5,
    )
    assert [(p.pid, p.memory_bytes) for p in a.processes] == [(4242, 32 * GiB), (4343, 8 * GiB)]
    assert (b.bdf, b.power_draw, b.power_limit) == ("0001:3b:00.0", None, None)
    with pytest.raises(amd.SourceError):
        nvidia.parse_smi_csv("0, x, y\n")


def test_nvidia_smi_csv_from_a_real_h100() -> None:
    """What nvidia-smi 580.159.04 printed on an H100 (tests/gpu on a lent GPU machine):
    the GPU read idle, the apps while that test's CUDA program held memory; NVML's BDF
    form, sizes in MiB."""
    (g,) = nvidia.parse_smi_csv(
        (FIX / "h100-nvidia-smi-gpus.csv").read_text(),
        (FIX / "h100-nvidia-smi-apps.csv").read_text(),
    )
    assert (g.index, g.bdf, g.name, g.driver_version) == (
        0,
        "0000:00:06.0",
        "NVIDIA H100 80GB HBM3",
        "580.159.04",
    )
    assert (g.memory_total, g.memory_used, g.utilization) == (81559 * 2**20, 0, 0)
    assert (g.temperature, g.power_draw, g.power_limit) == (36, 70.16, 700)
    assert [(p.pid, p.memory_bytes) for p in g.processes] == [(585, 2884 * 2**20)]


def test_nvml_through_real_pynvml_not_supported_is_absent(fake_nvml) -> None:
    c = GpuCollector(
        5,
        "gpu-7",
        {"nvidia": [nvml_source(fake_nvml)]},
        dev_root=FIX / "dev",
        identify=lambda pid: {"pod": "train-0", "namespace": "ml", "container": "t"}
        if pid == 4242
        else {},
    )
    c.run_once()
    assert c.success and c.errors == {}
    v = values(c)
    assert by("hw_gpu_count", v) == 2 and by("hw_gpu_used_count", v) == 1
    assert by("hw_gpu_utilization_percent", v, gpu_index="0", vendor="nvidia") == 87
    # NVML v2: used is the processes' 40 GiB; the 480 MiB the driver keeps is not free
    assert by("hw_gpu_memory_used_bytes", v, gpu_index="0") == 40 * GiB
    assert by("hw_gpu_memory_free_bytes", v, gpu_index="0") == 40 * GiB - 480 * 2**20
    assert by("hw_gpu_power_draw_watts", v, gpu_index="0") == 312.5
    assert by("hw_gpu_power_limit_watts", v, gpu_index="0") == 700
    # GPU 1 answers NotSupported for power: those series are absent, the rest stay
    assert by("hw_gpu_power_draw_watts", v, gpu_index="1") is None
    assert by("gpu_power_draw_watts", v, gpu_index="1") is None
    assert by("hw_gpu_temperature_celsius", v, gpu_index="1") == 35
    assert by("gpu_utilization", v, gpu_id="0") == 87
    assert by("gpu_process_memory_bytes", v, pid="4242") == 32 * GiB
    assert by("gpu_process_memory_bytes", v, pid="4242", pod="train-0", namespace="ml") == 32 * GiB
    assert by("gpu_process_memory_bytes", v, pid="4343", pod="") == 8 * GiB
    assert by("hw_gpu_type_count", v, gpu_type="NVIDIA H100 80GB HBM3") == 1
    assert c.views["driver"] == "550.54.15"


def test_nvml_health_where_the_gpu_reports_it(fake_nvml) -> None:
    c = GpuCollector(5, "gpu-7", {"nvidia": [nvml_source(fake_nvml)]}, dev_root=FIX / "dev")
    read: list[Any] = []
    c.on_readings = lambda gpus, _holders: read.extend(gpus)
    c.run_once()
    assert c.success and c.errors == {}
    v = values(c)
    ecc = "lens_gpu_ecc_errors_total"
    assert by(ecc, v, gpu_index="0", type="corrected", counter="volatile") == 12
    assert by(ecc, v, gpu_index="0", type="corrected", counter="aggregate") == 340
    assert by(ecc, v, gpu_index="0", type="uncorrected", counter="aggregate") == 2
    assert by(ecc, v, gpu_index="0", type="uncorrected", counter="volatile") == 0
    assert by("lens_gpu_retired_pages", v, gpu_index="0", cause="multiple_single_bit_ecc") == 3
    assert by("lens_gpu_retired_pages", v, gpu_index="0", cause="double_bit_ecc") == 1
    assert by("lens_gpu_retired_pages_pending", v, gpu_index="0") == 1
    assert by("lens_gpu_remapped_rows", v, gpu_index="0", type="correctable") == 5
    assert by("lens_gpu_remapped_rows", v, gpu_index="0", type="uncorrectable") == 1
    assert (
        by("lens_gpu_row_remap_pending", v, gpu_index="0"),
        by("lens_gpu_row_remap_failure", v, gpu_index="0"),
    ) == (1, 0)
    # NVML's recovery action (field 230): GPU 0 asks for a reset, GPU 1 for nothing
    assert (
        by("lens_gpu_reset_pending", v, gpu_index="0"),
        by("lens_gpu_reset_pending", v, gpu_index="1"),
    ) == (1, 0)
    assert [g.recovery_action for g in read] == ["gpu_reset", "none"]
    active = {
        dict(lbl)["reason"]
        for (name, lbl), val in v.items()
        if name == "lens_gpu_clock_event_active" and dict(lbl)["gpu_index"] == "0" and val
    }
    assert active == {"sw_power_cap", "hw_thermal_slowdown"}
    assert by("lens_gpu_clock_event_active", v, gpu_index="1", reason="gpu_idle") == 1
    assert by("lens_gpu_clock_mhz", v, gpu_index="0", clock="sm") == 1755
    assert by("lens_gpu_clock_mhz", v, gpu_index="1", clock="memory") == 1215
    assert by("lens_gpu_pcie_replays_total", v, gpu_index="0") == 7
    assert by("lens_gpu_energy_joules_total", v, gpu_index="0") == 123456.789
    # GPU 1 has no ECC, retirement, remapping or energy: absent, never zero
    for name in (
        ecc,
        "lens_gpu_retired_pages",
        "lens_gpu_retired_pages_pending",
        "lens_gpu_remapped_rows",
        "lens_gpu_row_remap_pending",
        "lens_gpu_energy_joules_total",
    ):
        assert by(name, v, gpu_index="1") is None, name
    assert by("lens_gpu_pcie_replays_total", v, gpu_index="1") == 0
    # PCIe throughput (KB/s from NVML) in bytes; NVLink: 18 links, link 3 down, the
    # errors summed over links; GPU 1 has neither
    pcie = "lens_gpu_pcie_throughput_bytes_per_second"
    assert by(pcie, v, gpu_index="0", direction="tx") == 1200 * 1024
    assert by(pcie, v, gpu_index="0", direction="rx") == 3400 * 1024
    links = {
        dict(lbl)["link"]: val
        for (name, lbl), val in v.items()
        if name == "lens_gpu_nvlink_up" and dict(lbl)["gpu_index"] == "0"
    }
    assert len(links) == 18 and [k for k, up in links.items() if not up] == ["3"]
    nvl = "lens_gpu_nvlink_errors_total"
    assert {c: by(nvl, v, gpu_index="0", counter=c) for c in nvidia.NVLINK_ERRORS} == {
        "replay": 4,
        "recovery": 1,
        "crc_flit": 9,
        "crc_data": 0,
        "ecc_data": 0,
    }
    for name in (pcie, "lens_gpu_nvlink_up", nvl):
        assert by(name, v, gpu_index="1") is None, name


def test_older_nvml_reads_the_throttle_reasons(fake_nvml, monkeypatch) -> None:
    """A binding older than R535's rename: the throttle reasons call, same bits."""
    monkeypatch.delattr(fake_nvml, "nvmlDeviceGetCurrentClocksEventReasons")
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: 0x8)
    (g0, _) = nvidia.read_nvml(fake_nvml)
    assert {k for k, on in g0.clock_events.items() if on} == {"hw_slowdown"}


def test_golden_exposition_amd_sysfs_and_nvml(fake_nvml) -> None:
    class Clock:
        now = 100.0

        def __call__(self) -> float:
            return self.now

    c = GpuCollector(
        5,
        "gpu-7",
        {
            "amd": [("sysfs", lambda: amd.read_sysfs(FIX / "sys"))],
            "nvidia": [nvml_source(fake_nvml)],
        },
        dev_root=FIX / "dev",
        clock=Clock(),
    )
    c.run_once()
    check_golden("gpu.prom", render_metrics(c.snapshot()))
    # the host's names for the nodes, whatever root /dev was read from
    assert c.views["dri"]["/dev/dri/card1"] == {
        "card": "/dev/dri/card1",
        "render": "/dev/dri/renderD128",
        "pci_addr": "0000:c1:00.0",
        "card_id": 1,
        "gpu": 0,
        "vendor": "amd",
    }


def test_dri_mapping_any_domain() -> None:
    m = dri_mapping(FIX / "dev")
    assert m["0001:03:00.0"]["render"].endswith("/dri/renderD129")


def test_failing_source_serves_last_good_reading_marked_stale_then_drops_it() -> None:
    now = [0.0]
    calls = {"n": 0}

    def flaky() -> list:
        calls["n"] += 1
        if calls["n"] == 1:
            return nvidia.parse_smi_csv((FIX / "nvidia-smi-gpus.csv").read_text())
        raise subprocess.TimeoutExpired(["nvidia-smi"], 10)

    c = GpuCollector(
        5, "n", {"nvidia": [("nvidia-smi", flaky)]}, stale_seconds=300, clock=lambda: now[0]
    )
    c.run_once()
    now[0] = 60
    c.run_once()
    v = values(c)
    assert by("lens_gpu_reading_stale", v, vendor="nvidia") == 1
    assert by("lens_gpu_reading_age_seconds", v, vendor="nvidia") == 60
    assert by("hw_gpu_utilization_percent", v, gpu_index="0") == 87
    assert c.errors == {"timeout": 1}
    assert c.views["cards"][0]["stale"] is True
    now[0] = 400
    c.run_once()
    assert by("hw_gpu_count", values(c)) is None


def test_cpu_only_node_exports_nothing_and_no_errors(tmp_path: Path) -> None:
    c = GpuCollector(
        5,
        "n",
        {
            "amd": [("sysfs", lambda: amd.read_sysfs(tmp_path) or None)],
            "nvidia": [("nvidia-smi", lambda: None)],
        },
    )
    c.run_once()
    assert c.snapshot() == [] and c.errors == {} and c.success
    assert c.views["gpus"] == []


def test_nvml_without_the_v2_memory_call_falls_back_to_v1(fake_nvml, monkeypatch) -> None:
    """A binding (or driver) without nvmlDeviceGetMemoryInfo_v2: v1's used, which counts
    what the driver reserves, as such drivers report it."""
    monkeypatch.delattr(fake_nvml, "nvmlMemory_v2")
    (g0, _) = nvidia.read_nvml(fake_nvml)
    assert (g0.memory_used, g0.memory_reserved) == (40 * 2**30 + 480 * 2**20, None)
