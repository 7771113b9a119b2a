"""`python -m bench.drops`: what a drop storm costs with the drops feature on.

On CPU 1, dropgen (bench/dropgen.c) sends 65,507-byte UDP datagrams, paced to --rate
packets a second for --seconds, through a veth of MTU 68 in a network namespace of the
bench's own whose neighbour resolution is off: IP cuts each datagram into 1,365 fragments
and the kernel drops every one of them as it looks for the neighbour (NEIGH_FAILED), in
the sender's own send(), so one CPU makes about two million drops a second. The agent
runs on CPU 0 with BPF run-time statistics on. Measured: the drops sent (the namespace's
IP FragCreates, which dropgen's own count must equal), the agent's CPU during the storm
against an idle stretch as long, the drops program's nanoseconds a run (the kernel's
run_time_ns / run_cnt), its count against the drops sent, and conngen's connections/s
with the drops feature on and off. Writes bench/drops.json and the Drops section of
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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

# RFC 2544's benchmarking range, in a namespace of the bench's own: nothing answers there
SRC, DST, PORT = "198.18.72.1", "198.18.72.9", 9
NS = f"lens-bench-drops-{os.getpid()}"
DEV = "lbd0"
CONN_ADDR = "127.0.0.122"
RUN_STATS = {"LENS_BPF__RUN_STATS": "true"}
CEILING_SECONDS = 3.0
# what the storm's drops are, on the agent's metric
STORM = {"protocol": "udp", "direction": "egress", "reason": "NEIGH_FAILED"}


@contextlib.contextmanager
def drop_path() -> Iterator[None]:
    """NS with a veth of MTU 68 towards DST whose neighbour is never asked for (no ARP
    probes of any kind): every packet sent to DST is dropped before it leaves."""
    sh("ip", "netns", "add", NS)
    try:
        nsx = ("ip", "netns", "exec", NS)
        sh("ip", "-n", NS, "link", "add", DEV, "type", "veth", "peer", "name", DEV + "p")
        for dev in (DEV, DEV + "p"):
            sh("ip", "-n", NS, "link", "set", dev, "mtu", "68", "up")
        sh("ip", "-n", NS, "addr", "add", f"{SRC}/24", "dev", DEV)
        for knob in ("mcast_solicit", "ucast_solicit", "app_solicit", "mcast_resolicit"):
            sh(*nsx, "sysctl", "-qw", f"net.ipv4.neigh.{DEV}.{knob}=0")
        yield
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def frag_creates() -> int:
    """The namespace's IP FragCreates (/proc/net/snmp): one a fragment made."""
    text = sh("ip", "netns", "exec", NS, "cat", "/proc/net/snmp")
    head, vals = [line.split() for line in text.splitlines() if line.startswith("Ip:")][:2]
    return int(vals[head.index("FragCreates")])


