"""Recorder figures: how fast a cluster's GPU pods and their workloads land in the database
at start (the first list), and how fast a stream of pod changes is stored afterwards, on
SQLite and (with --postgres, root) a PostgreSQL from Debian's package, against the local API
stand-in (tests/k8slab.py), which runs in this process and shares its CPU and GIL.

    .venv/bin/python -m bench.recorder [--deployments 200] [--pods 4] [--updates 2000] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select

from lens_ebpf.k8s.client import api_client
from lens_ebpf.recorder import config
from lens_ebpf.recorder.service import RecorderApp
from lens_ebpf.recorder.store import schema
from tests.k8slab import FakeApiServer
from tests.recorder.objects import gpu_pod, state, template


def count(url: str, table: str) -> int:
    eng = create_engine(url)
    with eng.connect() as conn:
        n = conn.execute(select(func.count()).select_from(schema.metadata.tables[table])).scalar()
    eng.dispose()
    return int(n or 0)


def wait(check: Any, timeout: float = 600) -> float:
    start = time.perf_counter()
    while not check():
        if time.perf_counter() - start > timeout:
            raise TimeoutError
        time.sleep(0.05)
    return time.perf_counter() - start


def run(url: str, deployments: int, pods: int, updates: int) -> dict[str, Any]:
    api = FakeApiServer().start()
    spec = {"replicas": pods, "template": template("nvidia.com/gpu", 1)}
    first = []
    for d in range(deployments):
        meta = {"name": f"app-{d}", "namespace": "ml", "uid": f"uid-d{d}"}
        api.put(
            "deployments",
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": spec,
                "status": {"replicas": pods, "readyReplicas": pods},
            },
        )
        rs = {
            "name": f"app-{d}-5d",
            "namespace": "ml",
            "uid": f"uid-r{d}",
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": f"app-{d}",
                    "uid": f"uid-d{d}",
                    "controller": True,
                }
            ],
        }
        api.put(
            "replicasets",
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": rs,
                "spec": spec,
                "status": {"replicas": pods},
            },
        )
        for i in range(pods):
            p = gpu_pod(f"app-{d}-5d-{i}", "trainer-5d9f", "nvidia.com/gpu", 1, f"gpu-{d % 64}")
            p["metadata"]["ownerReferences"][0].update(name=f"app-{d}-5d", uid=f"uid-r{d}")
            api.put("pods", state(p, "Running", True))
            first.append(p)
    with tempfile.TemporaryDirectory() as tmp:
        kc = api.kubeconfig(Path(tmp) / "kc")
        over = {
            ("recorder", "database_url"): url,
            ("recorder", "listen"): "127.0.0.1:0",
            ("recorder", "collect_listen"): "",
            ("recorder", "finalizers"): False,
        }
        cfg = config.load(env={}, overrides=over)
        app = RecorderApp(cfg, api_client("kubeconfig", str(kc)))
        total = deployments * pods
        start = time.perf_counter()
        app.start()
        wait(lambda: app.tracker.pod_reflector.synced.is_set())
        listed = time.perf_counter() - start
        wait(lambda: count(url, "gpu_pods") == total and app.writer.flush(0.01))
        stored = time.perf_counter() - start
        # a stream of changes: each a restart of some pod
        events0 = count(url, "gpu_pods_events")
        start = time.perf_counter()
        for n in range(updates):
            p = first[n % total]
            api.put("pods", state(p, "Running", True, restarts=1 + n // total))
        wait(lambda: count(url, "gpu_pods_events") - events0 >= updates and app.writer.flush(0.01))
        streamed = time.perf_counter() - start
        w = app.writer
        batches = sum(w.writes.counts)  # every commit
        out = {
            "pods": total,
            "workloads": 2 * deployments,
            "first_list_seconds": round(listed, 2),
            "first_list_stored_seconds": round(stored, 2),
            "pods_per_second_at_start": round(total / stored, 1),
            "updates": updates,
            "updates_stored_seconds": round(streamed, 2),
            "updates_per_second": round(updates / streamed, 1),
            "commits": batches,
            "mean_commit_ms": round(1000 * w.writes.total / max(1, batches), 2),
            # what the recorder keeps per pod to derive the next change: its last snapshot
            "snapshot_json_bytes_per_pod": round(
                sum(len(json.dumps(p.snap, default=str)) for p in app.tracker.pods.values())
                / max(1, len(app.tracker.pods))
            ),
        }
        app.stop()
    api.kill()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.recorder")
    ap.add_argument("--deployments", type=int, default=200)
    ap.add_argument("--pods", type=int, default=4, help="GPU pods per Deployment")
    ap.add_argument("--updates", type=int, default=2000)
    ap.add_argument("--postgres", action="store_true", help="also on PostgreSQL (root)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        res = {"sqlite": run(f"sqlite:///{d}/bench.db", args.deployments, args.pods, args.updates)}
    if args.postgres:
        from tests import pglab

        pg = pglab.Postgres().init()
        try:
            res["postgresql"] = run(
                pg.create_database("bench"), args.deployments, args.pods, args.updates
            )
        finally:
            pg.destroy()
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
