import shutil
from pathlib import Path

from lens_ebpf.agent.devices.system import ProcSample, SystemCollector, health_score
from lens_ebpf.core.exposition import render_metrics
from tests.golden import check_golden

FIX = Path(__file__).parent.parent / "fixtures"


class Procs:
    def __init__(self) -> None:
        self.rounds = [
            [
                ProcSample(1, "init", 10.0, 5_000),
                ProcSample(200, "trainer", 100.0, 900_000),
                ProcSample(300, "sshd", 1.0, 7_000),
                ProcSample(400, "busy", 50.0, 1_000),
            ],
            [
                ProcSample(1, "init", 10.0, 5_000),
                ProcSample(200, "trainer", 101.0, 900_000),
                ProcSample(300, "sshd", 1.0, 7_000),
                ProcSample(400, "busy", 58.0, 1_000),
            ],
        ]

    def __call__(self) -> list[ProcSample]:
        return self.rounds.pop(0)


def values(c: SystemCollector) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for m in c.snapshot() for s in m.samples
    }


def make(procfs: Path = FIX / "proc") -> SystemCollector:
    return SystemCollector(5, "gpu-7", procfs, FIX / "etc", top_n=1, processes=Procs())


def test_exact_values_from_fixture_proc() -> None:
    c = make()
    c.run_once()
    v = values(c)
    n = (("node", "gpu-7"),)
    assert v[("hw_memory_total_bytes", n)] == 24_576_000 * 1024
    assert v[("hw_memory_available_bytes", n)] == 18_432_000 * 1024
    assert v[("hw_memory_used_bytes", n)] == (24_576_000 - 18_432_000) * 1024
    assert v[("hw_memory_usage_percent", n)] == 25.0
    assert v[("hw_cpu_threads", n)] == 2
    assert v[("hw_cpu_usage_percent", n)] == 15.0  # busy 1500 of 10000 jiffies since boot
    assert v[("node_cpu_utilization_ratio", ())] == 0.15
    assert v[("cpu_load_1m", ())] == 1.25
    assert v[("node_cpu_pressure_avg10", ())] == 12.5
    assert v[("node_memory_pressure_avg10", ())] == 2.0
    assert v[("hw_node_uptime_seconds", n)] == 3600.5
    # 10 * (1 - (0.4 * 0.15 + 0.4 * 0.25 + 0.2 * 0.125))
    assert v[("node_health_score", ())] == 8.15
    info = dict(next(k[1] for k in v if k[0] == "hw_node_info"))
    assert info == {
        "node": "gpu-7",
        "os": "Ubuntu",
        "os_version": "22.04",
        "kernel": "6.8.0-45-generic",
        "cpu_model": "AMD EPYC 9654 96-Core Processor",
    }
    assert c.views["node"]["cpu_threads"] == 2


def test_top_processes_by_cpu_since_last_run_and_by_rss(tmp_path: Path) -> None:
    c = make()
    c.run_once()
    c.run_once()  # second round: busy used 8 s, trainer 1 s
    v = values(c)
    pids = {dict(k[1])["name"] for k in v if k[0] == "cpu_process_cpu_seconds_total"}
    assert pids == {"busy", "trainer"}  # top 1 by CPU, top 1 by RSS
    assert v[("cpu_process_cpu_seconds_total", (("name", "busy"), ("pid", "400")))] == 58.0
    assert v[("cpu_process_rss_bytes", (("name", "trainer"), ("pid", "200")))] == 900_000


def test_psi_absent_not_zero_when_off(tmp_path: Path) -> None:
    shutil.copytree(FIX / "proc", tmp_path / "proc")
    shutil.rmtree(tmp_path / "proc" / "pressure")
    c = make(tmp_path / "proc")
    c.run_once()
    names = {k[0] for k in values(c)}
    assert "node_cpu_pressure_avg10" not in names
    assert "node_memory_pressure_avg10" not in names
    assert "node_health_score" in names


def test_health_score_formula_bounds() -> None:
    assert health_score(0.0, 0.0, [None, None]) == 10.0
    assert health_score(1.0, 1.0, [100.0, 50.0]) == 0.0
    assert health_score(0.5, 0.0, [None, None]) == 8.0


def test_golden_exposition() -> None:
    c = make()
    c.run_once()
    text = render_metrics(c.snapshot())
    check_golden("system.prom", text)
