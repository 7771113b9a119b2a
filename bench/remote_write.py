"""Remote write through the recorder at 1,000 nodes x 8 GPUs x 40 series every 15 s
(dcgm-exporter's label set, as one Prometheus sends it: batches of 2,000 series, several
shards at once) into a receiver that takes everything (a process of its own), and prints
the samples per second per core of the service's CPU and the latency it adds to a request
(p50, p99: its time less the receiver's). Goals: >= 50,000 samples/s per core, p99 added
< 50 ms. Every GPU is held by a pod of a PyTorchJob, so every sample is copied.

.venv/bin/python -m bench.remote_write [--nodes 1000] [--cycles 3] [--shards 4] [--flat-out]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing as mp
import os
import resource
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import service
from bench.__main__ import cpu_seconds
from lens_ebpf.recorder.remote_write import wire
from lens_ebpf.recorder.store import schema
from lens_ebpf.recorder.store.writer import engine_for, upgrade
from tests.k8slab import FakeApiServer, eventually, pod

GPUS, SERIES, BATCH, PERIOD = 8, 40, 2000, 15.0
FIELDS = [f"DCGM_FI_DEV_FIELD_{i:02d}" for i in range(SERIES)]


def uuid(n: int, i: int) -> str:
    return f"GPU-{n:08x}-0000-4000-8000-{i:012x}"


def gpu_rows(nodes: int, now: Any) -> list[dict[str, Any]]:
    """Each node's GPUs as its agent reported them, each held by its job's pod."""
    return [
        {
            "cluster": "local",
            "node": f"gpu-{n}",
            "kind": "gpu",
            "slot": f"0000:{0x10 + i * 0x10:02x}:00.0",
            "key": uuid(n, i),
            "idx": i,
            "vendor": "nvidia",
            "model": "NVIDIA H100 80GB HBM3",
            "uuid": uuid(n, i),
            "serial": "",
            "bdf": f"0000:{0x10 + i * 0x10:02x}:00.0",
            "holder": f"ml/job-{n // 8}-worker-{n % 8}",
            "present": True,
            "first_seen": now,
            "last_seen": now,
        }
        for n in range(nodes)
        for i in range(GPUS)
    ]


def series_labels(nodes: int) -> list[bytes]:
    """Every series' labels, serialized, as Prometheus sends dcgm-exporter's."""
    out = []
    for n in range(nodes):
        for i in range(GPUS):
            for f in FIELDS:
                out.append(
                    wire.labels(
                        {
                            "__name__": f,
                            "gpu": str(i),
                            "UUID": uuid(n, i),
                            "pci_bus_id": f"00000000:{0x10 + i * 0x10:02X}:00.0",
                            "device": f"nvidia{i}",
                            "modelName": "NVIDIA H100 80GB HBM3",
                            "Hostname": f"gpu-{n}",
                            "DCGM_FI_DRIVER_VERSION": "570.86.15",
                            "instance": f"10.1.{n // 250}.{n % 250}:9400",
                            "job": "dcgm-exporter",
                        }
                    )
                )
    return out


def sink(port_out: Any) -> None:
    """A receiver that reads each body and answers 204 (what it adds is the bench's floor)."""
    from aiohttp import web

    async def take(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=204)

    async def main() -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/api/v1/write", take)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_out.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


def send(target: str, nodes: int, cycles: int, shards: int, flat_out: bool) -> dict[str, Any]:
    """The sender (a process of its own): every cycle, every series' sample of now, in
    batches, shards at a time; each request's latency, and the CPU it used."""
    import urllib3

    labels = series_labels(nodes)
    pool = urllib3.PoolManager(maxsize=shards, retries=False, timeout=60)
    headers = {
        "Content-Type": "application/x-protobuf",
        "Content-Encoding": "snappy",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
    lat: list[float] = []
    cycle_lat: list[float] = []
    per_cycle: list[float] = []  # each cycle's p99
    statuses: dict[int, int] = {}
    sent = 0
    cpu0, start = time.process_time(), time.monotonic()

    def post(body: bytes) -> None:
        t = time.perf_counter()
        r = pool.request("POST", target, body=body, headers=headers)
        lat.append(time.perf_counter() - t)
        cycle_lat.append(lat[-1])
        statuses[r.status] = statuses.get(r.status, 0) + 1

    build = 0.0
    with concurrent.futures.ThreadPoolExecutor(shards) as ex:
        for c in range(cycles):
            due = start + c * PERIOD
            if not flat_out and time.monotonic() < due:
                time.sleep(due - time.monotonic())
            t0 = time.perf_counter()
            ms = int(time.time() * 1000)
            bodies = []
            for b in range(0, len(labels), BATCH):
                # a Sample (TimeSeries field 2): value (double), timestamp (varint, ms)
                rest = wire.field(
                    0x12, b"\x09" + struct.pack("<d", float(b % 100)) + b"\x10" + wire.uvarint(ms)
                )
                bodies.append(
                    wire.snappy(b"".join(wire.timeseries(lb, rest) for lb in labels[b : b + BATCH]))
                )
            build += time.perf_counter() - t0
            cycle_lat.clear()
            list(ex.map(post, bodies))
            per_cycle.append(sorted(cycle_lat)[int(0.99 * len(cycle_lat))])
            sent += len(labels)
    return {
        "latency": lat,
        "statuses": statuses,
        "samples": sent,
        "per_cycle": per_cycle,
        "seconds": time.monotonic() - start,
        "cpu": time.process_time() - cpu0,
        "build": build,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.remote_write",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--shards", type=int, default=4, help="requests at once (default 4)")
    ap.add_argument(
        "--flat-out",
        action="store_true",
        help="cycles back to back, not every 15 s: the most the service takes",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lens-bench-rw-"))
    url = f"sqlite:///{tmp / 'recorder.db'}"
    eng = engine_for(url)
    upgrade(eng)
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    with eng.begin() as conn:
        conn.execute(schema.node_devices.insert(), gpu_rows(args.nodes, now))
    eng.dispose()
    api = FakeApiServer().start()
    jobs = (args.nodes + 7) // 8
    for j in range(jobs):
        api.put(
            "pytorchjobs",
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": f"job-{j}", "namespace": "ml", "uid": f"uid-job-{j}"},
                "spec": {},
                "status": {},
            },
        )
    for n in range(args.nodes):
        api.put(
            "nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": f"gpu-{n}", "uid": f"uid-node-{n}"},
                "status": {
                    "addresses": [{"type": "InternalIP", "address": f"10.1.{n // 250}.{n % 250}"}],
                    "capacity": {"nvidia.com/gpu": "8"},
                    "allocatable": {"nvidia.com/gpu": "8"},
                },
            },
        )
        p = pod(
            f"job-{n // 8}-worker-{n % 8}",
            "",
            "ml",
            node=f"gpu-{n}",
            containers=[
                {"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
            ],
        )
        p["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": f"job-{n // 8}",
                "uid": f"uid-job-{n // 8}",
                "controller": True,
            }
        ]
        api.put("pods", p)
    ctx = mp.get_context("spawn")
    port_q: Any = ctx.Queue()
    receiver = ctx.Process(target=sink, args=(port_q,), daemon=True)
    receiver.start()
    port = port_q.get(timeout=60)
    app = service.start(
        url,
        tmp,
        api,
        {
            ("recorder", "remote_write", "url"): f"http://127.0.0.1:{port}/api/v1/write",
            ("recorder", "remote_write", "cache_seconds"): 3600,
            ("recorder", "jobs", "allocation_seconds"): 3600,
        },
    )
    try:

        def tracked() -> bool:
            running = app.tracker.running_pods()
            return len(running) == jobs and sum(len(v) for v in running.values()) == args.nodes

        eventually(tracked, timeout=300)
        assert app.writer.flush(120)
        idx = app.remote_write.indexer.refresh()
        print(
            f"maps: {len(idx.pods)} pods, {sum(len(g) for g in idx.gpus.values())} GPU "
            f"identities, {len(idx.holders)} held devices"
        )
        target = f"http://127.0.0.1:{app.http.port}/prometheus"
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as ex:
            ex.submit(int).result()
            cpu0 = cpu_seconds(os.getpid())
            got = ex.submit(
                send, target, args.nodes, args.cycles, args.shards, args.flat_out
            ).result()
            cpu = cpu_seconds(os.getpid()) - cpu0
        samples = got["samples"]
        copied = app.remote_write.samples["copied"]
        every = list(app.remote_write.recent_added)
        per = len(every) // args.cycles  # requests a cycle
        cold, added = sorted(every[:per]), sorted(every[per:])
        lat = sorted(got["latency"])

        def pct(xs: list[float], q: float) -> float:
            return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000

        print(
            f"{args.nodes} nodes x {GPUS} GPUs x {SERIES} series, {args.cycles} cycles "
            f"{'back to back' if args.flat_out else 'every 15 s'}, {args.shards} shards, "
            f"{BATCH} series a request: {samples} samples sent in {got['seconds']:.1f} s "
            f"({samples / got['seconds']:.0f}/s), answers {got['statuses']}, {copied} copied"
        )
        print(
            f"the service's CPU: {cpu:.1f} s: {samples / cpu:.0f} samples/s per core "
            f"(goal >= 50000)"
        )
        print(
            f"latency it adds (its time less the receiver's), after the first cycle, "
            f"{len(added)} requests: p50 {pct(added, 0.5):.1f} ms, p99 {pct(added, 0.99):.1f} "
            f"ms (goal p99 < 50 ms); the first cycle (every series new to the service): "
            f"p50 {pct(cold, 0.5):.1f} ms, p99 {pct(cold, 0.99):.1f} ms"
        )
        print(
            f"the sender's whole request: p50 {pct(lat, 0.5):.1f} ms, p99 "
            f"{pct(lat, 0.99):.1f} ms, mean {statistics.mean(lat) * 1000:.1f} ms; p99 per "
            f"cycle: {', '.join(f'{x * 1000:.0f} ms' for x in got['per_cycle'])}"
        )
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"the sender's own CPU {got['cpu']:.1f} s (building bodies {got['build']:.1f} s); "
            f"series remembered {len(app.remote_write.relabeler.cache)}; peak RSS of the "
            f"service's process {rss:.0f} MB"
        )
    finally:
        app.stop()
        api.kill()
        receiver.kill()


if __name__ == "__main__":
    main()
