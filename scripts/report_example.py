"""Writes docs/recorder/weekly-report-example.html and its first page as a PNG
(weekly-report-example.png): the weekly report of a fixed, fabricated week (2026-W47 of a
cluster "mi300-prod": pods, workloads, a GPU fault, a firmware change, a training
slowdown) in a throwaway SQLite database, with fixed utilization figures in place of
Prometheus, so the example is the same each time.

python scripts/report_example.py (needs Debian's chromium for the PNG)
"""

from __future__ import annotations

import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine  # noqa: E402

from lens_ebpf.recorder.reports import content, render, week, weekly  # noqa: E402
from lens_ebpf.recorder.scope import Scope  # noqa: E402
from lens_ebpf.recorder.store import schema as t  # noqa: E402
from lens_ebpf.recorder.store.writer import upgrade  # noqa: E402

OUT = ROOT / "docs" / "recorder"
WEEK = week.parse("2026-W47")
MON = WEEK.start
H = timedelta(hours=1)
CLUSTER = "mi300-prod"
# workload: (namespace, name, kind, team, [(pod, node, GPUs, start h, end h, utilization %)])
WORKLOADS = [
    (
        "llm",
        "llama-70b-pretrain",
        "PyTorchJob",
        "foundation",
        [
            (f"llama-70b-pretrain-worker-{i}", f"gpu-{i + 1}", 8, -30, 168, 82.0 - 3 * i)
            for i in range(4)
        ],
    ),
    (
        "llm",
        "mixtral-sft",
        "PyTorchJob",
        "foundation",
        [("mixtral-sft-master-0", "gpu-5", 8, 20, 110, 64.0)],
    ),
    (
        "research",
        "rl-sweep",
        "Job",
        "research",
        [(f"rl-sweep-{i}", "gpu-6", 2, 8 + 30 * i, 38 + 30 * i, 18.0) for i in range(4)],
    ),
    (
        "inference",
        "chat-serving",
        "Deployment",
        "serving",
        [
            ("chat-serving-7d9f-x2k", "gpu-7", 4, -200, 200, 23.0),
            ("chat-serving-7d9f-p8q", "gpu-7", 4, -200, 200, 21.0),
        ],
    ),
    (
        "notebooks",
        "jupyter-ana",
        "StatefulSet",
        "research",
        [("jupyter-ana-0", "gpu-8", 1, 10, 150, 3.0)],
    ),
]


class FixedUtilization:
    """Prometheus's place: each pod's utilization, the same every day."""

    url = "fixed"

    def __init__(self, util: dict[tuple[str, str], float]) -> None:
        self.util = util

    def instant(self, query: str, at: datetime) -> list[tuple[dict[str, str], float]]:
        return [({"namespace": ns, "pod": pod}, v) for (ns, pod), v in self.util.items()]


def seed(url: str) -> dict[tuple[str, str], float]:
    eng = create_engine(url)
    upgrade(eng, CLUSTER)
    util: dict[tuple[str, str], float] = {}
    with eng.begin() as conn:
        for ns, name, kind, team, pods in WORKLOADS:
            uid = f"wl-{name}"
            conn.execute(
                t.gpu_workloads.insert(),
                {
                    "cluster": CLUSTER,
                    "uid": uid,
                    "api_version": "v1",
                    "kind": kind,
                    "namespace": ns,
                    "name": name,
                    "gpu_request": 0,
                    "gpu_resources": {},
                    "labels": {"team": team},
                    "created_at": MON - 300 * H,
                    "updated_at": MON,
                },
            )
            for pod, node, gpus, start, end, u in pods:
                util[(ns, pod)] = u
                conn.execute(
                    t.gpu_pods.insert(),
                    {
                        "cluster": CLUSTER,
                        "uid": f"pod-{pod}",
                        "namespace": ns,
                        "name": pod,
                        "node": node,
                        "gpus": gpus,
                        "gpu_resources": {"amd.com/gpu": gpus},
                        "phase": "Running",
                        "workload_uid": uid,
                        "created_at": MON + start * H,
                        "started_at": MON + start * H,
                        "ended_at": MON + end * H if end < 168 else None,
                        "updated_at": MON,
                    },
                )
        conn.execute(
            t.allocation_snapshots.insert(),
            [
                {
                    "cluster": CLUSTER,
                    "at": MON + timedelta(days=d, hours=12),
                    "node": "",
                    "allocatable": 64,
                    "requested": 0,
                    "rate": 0.0,
                }
                for d in range(-7, 7)
            ],
        )
        conn.execute(
            t.node_events.insert(),
            {
                "cluster": CLUSTER,
                "node": "gpu-3",
                "seq": 1,
                "at": MON + 51 * H,
                "kind": "gpu_fault",
                "namespace": "llm",
                "pod": "llama-70b-pretrain-worker-2",
                "pod_uid": "pod-llama-70b-pretrain-worker-2",
                "payload": {
                    "gpu_index": 5,
                    "fault": "ras",
                    "code": "UMC",
                    "message": "uncorrectable ECC error",
                },
            },
        )
        conn.execute(
            t.device_changelog.insert(),
            {
                "cluster": CLUSTER,
                "at": MON + 99 * H,
                "node": "gpu-5",
                "kind": "gpu",
                "slot": "0000:0c:00.0",
                "device_key": "MI300X-0c",
                "field": "firmware_version",
                "old_value": "PLDM 0x12",
                "new_value": "PLDM 0x14",
            },
        )
        conn.execute(
            t.training_events.insert(),
            {
                "cluster": CLUSTER,
                "workload_uid": "wl-llama-70b-pretrain",
                "namespace": "llm",
                "workload": "llama-70b-pretrain",
                "pod": "llama-70b-pretrain-worker-2",
                "node": "gpu-3",
                "kind": "training_slowdown",
                "at": MON + 51 * H + 2 * H,
                "iteration": 41230,
                "value": 9.8,
                "baseline": 4.1,
                "detail": {},
            },
        )
    eng.dispose()
    return util


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="lens-report-example-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'example.db'}"
        util = seed(url)
        prom: Any = FixedUtilization(util)
        eng = create_engine(url)
        with eng.connect() as conn:
            made = weekly.make(
                conn,
                Scope(CLUSTER, prom),
                WEEK,
                WEEK.end + 9 * H,
                content.Options(label_keys=("team",)),
                chromium=None,
            )
        eng.dispose()
        page = OUT / "weekly-report-example.html"
        page.write_text(made.html)
        png = OUT / "weekly-report-example.png"
        render.screenshot(page, png, size="1000,1400")
        print(f"wrote {page} ({page.stat().st_size} bytes), {png} ({png.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
