"""Python "ranks" in real containerd containers for the deep-dive tests: a busybox rootfs
with the host's /usr bound read-only (its python3), each container labelled as a pod's,
and an agent (no BPF) whose gRPC port takes two static tokens: the recorder's and
someone else's."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.agentproc import AgentProc, free_port
from tests.conftest import wait_for
from tests.containerlab import Containerd, private_containerd

RECORDER_TOKEN, OTHER_TOKEN = "recorder-" + uuid.uuid4().hex, "other-" + uuid.uuid4().hex
# a rank: its main function spins (so a sample sees it), waits in the collective as ranks
# of a stalled job do (barrier), or is stuck elsewhere (stuck); it starts a non-Python
# child (sleep) and a Python one (a spinning helper)
RANK = """\
import subprocess, sys, time
def wait_in_barrier():
    time.sleep(3600)
def load_next_batch():
    time.sleep(3600)
def spin_in_train_step():
    while True:
        sum(range(1000))
MODES = {"spin": spin_in_train_step, "barrier": wait_in_barrier, "stuck": load_next_batch}
def main(mode):
    subprocess.Popen(["/bin/sleep", "3600"])
    subprocess.Popen(["/usr/bin/python3", "-c", "while True: sum(range(100))"])
    MODES[mode]()
main(sys.argv[1])
"""


def containerd_with_python(tag: str) -> Iterator[Containerd]:
    """A fixture's body: private_containerd, its rootfs ready for python3 from /usr."""
    for ctd in private_containerd(tag):
        for name in ("lib", "lib64"):
            link = ctd.rootfs / name
            if not link.exists() and Path("/" + name).is_symlink():
                link.symlink_to("usr/" + name)
        (ctd.rootfs / "usr").mkdir(exist_ok=True)
        (ctd.rootfs / "app").mkdir(exist_ok=True)
        (ctd.rootfs / "app" / "rank.py").write_text(RANK)
        yield ctd


@dataclass
class Rank:
    cid: str
    pod_uid: str
    pod_name: str
    pid: int  # the host pid of the container's init (the rank's main Python process)


def start_rank(ctd: Containerd, pod: str, mode: str, namespace: str = "team-a") -> Rank:
    """A container running rank.py (mode spin, barrier or stuck) as pod's; its processes
    up."""
    cid, uid = "rank-" + uuid.uuid4().hex[:12], str(uuid.uuid4())
    labels = {
        "io.kubernetes.pod.name": pod,
        "io.kubernetes.pod.namespace": namespace,
        "io.kubernetes.pod.uid": uid,
        "io.kubernetes.container.name": "trainer",
    }
    args = ["run", "-d", "--mount", "type=bind,src=/usr,dst=/usr,options=rbind:ro"]
    for k, v in labels.items():
        args += ["--label", f"{k}={v}"]
    res = ctd.ctr(
        *args,
        "--rootfs",
        str(ctd.rootfs),
        cid,
        "/usr/bin/python3",
        "/app/rank.py",
        mode,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    pid_file = ctd.state / "io.containerd.runtime.v2.task" / "default" / cid / "init.pid"
    pid = wait_for(lambda: pid_file.exists() and int(pid_file.read_text()), f"{cid}'s init pid")
    wait_for(lambda: len(children(pid)) == 2, f"{cid}'s two children", every=0.1)
    return Rank(cid, uid, pod, pid)


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return sorted(int(x) for x in text.split())


def agent_for(
    ctd: Containerd, tmp: Path, *args: str, env: dict[str, str] | None = None, node: str = "node-a"
) -> tuple[AgentProc, str]:
    """An agent without BPF reading ctd's containers; (it, its gRPC address)."""
    tokens = tmp / "agent-tokens"
    tokens.write_text(f"lens-ebpf-recorder {RECORDER_TOKEN}\nsomeone-else {OTHER_TOKEN}\n")
    os.chmod(tokens, 0o600)
    address = f"127.0.0.1:{free_port()}"
    agent = AgentProc(
        "--no-collector.tcp",
        "--no-collector.processes",
        *args,
        env={
            "LENS_CONTAINERS__CONTAINERD_STATE": str(ctd.state),
            "LENS_GRPC__LISTEN": address,
            "LENS_GRPC__AUTH__TOKENREVIEW": "false",
            "LENS_GRPC__AUTH__TOKENS_FILE": str(tokens),
            "LENS_NODE__NAME": node,
            **(env or {}),
        },
    )
    agent.wait_ready()
    return agent, address
