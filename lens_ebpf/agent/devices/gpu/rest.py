"""The node exporter's GPU routes, key for key: /gpus, /cardMetrics, /driMapping and the GPU
half of /pods. Pure: readings and the DRI map in, JSON-ready values out.

Every documented key is present with its documented type; what lens-ebpf knows beyond
that (vendor, BDF, allocation, stale flags, ...) rides beside it as extra keys (docs/agent/http.md).
"""

from __future__ import annotations

import re
from typing import Any

from lens_ebpf.agent.devices.gpu.model import GpuReading

CARD_ID = re.compile(r"card(\d+)$")
NVIDIA_DEV = re.compile(r"^/dev/nvidia(\d+)$")


def hex_id(device_id: str) -> str:
    """'74a1', '0x74A1' -> '0x74a1' (amd-smi's spelling); '' when unknown."""
    bare = device_id.strip().lower().removeprefix("0x")
    return f"0x{bare}" if bare else ""


def asic_serial(g: GpuReading) -> str:
    """The serial as amd-smi gives it: AMD boards whose serial_number is empty in sysfs
    have it as unique_id, which amd-smi prints as 0x plus 16 upper-case hex digits."""
    if g.serial or g.vendor != "amd" or not g.unique_id:
        return g.serial
    return "0x" + g.unique_id.lower().removeprefix("0x").upper()


def card_id(card_path: str) -> int:
    m = CARD_ID.search(card_path)
    return int(m.group(1)) if m else -1


def gpu_entry(
    g: GpuReading, dri: dict[str, str], allocated_to: dict[str, str] | None
) -> dict[str, Any]:
    """One /gpus row: gpu, asic, bus, dri_device, then our extras."""
    return {
        "gpu": g.index,
        "asic": {
            "market_name": g.name,
            "device_id": hex_id(g.device_id),
            "asic_serial": asic_serial(g),
        },
        "bus": {"bdf": g.bdf},
        "dri_device": {
            "card": dri.get("card", ""),
            "render": dri.get("render", ""),
            "pci_addr": g.bdf,
        },
        # lens-ebpf's additions
        "vendor": g.vendor,
        "uuid": g.uuid,
        "unique_id": g.unique_id,
        "driver_version": g.driver_version,
        "memory_total_bytes": g.memory_total,
        "source": g.source,
        "allocated_to": allocated_to or None,
    }


def card_entry(g: GpuReading, stale: bool) -> dict[str, Any]:
    """One /cardMetrics row; percents are null when the source cannot say."""
    mem_pct = None
    if g.memory_used is not None and g.memory_total:
        mem_pct = round(100 * g.memory_used / g.memory_total, 2)
    return {
        "gpu": g.index,
        "gpu_use_percent": g.utilization,
        "memory_use_percent": mem_pct,
        # lens-ebpf's additions
        "vendor": g.vendor,
        "bdf": g.bdf,
        "memory_used_bytes": g.memory_used,
        "memory_total_bytes": g.memory_total,
        "temperature_celsius": g.temperature,
        "temperatures": g.temperatures,
        "power_draw_watts": g.power_draw,
        "power_limit_watts": g.power_limit,
        "stale": stale,
    }


def dri_map(gpus: list[GpuReading], dri: dict[str, dict[str, str]]) -> dict[str, dict[str, Any]]:
    """/driMapping: card path -> {card, render, pci_addr, card_id} (+ gpu, vendor)."""
    out: dict[str, dict[str, Any]] = {}
    for g in gpus:
        nodes = dri.get(g.bdf, {})
        card = nodes.get("card")
        if not card:
            continue
        out[card] = {
            "card": card,
            "render": nodes.get("render", ""),
            "pci_addr": g.bdf,
            "card_id": card_id(card),
            "gpu": g.index,
            "vendor": g.vendor,
        }
    return out


def driver_version(gpus: list[GpuReading]) -> str:
    """The AMD driver's version (amdsmi, amd-smi, or the amdgpu module's in sysfs), as the
    node exporter reports; on a node without AMD GPUs, NVIDIA's (NVML, nvidia-smi)."""
    ordered = sorted(gpus, key=lambda g: g.vendor != "amd")
    return next((g.driver_version for g in ordered if g.driver_version), "")


def device_nodes(
    gpus: list[GpuReading], dri: dict[str, dict[str, str]]
) -> dict[str, dict[str, Any]]:
    """Host device path -> the GPU behind it, in /pods' device shape (without the path).

    AMD: its /dev/dri card and render nodes. NVIDIA: /dev/nvidiaN is the GPU whose
    index is N (the device minor; NVML numbers GPUs in minor order on one driver).
    """
    out: dict[str, dict[str, Any]] = {}
    for g in gpus:
        dev = {
            "name": g.name,
            "id": g.index,
            "kind": "GPU",
            "uuid": hex_id(g.device_id),
            "serial": asic_serial(g),
            "slot": g.bdf,
            "vendor": g.vendor,
        }
        for path in dri.get(g.bdf, {}).values():
            out[path] = dev
        if g.vendor == "nvidia":
            out[f"/dev/nvidia{g.index}"] = dev
    return out
