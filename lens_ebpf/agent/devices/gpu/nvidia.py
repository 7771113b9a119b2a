"""NVIDIA GPUs: NVML through pynvml (nvidia-ml-py), else nvidia-smi's CSV."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from lens_ebpf.agent.devices.gpu.amd import SourceError
from lens_ebpf.agent.devices.gpu.faults import Fault
from lens_ebpf.agent.devices.gpu.model import GpuProcess, GpuReading, norm_bdf

log = logging.getLogger(__name__)

MIB = 1024 * 1024
QUERY_GPU = (
    "index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,"
    "utilization.gpu,temperature.gpu,power.draw,power.limit"
)
QUERY_APPS = "gpu_uuid,pid,used_memory"
MISSING = {"[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", ""}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _memory_v2(nvml: Any, h: Any) -> Any:
    """nvmlDeviceGetMemoryInfo_v2 (total, reserved, free, used); None where the driver or
    the binding lacks it."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is None:
        return None
    try:
        return nvml.nvmlDeviceGetMemoryInfo(h, version=version)
    except (nvml.NVMLError, TypeError):
        return None


# NVML's clock event (throttle) reason bits, by the names the metric uses
CLOCK_EVENTS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


def _answered(
    get: Callable[..., Any], fn: Any, h: Any, asks: dict[Any, tuple[Any, ...]]
) -> dict[Any, Any]:
    """{key: fn(h, *args)} for each key whose call answered (get() gives None when not)."""
    got = {key: get(fn, h, *args) for key, args in asks.items()}
    return {key: v for key, v in got.items() if v is not None}


# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (R570+; the deprecated RESET_STATUS and
# DRAIN_AND_RESET_STATUS fields before it) and its NVML_GPU_RECOVERY_ACTION_* values
FI_GPU_RECOVERY_ACTION = 230
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


