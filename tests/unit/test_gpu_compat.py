"""devices.compat: AMD device-metrics-exporter's and dcgm-exporter's families from the
readings the GPU collector already has, exact in name, value, unit and labels; none of them
with the list empty; no duplicate series on a node with GPUs of both vendors."""

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lens_ebpf.agent import config
from lens_ebpf.agent.devices.gpu import amd, compat_amd
from lens_ebpf.agent.devices.gpu.collector import GpuCollector, nvml_source
from lens_ebpf.agent.devices.gpu.faults import Fault
from lens_ebpf.core.exposition import render_metrics
from lens_ebpf.core.settings import ConfigError
from tests.golden import check_golden
from tests.promserver import available, promtool_check_metrics

FIX = Path(__file__).parent.parent / "fixtures" / "gpu"
MiB = 1024 * 1024


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def mixed(fake_nvml, compat: tuple[str, ...]) -> GpuCollector:
    """Two AMD GPUs (sysfs fixture) and two NVIDIA (the NVML stand-in) on one node."""
    c = GpuCollector(
        5,
        "gpu-7",
        {
            "amd": [("sysfs", lambda: amd.read_sysfs(FIX / "sys"))],
            "nvidia": [nvml_source(fake_nvml)],
        },
        dev_root=FIX / "dev",
        clock=Clock(),
        sysfs=FIX / "sys",
        compat=compat,
    )
    c.run_once()
    assert c.success and c.errors == {}
    return c


def samples(c: GpuCollector) -> dict[tuple[str, frozenset], float]:
    out: dict[tuple[str, frozenset], float] = {}
    for m in c.snapshot():
        for s in m.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def one(v: dict, name: str, **labels: str) -> float | None:
    got = [val for (n, lbl), val in v.items() if n == name and labels.items() <= dict(lbl).items()]
    assert len(got) <= 1, (name, labels, got)
    return got[0] if got else None


def labels_of(v: dict, name: str, **labels: str) -> dict[str, str]:
    (lbl,) = (
        dict(lbl) for (n, lbl), _ in v.items() if n == name and labels.items() <= dict(lbl).items()
    )
    return lbl


COMPAT_PREFIXES = ("DCGM_FI_",)
AMD_NAMES = {n for n, _, _ in compat_amd.GAUGES} | {
    "gpu_health",
    "gpu_nodes_total",
    "gpu_clock",
    "gpu_xgmi_link_rx",
    "gpu_xgmi_link_tx",
}


def compat_family(name: str) -> bool:
    return name.startswith(COMPAT_PREFIXES) or name in AMD_NAMES or name.startswith("gpu_ecc_")


def test_empty_list_adds_nothing_and_each_name_adds_only_its_own(fake_nvml) -> None:
    plain = {m.name for m in mixed(fake_nvml, ()).snapshot()}
    assert not [n for n in plain if compat_family(n)]
    amd_only = {m.name for m in mixed(fake_nvml, ("amd",)).snapshot()} - plain
    dcgm_only = {m.name for m in mixed(fake_nvml, ("dcgm",)).snapshot()} - plain
    assert amd_only and all(not n.startswith("DCGM_") for n in amd_only)
    assert dcgm_only and all(n.startswith("DCGM_FI_") for n in dcgm_only)


