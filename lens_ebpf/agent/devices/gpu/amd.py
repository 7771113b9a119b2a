"""AMD GPUs: the amdsmi library, else `amd-smi --json`, else sysfs (needs nothing)."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lens_ebpf.agent.devices.files import read_bytes, read_text
from lens_ebpf.agent.devices.gpu.model import GpuProcess, GpuReading, norm_bdf

CARD = re.compile(r"^card\d+$")
MB = 1024 * 1024


class SourceError(Exception):
    """A source that is absent or answered nonsense; the next one is tried."""


# -- sysfs -------------------------------------------------------------------
def _read(path: Path) -> str | None:
    text = read_text(path)
    return text.strip() if text is not None else None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parse_uevent(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


RAS_TYPES = {"ue": "uncorrectable", "ce": "correctable", "de": "deferred"}


def parse_ras_count(text: str) -> dict[str, int]:
    """A ras/<block>_err_count file: `ue: N` and `ce: N` lines (and `de: N` on newer
    kernels), by type name; lines that are not that are skipped."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in RAS_TYPES and value.strip().isdigit():
            out[RAS_TYPES[key.strip()]] = int(value)
    return out


# The gpu_metrics table (kgd_pp_interface.h): a header (u16 structure_size, u8
# format_revision, u8 content_revision), then a layout per revision. Versions 1.1-1.3
# (MI100, MI200, RDNA) share the offsets read here; 1.3 adds the ASIC-independent throttle
# status. Other revisions (1.0, 1.4+ on MI300, 2.x on APUs) are skipped and counted.
METRICS_HEADER = struct.Struct("<HBB")
METRICS_CLOCKS = {"gfx": 54, "soc": 56, "memory": 58}  # current_gfxclk, socclk, uclk (MHz)
METRICS_SIZES = {1: 96, 2: 104, 3: 120}  # content revision -> sizeof(gpu_metrics_v1_N)
INDEP_THROTTLE_OFFSET = 112  # gpu_metrics_v1_3.indep_throttle_status (u64)
# SMU_THROTTLER_*_BIT (amdgpu_smu.h), the bits of the ASIC-independent throttle status
THROTTLERS = {
    "ppt0": 0,
    "ppt1": 1,
    "ppt2": 2,
    "ppt3": 3,
    "spl": 4,
    "fppt": 5,
    "sppt": 6,
    "sppt_apu": 7,
    "tdc_gfx": 16,
    "tdc_soc": 17,
    "tdc_mem": 18,
    "tdc_vdd": 19,
    "tdc_cvip": 20,
    "edc_cpu": 21,
    "edc_gfx": 22,
    "apcc": 23,
    "temp_gpu": 32,
    "temp_core": 33,
    "temp_mem": 34,
    "temp_edge": 35,
    "temp_hotspot": 36,
    "temp_soc": 37,
    "temp_vr_gfx": 38,
    "temp_vr_soc": 39,
    "temp_vr_mem0": 40,
    "temp_vr_mem1": 41,
    "temp_liquid0": 42,
    "temp_liquid1": 43,
    "vrhot0": 44,
    "vrhot1": 45,
    "prochot_cpu": 46,
    "prochot_gfx": 47,
    "ppm": 56,
    "fit": 57,
}


def parse_gpu_metrics(data: bytes, r: GpuReading) -> None:
    """Clocks and throttle reasons from a gpu_metrics table into r; r.metrics_table says
    the revision, and whether it was understood."""
    if len(data) < METRICS_HEADER.size:
        r.metrics_table = ("short", False)
        return
    size, fmt, content = METRICS_HEADER.unpack_from(data)
    revision = f"{fmt}.{content}"
    need = METRICS_SIZES.get(content) if fmt == 1 else None
    if need is None or len(data) < need or size < need:
        r.metrics_table = (revision, False)
        return
    r.metrics_table = (revision, True)
    for clock, offset in METRICS_CLOCKS.items():
        (mhz,) = struct.unpack_from("<H", data, offset)
        if mhz != 0xFFFF:  # not available on this ASIC
            r.clocks_mhz[clock] = float(mhz)
    if content >= 3:
        (status,) = struct.unpack_from("<Q", data, INDEP_THROTTLE_OFFSET)
        if status != 0xFFFFFFFFFFFFFFFF:
            r.clock_events = {name: bool(status >> bit & 1) for name, bit in THROTTLERS.items()}


PCI_VENDORS = {"1002": "Advanced Micro Devices, Inc. [AMD/ATI]"}  # pci.ids' name


