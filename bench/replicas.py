"""The recorder's ingest with one replica and with three (deploy/recorder: leader election
on, one PostgreSQL), on this machine's cores: a thousand node agents' event streams
(tests/reportersim.py, one connection each) and remote write at 1,000 nodes x 8 GPUs x
40 series (bench/remote_write.py's sender and sink), each through a TCP balancer in
front of the replicas as a Kubernetes Service puts one (tests/tcplb.py). Prints each
figure with the replicas' CPU (every process), and the per-core rates a larger cluster's
sizing is worked out from (BENCHMARKS.md).

--failover N: three replicas against the real kube-apiserver (tests/kube/apiserver.py,
deploy/recorder's RBAC applied) when this machine has one, else the stand-in; the leader
killed -9 N times (restarted after, as its pod would be): the seconds from the kill to
another replica answering /readyz as the leader. tests/kube/test_replicas.py checks that
the failover happens and loses nothing; how long it takes is this figure.

The API is the stand-in (tests/k8slab.py: it serves the replicas' Lease; the nodes, the
jobs and their GPU pods the leader follows), so the figures are the service's and its
database's, not an API server's.

    .venv/bin/python -m bench.replicas [--replicas 1 3] [--nodes 1000] [--events 20]
        [--cycles 3] [--failover N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select

from bench import remote_write as rw
from bench.__main__ import cpu_seconds
from bench.cluster_api import postgres_cpu
from lens_ebpf.recorder.store import schema
from lens_ebpf.recorder.store.writer import engine_for, upgrade
from tests import pglab
from tests.conftest import wait_for
from tests.k8slab import FakeApiServer, eventually, pod
from tests.kube.recorders import Replica
from tests.reportersim import simulate
from tests.tcplb import Balancer


def cluster(api: FakeApiServer, nodes: int) -> None:
    """nodes GPU nodes, each running one 8-GPU pod of a PyTorchJob of eight."""
    for j in range((nodes + 7) // 8):
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
    for n in range(nodes):
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


def cpu(replicas: list[Replica]) -> float:
    return sum(cpu_seconds(r.proc.pid) for r in replicas if r.proc is not None and r.alive)


def run(count: int, args: argparse.Namespace, pg: pglab.Postgres, sink_url: str) -> None:
    url = pg.create_database(f"replicas{count}")
    eng = engine_for(url)
    upgrade(eng)
    with eng.begin() as conn:
        conn.execute(schema.node_devices.insert(), rw.gpu_rows(args.nodes, datetime.now(UTC)))
    eng.dispose()
    api = FakeApiServer().start()
    cluster(api, args.nodes)
    tmp = Path(tempfile.mkdtemp(prefix="lens-bench-replicas-"))
    settings = {
        "remote_write__url": sink_url,
        "remote_write__cache_seconds": 3600,
        "jobs__allocation_seconds": 3600,
        "queue_max": 1_000_000,
    }
    replicas = [
        Replica(f"recorder-{i}", url, api.kubeconfig(tmp / "kubeconfig"), settings)
        for i in range(count)
    ]
    try:
        for r in replicas:
            r.start()
        eventually(lambda: sum(r.leads() for r in replicas) == 1, timeout=60)
        eng = create_engine(url)

        def running() -> int:
            with eng.connect() as conn:
                return int(
                    conn.execute(
                        select(func.count())
                        .select_from(schema.gpu_pods)
                        .where(schema.gpu_pods.c.running.is_(True))
                    ).scalar_one()
                )

        eventually(lambda: running() == args.nodes, timeout=600)
        print(f"{count} replica(s), PostgreSQL: {args.nodes} GPU pods followed by the leader")

        # the agents' events, through the Service
        lb = Balancer([("127.0.0.1", r.collect_port) for r in replicas])
        c0, p0, t0 = cpu(replicas), postgres_cpu(), time.monotonic()
        got = simulate(lb.target, args.nodes, args.events, per_message=5, own_connections=True)
        wall, used, pg_used = time.monotonic() - t0, cpu(replicas) - c0, postgres_cpu() - p0
        lb.stop()
        sent = args.nodes * args.events
        with eng.connect() as conn:
            stored = int(
                conn.execute(select(func.count()).select_from(schema.node_events)).scalar_one()
            )
        full = sum(1 for n in got.acked.values() if n == args.events)
        per = {r.identity: lb.connections[("127.0.0.1", r.collect_port)] for r in replicas}
        print(
            f"  events: {stored:,} of {sent:,} stored, {full} of {args.nodes} streams "
            f"acknowledged to the last, {sent / got.seconds:,.0f} events/s; the replicas' "
            f"CPU {used:.1f} s over {wall:.1f} s: {sent / used:,.0f} events per CPU-second "
            f"(PostgreSQL {pg_used:.1f} s more); streams per replica {per}"
        )

        # remote write, through the Service (every replica answers from its own maps)
        lb = Balancer([("127.0.0.1", r.port) for r in replicas])
        ctx = mp.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as ex:
            ex.submit(int).result()
            c0 = cpu(replicas)
            sent_rw = ex.submit(
                rw.send, f"http://{lb.target}/prometheus", args.nodes, args.cycles, 4 * count, True
            ).result()
            used = cpu(replicas) - c0
        lb.stop()
        samples = sent_rw["samples"]
        lat = sorted(sent_rw["latency"])
        print(
            f"  remote write, {args.cycles} cycles back to back, {4 * count} shards: "
            f"{samples:,} samples in {sent_rw['seconds']:.1f} s "
            f"({samples / sent_rw['seconds']:,.0f}/s), answers {sent_rw['statuses']}; the "
            f"replicas' CPU {used:.1f} s: {samples / used:,.0f} samples per CPU-second; "
            f"request p50 {lat[len(lat) // 2] * 1000:.0f} ms, p99 "
            f"{lat[int(0.99 * len(lat))] * 1000:.0f} ms"
        )
        eng.dispose()
    finally:
        for r in replicas:
            r.stop()
        api.kill()


@contextlib.contextmanager
def api_for_replicas(tmp: Path) -> Iterator[tuple[str, Path]]:
    """(which API, a kubeconfig for the replicas): the real kube-apiserver acting as
    deploy/recorder's ServiceAccount when this machine has one, else the stand-in."""
    from tests.kube import apiserver
    from tests.kube.recorders import NAMESPACE, apply

    if apiserver.unavailable():
        api = FakeApiServer().start()
        try:
            yield "the stand-in API (tests/k8slab.py)", api.kubeconfig(tmp / "kubeconfig")
        finally:
            api.kill()
        return
    with apiserver.KubeApiServer() as server:
        deploy = Path(__file__).resolve().parents[1] / "deploy"
        apply(
            server,
            deploy / "namespace.yaml",
            deploy / "recorder" / "serviceaccount.yaml",
            deploy / "recorder" / "rbac.yaml",
        )
        config = server.kubeconfig_for(NAMESPACE, "lens-ebpf-recorder", tmp / "sa.kubeconfig")
        yield "the real kube-apiserver (tests/kube/apiserver.py)", config