def test_amd_families_from_sysfs_exact(fake_nvml) -> None:
    v = samples(mixed(fake_nvml, ("amd", "dcgm")))
    lbl = labels_of(v, "gpu_total_vram", gpu_id="0")
    assert lbl == {
        "gpu_id": "0",
        "gpu_uuid": "0x18a96c02d4e1c0a3",
        "serial_number": "",
        "card_model": "102-G30211-00",
        "card_series": "AMD Instinct MI300X",
        "card_vendor": "Advanced Micro Devices, Inc. [AMD/ATI]",
        "driver_version": "6.7.0",
        "vbios_version": "113-M3000100-102",
        "gpu_partition_id": "0",
        "deployment_mode": "baremetal",
        "hostname": "gpu-7",
        "pod": "",
        "namespace": "",
        "container": "",
    }
    assert one(v, "gpu_total_vram", gpu_id="0") == 206141652992 / MiB  # MB, as AMD's
    assert one(v, "gpu_used_vram", gpu_id="0") == 1024
    assert one(v, "gpu_free_vram", gpu_id="0") == 206141652992 / MiB - 1024
    assert one(v, "gpu_gfx_activity", gpu_id="0") == 35
    assert one(v, "gpu_umc_activity", gpu_id="0") == 12
    assert one(v, "gpu_edge_temperature", gpu_id="0") == 45
    assert one(v, "gpu_junction_temperature", gpu_id="0") == 60
    assert one(v, "gpu_memory_temperature", gpu_id="0") == 50
    assert one(v, "gpu_power_usage", gpu_id="0") == 301
    assert one(v, "pcie_speed", gpu_id="0") == 32 and one(v, "pcie_max_speed", gpu_id="1") == 16
    assert one(v, "gpu_total_visible_vram", gpu_id="0") == 206141652992 / MiB
    assert one(v, "gpu_used_visible_vram", gpu_id="0") == 1024
    assert (one(v, "gpu_total_gtt", gpu_id="0"), one(v, "gpu_free_gtt", gpu_id="0")) == (
        1547406,
        1547406 - 52,
    )
    assert one(v, "gpu_total_gtt", gpu_id="1") is None  # no mem_info_gtt_*: absent
    # RAS counts per block, the exporter's names; totals are the blocks' sums
    assert one(v, "gpu_ecc_uncorrect_umc", gpu_id="0") == 2
    assert one(v, "gpu_ecc_correct_umc", gpu_id="0") == 17
    assert one(v, "gpu_ecc_correct_gfx", gpu_id="0") == 3
    assert one(v, "gpu_ecc_deferred_sdma", gpu_id="0") == 1
    assert one(v, "gpu_ecc_correct_total", gpu_id="0") == 20
    assert one(v, "gpu_ecc_uncorrect_total", gpu_id="0") == 2
    assert one(v, "gpu_health", gpu_id="0") == 0  # an uncorrectable error: unhealthy
    assert one(v, "gpu_health", gpu_id="1") == 1
    assert one(v, "gpu_nodes_total") == 2
    # GPU 1 has no RAS directory, no edge sensor: absent, never zero
    for name in ("gpu_ecc_correct_total", "gpu_edge_temperature", "gpu_umc_activity"):
        assert one(v, name, gpu_id="1") is None, name
    # always on, beside the compat families: the seed's own names
    assert one(v, "gpu_socket_power_watts", gpu_id="0", vendor="amd") == 301


