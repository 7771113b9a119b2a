"""One reading of a GPU, whatever the vendor and the source."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuProcess:
    pid: int
    memory_bytes: int | None


@dataclass
class GpuReading:
    vendor: str  # nvidia or amd
    bdf: str  # the key: PCI domain:bus:device.function, lower case
    index: int = 0
    name: str = ""
    uuid: str = ""
    device_id: str = ""
    serial: str = ""
    unique_id: str = ""
    driver_version: str = ""
    memory_total: int | None = None
    memory_used: int | None = None  # by processes; not what the driver reserves
    memory_reserved: int | None = None  # kept by the driver (NVML v2), when known
    utilization: float | None = None
    temperature: float | None = None  # edge, else junction
    temperatures: dict[str, float] = field(default_factory=dict)
    power_draw: float | None = None  # watts
    power_limit: float | None = None  # watts
    processes: list[GpuProcess] = field(default_factory=list)
    source: str = ""  # amdsmi, amd-smi, sysfs, nvml, nvidia-smi
    # health; each entry only where the GPU reports it (absent, never zero)
    ecc_errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (type, counter)
    retired_pages: dict[str, int] = field(default_factory=dict)  # cause -> pages
    retired_pages_pending: bool | None = None
    remapped_rows: dict[str, int] = field(default_factory=dict)  # correctable, uncorrectable
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    # NVIDIA (R570+): what the driver asks before the GPU is usable again, after an Xid:
    # none, gpu_reset, node_reboot, drain_p2p, drain_and_reset, ...
    recovery_action: str | None = None
    clock_events: dict[str, bool] = field(default_factory=dict)  # reason -> active
    clocks_mhz: dict[str, float] = field(default_factory=dict)  # sm, memory
    pcie_replays: int | None = None
    ras_errors: dict[tuple[str, str], int] = field(default_factory=dict)  # (block, type)
    energy_joules: float | None = None  # since the driver loaded
    xgmi_error_status: int | None = None  # AMD: 0 no errors, 1 an error, 2 several
    pcie_bytes_per_second: dict[str, float] = field(default_factory=dict)  # tx, rx
    nvlink_up: dict[int, bool] = field(default_factory=dict)  # link -> active
    nvlink_errors: dict[tuple[int, str], int] = field(default_factory=dict)  # (link, counter)
    metrics_table: tuple[str, bool] | None = None  # AMD gpu_metrics: (revision, understood)
    # identity beyond the name, for the exporter-compatible families (devices.compat)
    vbios_version: str = ""
    card_series: str = ""  # AMD: the product (board) name
    card_model: str = ""  # AMD: the board's part number (102-...)
    card_vendor: str = ""
    minor: int | None = None  # NVIDIA: /dev/nvidia<minor>
    memory_utilization: float | None = None  # percent: NVML memory, AMD UMC activity
    # AMD socket power, watts: amdsmi's socket_power, current_socket_power (MI300) and
    # average_socket_power (MI200), each where the GPU answers
    power_socket: float | None = None
    power_current: float | None = None
    power_average: float | None = None
    pcie_speed_gts: float | None = None  # current link speed, GT/s
    pcie_max_speed_gts: float | None = None
    pcie_bandwidth_mbs: float | None = None  # amdsmi's instantaneous PCIe bandwidth, Mb/s
    pcie_counters: dict[str, int] = field(default_factory=dict)  # recovery, nak_sent, ...
    xgmi_read_kb: dict[int, int] = field(default_factory=dict)  # link -> KB read, accumulated
    xgmi_write_kb: dict[int, int] = field(default_factory=dict)
    # AMD: CPU-visible VRAM and GTT, bytes; clock ranges (clock -> (min, max) MHz); HBM
    # stack temperatures (stack -> C)
    memory_visible_total: int | None = None
    memory_visible_used: int | None = None
    gtt_total: int | None = None
    gtt_used: int | None = None
    clock_ranges_mhz: dict[str, tuple[float, float]] = field(default_factory=dict)
    hbm_temperatures: dict[int, float] = field(default_factory=dict)

    @property
    def memory_free(self) -> int | None:
        if self.memory_total is None or self.memory_used is None:
            return None
        return self.memory_total - (self.memory_reserved or 0) - self.memory_used

    @property
    def used(self) -> bool:
        return bool(self.utilization) or bool(self.memory_used)


def norm_bdf(bdf: str) -> str:
    """'00000000:18:00.0' (NVML) or '0000:C1:00.0' -> '0000:c1:00.0'."""
    bdf = bdf.strip().lower()
    dom, _, rest = bdf.rpartition(":")
    dom_part, _, bus = dom.rpartition(":")
    if not dom_part:
        return f"0000:{bdf}" if bdf.count(":") == 1 else bdf
    return f"{int(dom_part, 16):04x}:{bus}:{rest}"


def flag(v: bool | None) -> float | None:
    """A health flag as a sample: 1.0, 0.0, or None where the GPU does not report it."""
    return None if v is None else float(v)
