"""GPU metrics for AMD and NVIDIA: one reading per GPU feeds every name in
docs/reference/metric-conventions.md.

Sources, first that works: AMD amdsmi -> amd-smi --json -> sysfs; NVIDIA NVML ->
nvidia-smi. A source that is absent is skipped quietly (CPU-only nodes export no GPU
series and no errors); one that fails counts an error and the next is tried. When
every source of a vendor fails, its last good reading is served for
collectors.gpu.stale_seconds and lens_gpu_reading_stale says so.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import io
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from pydantic import Field

from lens_ebpf.agent.config import DevicesConfig
from lens_ebpf.agent.devices import inventory
from lens_ebpf.agent.devices.gpu import amd, compat_amd, compat_dcgm, families, faults, nvidia, rest
from lens_ebpf.agent.devices.gpu.faults import Fault
from lens_ebpf.agent.devices.gpu.model import GpuReading
from lens_ebpf.agent.events import GpuFault, owner_fields
from lens_ebpf.agent.feature import CollectorFeature, Settings, register
from lens_ebpf.core.collector import PeriodicCollector
from lens_ebpf.core.exposition import Family, family

log = logging.getLogger(__name__)

DEDUP_SECONDS = 10.0  # an Xid in the kernel log and from NVML within this is one fault
MAX_FAULT_SERIES = 1000  # lens_gpu_faults_total series; beyond, counted unattributed

# A source returns readings, or None when it is not there at all (no library, no tool).
Source = tuple[str, Callable[[], list[GpuReading] | None]]
BY_PATH = re.compile(r"^pci-(.+)-(card|render)$")


@dataclass
class VendorState:
    readings: list[GpuReading]
    source: str
    at: float


def dri_mapping(dev: Path = Path("/dev")) -> dict[str, dict[str, str]]:
    """BDF -> {card, render} from /dev/dri/by-path (any PCI domain), as the host names
    them (/dev/dri/card0), whatever root the agent reads /dev from."""
    out: dict[str, dict[str, str]] = {}
    by_path = dev / "dri" / "by-path"
    if not by_path.is_dir():
        return out
    for entry in by_path.iterdir():
        m = BY_PATH.match(entry.name)
        if not m:
            continue
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        out.setdefault(m.group(1).lower(), {})[m.group(2)] = f"/dev/dri/{Path(target).name}"
    return out


class GpuCollector(PeriodicCollector):
    name = "gpu"

    def __init__(
        self,
        interval: float,
        node: str,
        sources: dict[str, list[Source]],
        stale_seconds: float = 300,
        dev_root: Path = Path("/dev"),
        identify: Callable[[int], dict[str, str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        allocated: Callable[[], dict[str, Any]] | None = None,
        sysfs: Path | None = None,
        compat: Sequence[str] = (),
    ) -> None:
        super().__init__(interval)
        self.compat = tuple(compat)  # other exporters' families to write too: amd, dcgm
        self.sysfs = sysfs  # AMD RAS counts and PCIe replays, whatever the source
        self.node = node
        self.sources = sources
        self.stale_seconds = stale_seconds
        self.dev_root = dev_root
        self.identify = identify or (lambda pid: {})
        # device key (GPU UUID or BDF, lower case) -> owner with labels(): the kubelet's
        # PodResources answer, so GPU series say which pod holds the GPU
        self.allocated = allocated or dict
        self.clock = clock
        self.state: dict[str, VendorState] = {}
        self.stale: dict[str, bool] = {}
        # (gpu, kind, code, namespace, pod, workload) -> faults; bounded, overflow counted
        self.faults: dict[tuple[str, ...], int] = {}
        self.faults_dropped = 0
        self.faults_duplicate = 0  # reported by both the kernel log and NVML
        self._baseline: dict[tuple[str, str, str], int] = {}  # uncorrectable error counters
        self._recent: dict[tuple[str, str, str], collections.deque[tuple[float, str]]] = {}
        self.tables_skipped: dict[str, int] = {}  # AMD gpu_metrics revisions not understood
        self.publish: Callable[[GpuFault], object] = lambda _ev: None
        self.last_xid: dict[str, int] = {}  # BDF -> the last Xid seen (dcgm's XID_ERRORS)
        # each read: the GPUs, and the labels of the pod the kubelet gave each (by BDF)
        self.on_readings: Callable[[list[GpuReading], dict[str, dict[str, str]]], object] = (
            lambda _gpus, _holders: None
        )

    def _read_vendor(self, vendor: str) -> None:
        for name, read in self.sources.get(vendor, []):
            try:
                readings = read()
            except subprocess.TimeoutExpired:
                self.count_error("timeout")
                log.warning("gpu: %s timed out", name)
                continue
            except Exception as exc:  # NVMLError, SourceError, OSError: try the next
                self.count_error(f"{name}")
                log.warning("gpu: %s failed: %s", name, exc)
                continue
            if readings is None:
                continue  # not installed here
            if vendor == "amd":
                for i, r in enumerate(sorted(readings, key=lambda r: r.bdf)):
                    r.index = i  # keyed on the BDF, numbered in BDF order
                if self.sysfs is not None:
                    amd.add_sysfs_health(self.sysfs, readings)
                for r in readings:
                    if r.metrics_table is not None and not r.metrics_table[1]:
                        rev = r.metrics_table[0]
                        self.tables_skipped[rev] = self.tables_skipped.get(rev, 0) + 1
            self.state[vendor] = VendorState(readings, name, self.clock())
            self.stale[vendor] = False
            self.counter_faults(readings)
            return
        old = self.state.get(vendor)
        if old is None:
            return
        if self.clock() - old.at > self.stale_seconds:
            del self.state[vendor]  # too old to show
            self.stale.pop(vendor, None)
        else:
            self.stale[vendor] = True

    def readings(self) -> list[GpuReading]:
        return [r for v in ("nvidia", "amd") if v in self.state for r in self.state[v].readings]

    def owner_labels(self, g: GpuReading, allocated: dict[str, Any]) -> dict[str, str]:
        """namespace/pod/container of the pod the kubelet gave this GPU; {} when none."""
        for key in (g.uuid, g.bdf):
            owner = allocated.get(key.lower()) if key else None
            if owner is not None:
                return dict(owner.labels())
        return {}

    def holders(self, g: GpuReading | None, pid: int) -> list[dict[str, str]]:
        """Who held the GPU at this moment: the process a fault names, else the pod the
        kubelet gave the GPU, else the pods of the processes using it; [{}] for nobody."""
        if pid and (who := self.identify(pid)).get("pod"):
            return [who]
        if g is None:
            return [{}]
        if owner := self.owner_labels(g, self.allocated()):
            return [owner]
        pods: dict[tuple[str, str], dict[str, str]] = {}
        for p in g.processes:
            who = self.identify(p.pid)
            if who.get("pod"):
                pods.setdefault((who.get("namespace", ""), who["pod"]), who)
        return list(pods.values()) or [{}]

    def counter_faults(self, readings: list[GpuReading]) -> None:
        """Uncorrectable errors that a counter shows and no log line may have told (NVML's
        ECC count, amdgpu's RAS counts): a rise between two readings is a fault. The first
        reading, and a counter that went down (driver reloaded), only set the baseline."""
        for r in readings:
            for (kind, code), (n, message) in uncorrectable_counts(r).items():
                key = (r.bdf, kind, code)
                prev, self._baseline[key] = self._baseline.get(key), n
                if prev is not None and n > prev:
                    self.fault(
                        Fault(
                            r.vendor,
                            r.bdf,
                            kind,
                            code,
                            message.format(n - prev, n),
                            count=n - prev,
                            source="counter",
                        )
                    )

    def duplicate(self, f: Fault) -> bool:
        """True for the second report of one fault: an Xid the kernel log and NVML's event
        API both report, an amdgpu RAS report the counters show too. Each report of one
        source pairs with at most one of another source within the window, so repeated
        faults still count one by one."""
        now = self.clock()
        key = (f.bdf, f.kind, f.code)
        window = max(DEDUP_SECONDS, 2 * self.interval)  # a counter shows it a reading later
        with self._lock:
            for k in [k for k, q in self._recent.items() if not q or q[-1][0] < now - window]:
                del self._recent[k]
            q = self._recent.setdefault(key, collections.deque(maxlen=256))
            while q and q[0][0] < now - window:
                q.popleft()
            for i, (_, source) in enumerate(q):
                if source != f.source:
                    del q[i]
                    self.faults_duplicate += 1
                    return True
            q.append((now, f.source))
        return False

    def fault(self, f: Fault) -> None:
        """A fault from the kernel log or NVML's events: an event per holder of the GPU,
        and counted; once, when both report it."""
        if self.duplicate(f):
            return
        if f.kind == "xid" and f.code.isdigit():
            with self._lock:
                self.last_xid[f.bdf] = int(f.code)
        g = next((r for r in self.readings() if r.bdf == f.bdf), None)
        for who in self.holders(g, f.pid):
            ev = GpuFault(
                gpu_index=g.index if g else 0,
                bdf=f.bdf,
                uuid=g.uuid if g else "",
                vendor=f.vendor,
                fault=f.kind,
                code=f.code,
                message=f.message,
                pid=f.pid,
                **owner_fields(who),
            )
            self.publish(ev)
            key = (str(g.index) if g else f.bdf, f.kind, f.code, ev.namespace, ev.pod, ev.workload)
            with self._lock:
                if key in self.faults or len(self.faults) < MAX_FAULT_SERIES:
                    self.faults[key] = self.faults.get(key, 0) + f.count
                else:
                    self.faults_dropped += f.count
            log.warning(
                "gpu fault: %s %s %s on %s (pod %s/%s)",
                f.vendor,
                f.kind,
                f.code,
                f.bdf,
                ev.namespace,
                ev.pod,
            )

    def refresh(self) -> list[Metric]:
        for vendor in ("amd", "nvidia"):
            self._read_vendor(vendor)
        gpus = self.readings()
        allocated = self.allocated()
        owners = {id(g): self.owner_labels(g, allocated) for g in gpus}
        self.on_readings(gpus, {g.bdf: owners[id(g)] for g in gpus})
        dri = dri_mapping(self.dev_root)
        self.views["gpus"] = [rest.gpu_entry(g, dri.get(g.bdf, {}), owners[id(g)]) for g in gpus]
        self.views["driver"] = rest.driver_version(gpus)
        self.views["cards"] = [rest.card_entry(g, self.stale.get(g.vendor, False)) for g in gpus]
        self.views["dri"] = rest.dri_map(gpus, dri)
        self.views["devices"] = rest.device_nodes(gpus, dri)
        return self._metrics(gpus, owners)

    def _metrics(self, gpus: list[GpuReading], owners: dict[int, dict[str, str]]) -> list[Metric]:
        n = {"node": self.node}
        fams: dict[str, Family] = {}

        def add(
            name: str,
            help_text: str,
            labels: dict[str, str],
            value: float | None,
            kind: str = "gauge",
        ) -> None:
            if value is None:
                return  # unsupported or unknown: absent, never zero
            # a counter's samples named as given (gpu_xid_errors_total, ...)
            m = fams.get(name) or fams.setdefault(name, family(name, help_text, kind, total=False))
            m.add(labels, value)

        with self._lock:
            counted, dropped = dict(self.faults), self.faults_dropped
        for (gpu, kind, code, ns, pod, workload), count in sorted(counted.items()):
            add(
                "lens_gpu_faults_total",
                "GPU faults (Xid, uncorrectable ECC and RAS errors), "
                "with the pod that held the GPU",
                {
                    "gpu": gpu,
                    "kind": kind,
                    "code": code,
                    "namespace": ns,
                    "pod": pod,
                    "workload": workload,
                },
                count,
                "counter",
            )
        if counted or dropped:
            add(
                "lens_gpu_faults_unattributed_total",
                "GPU faults beyond the series cap, " f"counted here ({MAX_FAULT_SERIES} series)",
                n,
                dropped,
                "counter",
            )
            add(
                "lens_gpu_faults_duplicate_total",
                "Fault reports seen two ways (kernel log, "
                "NVML events, error counters), counted once in lens_gpu_faults_total",
                n,
                self.faults_duplicate,
                "counter",
            )
        for rev, count in sorted(self.tables_skipped.items()):
            add(
                "lens_gpu_metrics_table_skipped_total",
                "AMD gpu_metrics tables read but not "
                "understood (a layout revision lens-ebpf does not know), by revision",
                {"revision": rev},
                count,
                "counter",
            )
        for vendor in sorted(self.state):
            add(
                "lens_gpu_reading_stale",
                "1 while the last good reading is served",
                {"vendor": vendor},
                1 if self.stale.get(vendor) else 0,
            )
            add(
                "lens_gpu_reading_age_seconds",
                "Age of the reading served",
                {"vendor": vendor},
                round(self.clock() - self.state[vendor].at, 3),
            )
            add(
                "lens_gpu_source_info",
                "Where the reading came from (value 1)",
                {"vendor": vendor, "source": self.state[vendor].source},
                1,
            )
        if not gpus:
            return list(fams.values())
        families.gpu_families(add, n, gpus, owners, self.identify)
        out: list[Metric] = list(fams.values())
        if "amd" in self.compat:
            out += compat_amd.families(gpus, self.node, lambda g: owners[id(g)])
        if "dcgm" in self.compat:
            with self._lock:
                xids = dict(self.last_xid)
            out += compat_dcgm.families(
                gpus, self.node, lambda g: owners[id(g)], lambda g: xids.get(g.bdf, 0)
            )
        return out


def processes_by_pid(readings: list[GpuReading]) -> dict[int, list[int]]:
    """pid -> the indexes of the GPUs whose process list names it (the deep dive's)."""
    out: dict[int, list[int]] = {}
    for g in readings:
        for p in g.processes:
            out.setdefault(p.pid, []).append(g.index)
    return out


def uncorrectable_counts(g: GpuReading) -> dict[tuple[str, str], tuple[int, str]]:
    """(fault kind, code) -> (count now, message template) for the counters whose rise is
    a fault: NVIDIA's uncorrected ECC errors (volatile, else aggregate), AMD's
    uncorrectable RAS errors per block (the kind and code the kernel log's reports use,
    so the two count once)."""
    out: dict[tuple[str, str], tuple[int, str]] = {}
    for counter in ("volatile", "aggregate"):
        n = g.ecc_errors.get(("uncorrected", counter))
        if n is not None:
            out[("ecc_uncorrectable", "memory")] = (
                n,
                f"{{}} uncorrectable ECC errors (NVML {counter} count now {{}})",
            )
            break
    for (block, kind), n in g.ras_errors.items():
        if kind == "uncorrectable":
            out[("ras_uncorrectable", block)] = (
                n,
                f"{{}} uncorrectable RAS errors in {block} (count now {{}})",
            )
    return out


def nvml_source(nvml: Any) -> Source:
    def read() -> list[GpuReading] | None:
        try:
            return nvidia.read_nvml(nvml)
        except nvml.NVMLError as exc:
            # no library or no driver: this node has no NVIDIA GPU for us
            absent = (nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_DRIVER_NOT_LOADED)
            if getattr(exc, "value", None) in absent:
                return None
            raise

    return "nvml", read


def nvml_module() -> Any:
    """pynvml (nvidia-ml-py), or None where it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuSettings(Settings):
    interval_seconds: float = Field(5.0, gt=0)
    kmsg: str = "/dev/kmsg"  # the kernel log, for Xid and RAS reports; "" turns that off
    nvml_events: bool = True  # Xid errors through NVML's event API too (counted once)
    stale_seconds: float = Field(300.0, ge=0)
    timeout_seconds: float = Field(10.0, gt=0)
    amd_smi: str = "amd-smi"
    nvidia_smi: str = "nvidia-smi"


def default_sources(g: GpuSettings, sysfs: Path) -> dict[str, list[Source]]:
    amd_sources: list[Source] = []
    said = io.StringIO()
    try:
        # the binding prints to stdout, then fails, where libamd_smi.so is not installed
        with contextlib.redirect_stdout(said):
            amdsmi = importlib.import_module("amdsmi")
        amdsmi.amdsmi_init()
        amd_sources.append(("amdsmi", lambda: amd.read_amdsmi(amdsmi)))
    except Exception as exc:  # KeyError, OSError, AmdSmiLibraryException: no ROCm here
        log.debug("amdsmi unavailable: %s %s", exc, said.getvalue().strip())
    tool = shutil.which(g.amd_smi)
    if tool:

        def amd_smi() -> list[GpuReading]:
            def call(*a: str) -> str:
                return subprocess.run(
                    [tool, *a, "--json"],
                    capture_output=True,
                    text=True,
                    timeout=g.timeout_seconds,
                    check=True,
                ).stdout

            return amd.parse_amd_smi(call("static"), call("metric"), call("process"))

        amd_sources.append(("amd-smi", amd_smi))
    amd_sources.append(("sysfs", lambda: amd.read_sysfs(sysfs) or None))
    nv_sources: list[Source] = []
    if (pynvml := nvml_module()) is not None:
        nv_sources.append(nvml_source(pynvml))
    smi = shutil.which(g.nvidia_smi)
    if smi:
        nv_sources.append(
            (
                "nvidia-smi",
                lambda: nvidia.parse_smi_csv(*nvidia.run_nvidia_smi(smi, g.timeout_seconds)),
            )
        )
    return {"amd": amd_sources, "nvidia": nv_sources}


def make_collector(
    devices: DevicesConfig,
    node: str,
    g: GpuSettings,
    identify: Callable[[int], dict[str, str]],
    allocated: Callable[[], dict[str, Any]],
) -> GpuCollector:
    """The GPU collector from its settings (the agent's feature and `trace gpu`)."""
    sysfs = Path(devices.sysfs_root)
    return GpuCollector(
        g.interval_seconds,
        node,
        default_sources(g, sysfs),
        g.stale_seconds,
        Path(devices.dev_root),
        identify=identify,
        allocated=allocated,
        sysfs=sysfs,
        compat=devices.compat,
    )


def fault_watchers(
    g: GpuSettings, gpu: GpuCollector
) -> tuple[faults.KmsgWatcher | None, nvidia.XidEvents | None]:
    """What reports faults to gpu beside its own readings, each as configured: the kernel
    log, and NVML's Xid events where pynvml is installed."""
    kmsg = faults.KmsgWatcher(g.kmsg, gpu.fault) if g.kmsg else None
    nvml = nvml_module() if g.nvml_events else None
    return kmsg, nvidia.XidEvents(nvml, gpu.fault) if nvml is not None else None


@register("gpu", order=30, settings={"gpu": GpuSettings})
class GpuFeature(CollectorFeature):
    """AMD (amdsmi, amd-smi, sysfs) and NVIDIA (NVML, nvidia-smi) GPUs, and the node
    exporter's GPU routes; processes attributed to pods, GPUs to the pods they serve."""

    VIEWS = {
        "/gpus": ("gpus", []),
        "/gpuDriverVersion": ("driver", ""),
        "/cardMetrics": ("cards", []),
        "/driMapping": ("dri", {}),
    }

    def make(self) -> GpuCollector:
        g = self.ctx.settings("gpu", GpuSettings)
        gpu = make_collector(
            self.ctx.devices,
            self.ctx.node.name,
            g,
            self.ctx.enrich.pid,
            lambda: self.ctx.offers.gpu_assignments(),
        )
        gpu.publish = self.ctx.bus.publish
        watch, node = self.ctx.watch, self.ctx.node.name
        watch.expect("gpu")
        gpu.on_readings = lambda gpus, holders: watch.update(
            "gpu", inventory.gpu_records(gpus, node, holders)
        )
        kmsg, xids = fault_watchers(g, gpu)
        if kmsg is not None:
            self.ctx.spawn("gpu-faults", lambda: kmsg.run(self.ctx.stop))
        if xids is not None:
            self.ctx.spawn("gpu-xid-events", lambda: xids.run(self.ctx.stop))
        self.ctx.offers.gpu_count = lambda: len(gpu.readings())
        self.ctx.offers.gpu_devices = lambda: gpu.views.get("devices", {})
        self.ctx.offers.gpu_processes = lambda: processes_by_pid(gpu.readings())
        return gpu
