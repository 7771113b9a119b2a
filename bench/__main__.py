"""`make bench`: overhead, completeness and scale of lens-ebpf, beside BCC's tcplife.

Each figure is measured in the same run on this machine. The load generators run
on CPU 1, the agent and the tools under test on CPU 0. Prints a table, writes
bench/results.json and BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LENS = str(Path(sys.executable).with_name("lens-ebpf"))
TICK = os.sysconf("SC_CLK_TCK")
PAYLOAD = 4096


def sh(*cmd: str, timeout: float = 600) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=timeout).stdout


def build(out: Path) -> dict[str, str]:
    tools = {}
    for name, flags in (("conngen", ["-pthread"]), ("execgen", [])):
        sh("gcc", "-O2", *flags, "-o", str(out / name), str(ROOT / "bench" / f"{name}.c"))
        tools[name] = str(out / name)
    return tools


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def parse_kv(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", text)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "w")  # noqa: SIM115
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", LENS, "run", "--listen", f"127.0.0.1:{self.port}"],
            env={**os.environ, "LENS_BPF__READ_INTERVAL_SECONDS": "1", **env},
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.ready_s = self._wait_ready()

    def _wait_ready(self) -> float:
        while time.monotonic() - self.started < 60:
            try:
                with urllib.request.urlopen(self.base + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        return time.monotonic() - self.started
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("agent did not start")

    def metrics(self) -> tuple[str, float]:
        t0 = time.monotonic()
        with urllib.request.urlopen(self.base + "/metrics", timeout=60) as r:
            body = r.read().decode()
        return body, time.monotonic() - t0

    def sample(self, name: str, **labels: str) -> float:
        body, _ = self.metrics()
        total = 0.0
        for line in body.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def conn_load(tools: dict[str, str], addr: str, seconds: float) -> dict[str, float]:
    out = sh("taskset", "-c", "1", tools["conngen"], addr, str(seconds), "2", str(PAYLOAD))
    return parse_kv(out)


def bench_connections(tools: dict[str, str], seconds: float, tmp: Path) -> dict[str, Any]:
    res: dict[str, Any] = {}
    base = conn_load(tools, "127.0.0.100", seconds)
    res["baseline_rate"] = base["rate"]
    agent = Agent({}, tmp / "agent-conn.log")
    res["startup_seconds"] = round(agent.ready_s, 2)
    try:
        cpu0 = cpu_seconds(agent.proc.pid)
        run = conn_load(tools, "127.0.0.101", seconds)
        time.sleep(3)
        cpu = cpu_seconds(agent.proc.pid) - cpu0
        opened = agent.sample("lens_tcp_connections_opened_total", direction="egress",
                              raddr="127.0.0.101", port=str(int(run["port"])))  # fmt: skip
        sent = agent.sample("lens_tcp_sent_bytes_total", direction="egress", raddr="127.0.0.101",
                            port=str(int(run["port"])))  # fmt: skip
        lost = agent.sample("lens_agent_events_lost_total", program="tcp_flows")
        missed = agent.sample("lens_agent_bpf_program_missed_total", program="tcp_flows")
        repaired = agent.sample("lens_agent_tcp_closes_repaired_total")
    finally:
        agent.stop()
    res.update(
        agent_rate=run["rate"],
        agent_rate_ratio=round(run["rate"] / base["rate"], 3),
        agent_cpu_s_per_10k=round(cpu / run["connections"] * 10_000, 3),
        agent_cpu_pct_at_rate=round(100 * cpu / run["seconds"], 1),
        agent_completeness=round(opened / run["connections"], 5),
        agent_bytes_error=round(sent / (opened * PAYLOAD) - 1, 5) if opened else None,
        agent_events_lost=lost,
        agent_kernel_skipped_runs=missed,
        agent_closes_repaired=repaired,
    )
    tcplife = shutil.which("tcplife-bpfcc")
    if tcplife is None:
        res["tcplife"] = "not installed (bpfcc-tools)"
        return res
    out_file = tmp / "tcplife.out"
    with open(out_file, "w") as f:
        tl = subprocess.Popen(["taskset", "-c", "0", tcplife], stdout=f, stderr=subprocess.STDOUT)
        time.sleep(6)  # compile and attach
        cpu0 = cpu_seconds(tl.pid)
        run = conn_load(tools, "127.0.0.102", seconds)
        time.sleep(3)
        cpu = cpu_seconds(tl.pid) - cpu0
        tl.terminate()
        tl.wait(30)
    lines = [ln.split() for ln in out_file.read_text().splitlines() if " 127.0.0.102 " in f" {ln} "]
    client = [x for x in lines if len(x) >= 9 and x[4] == "127.0.0.102"]
    tx_kb = [float(x[6]) for x in client if re.fullmatch(r"[\d.]+", x[6])]
    res.update(
        tcplife_rate=run["rate"],
        tcplife_rate_ratio=round(run["rate"] / base["rate"], 3),
        tcplife_cpu_s_per_10k=round(cpu / run["connections"] * 10_000, 3),
        tcplife_completeness=round(len(client) / run["connections"], 5),
        tcplife_tx_kb_median=statistics.median(tx_kb) if tx_kb else None,
        tcplife_bytes_error=round(statistics.median(tx_kb) * 1024 / PAYLOAD - 1, 3)
        if tx_kb else None,
    )  # fmt: skip
    return res


def bench_execs(tools: dict[str, str], seconds: float, tmp: Path) -> dict[str, Any]:
    base = parse_kv(sh("taskset", "-c", "1", tools["execgen"], str(seconds)))
    agent = Agent({"LENS_COLLECTORS__TCP__ENABLED": "false"}, tmp / "agent-exec.log")
    try:
        before = agent.sample("lens_container_process_execs_total", namespace="", pod="")
        cpu0 = cpu_seconds(agent.proc.pid)
        run = parse_kv(sh("taskset", "-c", "1", tools["execgen"], str(seconds)))
        time.sleep(3)
        cpu = cpu_seconds(agent.proc.pid) - cpu0
        counted = agent.sample("lens_container_process_execs_total", namespace="", pod="") - before
        lost = agent.sample("lens_agent_events_lost_total", program="proc_events")
    finally:
        agent.stop()
    res = {
        "baseline_rate": base["rate"],
        "agent_rate": run["rate"],
        "agent_rate_ratio": round(run["rate"] / base["rate"], 3),
        "agent_cpu_s_per_10k": round(cpu / run["execs"] * 10_000, 3),
        "agent_completeness": round(counted / run["execs"], 4),
        "agent_events_lost": lost,
    }
    snoop = shutil.which("execsnoop-bpfcc")
    if snoop:
        try:
            out = subprocess.run(["timeout", "8", snoop], capture_output=True, text=True)
            err = (out.stderr or out.stdout).strip().splitlines()
            res["execsnoop"] = (
                f"cannot run here: {err[-1] if err else 'exit ' + str(out.returncode)}"
            )
        except OSError as exc:
            res["execsnoop"] = f"cannot run here: {exc}"
    return res


def distinct_flows(start: int, count: int) -> None:
    """count connections, each to a remote of its own in 127.16.0.0/12."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen(4096)
    port = srv.getsockname()[1]

    def serve() -> None:
        for _ in range(count):
            srv.accept()[0].close()

    t = threading.Thread(target=serve)
    t.start()
    for i in range(start, start + count):
        addr = f"127.{16 + (i >> 16)}.{(i >> 8) & 255}.{(i & 255) or 1}"
        c = socket.create_connection((addr, port))
        c.send(b"x")
        c.close()
    t.join()
    srv.close()


