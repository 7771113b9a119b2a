"""Cluster index figures: list+sync time (the API stand-in runs in this process and
shares its CPU and GIL, so this is an upper bound), memory per pod, lookups per second, and how
fast a watch event reaches the index, against the local API stand-in (tests/k8slab.py).

    .venv/bin/python -m bench.k8s_index [--pods 50000]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
import tracemalloc
from pathlib import Path

from lens_ebpf.agent.config import KubernetesConfig
from lens_ebpf.agent.pods.cluster import ClusterWatch
from lens_ebpf.agent.pods.index import ClusterIndex
from lens_ebpf.k8s.client import api_client
from tests.k8slab import FakeApiServer, owned, pod, service


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.k8s_index")
    ap.add_argument("--pods", type=int, default=50_000)
    ap.add_argument("--deployments", type=int, default=2_000)
    args = ap.parse_args()
    api = FakeApiServer().start()
    for d in range(args.deployments):
        api.put("deployments", owned("Deployment", f"app-{d}"))
        api.put("replicasets", owned("ReplicaSet", f"app-{d}-5d", owner=("Deployment", f"app-{d}")))
    for i in range(args.pods):
        ip = f"10.{64 + i // 65536}.{i // 256 % 256}.{i % 256}"
        api.put("pods", pod(f"p-{i}", ip, owner=("ReplicaSet", f"app-{i % args.deployments}-5d")))
    for i in range(args.pods // 10):
        api.put("services", service(f"s-{i}", f"10.96.{i // 256 % 256}.{i % 256}"))
    with tempfile.TemporaryDirectory() as d:
        client = api_client("kubeconfig", str(api.kubeconfig(Path(d) / "kc")))
    w = ClusterWatch(client, KubernetesConfig(request_timeout_seconds=60))
    started = time.perf_counter()
    w.start()
    assert w.wait_synced(600)
    sync = time.perf_counter() - started
    # memory of the index alone, built from the same objects without HTTP or the server
    objs = [o for _, o in sorted(api.objects["pods"].items())]
    gc.collect()
    tracemalloc.start()
    idx = ClusterIndex(owners=w.owners)
    idx.replace_pods(objs)
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del idx
    ips = [f"10.{64 + i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(0, args.pods, 7)]
    t = time.perf_counter()
    hits = sum(1 for ip in ips if w.index.lookup(ip) is not None)
    per_lookup = (time.perf_counter() - t) / len(ips)
    assert hits == len(ips)
    lags = []
    for i in range(50):
        t = time.perf_counter()
        api.put("pods", pod(f"new-{i}", f"10.200.0.{i}"))
        while w.index.lookup(f"10.200.0.{i}") is None:
            time.sleep(0.0005)
        lags.append(time.perf_counter() - t)
    w.stop()
    api.kill()
    lags.sort()
    print(
        json.dumps(
            {
                "pods": args.pods,
                "services": args.pods // 10,
                "deployments": args.deployments,
                "list_and_sync_seconds": round(sync, 2),
                "owner_lookups": w.owners.lookups,
                "index_mb": round(held / 2**20, 1),
                "index_bytes_per_pod": int(held / args.pods),
                "lookup_us": round(per_lookup * 1e6, 2),
                "watch_event_to_index_ms_p50_p99": [
                    round(lags[25] * 1e3, 1),
                    round(lags[49] * 1e3, 1),
                ],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