def test_amd_families_from_amdsmi_exact(fake_amdsmi) -> None:
    c = GpuCollector(
        5,
        "gpu-7",
        {"amd": [("amdsmi", lambda: amd.read_amdsmi(fake_amdsmi))]},
        clock=Clock(),
        compat=("amd",),
    )
    c.run_once()
    v = samples(c)
    lbl = labels_of(v, "gpu_gfx_activity", gpu_id="0")
    assert (lbl["card_model"], lbl["card_series"], lbl["vbios_version"], lbl["serial_number"]) == (
        "102-D65209-0C",
        "Instinct MI250X",
        "113-D65209-073",
        "0x5F1A2B3C4D5E6F70",
    )
    assert lbl["card_vendor"] == "Advanced Micro Devices, Inc. [AMD/ATI]"
    assert one(v, "gpu_gfx_activity", gpu_id="0") == 73
    assert one(v, "gpu_umc_activity", gpu_id="0") == 21
    assert one(v, "gpu_total_vram", gpu_id="0") == 65520  # MB, as the library answers
    assert one(v, "gpu_used_vram", gpu_id="0") == 31337
    assert one(v, "gpu_free_vram", gpu_id="0") == 65520 - 31337
    # socket_power and average_socket_power answered, current_socket_power "N/A" (MI200)
    assert one(v, "gpu_power_usage", gpu_id="0") == 377
    assert one(v, "gpu_average_package_power", gpu_id="0") == 377
    assert one(v, "gpu_package_power", gpu_id="0") is None
    assert one(v, "gpu_energy_consumed", gpu_id="0") == 1000.0 * 1e6  # uJ
    assert one(v, "pcie_bandwidth", gpu_id="0") == 4821  # Mb/s
    assert one(v, "pcie_speed", gpu_id="0") == 16  # 16000 MT/s
    assert one(v, "pcie_max_speed", gpu_id="0") == 32
    assert {
        n: one(v, n, gpu_id="0")
        for n in (
            "pcie_replay_count",
            "pcie_recovery_count",
            "pcie_replay_rollover_count",
            "pcie_nack_sent_count",
            "pcie_nack_received_count",
        )
    } == {
        "pcie_replay_count": 13,
        "pcie_recovery_count": 2,
        "pcie_replay_rollover_count": 0,
        "pcie_nack_sent_count": 3,
        "pcie_nack_received_count": 1,
    }
    # XGMI: KB accumulated per link, links the table reports only
    assert {
        dict(lbl)["link_index"]: val
        for (n, lbl), val in v.items()
        if n == "gpu_xgmi_link_rx" and dict(lbl)["gpu_id"] == "0"
    } == {"0": 1048576, "1": 2097152}
    assert one(v, "gpu_xgmi_link_tx", gpu_id="0", link_index="1") == 262144
    assert one(v, "gpu_clock", gpu_id="0", clock_type="SYSTEM") == 2087.5
    assert one(v, "gpu_clock", gpu_id="0", clock_type="MEMORY") == 1300
    assert one(v, "gpu_min_clock", gpu_id="0", clock_type="SYSTEM", clock_index="0") == 500
    assert one(v, "gpu_max_clock", gpu_id="0", clock_type="MEMORY", clock_index="2") == 1600
    assert one(v, "gpu_max_clock", gpu_id="0", clock_type="SOC") == 1090
    assert {
        dict(lbl)["hbm_index"]: val for (n, lbl), val in v.items() if n == "gpu_hbm_temperature"
    } == {"0": 51, "1": 52, "2": 50, "3": 53}
    assert one(v, "gpu_total_visible_vram", gpu_id="0") == 65520
    assert one(v, "gpu_used_visible_vram", gpu_id="0") == 31337
    assert one(v, "gpu_free_visible_vram", gpu_id="0") == 65520 - 31337
    assert (one(v, "gpu_total_gtt", gpu_id="0"), one(v, "gpu_used_gtt", gpu_id="0")) == (258048, 16)
    assert one(v, "gpu_ecc_correct_xgmi_wafl", gpu_id="0") == 6
    assert one(v, "gpu_ecc_deferred_xgmi_wafl", gpu_id="0") == 1
    assert one(v, "gpu_ecc_uncorrect_total", gpu_id="0") == 2
    # the seed's always-on names
    assert one(v, "gpu_socket_power_watts", gpu_id="0") == 377
    assert one(v, "gpu_pcie_bandwidth_mbs", gpu_id="0") == 4821
    # GPU 1 answers not-supported for PCIe info, VBIOS, XGMI, RAS: absent
    for name in (
        "pcie_bandwidth",
        "gpu_xgmi_link_rx",
        "gpu_ecc_correct_total",
        "gpu_gfx_activity",
        "gpu_pcie_bandwidth_mbs",
    ):
        assert one(v, name, gpu_id="1") is None, name
    assert labels_of(v, "gpu_total_vram", gpu_id="1")["vbios_version"] == ""
    check_golden("gpu_compat_amdsmi.prom", render_metrics(c.snapshot()))


