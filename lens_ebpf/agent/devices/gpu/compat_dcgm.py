"""dcgm-exporter's families for its default counter set (NVIDIA/dcgm-exporter,
`etc/default-counters.csv`), from the readings the GPU collector already has
(`devices.compat: [dcgm]`), so dashboards written for dcgm-exporter work on lens-ebpf.

Names, types (the CSV's), units (FB memory in MiB, clocks in MHz, energy in mJ, power in
W) and labels as dcgm-exporter writes them: gpu, UUID, device (nvidia<minor>),
modelName, Hostname, pci_bus_id, DCGM_FI_DRIVER_VERSION, and namespace, pod, container
where the kubelet gave the GPU to a pod (its Kubernetes mode). A counter the default set
names that NVML does not give without DCGM (the DCGM_FI_PROF_* activity ratios but PCIe,
encoder and decoder utilization, memory temperature, NVLink bandwidth, vGPU license) is
absent. DCGM_FI_PROF_PCIE_TX_BYTES/RX_BYTES are NVML's PCIe throughput (a 20 ms sample,
bytes/s), not DCGM's profiling counter.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import Metric

from lens_ebpf.agent.devices.gpu.model import GpuReading, flag
from lens_ebpf.core.exposition import Family, family

MIB = 1024 * 1024


def _mib(n: int | None) -> float | None:
    return None if n is None else float(n // MIB)


def _reserved_mib(g: GpuReading) -> float | None:
    """What the driver keeps, in the whole MiB that total, used and free leave: the free,
    used and reserved figures add up to the total, and the value is nvidia-smi's, which
    rounds the reserve up (an H200: NVML's 644,939,776 bytes, 615.06 MiB, shown as 616;
    NVML's figure taken down to the MiB said 615)."""
    total, used, free = _mib(g.memory_total), _mib(g.memory_used), _mib(g.memory_free)
    if g.memory_reserved is None or total is None or used is None or free is None:
        return None
    return total - used - free


# name, type, help (the CSV's), value of one reading (None: absent)
FIELDS: list[tuple[str, str, str, Callable[[GpuReading], float | None]]] = [
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        lambda g: g.clocks_mhz.get("sm"),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        lambda g: g.clocks_mhz.get("memory"),
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: g.temperature),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: g.power_draw),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda g: None if g.energy_joules is None else round(g.energy_joules * 1000),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "Total number of PCIe retries.",
        lambda g: g.pcie_replays,
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: g.utilization),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        lambda g: g.memory_utilization,
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        lambda g: _mib(g.memory_free),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        lambda g: _mib(g.memory_used),
    ),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", _reserved_mib),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        lambda g: g.remapped_rows.get("uncorrectable"),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        lambda g: g.remapped_rows.get("correctable"),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        lambda g: flag(g.row_remap_failure),
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus "
        "- including both protocol headers and data payloads - in bytes per second.",
        lambda g: g.pcie_bytes_per_second.get("tx"),
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus "
        "- including both protocol headers and data payloads - in bytes per second.",
        lambda g: g.pcie_bytes_per_second.get("rx"),
    ),
]


def pci_bus_id(bdf: str) -> str:
    """'0001:3b:00.0' -> '00000001:3B:00.0', as NVML (and dcgm-exporter) write it."""
    dom, bus, rest = bdf.split(":", 2)
    return f"{int(dom, 16):08X}:{bus.upper()}:{rest.upper()}"


def labels(g: GpuReading, hostname: str, owner: dict[str, str]) -> dict[str, str]:
    lbl = {
        "gpu": str(g.index),
        "UUID": g.uuid,
        "device": f"nvidia{g.minor if g.minor is not None else g.index}",
        "modelName": g.name,
        "Hostname": hostname,
        "pci_bus_id": pci_bus_id(g.bdf) if g.bdf.count(":") == 2 else g.bdf,
        "DCGM_FI_DRIVER_VERSION": g.driver_version,
    }
    if owner.get("pod"):
        lbl.update(
            namespace=owner.get("namespace", ""),
            pod=owner["pod"],
            container=owner.get("container", ""),
        )
    return lbl


def families(
    gpus: list[GpuReading],
    hostname: str,
    owners: Callable[[GpuReading], dict[str, str]],
    last_xid: Callable[[GpuReading], int],
) -> list[Metric]:
    """dcgm-exporter's families for the NVIDIA GPUs among gpus."""
    fams: dict[str, Family] = {}

    def add(name: str, kind: str, help_text: str, lbl: dict[str, str], v: float | None) -> None:
        if v is None:
            return
        # dcgm-exporter's counters have no _total
        m = fams.get(name) or fams.setdefault(name, family(name, help_text, kind, total=False))
        m.add(lbl, float(v))

    for g in (g for g in gpus if g.vendor == "nvidia"):
        lbl = labels(g, hostname, owners(g))
        for name, kind, help_text, value in FIELDS:
            add(name, kind, help_text, lbl, value(g))
        add(
            "DCGM_FI_DEV_XID_ERRORS",
            "gauge",
            "Value of the last XID error encountered.",
            lbl,
            last_xid(g),
        )
    return list(fams.values())