def _nvml_health(nvml: Any, h: Any, r: GpuReading, get: Callable[..., Any]) -> None:
    """ECC, page retirement, row remapping, clock events and clocks, PCIe replays,
    energy: each only where this GPU and driver answer."""
    ecc = {
        (ename, cname): (etype, ctype)
        for etype, ename in (
            (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
            (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
        )
        for ctype, cname in (
            (nvml.NVML_VOLATILE_ECC, "volatile"),
            (nvml.NVML_AGGREGATE_ECC, "aggregate"),
        )
    }
    got = _answered(get, nvml.nvmlDeviceGetTotalEccErrors, h, ecc)
    r.ecc_errors = {key: int(n) for key, n in got.items()}
    causes = {
        "multiple_single_bit_ecc": (
            nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        ),
        "double_bit_ecc": (nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,),
    }
    got = _answered(get, nvml.nvmlDeviceGetRetiredPages, h, causes)
    r.retired_pages = {cause: len(pages) for cause, pages in got.items()}
    pending = get(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    r.retired_pages_pending = bool(pending) if pending is not None else None
    rows = get(nvml.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        corr, unc, pend, fail = rows
        r.remapped_rows = {"correctable": int(corr), "uncorrectable": int(unc)}
        r.row_remap_pending, r.row_remap_failure = bool(pend), bool(fail)
    values = get(nvml.nvmlDeviceGetFieldValues, h, [FI_GPU_RECOVERY_ACTION])
    if values is not None and values[0].nvmlReturn == nvml.NVML_SUCCESS:
        code = int(values[0].value.uiVal)
        r.recovery_action = RECOVERY_ACTIONS.get(code, f"action_{code}")
    # the clock event reasons (R535+), formerly the throttle reasons
    reasons = None
    for fn_name in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ):
        fn = getattr(nvml, fn_name, None)
        if fn is not None and (reasons := get(fn, h)) is not None:
            break
    if reasons is not None:
        r.clock_events = {name: bool(reasons & bit) for name, bit in CLOCK_EVENTS.items()}
    clocks = {"sm": (nvml.NVML_CLOCK_SM,), "memory": (nvml.NVML_CLOCK_MEM,)}
    got = _answered(get, nvml.nvmlDeviceGetClockInfo, h, clocks)
    r.clocks_mhz = {clock: float(mhz) for clock, mhz in got.items()}
    replays = get(nvml.nvmlDeviceGetPcieReplayCounter, h)
    r.pcie_replays = int(replays) if replays is not None else None
    mj = get(nvml.nvmlDeviceGetTotalEnergyConsumption, h)
    r.energy_joules = mj / 1000 if mj is not None else None
    pcie = {"tx": (nvml.NVML_PCIE_UTIL_TX_BYTES,), "rx": (nvml.NVML_PCIE_UTIL_RX_BYTES,)}
    got = _answered(get, nvml.nvmlDeviceGetPcieThroughput, h, pcie)
    r.pcie_bytes_per_second = {d: kbps * 1024 for d, kbps in got.items()}  # KB/s
    _nvlink(nvml, h, r, get)


NVLINK_ERRORS = ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")  # DL_* counters


def _nvlink(nvml: Any, h: Any, r: GpuReading, get: Callable[..., Any]) -> None:
    """Each NVLink's state and its data-link error counters, for the links the GPU has
    (NVML answers NotSupported for link 0 on GPUs without NVLink, InvalidArgument past
    the last link)."""
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        state = get(nvml.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            break
        r.nvlink_up[link] = bool(state)
        for counter, name in enumerate(NVLINK_ERRORS):
            n = get(nvml.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            if n is not None:
                r.nvlink_errors[(link, name)] = int(n)


def _nvml_device(nvml: Any, i: int, driver: str) -> GpuReading:
    def get(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except nvml.NVMLError:  # NotSupported, NoPermission, GpuIsLost: per metric
            return None

    h = nvml.nvmlDeviceGetHandleByIndex(i)
    pci = get(nvml.nvmlDeviceGetPciInfo, h)
    bdf = norm_bdf(_text(pci.busId)) if pci is not None else f"unknown:{i}"
    r = GpuReading("nvidia", bdf, index=i, driver_version=driver, source="nvml")
    r.name = _text(get(nvml.nvmlDeviceGetName, h) or "")
    r.uuid = _text(get(nvml.nvmlDeviceGetUUID, h) or "")
    r.serial = _text(get(nvml.nvmlDeviceGetSerial, h) or "")
    if pci is not None and pci.pciDeviceId:
        r.device_id = f"{pci.pciDeviceId >> 16:04x}"  # the low 16 bits are the vendor's
    mem = _memory_v2(nvml, h)
    if mem is not None:  # used excludes what the driver reserves, as nvidia-smi shows
        r.memory_total, r.memory_used = int(mem.total), int(mem.used)
        r.memory_reserved = int(mem.reserved)
    elif (mem := get(nvml.nvmlDeviceGetMemoryInfo, h)) is not None:
        # drivers before v2 (R510): "used" includes the reserved part
        r.memory_total, r.memory_used = int(mem.total), int(mem.used)
    util = get(nvml.nvmlDeviceGetUtilizationRates, h)
    r.utilization = float(util.gpu) if util is not None else None
    r.memory_utilization = float(util.memory) if util is not None else None
    minor = get(nvml.nvmlDeviceGetMinorNumber, h)
    r.minor = int(minor) if minor is not None else None
    r.vbios_version = _text(get(nvml.nvmlDeviceGetVbiosVersion, h) or "")
    temp = get(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
    r.temperature = float(temp) if temp is not None else None
    mw = get(nvml.nvmlDeviceGetPowerUsage, h)
    r.power_draw = mw / 1000 if mw is not None else None
    limit = get(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    r.power_limit = limit / 1000 if limit is not None else None
    for p in get(nvml.nvmlDeviceGetComputeRunningProcesses, h) or []:
        used = p.usedGpuMemory
        r.processes.append(GpuProcess(int(p.pid), int(used) if used is not None else None))
    _nvml_health(nvml, h, r, get)
    return r


class XidEvents:
    """Xid critical errors through NVML's event API, on a thread of their own: the same
    faults the driver logs to the kernel log, where /dev/kmsg cannot be read (the
    collector counts a fault seen both ways once)."""

    WAIT_MS = 500

    def __init__(self, nvml: Any, on_fault: Callable[[Fault], None]) -> None:
        self.nvml = nvml
        self.on_fault = on_fault
        self.events = 0
        self.errors = 0
        self.gpus: dict[int | None, str] = {}  # device handle address -> BDF

    def register(self) -> Any:
        """An event set with every GPU that takes Xid events; None when none does."""
        nvml = self.nvml
        nvml.nvmlInit()
        evset = nvml.nvmlEventSetCreate()
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, evset)
                bdf = norm_bdf(_text(nvml.nvmlDeviceGetPciInfo(h).busId))
            except nvml.NVMLError as exc:
                log.info("gpu %d: no NVML Xid events (%s); the kernel log still has them", i, exc)
                continue
            self.gpus[ctypes.cast(h, ctypes.c_void_p).value] = bdf
        if not self.gpus:
            nvml.nvmlEventSetFree(evset)
            nvml.nvmlShutdown()
            return None
        return evset

    def run(self, stop: threading.Event) -> None:
        """Until stop is set (a thread's whole life)."""
        nvml = self.nvml
        try:
            evset = self.register()
        except nvml.NVMLError as exc:
            log.info("NVML Xid events unavailable: %s", exc)
            return
        if evset is None:
            return
        try:
            while not stop.is_set():
                self.wait_once(evset)
        finally:
            with contextlib.suppress(nvml.NVMLError):
                nvml.nvmlEventSetFree(evset)
                nvml.nvmlShutdown()

    def wait_once(self, evset: Any) -> None:
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait_v2(evset, self.WAIT_MS)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                self.errors += 1
                log.warning("NVML event wait failed: %s", exc)
                time.sleep(1)
            return
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            return
        self.events += 1
        bdf = self.gpus.get(ctypes.cast(data.device, ctypes.c_void_p).value, "unknown")
        xid = int(data.eventData)
        self.on_fault(
            Fault("nvidia", bdf, "xid", str(xid), f"NVML Xid event: {xid}", source="nvml")
        )


def read_nvml(nvml: Any) -> list[GpuReading]:
    """Readings through pynvml; each metric's NVMLError is caught on its own."""
    nvml.nvmlInit()
    try:
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            driver = ""
        return [_nvml_device(nvml, i, driver) for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _num(text: str) -> float | None:
    text = text.strip()
    return None if text in MISSING else float(text)


def parse_smi_csv(gpus: str, apps: str = "") -> list[GpuReading]:
    """`nvidia-smi --query-gpu=QUERY_GPU --format=csv,noheader,nounits` (+ compute apps)."""
    out = []
    by_uuid: dict[str, GpuReading] = {}
    for lineno, line in enumerate(gpus.splitlines(), 1):
        if not line.strip():
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) != 11:
            raise SourceError(f"nvidia-smi line {lineno}: {len(f)} fields, expected 11")
        try:
            r = GpuReading(
                "nvidia",
                norm_bdf(f[3]),
                index=int(f[0]),
                uuid=f[1],
                name=f[2],
                driver_version=f[4],
                source="nvidia-smi",
            )
            total, used = _num(f[5]), _num(f[6])
            r.memory_total = int(total * MIB) if total is not None else None
            r.memory_used = int(used * MIB) if used is not None else None
            r.utilization, r.temperature = _num(f[7]), _num(f[8])
            r.power_draw, r.power_limit = _num(f[9]), _num(f[10])
        except ValueError as exc:
            raise SourceError(f"nvidia-smi line {lineno}: {exc}") from None
        out.append(r)
        by_uuid[r.uuid] = r
    for line in apps.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 3 and f[0] in by_uuid and f[1].isdigit():
            mem = _num(f[2])
            by_uuid[f[0]].processes.append(
                GpuProcess(int(f[1]), int(mem * MIB) if mem is not None else None)
            )
    return out


def run_nvidia_smi(tool: str, timeout: float) -> tuple[str, str]:
    """Both queries, each with a timeout (nvidia-smi hangs on a wedged driver)."""

    def call(*args: str) -> str:
        res = subprocess.run(
            [tool, *args, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if res.returncode != 0:
            raise SourceError(f"{tool} exited {res.returncode}: {res.stderr.strip()[:200]}")
        return res.stdout

    return call(f"--query-gpu={QUERY_GPU}"), call(f"--query-compute-apps={QUERY_APPS}")