def test_dcgm_families_from_nvml_exact(fake_nvml) -> None:
    c = mixed(fake_nvml, ("dcgm",))
    v = samples(c)
    assert labels_of(v, "DCGM_FI_DEV_GPU_UTIL", gpu="1") == {
        "gpu": "1",
        "UUID": "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        "device": "nvidia5",
        "modelName": "NVIDIA A100-SXM4-40GB",
        "Hostname": "gpu-7",
        "pci_bus_id": "00000001:3B:00.0",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }
    assert one(v, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 87
    assert one(v, "DCGM_FI_DEV_MEM_COPY_UTIL", gpu="0") == 40
    assert one(v, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 61
    assert one(v, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == 312.5
    assert one(v, "DCGM_FI_DEV_POWER_USAGE", gpu="1") is None  # not supported: absent
    # FB memory in MiB: used without the driver's reserve (NVML v2), as dcgm-exporter
    assert one(v, "DCGM_FI_DEV_FB_USED", gpu="0") == 40960
    assert one(v, "DCGM_FI_DEV_FB_RESERVED", gpu="0") == 480
    assert one(v, "DCGM_FI_DEV_FB_FREE", gpu="0") == 81920 - 40960 - 480
    assert one(v, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0  # none seen yet
    fam = {m.name: m.type for m in c.snapshot()}
    assert fam["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == "counter"
    assert fam["DCGM_FI_DEV_GPU_UTIL"] == "gauge"
    # an Xid from the kernel log: the last one seen, per GPU
    c.fault(Fault("nvidia", "0000:18:00.0", "xid", "79", "NVRM: Xid (PCI:0000:18:00): 79"))
    c.fault(Fault("nvidia", "0000:18:00.0", "xid", "48", "NVRM: Xid (PCI:0000:18:00): 48"))
    c.run_once()
    v = samples(c)
    assert one(v, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 48
    assert one(v, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 0
    text = render_metrics(c.snapshot())
    assert "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter\n" in text  # no _total, as dcgm's


def test_golden_mixed_node_with_both_compat_lists(fake_nvml) -> None:
    check_golden("gpu_compat.prom", render_metrics(mixed(fake_nvml, ("amd", "dcgm")).snapshot()))


def test_mixed_vendors_no_duplicate_series(fake_nvml) -> None:
    """Two GPUs 0 (one AMD, one NVIDIA): every series of the exposition is unique, as a
    scraper parses it, and promtool finds nothing but the names
    docs/reference/metric-conventions.md fixes."""
    text = render_metrics(mixed(fake_nvml, ("amd", "dcgm")).snapshot())
    seen: set[tuple[str, frozenset]] = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in seen, f"duplicate series {key}"
            seen.add(key)
    assert ("gpu_utilization", frozenset({("gpu_id", "0"), ("vendor", "amd")})) in seen
    assert ("gpu_utilization", frozenset({("gpu_id", "0"), ("vendor", "nvidia")})) in seen
    if available():
        pytest.skip(available())
    _, problems = promtool_check_metrics(text)
    fixed = {"hw_gpu_count", "hw_gpu_type_count", "hw_gpu_used_count"}  # the seed's names
    # the other exporters' names and labels (AMD's gauges named *_total and *_count,
    # dcgm's camelCase labels and counters without _total), kept exactly for their
    # dashboards
    assert [
        p for p in problems if p.split()[0] not in fixed and not compat_family(p.split()[0])
    ] == []


def test_unknown_compat_name_is_a_clear_error(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("devices:\n  compat: [amd, nvidia]\n")
    with pytest.raises(ConfigError) as err:
        config.load(cfg, env={})
    assert "devices.compat" in str(err.value) and "nvidia" in str(err.value)
    cfg.write_text("devices:\n  compat: [dcgm]\n")
    assert config.load(cfg, env={}).devices.compat == ["dcgm"]


def test_dcgm_framebuffer_figures_add_up_as_nvidia_smi_shows_them() -> None:
    """An H200 (tests/gpu on a lent machine, driver 580.159.04) read by NVML v2 with a
    CUDA program holding memory: reserved 644,939,776 bytes (615.06 MiB) beside used and
    free with fractions. nvidia-smi showed the reserve as 616 MiB (tests/gpu compares);
    the whole MiB that total, used and free leave is that, and the three add up."""
    from lens_ebpf.agent.devices.gpu import compat_dcgm
    from lens_ebpf.agent.devices.gpu.model import GpuReading

    g = GpuReading("nvidia", "0000:00:06.0", uuid="GPU-h200", name="NVIDIA H200")
    g.memory_total, g.memory_reserved, g.memory_used = 150754820096, 644939776, 2938961920
    v = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in compat_dcgm.families([g], "n", lambda _g: {}, lambda _g: 0)
        for s in m.samples
    }
    fb = {k: one(v, f"DCGM_FI_DEV_FB_{k}") for k in ("FREE", "USED", "RESERVED")}
    assert fb == {"FREE": 140353, "USED": 2802, "RESERVED": 616}
    assert sum(fb.values()) == 143771  # nvidia-smi's memory.total, MiB
    g.memory_reserved = None  # a driver before NVML v2: absent, never a guess
    v = {
        s.name
        for m in compat_dcgm.families([g], "n", lambda _g: {}, lambda _g: 0)
        for s in m.samples
    }
    assert "DCGM_FI_DEV_FB_RESERVED" not in v
