"""Per-probe kernel cost of tcp_flows and proc_events on the running kernel.

Turns kernel.bpf_stats_enabled on, loads both programs as the agent would (whatever
paths this kernel's specs choose), drives TCP connections with bytes both ways and
execs on loopback, and prints each probe's runs and nanoseconds per run
(bpf_prog_info run_time_ns / run_cnt, as `bpftool prog show` reports them). The
kernel matrix runs it in each guest; there the CPU is emulated, so compare paths
within one kernel, not nanoseconds across machines.

    python -m bench.kernel_cost [--connections 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import subprocess
import sys
import threading
from pathlib import Path

from lens_ebpf.agent import config, kernel_headers
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.bpf.syscall import run_stats
from lens_ebpf.agent.containers.cgroups import CgroupIndex
from lens_ebpf.agent.containers.resolver import ContainerResolver
from lens_ebpf.agent.containers.runtime import ContainerdState
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net.policy import parse_policy
from lens_ebpf.agent.processes.proc_events import ProcEvents
from lens_ebpf.agent.tcp.tcp_flows import TcpFlows

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def traffic(connections: int, nbytes: int = 4096) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def serve() -> None:
        for _ in range(connections):
            c, _ = srv.accept()
            with c:
                got = 0
                while got < nbytes:
                    got += len(c.recv(65536))
                c.sendall(b"r" * nbytes)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    for _ in range(connections):
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"q" * nbytes)
            got = 0
            while got < nbytes:
                got += len(c.recv(65536))
    t.join(30)
    srv.close()


def measure(connections: int, execs: int) -> dict:
    kernel_headers.resolve(link=True)
    cfg = config.load(None, env={})
    cache, bus, loader = MetricCache(3600, 100000), EventBus(100000), BpfLoader()
    flows = TcpFlows(cfg.bpf, cfg.events, cache, bus, loader)
    resolver = ContainerResolver(CgroupIndex.for_host(), ContainerdState(Path("/nonexistent")))
    procs = ProcEvents(cfg.bpf, cache, bus, loader, Enrichment(resolver))
    old = STATS.read_text().strip()
    STATS.write_text("1")
    try:
        if not flows.start(parse_policy("localhost: [127.0.0.0/8]\n")) or not procs.start():
            raise SystemExit(f"cannot load: {loader.status}")
        traffic(connections)
        for _ in range(execs):
            subprocess.run(["/bin/true"], check=True)
        probes = {}
        for prog in (flows, procs):
            for raw, fn in prog.bpf.funcs.items():
                name = raw.decode() if isinstance(raw, bytes) else raw
                got = run_stats(fn.fd)
                if got and got[1]:
                    probes[f"{prog.NAME}/{name}"] = {"runs": got[1], "ns_per_run": got[0] / got[1]}
        paths = {n: st.paths for n, st in loader.status.items()}
    finally:
        STATS.write_text(old)
        loader.close()
    return {
        "kernel": platform.release(),
        "connections": connections,
        "execs": execs,
        "paths": paths,
        "probes": probes,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.kernel_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--execs", type=int, default=100)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    r = measure(args.connections, args.execs)
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    print(f"kernel {r['kernel']}: {r['connections']} connections, {r['execs']} execs")
    print(f"{'PROBE':<52} {'RUNS':>8} {'NS/RUN':>8}")
    for name, p in sorted(r["probes"].items()):
        print(f"{name[:52]:<52} {p['runs']:>8} {p['ns_per_run']:>8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