def link_speed(text: str | None) -> float | None:
    """A PCI device's current_link_speed / max_link_speed ("32.0 GT/s PCIe") in GT/s."""
    m = re.match(r"^\s*([0-9.]+)\s*GT/s", text or "")
    return float(m.group(1)) if m else None


def add_sysfs_health(sysfs: Path, readings: list[GpuReading]) -> None:
    """RAS error counts per block, PCIe replays, and clocks and throttling from the
    gpu_metrics table, from each card's sysfs directory, for AMD readings whatever their
    source."""
    dirs = card_dirs(sysfs)
    for r in readings:
        dev = dirs.get(r.bdf)
        if dev is None:
            continue
        ras = dev / "ras"
        for f in sorted(ras.glob("*_err_count")) if ras.is_dir() else []:
            for kind, n in parse_ras_count(_read(f) or "").items():
                r.ras_errors[(f.name[: -len("_err_count")], kind)] = n
        if r.pcie_speed_gts is None:
            r.pcie_speed_gts = link_speed(_read(dev / "current_link_speed"))
        if r.pcie_max_speed_gts is None:
            r.pcie_max_speed_gts = link_speed(_read(dev / "max_link_speed"))
        if not r.card_model:
            r.card_model = _read(dev / "product_number") or ""
        if not r.vbios_version:
            r.vbios_version = _read(dev / "vbios_version") or ""
        replays = _int(_read(dev / "pcie_replay_count"))
        if replays is not None:
            r.pcie_replays = replays
        metrics = read_bytes(dev / "gpu_metrics")
        if metrics is not None:
            parse_gpu_metrics(metrics, r)


def card_dirs(sysfs: Path) -> dict[str, Path]:
    """BDF -> the device directory of each amdgpu card under class/drm."""
    drm = sysfs / "class" / "drm"
    out: dict[str, Path] = {}
    for card in sorted(drm.iterdir()) if drm.is_dir() else []:
        if not CARD.match(card.name):
            continue
        dev = card / "device"
        ev = parse_uevent(_read(dev / "uevent") or "")
        if ev.get("DRIVER") == "amdgpu":
            out[norm_bdf(ev.get("PCI_SLOT_NAME") or dev.resolve().name)] = dev
    return out


def read_sysfs(sysfs: Path = Path("/sys")) -> list[GpuReading]:
    """amdgpu cards under class/drm (cardN only, not connectors), keyed by BDF."""
    out: dict[str, GpuReading] = {}
    for bdf, dev in card_dirs(sysfs).items():
        ev = parse_uevent(_read(dev / "uevent") or "")
        r = GpuReading("amd", bdf, source="sysfs")
        r.device_id = ev.get("PCI_ID", "").split(":")[-1].lower()
        r.name = _read(dev / "product_name") or ""
        r.serial = _read(dev / "serial_number") or ""
        r.unique_id = _read(dev / "unique_id") or ""
        r.utilization = _int(_read(dev / "gpu_busy_percent"))
        r.memory_total = _int(_read(dev / "mem_info_vram_total"))
        r.memory_used = _int(_read(dev / "mem_info_vram_used"))
        r.driver_version = _read(sysfs / "module" / "amdgpu" / "version") or ""
        r.card_series = r.name
        r.card_model = _read(dev / "product_number") or ""
        r.vbios_version = _read(dev / "vbios_version") or ""
        r.card_vendor = PCI_VENDORS.get(ev.get("PCI_ID", "").split(":")[0].lower(), "")
        r.memory_utilization = _int(_read(dev / "mem_busy_percent"))
        r.memory_visible_total = _int(_read(dev / "mem_info_vis_vram_total"))
        r.memory_visible_used = _int(_read(dev / "mem_info_vis_vram_used"))
        r.gtt_total = _int(_read(dev / "mem_info_gtt_total"))
        r.gtt_used = _int(_read(dev / "mem_info_gtt_used"))
        hw = dev / "hwmon"
        for h in sorted(hw.iterdir()) if hw.is_dir() else []:
            if _read(h / "name") != "amdgpu":
                continue
            for temp in sorted(h.glob("temp*_input")):
                label = _read(h / temp.name.replace("_input", "_label")) or temp.name
                value = _int(_read(temp))
                if value is not None:
                    r.temperatures[label] = value / 1000
            # kernels from 6.6 may expose power1_input only
            power = _int(_read(h / "power1_average")) or _int(_read(h / "power1_input"))
            if power is not None:
                r.power_draw = r.power_socket = power / 1e6
            cap = _int(_read(h / "power1_cap"))
            if cap is not None:
                r.power_limit = cap / 1e6
        r.temperature = r.temperatures.get("edge", r.temperatures.get("junction"))
        out[bdf] = r
    return [out[b] for b in sorted(out)]