def failover(rounds: int, pg: pglab.Postgres) -> list[float]:
    """Three replicas; the leader killed -9 `rounds` times, restarted after: the seconds
    from each kill to another replica leading."""
    url = pg.create_database("failover")
    tmp = Path(tempfile.mkdtemp(prefix="lens-bench-failover-"))
    took: list[float] = []
    with api_for_replicas(tmp) as (which, kubeconfig):
        replicas = [Replica(f"recorder-{i}", url, kubeconfig) for i in range(3)]
        try:
            for r in replicas:
                r.start()

            def leader() -> Replica | None:
                got = [r for r in replicas if r.alive and r.leads()]
                return got[0] if len(got) == 1 else None

            def another(than: Replica) -> Replica | None:
                now = leader()
                return now if now is not than else None

            for _ in range(rounds):
                eventually(leader, timeout=60, every=0.05)
                first = leader()
                assert first is not None
                killed_at = time.monotonic()
                first.kill()
                second = wait_for(partial(another, first), "another leading", 120, 0.05)
                assert second is not None
                took.append(time.monotonic() - killed_at)
                print(
                    f"  the leader {first.identity} killed -9: {second.identity} leads "
                    f"{took[-1]:.2f} s later"
                )
                first.start()
        finally:
            for r in replicas:
                r.stop()
    print(
        f"failover, 3 replicas, {which}, lease 15 s, retry 2 s: {len(took)} kills, "
        f"min {min(took):.2f} s, median {statistics.median(took):.2f} s, "
        f"max {max(took):.2f} s"
    )
    return took


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m bench.replicas",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--events", type=int, default=20)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument(
        "--failover",
        type=int,
        default=0,
        metavar="N",
        help="only the failover figure: the leader killed N times",
    )
    args = ap.parse_args()
    why = pglab.unavailable()
    if why:
        raise SystemExit(f"bench.replicas: {why}")
    if args.failover:
        pg = pglab.Postgres().init()
        try:
            failover(args.failover, pg)
        finally:
            pg.destroy()
        return
    from bench.service import allow_streams

    allow_streams(args.nodes)
    ctx = mp.get_context("spawn")
    port_q: Any = ctx.Queue()
    receiver = ctx.Process(target=rw.sink, args=(port_q,), daemon=True)
    receiver.start()
    sink_url = f"http://127.0.0.1:{port_q.get(timeout=60)}/api/v1/write"
    pg = pglab.Postgres().init()
    try:
        for count in args.replicas:
            run(count, args, pg, sink_url)
    finally:
        pg.destroy()
        receiver.kill()


if __name__ == "__main__":
    main()
