"""`python -m bench.drops`: what a drop storm costs with the drops feature on.

On CPU 1, dropgen sends 1-byte UDP datagrams to a closed port on loopback, paced to
--rate a second for --seconds (each is dropped by the kernel: NO_SOCKET, or CPU_BACKLOG
where loopback's backlog overflows); the agent runs on CPU 0 with BPF run-time statistics
on. Measured: the agent's CPU during the storm against an idle stretch as long, the drops
program's nanoseconds a run (the kernel's run_time_ns / run_cnt), its count against what
dropgen sent (every reason for that address), and conngen's connections/s with the drops
feature on and off. Writes bench/drops.json and the Drops section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.__main__ import (
    ROOT,
    SETTLE,
    Agent,
    build,
    conn_load,
    cpu_seconds,
    parse_kv,
    probe_costs,
    sh,
)

ADDR, PORT = "127.0.0.121", 9  # nobody listens: every datagram is dropped
CONN_ADDR = "127.0.0.122"
RUN_STATS = {"LENS_BPF__RUN_STATS": "true"}


def storm(tools: dict[str, str], tmp: Path, seconds: float, rate: float) -> dict[str, Any]:
    agent = Agent(RUN_STATS, tmp / "agent-drops.log")
    res: dict[str, Any] = {"startup_seconds": round(agent.ready_s, 2)}
    try:
        time.sleep(SETTLE)
        cpu0 = cpu_seconds(agent.proc.pid)
        time.sleep(seconds)
        idle = cpu_seconds(agent.proc.pid) - cpu0
        costs0 = probe_costs(agent)
        before = agent.sample("lens_packet_drops_total", protocol="udp", type="localhost")
        cpu0 = cpu_seconds(agent.proc.pid)
        run = parse_kv(
            sh("taskset", "-c", "1", tools["dropgen"], ADDR, str(PORT), str(seconds), str(rate))
        )
        load = cpu_seconds(agent.proc.pid) - cpu0
        time.sleep(3)  # two read cycles: the kernel's counts reach /metrics
        counted = agent.sample("lens_packet_drops_total", protocol="udp", type="localhost")
        costs = probe_costs(agent)
        reasons = {}
        body, _ = agent.metrics()
        for line in body.splitlines():
            if (
                line.startswith("lens_packet_drops_total{")
                and 'type="localhost"' in line
                and 'protocol="udp"' in line
            ):
                why = line.split('reason="', 1)[1].split('"', 1)[0]
                reasons[why] = reasons.get(why, 0) + float(line.rsplit(" ", 1)[1])
    finally:
        agent.stop()
    key = next((k for k in costs if k.startswith("drops/")), "")
    t = costs.get(key, (0.0, 0.0))[0] - costs0.get(key, (0.0, 0.0))[0]
    n = costs.get(key, (0.0, 0.0))[1] - costs0.get(key, (0.0, 0.0))[1]
    res.update(
        sent=int(run["sent"]),
        rate=round(run["rate"]),
        counted=int(counted - before),
        exact=int(counted - before) == int(run["sent"]),
        reasons={k: int(v) for k, v in reasons.items()},
        agent_cpu_pct_storm=round(100 * load / run["seconds"], 2),
        agent_cpu_pct_idle=round(100 * idle / seconds, 2),
        program_runs=int(n),
        program_ns_per_run=round(t / n * 1e9) if n else None,
        program_cpu_pct_of_one=round(100 * t / run["seconds"], 1),
    )
    return res


def connections(tools: dict[str, str], tmp: Path, seconds: float, rounds: int) -> dict[str, Any]:
    """conngen's connections/s with the drops feature on and off, alternating."""
    got: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(rounds):
        for mode in ("on", "off"):
            env = {} if mode == "on" else {"LENS_COLLECTORS__DROPS__ENABLED": "false"}
            agent = Agent(env, tmp / f"agent-conn-{mode}.log")
            try:
                time.sleep(SETTLE)
                got[mode].append(conn_load(tools, CONN_ADDR, seconds)["rate"])
            finally:
                agent.stop()
    return {f"rate_{m}": [round(r) for r in v] for m, v in got.items()}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.drops")
    ap.add_argument("--seconds", type=float, default=10, help="the storm, and each idle stretch")
    ap.add_argument("--rate", type=float, default=1_000_000, help="drops a second (0: all out)")
    ap.add_argument("--conn-seconds", type=float, default=5, help="each conngen round")
    ap.add_argument("--rounds", type=int, default=2, help="conngen rounds per mode")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument(
        "--rewrite",
        action="store_true",
        help="BENCHMARKS.md's section again from bench/drops.json, no run",
    )
    args = ap.parse_args()
    if args.rewrite:
        write_section(json.loads((ROOT / "bench" / "drops.json").read_text()), args)
        return 0
    if os.geteuid() != 0:
        print("bench.drops: needs root", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="lens-bench-drops-"))
    tools = build(tmp)
    sh("gcc", "-O2", "-o", str(tmp / "dropgen"), str(ROOT / "bench" / "dropgen.c"))
    tools["dropgen"] = str(tmp / "dropgen")
    res = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "load_average": os.getloadavg()[0],
        "storm": storm(tools, tmp, args.seconds, args.rate),
        "connections": connections(tools, tmp, args.conn_seconds, args.rounds),
    }
    print(json.dumps(res, indent=1))
    if args.no_write:
        return 0
    (ROOT / "bench" / "drops.json").write_text(json.dumps(res, indent=2) + "\n")
    write_section(res, args)
    return 0