# -- amd-smi --json ----------------------------------------------------------
def _gpu_list(doc: Any) -> list[dict[str, Any]]:
    """Older amd-smi prints a list; newer wraps it in {"gpu_data": [...]}."""
    if isinstance(doc, dict) and isinstance(doc.get("gpu_data"), list):
        doc = doc["gpu_data"]
    if not isinstance(doc, list) or not all(isinstance(g, dict) for g in doc):
        raise SourceError("amd-smi JSON: expected a list of GPUs or {gpu_data: [...]}")
    return doc


def _val(node: Any, *path: str) -> float | None:
    """A {"value": V, "unit": U} leaf (or a bare number); None for "N/A" or absent."""
    for key in path:
        if not isinstance(node, dict):
            return None
        node = node.get(key)
    if isinstance(node, dict):
        node = node.get("value")
    if isinstance(node, bool) or node is None:
        return None
    try:
        return float(node)
    except (TypeError, ValueError):
        return None


def _unit_bytes(node: Any) -> int | None:
    value = _val(node)
    if value is None:
        return None
    unit = node.get("unit", "B") if isinstance(node, dict) else "B"
    scale = {"B": 1, "KB": 1024, "MB": MB, "GB": 1024 * MB}.get(str(unit).upper(), 1)
    return int(value * scale)


def parse_amd_smi(static: str, metric: str, process: str | None = None) -> list[GpuReading]:
    """Readings from `amd-smi static --json`, `metric --json` and `process --json`."""
    try:
        statics = _gpu_list(json.loads(static))
        metrics = {g.get("gpu"): g for g in _gpu_list(json.loads(metric))}
        procs = {g.get("gpu"): g for g in _gpu_list(json.loads(process))} if process else {}
    except json.JSONDecodeError as exc:
        raise SourceError(f"amd-smi JSON: {exc.msg}") from None
    out = []
    for s in statics:
        bdf = (s.get("bus") or {}).get("bdf")
        if not isinstance(bdf, str):
            raise SourceError("amd-smi static: a GPU without bus.bdf")
        asic, m = s.get("asic") or {}, metrics.get(s.get("gpu")) or {}
        r = GpuReading("amd", norm_bdf(bdf), index=int(s.get("gpu", 0)), source="amd-smi")
        r.name = str(asic.get("market_name") or "")
        r.device_id = str(asic.get("device_id") or "").lower().removeprefix("0x")
        r.serial = str(asic.get("asic_serial") or "")
        r.driver_version = str((s.get("driver") or {}).get("version") or "")
        board, vbios = s.get("board") or {}, s.get("vbios") or {}
        r.card_series = str(board.get("product_name") or r.name)
        r.card_model = str(board.get("model_number") or "")
        r.card_vendor = str(board.get("manufacturer_name") or asic.get("vendor_name") or "")
        r.vbios_version = str(vbios.get("version") or "")
        r.memory_total = _unit_bytes((m.get("mem_usage") or {}).get("total_vram")) or _unit_bytes(
            (s.get("vram") or {}).get("size")
        )
        r.memory_used = _unit_bytes((m.get("mem_usage") or {}).get("used_vram"))
        r.utilization = _val(m, "usage", "gfx_activity")
        temps = m.get("temperature") or {}
        for label, key in (("edge", "edge"), ("junction", "hotspot"), ("mem", "mem")):
            v = _val(temps, key)
            if v is not None:
                r.temperatures[label] = v
        r.temperature = r.temperatures.get("edge", r.temperatures.get("junction"))
        r.memory_utilization = _val(m, "usage", "umc_activity")
        r.power_socket = _val(m, "power", "socket_power")
        r.power_average = _val(m, "power", "average_socket_power")
        r.power_draw = r.power_socket or r.power_average
        r.power_limit = _val(s, "limit", "max_power") or _val(s, "limit", "power_cap")
        for p in (procs.get(s.get("gpu")) or {}).get("process_list") or []:
            info = p.get("process_info", p) if isinstance(p, dict) else {}
            pid = info.get("pid") if isinstance(info, dict) else None
            if isinstance(pid, int):
                r.processes.append(GpuProcess(pid, _unit_bytes(info.get("mem_usage"))))
        out.append(r)
    return out