def bench_scrape(tmp: Path) -> dict[str, Any]:
    env = {
        "LENS_CACHE__MAX_SERIES": "400000",
        "LENS_BPF__MAX_FLOW_KEYS": "120000",
        "LENS_BPF__MAX_RTT_KEYS": "120000",
        "LENS_COLLECTORS__PROCESSES__ENABLED": "false",
        # per-remote RTT histograms cost ~50 lines a remote: measured apart from series
        "LENS_COLLECTORS__RTT__ENABLED": "false",
    }
    cfg = tmp / "scrape.yaml"
    # one family capped low, to show what the cache does at its cap
    cfg.write_text("cache:\n  families:\n    primus_lens_network_tcp_flow_egress:\n"
                   "      max_series: 1000\n")  # fmt: skip
    agent = Agent({**env, "LENS_CONFIG": str(cfg)}, tmp / "agent-scrape.log")
    levels = []
    done = 0
    try:
        for level in (1_000, 10_000, 50_000):  # live series: about 5 per flow
            flows = level // 5
            distinct_flows(done, flows - done)
            done = flows
            time.sleep(4)
            times = []
            for _ in range(3):
                body, took = agent.metrics()
                times.append(took)
            series = sum(1 for ln in body.splitlines() if ln and not ln.startswith("#"))
            levels.append({"target": level, "flows": flows, "series": series,
                           "scrape_ms": round(statistics.median(times) * 1000, 1),
                           "rss_mb": round(rss_mb(agent.proc.pid), 1),
                           "bytes": len(body)})  # fmt: skip
        refused = agent.sample("lens_agent_cache_refused_total",
                               family="primus_lens_network_tcp_flow_egress")  # fmt: skip
        capped = agent.sample("lens_agent_cache_series",
                              family="primus_lens_network_tcp_flow_egress")  # fmt: skip
    finally:
        agent.stop()
    return {"levels": levels, "cap": {"family": "primus_lens_network_tcp_flow_egress",
                                      "max_series": 1000, "series": capped,
                                      "refused": refused}}  # fmt: skip


