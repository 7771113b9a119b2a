"""AMD device-metrics-exporter's families, from the readings the GPU collector already has
(`devices.compat: [amd]`): the names, units and labels of ROCm/device-metrics-exporter
(`ROCm/device-metrics-exporter/docs/configuration/metricslist.md`; its labels from
`pkg/amdgpu/gpuagent`), so its Grafana dashboards and Primus-Lens's node dashboards work
on lens-ebpf alone.

Every family is a gauge, as that exporter writes them. A value the GPU does not give is
absent, never zero. Labels: the exporter's default set (gpu_id, serial_number,
card_model, the partition labels, deployment_mode, hostname, pod, namespace, container)
plus card_series, card_vendor, driver_version, vbios_version and gpu_uuid, which its
dashboards filter on. A whole (unpartitioned) GPU is partition 0 of itself; the compute
and memory partition types are not read (absent).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import Metric

from lens_ebpf.agent.devices.gpu.model import GpuReading
from lens_ebpf.core.exposition import Family, gauge

MB = 1024 * 1024
# lens-ebpf's RAS block names (amdsmi's, sysfs's ras/<block>_err_count) -> the exporter's
BLOCKS = {"pcie_bif": "bif"}
ECC_KINDS = {"correctable": "correct", "uncorrectable": "uncorrect", "deferred": "deferred"}
CLOCK_TYPES = {"gfx": "SYSTEM", "soc": "SOC", "memory": "MEMORY"}  # GPU_CLOCK_TYPE_*


def _clock_order(clock: str) -> int:
    """clock_index: the clock's place in (gfx, soc, memory), the same on every GPU."""
    return list(CLOCK_TYPES).index(clock) if clock in CLOCK_TYPES else len(CLOCK_TYPES)


def _mb(n: int | None) -> float | None:
    return None if n is None else n / MB


def _minus(total: int | None, used: int | None) -> int | None:
    return None if total is None or used is None else total - used


# name, help (the exporter's), value of one reading (None: absent)
GAUGES: list[tuple[str, str, Callable[[GpuReading], float | None]]] = [
    ("gpu_gfx_activity", "Graphics engine usage percentage (0 - 100)", lambda g: g.utilization),
    (
        "gpu_umc_activity",
        "Memory engine usage percentage (0 - 100)",
        lambda g: g.memory_utilization,
    ),
    ("gpu_total_vram", "Total VRAM available in MB", lambda g: _mb(g.memory_total)),
    ("gpu_used_vram", "Total VRAM memory used in MB", lambda g: _mb(g.memory_used)),
    ("gpu_free_vram", "Total VRAM memory free in MB", lambda g: _mb(g.memory_free)),
    (
        "gpu_total_visible_vram",
        "Total available visible VRAM memory in MB",
        lambda g: _mb(g.memory_visible_total),
    ),
    (
        "gpu_used_visible_vram",
        "Used visible VRAM memory in MB",
        lambda g: _mb(g.memory_visible_used),
    ),
    (
        "gpu_free_visible_vram",
        "Free visible VRAM memory in MB",
        lambda g: _mb(_minus(g.memory_visible_total, g.memory_visible_used)),
    ),
    ("gpu_total_gtt", "Total GTT memory in MB", lambda g: _mb(g.gtt_total)),
    ("gpu_used_gtt", "Current GTT memory usage in MB", lambda g: _mb(g.gtt_used)),
    (
        "gpu_free_gtt",
        "Free GTT memory available in MB",
        lambda g: _mb(_minus(g.gtt_total, g.gtt_used)),
    ),
    ("gpu_power_usage", "GPU power usage in Watts", lambda g: g.power_socket),
    ("gpu_package_power", "Current socket power in Watts", lambda g: g.power_current),
    ("gpu_average_package_power", "Average socket power in Watts", lambda g: g.power_average),
    (
        "gpu_edge_temperature",
        "Edge temperature value in Celsius",
        lambda g: g.temperatures.get("edge"),
    ),
    (
        "gpu_junction_temperature",
        "Hotspot (aka junction) temperature value in Celsius",
        lambda g: g.temperatures.get("junction"),
    ),
    (
        "gpu_memory_temperature",
        "Memory temperature value in Celsius",
        lambda g: g.temperatures.get("mem"),
    ),
    (
        "gpu_energy_consumed",
        "Accumulated energy consumed by the GPU in Micro Joules (uJ)",
        lambda g: None if g.energy_joules is None else g.energy_joules * 1e6,
    ),
    ("pcie_speed", "Current PCIe speed capable in GT/s", lambda g: g.pcie_speed_gts),
    ("pcie_max_speed", "Maximum capable PCIe speed in GT/s", lambda g: g.pcie_max_speed_gts),
    (
        "pcie_bandwidth",
        "Current instantaneous bandwidth usage in Mb/s",
        lambda g: g.pcie_bandwidth_mbs,
    ),
    (
        "pcie_replay_count",
        "Total number of PCIe replays (NAKs)",
        lambda g: g.pcie_counters.get("replay", g.pcie_replays),
    ),
    (
        "pcie_recovery_count",
        "Total number of PCIe recoveries",
        lambda g: g.pcie_counters.get("recovery"),
    ),
    (
        "pcie_replay_rollover_count",
        "PCIe Replay accumulated count",
        lambda g: g.pcie_counters.get("replay_rollover"),
    ),
    (
        "pcie_nack_sent_count",
        "PCIe NACK sent accumulated count",
        lambda g: g.pcie_counters.get("nack_sent"),
    ),
    (
        "pcie_nack_received_count",
        "PCIe NACK received accumulated count",
        lambda g: g.pcie_counters.get("nack_received"),
    ),
]