# -- the amdsmi library --------------------------------------------------------
def _safe(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # AmdSmiLibraryException (not supported, no permission) per metric
        return None


def _amdsmi_health(lib: Any, h: Any, r: GpuReading) -> None:
    """RAS error counts for each block whose RAS feature is on, PCIe replays, energy and
    the XGMI error state: each only where the GPU answers. sysfs, read after this, has
    the final word on the counts they both give (add_sysfs_health)."""
    blocks = [b for b in lib.AmdSmiGpuBlock if b.name not in ("INVALID", "RESERVED")]
    enabled = _safe(lib.amdsmi_get_gpu_ras_block_features_enabled, h)
    if isinstance(enabled, list):  # the call answers for every block or fails as a whole
        on = {e.get("block") for e in enabled if e.get("status") == "ENABLED"}
        blocks = [b for b in blocks if b.name in on]
    for block in blocks:
        ec = _safe(lib.amdsmi_get_gpu_ecc_count, h, block)
        if isinstance(ec, dict):
            for key, kind in (
                ("correctable_count", "correctable"),
                ("uncorrectable_count", "uncorrectable"),
                ("deferred_count", "deferred"),
            ):
                if isinstance(ec.get(key), int):
                    r.ras_errors[(block.name.lower(), kind)] = ec[key]
    replays = _safe(lib.amdsmi_get_gpu_pci_replay_counter, h)
    r.pcie_replays = replays if isinstance(replays, int) else None
    energy = _safe(lib.amdsmi_get_energy_count, h) or {}
    acc, res = energy.get("energy_accumulator"), energy.get("counter_resolution")
    if isinstance(acc, int) and isinstance(res, float):
        r.energy_joules = acc * res / 1e6  # counts of `resolution` microjoules
    xgmi = _safe(lib.amdsmi_gpu_xgmi_error_status, h)
    r.xgmi_error_status = xgmi if isinstance(xgmi, int) else None
    # the gpu_metrics table through the library, whatever its revision (MI300's 1.4+ too,
    # which the sysfs reader skips): clocks; gfx is the mean over the XCCs that report.
    # The binding turns the throttle status into a bool, so reasons come from sysfs only.
    metrics = _safe(lib.amdsmi_get_gpu_metrics_info, h)
    if isinstance(metrics, dict):
        for clock, key in (("gfx", "current_gfxclks"), ("soc", "current_socclks")):
            got = metrics.get(key)
            mhz = [v for v in got if isinstance(v, int)] if isinstance(got, list) else []
            if mhz:
                r.clocks_mhz[clock] = sum(mhz) / len(mhz) if clock == "gfx" else float(mhz[0])
        if isinstance(metrics.get("current_uclk"), int):
            r.clocks_mhz["memory"] = float(metrics["current_uclk"])
        hbm = metrics.get("temperature_hbm")
        for stack, c in enumerate(hbm if isinstance(hbm, list) else []):
            if isinstance(c, int):
                r.hbm_temperatures[stack] = float(c)
        for key, into in (
            ("xgmi_read_data_acc", r.xgmi_read_kb),
            ("xgmi_write_data_acc", r.xgmi_write_kb),
        ):
            got = metrics.get(key)
            for link, kb in enumerate(got if isinstance(got, list) else []):
                if isinstance(kb, int):
                    into[link] = kb
    mt = lib.AmdSmiMemoryType
    for kind, total_attr, used_attr in (
        (mt.VIS_VRAM, "memory_visible_total", "memory_visible_used"),
        (mt.GTT, "gtt_total", "gtt_used"),
    ):
        total, used = (
            _safe(lib.amdsmi_get_gpu_memory_total, h, kind),
            _safe(lib.amdsmi_get_gpu_memory_usage, h, kind),
        )
        setattr(r, total_attr, total if isinstance(total, int) else None)
        setattr(r, used_attr, used if isinstance(used, int) else None)
    ct = lib.AmdSmiClkType
    for clock, kind in (("gfx", ct.GFX), ("soc", ct.SOC), ("memory", ct.MEM)):
        ci = _safe(lib.amdsmi_get_clock_info, h, kind) or {}
        lo, hi = ci.get("min_clk"), ci.get("max_clk")
        if isinstance(lo, int) and isinstance(hi, int):
            r.clock_ranges_mhz[clock] = (float(lo), float(hi))
    info = _safe(lib.amdsmi_get_pcie_info, h) or {}
    static, pcie = info.get("pcie_static") or {}, info.get("pcie_metric") or {}
    if isinstance(static.get("max_pcie_speed"), int):
        r.pcie_max_speed_gts = static["max_pcie_speed"] / 1000  # MT/s
    if isinstance(pcie.get("pcie_speed"), int):
        r.pcie_speed_gts = pcie["pcie_speed"] / 1000  # MT/s
    if isinstance(pcie.get("pcie_bandwidth"), int):
        r.pcie_bandwidth_mbs = float(pcie["pcie_bandwidth"])
    for name, key in PCIE_COUNTERS.items():
        if isinstance(pcie.get(key), int):
            r.pcie_counters[name] = pcie[key]


# amdsmi_get_pcie_info's counters (MI300), by the names the AMD exporter gives them
PCIE_COUNTERS = {
    "replay": "pcie_replay_count",
    "recovery": "pcie_l0_to_recovery_count",
    "replay_rollover": "pcie_replay_roll_over_count",
    "nack_sent": "pcie_nak_sent_count",
    "nack_received": "pcie_nak_received_count",
}


def _text(v: Any) -> str:
    """A string the binding returns, "" for its "N/A"."""
    return "" if v is None or v == "N/A" else str(v)


def _amdsmi_device(lib: Any, index: int, h: Any) -> GpuReading:
    r = GpuReading("amd", norm_bdf(lib.amdsmi_get_gpu_device_bdf(h)), index=index, source="amdsmi")
    asic = _safe(lib.amdsmi_get_gpu_asic_info, h) or {}
    r.name = _text(asic.get("market_name"))
    r.device_id = _text(asic.get("device_id")).lower().removeprefix("0x")
    r.serial = _text(asic.get("asic_serial"))
    r.driver_version = _text((_safe(lib.amdsmi_get_gpu_driver_info, h) or {}).get("driver_version"))
    board = _safe(lib.amdsmi_get_gpu_board_info, h) or {}
    r.card_model = _text(board.get("model_number"))
    r.card_series = _text(board.get("product_name")) or r.name
    r.card_vendor = _text(board.get("manufacturer_name")) or _text(asic.get("vendor_name"))
    r.vbios_version = _text((_safe(lib.amdsmi_get_gpu_vbios_info, h) or {}).get("version"))
    vram = _safe(lib.amdsmi_get_gpu_vram_usage, h) or {}
    total, used = _val(vram, "vram_total"), _val(vram, "vram_used")  # MB
    r.memory_total = int(total * MB) if total is not None else None
    r.memory_used = int(used * MB) if used is not None else None
    activity = _safe(lib.amdsmi_get_gpu_activity, h) or {}
    r.utilization = _val(activity, "gfx_activity")
    r.memory_utilization = _val(activity, "umc_activity")
    tt, tm = lib.AmdSmiTemperatureType, lib.AmdSmiTemperatureMetric
    for label, kind in (("edge", tt.EDGE), ("junction", tt.HOTSPOT), ("mem", tt.VRAM)):
        v = _safe(lib.amdsmi_get_temp_metric, h, kind, tm.CURRENT)
        if isinstance(v, int | float):  # "N/A" strings where numbers are missing
            r.temperatures[label] = float(v)
    r.temperature = r.temperatures.get("edge", r.temperatures.get("junction"))
    power = _safe(lib.amdsmi_get_power_info, h) or {}
    r.power_socket = _val(power, "socket_power")
    r.power_current = _val(power, "current_socket_power")
    r.power_average = _val(power, "average_socket_power")
    r.power_draw = r.power_average or r.power_current
    limit = _val(power, "power_limit")
    r.power_limit = limit / 1e6 if limit and limit > 10_000 else limit  # uW on some releases
    for p in _safe(lib.amdsmi_get_gpu_process_list, h) or []:
        if isinstance(p, dict) and isinstance(p.get("pid"), int):
            usage = p.get("memory_usage")
            mem = usage.get("vram_mem") if isinstance(usage, dict) else p.get("mem")
            r.processes.append(GpuProcess(p["pid"], int(mem) if isinstance(mem, int) else None))
    _amdsmi_health(lib, h, r)
    return r


def read_amdsmi(lib: Any) -> list[GpuReading]:
    """Readings through the amdsmi Python binding (lib: the imported module, initialized)."""
    return [_amdsmi_device(lib, i, h) for i, h in enumerate(lib.amdsmi_get_processor_handles())]