def bench_soak(tools: dict[str, str], seconds: float, tmp: Path) -> dict[str, Any]:
    agent = Agent({}, tmp / "agent-soak.log")
    samples = []
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            conn_load(tools, "127.0.0.103", 5)
            sh("taskset", "-c", "1", tools["execgen"], "2")

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    start = time.monotonic()
    try:
        while time.monotonic() - start < seconds:
            samples.append((time.monotonic() - start, rss_mb(agent.proc.pid)))
            time.sleep(10)
    finally:
        stop.set()
        t.join(30)
        agent.stop()
    xs, ys = zip(*samples, strict=True)
    slope = statistics.linear_regression(xs, ys).slope if len(xs) > 2 else 0.0
    half = ys[len(ys) // 2 :]
    return {"seconds": seconds, "rss_mb_first": ys[0], "rss_mb_last": ys[-1],
            "rss_mb_max": max(ys), "slope_mb_per_hour": round(slope * 3600, 2),
            "second_half_slope_mb_per_hour": round(
                statistics.linear_regression(xs[len(xs) // 2:], half).slope * 3600, 2)
            if len(half) > 2 else None, "samples": samples}  # fmt: skip


def table(r: dict[str, Any]) -> str:
    c, e, s = r["connections"], r["execs"], r["scrape"]
    rows = [
        ("connections/s, no tracer", f"{c['baseline_rate']:.0f}", ""),
        ("connections/s, lens-ebpf", f"{c['agent_rate']:.0f}",
         f"{c['agent_rate_ratio']:.1%} of no tracer (target >= 95%)"),
        ("connections/s, tcplife", f"{c.get('tcplife_rate', 0):.0f}",
         f"{c.get('tcplife_rate_ratio', 0):.1%} of no tracer"),
        ("lens-ebpf CPU s / 10k conns", f"{c['agent_cpu_s_per_10k']}",
         f"{c['agent_cpu_pct_at_rate']}% of a core at {c['agent_rate']:.0f}/s"),
        ("tcplife CPU s / 10k conns", f"{c.get('tcplife_cpu_s_per_10k')}", ""),
        ("lens-ebpf completeness", f"{c['agent_completeness']:.4%}",
         f"lost {c['agent_events_lost']:.0f}, bytes error {c['agent_bytes_error']}"),
        ("tcplife completeness", f"{c.get('tcplife_completeness', 0):.4%}",
         f"TX_KB median {c.get('tcplife_tx_kb_median')} for {PAYLOAD // 1024} KB sent"),
        ("execs/s, no tracer", f"{e['baseline_rate']:.0f}", ""),
        ("execs/s, lens-ebpf", f"{e['agent_rate']:.0f}", f"{e['agent_rate_ratio']:.1%}"),
        ("lens-ebpf exec completeness", f"{e['agent_completeness']:.2%}",
         f"CPU s / 10k execs {e['agent_cpu_s_per_10k']}"),
        ("execsnoop-bpfcc", "-", str(e.get("execsnoop", ""))[:50]),
        ("start-up to attached", f"{c['startup_seconds']} s", "target < 5 s"),
    ]  # fmt: skip
    for lv in s["levels"]:
        rows.append(
            (
                f"/metrics, {lv['series']} series",
                f"{lv['scrape_ms']} ms",
                f"{lv['flows']} flows, RSS {lv['rss_mb']} MB (targets 250 ms, 150 MB)",
            )
        )
    rows.append(
        (
            "cache at its cap",
            f"{s['cap']['series']:.0f}",
            f"series (cap {s['cap']['max_series']}), {s['cap']['refused']:.0f} refused",
        )
    )
    if "soak" in r:
        so = r["soak"]
        rows.append((f"soak {so['seconds']:.0f} s RSS", f"{so['rss_mb_first']:.0f}->"
                     f"{so['rss_mb_last']:.0f} MB", f"slope {so['slope_mb_per_hour']} MB/h, "
                     f"2nd half {so['second_half_slope_mb_per_hour']} MB/h"))  # fmt: skip
    width = max(len(a) for a, _, _ in rows)
    return "\n".join(f"| {a:<{width}} | {b:>12} | {c} |" for a, b, c in rows)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--seconds", type=float, default=10, help="each load phase")
    ap.add_argument("--soak", type=float, default=600, help="soak seconds (0: skip)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench: needs root", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="lens-bench-"))
    tools = build(tmp)
    results: dict[str, Any] = {"host": {"kernel": os.uname().release, "cpus": os.cpu_count()},
                               "payload_bytes": PAYLOAD}  # fmt: skip
    results["connections"] = bench_connections(tools, args.seconds, tmp)
    results["execs"] = bench_execs(tools, args.seconds, tmp)
    results["scrape"] = bench_scrape(tmp)
    if args.soak:
        results["soak"] = bench_soak(tools, args.soak, tmp)
    Path(args.out).write_text(json.dumps(results, indent=2))
    text = table(results)
    print(text)
    cmd = f"make bench  # python -m bench --seconds {args.seconds:g} --soak {args.soak:g}"
    (ROOT / "BENCHMARKS.md").write_text(
        "# Benchmarks\n\nMade by `" + cmd + "` on " + time.strftime("%Y-%m-%d") +
        f", kernel {os.uname().release}, {os.cpu_count()} CPUs; load on CPU 1, tracers on CPU 0;"
        f" {PAYLOAD}-byte request and reply per connection. Raw figures: `bench/results.json`."
        "\n\n| figure | value | note |\n| --- | ---: | --- |\n" + text + "\n"
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