def labels(g: GpuReading, hostname: str, owner: dict[str, str]) -> dict[str, str]:
    return {
        "gpu_id": str(g.index),
        "gpu_uuid": g.uuid or g.unique_id or g.serial or g.bdf,
        "serial_number": g.serial,
        "card_model": g.card_model or g.card_series or g.name,
        "card_series": g.card_series or g.name,
        "card_vendor": g.card_vendor,
        "driver_version": g.driver_version,
        "vbios_version": g.vbios_version,
        "gpu_partition_id": "0",
        "deployment_mode": "baremetal",
        "hostname": hostname,
        "pod": owner.get("pod", ""),
        "namespace": owner.get("namespace", ""),
        "container": owner.get("container", ""),
    }


def healthy(g: GpuReading) -> bool:
    """The exporter's health with its default thresholds (0): unhealthy once any block
    has an uncorrectable ECC error."""
    return not any(n > 0 for (_, kind), n in g.ras_errors.items() if kind == "uncorrectable")


def families(
    gpus: list[GpuReading], hostname: str, owners: Callable[[GpuReading], dict[str, str]]
) -> list[Metric]:
    """The exporter's families for the AMD GPUs among gpus."""
    amd = [g for g in gpus if g.vendor == "amd"]
    fams: dict[str, Family] = {}

    def add(name: str, help_text: str, lbl: dict[str, str], value: float | None) -> None:
        if value is None:
            return
        m = fams.get(name) or fams.setdefault(name, gauge(name, help_text))
        m.add(lbl, float(value))

    if amd:
        add(
            "gpu_nodes_total",
            "Number of GPU nodes on the machine",
            {"hostname": hostname},
            len(amd),
        )
    for g in amd:
        lbl = labels(g, hostname, owners(g))
        add("gpu_health", "Health of the GPU (1 healthy, 0 unhealthy)", lbl, float(healthy(g)))
        for name, help_text, value in GAUGES:
            add(name, help_text, lbl, value(g))
        for clock in sorted(set(g.clocks_mhz) | set(g.clock_ranges_mhz), key=_clock_order):
            clbl = {
                **lbl,
                "clock_index": str(_clock_order(clock)),
                "clock_type": CLOCK_TYPES.get(clock, clock.upper()),
            }
            add("gpu_clock", "Clock measure of the GPU in Mhz", clbl, g.clocks_mhz.get(clock))
            lo, hi = g.clock_ranges_mhz.get(clock, (None, None))
            add("gpu_min_clock", "Minimum Clock measure of the GPU in Mhz", clbl, lo)
            add("gpu_max_clock", "Maximum Clock measure of the GPU in Mhz", clbl, hi)
        for stack, c in sorted(g.hbm_temperatures.items()):
            add(
                "gpu_hbm_temperature",
                "List of per-stack HBM temperatures in Celsius",
                {**lbl, "hbm_index": str(stack)},
                c,
            )
        for link, kb in sorted(g.xgmi_read_kb.items()):
            add(
                "gpu_xgmi_link_rx",
                "Accumulated XGMI Link Data Read in KB",
                {**lbl, "link_index": str(link)},
                kb,
            )
        for link, kb in sorted(g.xgmi_write_kb.items()):
            add(
                "gpu_xgmi_link_tx",
                "Accumulated XGMI Link Data Write in KB",
                {**lbl, "link_index": str(link)},
                kb,
            )
        totals: dict[str, int] = {}
        for (block, kind), n in sorted(g.ras_errors.items()):
            word = ECC_KINDS.get(kind)
            if word is None:
                continue
            add(
                f"gpu_ecc_{word}_{BLOCKS.get(block, block)}",
                f"{kind.capitalize()} ECC error in {BLOCKS.get(block, block).upper()}",
                lbl,
                n,
            )
            totals[word] = totals.get(word, 0) + n
        for word, n in sorted(totals.items()):
            add(f"gpu_ecc_{word}_total", f"Total {word} ECC error count", lbl, n)
    return list(fams.values())
