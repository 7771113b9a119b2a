"""A training "rank" in a real containerd container that wrote PyTorch profiler traces: the
HolisticTraceAnalysis fixtures (shared/fixtures/profiler, real torch.profiler output) laid
in its filesystem where torch.profiler would put them, found through its cwd, its
--profile-dir argument, its TORCH_PROFILER_DIR and a configured glob; beside them a
malformed trace, a 2 GiB sparse one and a link out of the container."""

from __future__ import annotations

import gzip
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import wait_for
from tests.containerlab import Containerd

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "profiler"
if not FIXTURES.is_dir():  # CI's clone: shared/ beside the repository
    FIXTURES = Path(__file__).resolve().parents[1] / "shared" / "fixtures" / "profiler"
# in the container: what torch.profiler's tensorboard_trace_handler would name each
LAYOUT = {
    # --profile-dir /prof: the two NCCL ranks (their rank in distributedInfo, not the name)
    "/prof/step5/node-a_4037.1682725898236.pt.trace.json.gz": "trace_filter_sampled_rank-0.json.gz",
    "/prof/step5/node-a_4045.1682725898079.pt.trace.json.gz": "trace_filter_sampled_rank-1.json.gz",
    # the cwd (/work): the MI250 rank, decompressed (a .pt.trace.json)
    "/work/mi250.pt.trace.json": "amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    # TORCH_PROFILER_DIR=/torchprof: the CPU-only rank 34 (its name says so)
    "/torchprof/cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": (
        "cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    ),
    # a configured glob (/out/*.json.gz): the two NCCL 2.17 ranks in one file
    "/out/nccl_data.json.gz": "nccl_parser_config_nccl_data.json.gz",
}
MALFORMED = "/bad/broken.pt.trace.json"  # alone: an analysis of it reads it alone
HUGE = "/prof/huge.pt.trace.json"  # 2 GiB, sparse; beside step5/, not in it
HUGE_BYTES = 2 << 30
LINK = "/prof/escape.pt.trace.json"  # -> /etc/hostname: must not be listed nor sent
GLOBS = '["/out/*.json.gz", "/bad/*.pt.trace.json"]'


def fixture_bytes(name: str) -> bytes:
    raw = (FIXTURES / name).read_bytes()
    return raw


def lay_out(rootfs: Path) -> dict[str, bytes]:
    """The traces in the rootfs; what each path's bytes are."""
    want: dict[str, bytes] = {}
    for path, name in LAYOUT.items():
        raw = fixture_bytes(name)
        data = gzip.decompress(raw) if not path.endswith(".gz") else raw
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        want[path] = data
    (rootfs / "bad").mkdir(exist_ok=True)
    (rootfs / MALFORMED.lstrip("/")).write_bytes(b'{"schemaVersion": 1, "traceEvents": [{"ph": ')
    with open(rootfs / HUGE.lstrip("/"), "wb") as f:
        f.truncate(HUGE_BYTES)
    link = rootfs / LINK.lstrip("/")
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to("/etc/hostname")
    return want


@dataclass
class Trainer:
    cid: str
    pod_uid: str
    pod_name: str
    namespace: str
    pid: int
    files: dict[str, bytes]


def start_trainer(
    ctd: Containerd, pod: str = "train-0", namespace: str = "team-a", uid: str = ""
) -> Trainer:
    """A container whose Python process sleeps with --profile-dir /prof, cwd /work and
    TORCH_PROFILER_DIR=/torchprof, as pod's; its traces laid out first."""
    files = lay_out(ctd.rootfs)
    cid, uid = "trainer-" + uuid.uuid4().hex[:12], uid or str(uuid.uuid4())
    labels = {
        "io.kubernetes.pod.name": pod,
        "io.kubernetes.pod.namespace": namespace,
        "io.kubernetes.pod.uid": uid,
        "io.kubernetes.container.name": "trainer",
    }
    args = [
        "run",
        "-d",
        "--cwd",
        "/work",
        "--env",
        "TORCH_PROFILER_DIR=/torchprof",
        "--mount",
        "type=bind,src=/usr,dst=/usr,options=rbind:ro",
    ]
    for k, v in labels.items():
        args += ["--label", f"{k}={v}"]
    res = ctd.ctr(
        *args,
        "--rootfs",
        str(ctd.rootfs),
        cid,
        "/usr/bin/python3",
        "-c",
        "import time; time.sleep(3600)",
        "--profile-dir",
        "/prof",
        check=False,
    )
    assert res.returncode == 0, res.stderr
    pid_file = ctd.state / "io.containerd.runtime.v2.task" / "default" / cid / "init.pid"
    pid = wait_for(lambda: pid_file.exists() and int(pid_file.read_text()), f"{cid}'s pid")
    wait_for(lambda: os.readlink(f"/proc/{pid}/cwd") == "/work", f"{cid} in /work", every=0.05)
    return Trainer(cid, uid, pod, namespace, pid, files)


def clear(rootfs: Path) -> None:
    for top in ("prof", "work", "torchprof", "out", "bad"):
        shutil.rmtree(rootfs / top, ignore_errors=True)
