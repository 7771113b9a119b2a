"""Node CPU, memory, PSI, health score and top processes (hw_*, node_*, cpu_process_*).

Parsing of /proc files is pure and takes a swappable procfs root; psutil lists
processes. The health score (0 to 10) is

    cpu      = node_cpu_utilization_ratio                        0..1
    mem      = 1 - MemAvailable / MemTotal                       0..1
    pressure = max(cpu, memory PSI "some avg10") / 100           0..1 (0 without PSI)
    score    = 10 * (1 - (0.4 * cpu + 0.4 * mem + 0.2 * pressure)), clamped to 0..10
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from prometheus_client.core import Metric
from pydantic import Field

from lens_ebpf.agent.devices.files import read_text
from lens_ebpf.agent.feature import CollectorFeature, Settings, register
from lens_ebpf.core.collector import PeriodicCollector
from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.core.http import Response, json_response

WEIGHTS = {"cpu": 0.4, "mem": 0.4, "pressure": 0.2}


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def parse_cpu_times(text: str) -> tuple[int, int]:
    """(busy, total) jiffies from the aggregate cpu line of /proc/stat."""
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            vals = [int(v) for v in parts[1:]]
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
            total = sum(vals[:8])  # guest time is already in user and nice
            return total - idle, total
    raise ValueError("no cpu line in /proc/stat")


def parse_psi(text: str) -> float | None:
    """The 'some avg10' of a /proc/pressure file."""
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                key, _, value = field.partition("=")
                if key == "avg10":
                    return float(value)
    return None


def parse_os_release(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value.strip().strip('"')
    return out


def parse_cpu_model(text: str) -> str:
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model"):
            return value.strip()
    return platform.machine()


def parse_cpu_topology(text: str) -> tuple[int, int]:
    """(physical cores, logical CPUs) from /proc/cpuinfo."""
    threads, cores, phys = 0, set(), ""
    for line in text.splitlines():
        key, _, value = (s.strip() for s in line.partition(":"))
        if key == "processor":
            threads += 1
        elif key == "physical id":
            phys = value
        elif key == "core id":
            cores.add((phys, value))
    return (len(cores) or threads), threads


def health_score(cpu_ratio: float, mem_ratio: float, psi: list[float | None]) -> float:
    known = [p for p in psi if p is not None]
    pressure = max(known) / 100 if known else 0.0
    load = WEIGHTS["cpu"] * cpu_ratio + WEIGHTS["mem"] * mem_ratio + WEIGHTS["pressure"] * pressure
    return round(max(0.0, min(10.0, 10 * (1 - load))), 2)


@dataclass
class ProcSample:
    pid: int
    name: str
    cpu_seconds: float
    rss: int


def list_processes() -> list[ProcSample]:
    out = []
    for p in psutil.process_iter(["pid", "name", "cpu_times", "memory_info"]):
        info = p.info
        if info.get("cpu_times") is None or info.get("memory_info") is None:
            continue  # exited, or not ours to read
        t = info["cpu_times"]
        out.append(
            ProcSample(info["pid"], info["name"] or "", t.user + t.system, info["memory_info"].rss)
        )
    return out


class SystemCollector(PeriodicCollector):
    name = "system"

    def __init__(
        self,
        interval: float,
        node: str,
        procfs: Path = Path("/proc"),
        etc: Path = Path("/etc"),
        top_n: int = 10,
        processes: Callable[[], list[ProcSample]] = list_processes,
    ) -> None:
        super().__init__(interval)
        self.node = node
        self.procfs = procfs
        self.etc = etc
        self.top_n = top_n
        self.processes = processes
        self._last_cpu: tuple[int, int] | None = None
        self._last_proc: dict[int, float] = {}

    def _read(self, rel: str) -> str | None:
        return read_text(self.procfs / rel)

    def _cpu_ratio(self) -> float:
        text = self._read("stat")
        if text is None:
            return 0.0
        busy, total = parse_cpu_times(text)
        last, self._last_cpu = self._last_cpu, (busy, total)
        if last is not None and total > last[1]:
            return (busy - last[0]) / (total - last[1])
        return busy / total if total else 0.0  # first run: the average since boot

    def _top(self) -> list[tuple[ProcSample, float]]:
        """The top_n by CPU used since the last run, and the top_n by RSS."""
        procs = self.processes()
        grew = {p.pid: p.cpu_seconds - self._last_proc.get(p.pid, p.cpu_seconds) for p in procs}
        self._last_proc = {p.pid: p.cpu_seconds for p in procs}
        by_cpu = sorted(procs, key=lambda p: grew[p.pid], reverse=True)[: self.top_n]
        by_rss = sorted(procs, key=lambda p: p.rss, reverse=True)[: self.top_n]
        chosen = {p.pid: p for p in (*by_cpu, *by_rss)}
        return [(p, grew[p.pid]) for p in chosen.values()]

    def refresh(self) -> list[Metric]:
        n = {"node": self.node}
        mem = parse_meminfo(self._read("meminfo") or "")
        total, avail = mem.get("MemTotal", 0), mem.get("MemAvailable", mem.get("MemFree", 0))
        cpu = self._cpu_ratio()
        mem_ratio = 1 - avail / total if total else 0.0
        psi = {
            k: parse_psi(t) if (t := self._read(f"pressure/{k}")) else None
            for k in ("cpu", "memory")
        }
        osr = parse_os_release(read_text(self.etc / "os-release") or "")
        kernel = (self._read("sys/kernel/osrelease") or platform.release()).strip()
        cpuinfo = self._read("cpuinfo") or ""
        cpu_model = parse_cpu_model(cpuinfo)
        cores, threads = parse_cpu_topology(cpuinfo)
        if not threads:
            cores = threads = os.cpu_count() or 1
        uptime_text = self._read("uptime")
        uptime = float(uptime_text.split()[0]) if uptime_text else 0.0
        load1 = float((self._read("loadavg") or "0").split()[0])
        score = health_score(cpu, mem_ratio, list(psi.values()))

        fams: list[Metric] = []

        def put(name: str, help_text: str, value: float, labels: dict[str, str] = n) -> None:
            m = gauge(name, help_text)
            m.add(labels, value)
            fams.append(m)

        info = {
            "os": osr.get("NAME", platform.system()),
            "os_version": osr.get("VERSION_ID", ""),
            "kernel": kernel,
            "cpu_model": cpu_model,
        }
        put("hw_node_info", "Node identity (value 1)", 1, {**n, **info})
        up = counter("hw_node_uptime_seconds", "Seconds since boot", total=False)
        up.add(n, uptime)
        fams.append(up)
        put("hw_cpu_cores", "Physical CPU cores", cores)
        put("hw_cpu_threads", "Logical CPUs", threads)
        put("hw_cpu_usage_percent", "CPU busy since the last refresh", cpu * 100)
        put("hw_memory_total_bytes", "MemTotal", total)
        put("hw_memory_used_bytes", "MemTotal - MemAvailable", total - avail)
        put("hw_memory_available_bytes", "MemAvailable", avail)
        put("hw_memory_usage_percent", "Used / total", mem_ratio * 100)
        put("cpu_load_1m", "1-minute load average", load1, {})
        put("node_cpu_utilization_ratio", "CPU busy since the last refresh (0 to 1)", cpu, {})
        if psi["cpu"] is not None:
            put("node_cpu_pressure_avg10", "PSI cpu some avg10", psi["cpu"], {})
        if psi["memory"] is not None:
            put("node_memory_pressure_avg10", "PSI memory some avg10", psi["memory"], {})
        put("node_memory_total_bytes", "MemTotal", total, {})
        put("node_memory_available_bytes", "MemAvailable", avail, {})
        put("node_health_score", "0 (struggling) to 10 (idle); see the formula", score, {})
        cpu_m = counter("cpu_process_cpu_seconds", "CPU seconds of the top processes")
        rss_m = gauge("cpu_process_rss_bytes", "Resident memory of the top processes")
        top = self._top()
        for p, _ in top:
            lbl = {"pid": str(p.pid), "name": p.name}
            cpu_m.add(lbl, p.cpu_seconds)
            rss_m.add(lbl, p.rss)
        fams += [cpu_m, rss_m]
        self.views["node"] = {
            "node_name": self.node,
            **info,
            "cpu_cores": cores,
            "cpu_threads": threads,
            "memory_total_bytes": total,
            "uptime_seconds": uptime,
        }
        self.views["system"] = {
            "timestamp": time.time(),
            "cpu": {"usage_percent": cpu * 100, "load_1m": load1, "pressure_avg10": psi["cpu"]},
            "memory": {
                "total_bytes": total,
                "available_bytes": avail,
                "used_bytes": total - avail,
                "usage_percent": mem_ratio * 100,
                "pressure_avg10": psi["memory"],
            },
            "health_score": score,
            "top_processes": [
                {
                    "pid": p.pid,
                    "name": p.name,
                    "cpu_seconds": p.cpu_seconds,
                    "cpu_seconds_since_last": round(g, 3),
                    "rss_bytes": p.rss,
                }
                for p, g in top
            ],
        }
        return fams


class SystemSettings(Settings):
    interval_seconds: float = Field(5.0, gt=0)
    top_processes: int = Field(10, ge=0)


@register("system", order=30, settings={"system": SystemSettings})
class SystemFeature(CollectorFeature):
    """hw_* CPU and memory, PSI, the health score, top processes; /node, /metrics/json."""

    VIEWS = {"/node": ("node", None)}

    def make(self) -> SystemCollector:
        d, c = self.ctx.devices, self.ctx.settings("system", SystemSettings)
        return SystemCollector(
            c.interval_seconds,
            self.ctx.node.name,
            Path(d.procfs_root),
            Path(d.etc_root),
            c.top_processes,
        )

    def routes(self) -> dict[str, Callable[[], Response]]:
        # the system info exporter's JSON, without the REST envelope
        return {
            **super().routes(),
            "/metrics/json": lambda: json_response(200, self.view("system")),
        }
