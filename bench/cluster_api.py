"""The recorder at 1,000 nodes x 8 GPUs: the agents' device inventories, device
changes and container events streamed in at once (into PostgreSQL, or SQLite with
--sqlite), then the cluster API's overview, node list and node page timed against a real
Prometheus holding every GPU's utilization (the reporters run in a process of their
own). Prints the figures; the goals (ingest >= 5,000
events/s, overview <= 100 ms, a node page <= 50 ms) are printed beside them.

.venv/bin/python -m bench.cluster_api [--nodes 1000] [--events 20] [--per-message 5] [--sqlite]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine, func, select

from bench import service
from bench.__main__ import cpu_seconds
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.recorder.store import schema
from tests.k8slab import FakeApiServer, eventually
from tests.promserver import Prometheus
from tests.reportersim import event as container_start

GPUS = 8


def gpu(node: int, i: int, serial: str) -> pb.DeviceChange:
    bdf = f"0000:{0x10 + i * 0x10:02x}:00.0"
    return pb.DeviceChange(
        device_kind="gpu",
        vendor="amd",
        bdf=bdf,
        slot=bdf,
        index=i,
        key=f"uid-{node}-{i}",
        model="AMD Instinct MI300X",
        serial=serial,
        driver_version="6.10.5",
        vbios_version="113-M3000100-102",
    )


def make_event(node: int, seq: int) -> pb.Event:
    """Event 1: the node's inventory (8 GPUs); every 5th: a GPU's serial changes; the rest:
    container starts."""
    name, ts = f"gpu-{node}", 1_795_000_000_000_000_000 + seq
    if seq == 1:
        inv = pb.DeviceInventory(devices=[gpu(node, i, f"S{node}-{i}") for i in range(GPUS)])
        return pb.Event(seq=seq, ts_unix_nano=ts, node_name=name, device_inventory=inv)
    if seq % 5 == 0:
        change = gpu(node, seq % GPUS, f"S{node}-{seq % GPUS}-{seq}")
        change.change, change.fields[:] = "changed", ["serial"]
        return pb.Event(seq=seq, ts_unix_nano=ts, node_name=name, device_change=change)
    return container_start(node, seq)


def node_object(n: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"gpu-{n}",
            "labels": {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
        },
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": f"10.1.{n // 250}.{n % 250}"}],
            "capacity": {"cpu": "192", "memory": "2113474560Ki", "amd.com/gpu": "8"},
            "allocatable": {"amd.com/gpu": "8"},
            "nodeInfo": {
                "kubeletVersion": "v1.31.2",
                "osImage": "Ubuntu 22.04",
                "containerRuntimeVersion": "containerd://1.7.22",
            },
        },
    }


def postgres_cpu() -> float:
    """CPU seconds of every PostgreSQL process on the machine (the bench's own server)."""
    total = 0.0
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if (proc / "comm").read_text().strip() == "postgres":
                total += cpu_seconds(int(proc.name))
    return total


def timed(url: str, n: int = 30) -> tuple[float, float]:
    """(median, max) ms of n GETs."""
    took = []
    for _ in range(n):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()
            assert r.status == 200, url
        took.append((time.perf_counter() - start) * 1000)
    return statistics.median(took), max(took)


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.cluster_api",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--sqlite", action="store_true")
    ap.add_argument(
        "--per-message",
        type=int,
        default=5,
        help="events per ReportBatch message, as an agent's reporter sends what "
        "it holds (default 5); 1: Report, one event per message, as agents "
        "older than ReportBatch send",
    )
    args = ap.parse_args()
    from tests.reportersim import simulate

    service.allow_streams(args.nodes)
    tmp = Path(tempfile.mkdtemp(prefix="lens-bench-cluster-"))
    url, pg = service.database(not args.sqlite, tmp, "cluster")
    now = int(datetime.now(UTC).timestamp()) // 60 * 60
    lines = ["# TYPE gpu_utilization gauge\n"]
    for n in range(args.nodes):
        for i in range(GPUS):
            lines += [
                f'gpu_utilization{{node="gpu-{n}",gpu_id="{i}"}} {(n + i) % 100} '
                f"{now - 600 + 60 * m}\n"
                for m in range(10)
            ]
    prometheus = Prometheus([], openmetrics="".join(lines) + "# EOF\n")
    api = FakeApiServer().start()
    for n in range(args.nodes):
        api.put("nodes", node_object(n))
    at = datetime.fromtimestamp(now - 60, UTC)
    app = service.start(
        url, tmp, api, {("recorder", "prometheus", "url"): prometheus.base}, lambda: at
    )
    try:
        eng = create_engine(url)

        def count(table: str) -> int:
            with eng.connect() as conn:
                tab = schema.metadata.tables[table]
                return int(conn.execute(select(func.count()).select_from(tab)).scalar_one())

        eventually(lambda: count("nodes") == args.nodes, timeout=300)
        # the reporters in a process of their own: the service's figures, not the
        # clients' (they would share its interpreter lock)
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
            ex.submit(int).result()  # the process started before the clock does
            cpu = {"service": cpu_seconds(os.getpid()), "PostgreSQL": postgres_cpu()}
            writes = app.writer.writes.copy()
            got = ex.submit(
                simulate,
                f"127.0.0.1:{app.collect_port}",
                args.nodes,
                args.events,
                600,
                make_event,
                args.per_message,
            ).result()
        cpu = {
            "service": cpu_seconds(os.getpid()) - cpu["service"],
            "PostgreSQL": postgres_cpu() - cpu["PostgreSQL"],
            "reporters": got.cpu_seconds,
        }
        sent = args.nodes * args.events
        stored, devices, changes = (
            count("node_events"),
            count("node_devices"),
            count("device_changelog"),
        )
        full = sum(1 for n in got.acked.values() if n == args.events)
        print(
            f"{args.nodes} nodes x {GPUS} GPUs, {args.events} events each "
            f"({args.per_message} per message) into "
            f"{'SQLite' if args.sqlite else 'PostgreSQL'}: {stored} of {sent} events stored "
            f"({full} of {args.nodes} streams acknowledged to their last), {devices} devices, "
            f"{changes} changelog rows, {got.acks} acknowledgements, in {got.seconds:.1f} s "
            f"(once the {args.nodes} streams were open, which took {got.connect_seconds:.1f} s): "
            f"{sent / got.seconds:.0f} events/s (goal >= 5000)"
        )
        print(
            f"the database writer: {sum(app.writer.writes.counts) - sum(writes.counts)} commits "
            f"taking {app.writer.writes.total - writes.total:.1f} s"
        )
        print(
            "CPU meanwhile (2 cores: %.1f s): " % (2 * got.seconds)
            + ", ".join(f"{k} {v:.1f} s" for k, v in cpu.items())
        )
        base = f"http://127.0.0.1:{app.http.port}/v1"
        for label, path, goal in (
            ("clusters/overview", "/clusters/overview", 100),
            ("nodes page (10 of them)", "/nodes?page_num=1&page_size=10", 50),
            ("nodes/{name}", "/nodes/gpu-7", 50),
            ("nodes/{name}/devices", "/nodes/gpu-7/devices", 50),
            ("nodes/{name}/devices/changelog", "/nodes/gpu-7/devices/changelog", 50),
        ):
            med, worst = timed(base + path)
            print(
                f"{label} at {args.nodes} nodes: median {med:.1f} ms, max {worst:.1f} ms "
                f"(goal <= {goal} ms)"
            )
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process (service and clients): {rss:.0f} MB")
        eng.dispose()
    finally:
        app.stop()
        api.kill()
        prometheus.stop()
        if pg:
            pg.destroy()


if __name__ == "__main__":
    main()