def storm(tools: dict[str, str], tmp: Path, seconds: float, rate: float) -> dict[str, Any]:
    agent = Agent(RUN_STATS, tmp / "agent-drops.log")
    res: dict[str, Any] = {"startup_seconds": round(agent.ready_s, 2)}
    try:
        time.sleep(SETTLE)
        cpu0 = cpu_seconds(agent.proc.pid)
        time.sleep(seconds)
        idle = cpu_seconds(agent.proc.pid) - cpu0
        costs0 = probe_costs(agent)
        before = agent.sample("lens_packet_drops_total", **STORM)
        made0 = frag_creates()
        load_average = os.getloadavg()
        cpu0 = cpu_seconds(agent.proc.pid)
        gen = ("ip", "netns", "exec", NS, "taskset", "-c", "1", tools["dropgen"])
        run = parse_kv(sh(*gen, DST, str(PORT), str(seconds), str(rate)))
        load = cpu_seconds(agent.proc.pid) - cpu0
        made = frag_creates() - made0
        time.sleep(3)  # two read cycles: the kernel's counts reach /metrics
        counted = agent.sample("lens_packet_drops_total", **STORM)
        costs = probe_costs(agent)
        reasons: dict[str, float] = {}
        body, _ = agent.metrics()
        for line in body.splitlines():
            if line.startswith("lens_packet_drops_total{") and all(
                f'{k}="{v}"' in line for k, v in STORM.items() if k != "reason"
            ):
                why = line.split('reason="', 1)[1].split('"', 1)[0]
                reasons[why] = reasons.get(why, 0) + float(line.rsplit(" ", 1)[1])
    finally:
        agent.stop()
    key = next((k for k in costs if k.startswith("drops/")), "")
    t = costs.get(key, (0.0, 0.0))[0] - costs0.get(key, (0.0, 0.0))[0]
    n = costs.get(key, (0.0, 0.0))[1] - costs0.get(key, (0.0, 0.0))[1]
    res.update(
        sent=made,
        dropgen_sent=int(run["sent"]),
        fragments_a_datagram=int(run["fragments"]),
        rate=round(made / run["seconds"]),
        counted=int(counted - before),
        exact=int(counted - before) == made == int(run["sent"]),
        reasons={k: int(v) for k, v in reasons.items()},
        load_average_during=[round(x, 2) for x in load_average],
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


def storm_in_its_namespace(
    tools: dict[str, str], tmp: Path, seconds: float, rate: float
) -> dict[str, Any]:
    with drop_path():
        # what one CPU makes here and now with nothing counting: the storm's ceiling
        gen = ("ip", "netns", "exec", NS, "taskset", "-c", "1", tools["dropgen"])
        alone = parse_kv(sh(*gen, DST, str(PORT), str(CEILING_SECONDS), "0"))
        res = storm(tools, tmp, seconds, rate)
        res["rate_without_agent"] = round(alone["rate"])
        return res


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.drops")
    ap.add_argument("--seconds", type=float, default=10, help="the storm, and each idle stretch")
    ap.add_argument(
        "--rate", type=float, default=1_000_000, help="drops a second (0: all one CPU makes)"
    )
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
        "storm": storm_in_its_namespace(tools, tmp, args.seconds, args.rate),
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
    la = s.get("load_average_during", [res.get("load_average", 0)] * 3)
    short, per_drop_ns = "", 0.0
    if "rate_without_agent" in s and s["rate"]:
        per_drop_ns = 1e9 / s["rate"] - 1e9 / s["rate_without_agent"]
    if args.rate and s["rate"] < 0.98 * args.rate:
        short = (
            f" The storm fell short of the {args.rate:,.0f}/s asked: dropgen makes what its "
            "CPU gives it, shared with the other sessions' work (the load above), less what "
            "tracing each drop costs on that CPU (below); the count is exact at any rate."
        )
    text = (
        "## Drops: a storm of drops\n\n"
        f"`python -m bench.drops --seconds {args.seconds:g} --rate {args.rate:g}` on "
        f"{res.get('date', time.strftime('%Y-%m-%d'))}, kernel {res['kernel']}, {res['cpus']} "
        "CPUs: dropgen (bench/dropgen.c) on CPU 1 sends 65,507-byte UDP datagrams, paced in "
        "packets, through a veth of MTU 68 in a namespace of the bench's own whose neighbour "
        "is never resolved: IP cuts each into "
        f"{s.get('fragments_a_datagram', 0):,} fragments and the kernel drops each one "
        "(NEIGH_FAILED) inside the sender's send(), so one system call makes that many "
        "drops. The agent (every default feature, BPF run-time statistics on) runs on CPU 0. "
        "Drops sent: the namespace's IP FragCreates, which dropgen's own count equals. Raw "
        "figures: `bench/drops.json`. The machine is shared: load average "
        f"{la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f} (1, 5, 15 min) as the storm began, on "
        f"{res['cpus']} CPUs.{short}\n\n"
        "| figure | value | note |\n| --- | ---: | --- |\n"
        f"| drops sent | {s['sent']:,} at {s['rate']:,}/s | asked "
        f"{args.rate:,.0f}/s{' (as fast as it goes)' if not args.rate else ''}, one CPU |\n"
        + (
            f"| drops without the agent | {s['rate_without_agent']:,}/s | dropgen all out for "
            f"{CEILING_SECONDS:g} s just before, no agent running: what CPU 1 made then |\n"
            if "rate_without_agent" in s
            else ""
        )
        + (
            f"| a drop's cost with the agent | {per_drop_ns:,.0f} ns | on the dropping CPU: "
            "1/rate with the agent less 1/rate without (all out: "
            "the program's run, the tracepoint's entry, whatever else the agent runs there) |\n"
            if short and "rate_without_agent" in s
            else ""
        )
        + f"| drops counted | {s['counted']:,} | {'exact' if s['exact'] else 'NOT exact'}: "
        f"{by_reason} (udp, egress) |\n"
        f"| drops program | {ns} ns a run | {s['program_runs']:,} runs (every drop on the "
        f"machine); {s['program_cpu_pct_of_one']}% of the dropping CPU in the storm |\n"
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