def write_section(res: dict[str, Any], args: argparse.Namespace) -> None:
    """BENCHMARKS.md's Drops section, replaced whole (the other sections stay)."""
    s, c = res["storm"], res["connections"]
    ns = s["program_ns_per_run"] or 0
    by_reason = ", ".join(f"{k} {v:,}" for k, v in s["reasons"].items())
    text = (
        "## Drops: a storm of drops\n\n"
        f"`python -m bench.drops --seconds {args.seconds:g} --rate {args.rate:g}` on "
        f"{res.get('date', time.strftime('%Y-%m-%d'))}, kernel {res['kernel']}, {res['cpus']} "
        "CPUs: dropgen (bench/dropgen.c) on CPU 1 sends 1-byte UDP datagrams to a closed "
        "loopback port, the agent (every default feature, BPF run-time statistics on) on CPU "
        "0. Raw figures: `bench/drops.json`. The rate is the generator's: each datagram takes "
        "the kernel's whole send and receive path before its drop, and this machine was "
        f"shared (load average {res.get('load_average', 0):.1f} on its {res['cpus']} CPUs, "
        "other sessions' suites and emulated guests), so it fell far short of the rate asked; "
        "the program's work a drop is the same at any rate (one map lookup and add).\n\n"
        "| figure | value | note |\n| --- | ---: | --- |\n"
        f"| drops sent | {s['sent']:,} at {s['rate']:,}/s | asked {args.rate:,.0f}/s |\n"
        f"| drops counted | {s['counted']:,} | {'exact' if s['exact'] else 'NOT exact'}: "
        f"{by_reason} |\n"
        f"| drops program | {ns} ns a run | {s['program_runs']:,} runs; at 1,000,000 drops/s "
        f"that is {ns / 1e9 * 1e6 * 100:.0f}% of the dropping CPU |\n"
        f"| agent CPU in the storm | {s['agent_cpu_pct_storm']}% | idle: "
        f"{s['agent_cpu_pct_idle']}%: nothing per drop reaches user space |\n"
        f"| connections/s, drops on | {c['rate_on']} | conngen, "
        f"{args.conn_seconds:g} s rounds |\n"
        f"| connections/s, drops off | {c['rate_off']} | |\n"
    )
    path = ROOT / "BENCHMARKS.md"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    head = "\n## Drops: a storm of drops\n"
    if head in old:
        start = old.index(head)
        end = old.find("\n## ", start + 1)
        old = old[:start] + (old[end:] if end >= 0 else "\n")
    path.write_text(old.rstrip("\n") + "\n\n" + text)


if __name__ == "__main__":
    sys.exit(main())
