"""A private containerd (own root, state and socket) running busybox containers with runc."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tests.agentproc import stop_process
from tests.conftest import hang_guard

BUSYBOX = shutil.which("busybox") or "/bin/busybox"
APPLETS = ("sh", "true", "false", "echo", "sleep", "cat", "ls", "head", "tr")


def unavailable() -> str | None:
    for tool in ("containerd", "ctr", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh test installs it)"
    if not Path(BUSYBOX).exists():
        return "busybox-static is not installed"
    return None


class Containerd:
    """containerd with its socket, state and log in `base` (removed at stop); its root
    (content, snapshots, metadata) there too, or in `root`, kept between runs."""

    def __init__(self, base: Path, root: Path | None = None) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.sock = base / "c.sock"
        self.state = base / "state"
        self.rootfs = base / "rootfs"
        self._make_rootfs()
        self.log = open(base / "log", "w")  # noqa: SIM115 (open while containerd runs)
        self.proc = subprocess.Popen(
            [
                "containerd",
                "--root",
                str(root or base / "root"),
                "--state",
                str(self.state),
                "--address",
                str(self.sock),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + hang_guard(20)
        while time.monotonic() < deadline:
            if self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise AssertionError("hang guard: containerd did not start: " + (base / "log").read_text())

    def _make_rootfs(self) -> None:
        for d in ("bin", "proc", "sys", "dev", "tmp", "etc"):
            (self.rootfs / d).mkdir(parents=True, exist_ok=True)
        shutil.copy2(BUSYBOX, self.rootfs / "bin" / "busybox")
        for a in APPLETS:
            link = self.rootfs / "bin" / a
            if not link.exists():
                link.symlink_to("busybox")

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 15
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ctr", "--address", str(self.sock), *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=hang_guard(timeout),
        )

    def run(
        self,
        cid: str,
        *cmd: str,
        labels: dict[str, str] | None = None,
        devices: tuple[str, ...] = (),
        cgroup: str | None = None,
        memory: int = 0,
        env: dict[str, str] | None = None,
        detach: bool = False,
        check: bool = False,
        rootfs: Path | None = None,
        net_host: bool = False,
    ) -> subprocess.CompletedProcess:
        args = ["run", "-d" if detach else "--rm"]
        if net_host:
            args.append("--net-host")
        for k, v in (labels or {}).items():
            args += ["--label", f"{k}={v}"]
        for d in devices:
            args += ["--device", d]
        for k, v in (env or {}).items():
            args += ["--env", f"{k}={v}"]
        if cgroup:
            args += ["--cgroup", cgroup]
        if memory:
            args += ["--memory-limit", str(memory)]
        args += ["--rootfs", str(rootfs or self.rootfs), cid, *cmd]
        return self.ctr(*args, check=check)

    def remove(self, cid: str) -> None:
        self.ctr("task", "kill", "-s", "KILL", cid, check=False)
        # the task is removable once its process is gone; it may be gone already
        deadline = time.monotonic() + hang_guard(5)
        while self.ctr("task", "rm", cid, check=False).returncode != 0:
            if time.monotonic() > deadline:
                break  # no task (it had ended): the container goes all the same
            time.sleep(0.1)
        self.ctr("container", "rm", cid, check=False)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
        subprocess.run(["umount", "-R", str(self.state)], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


def private_containerd(tag: str) -> Iterator[Containerd]:
    """A fixture's body: a private containerd under /tmp/lens-ctd-<tag><pid>, stopped
    afterwards; the test skips where containerd, runc or busybox is missing."""
    if reason := unavailable():
        pytest.skip(reason)
    c = Containerd(Path(f"/tmp/lens-ctd-{tag}{os.getpid()}"))
    yield c
    c.stop()


def make_char_device(path: Path, major: int, minor: int) -> bool:
    """A device node standing in for a GPU or RDMA device; False when it already existed."""
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o600 | 0o020000, os.makedev(major, minor))
    return True


# Stand-in device nodes are the host's, and both of make test's workers make the same
# ones at once (/dev/dri/renderD128: the host's containers here, the Kubernetes lab's
# device plugin there): whoever uses them holds DEVNODES/lock shared, a node a test made
# is marked in DEVNODES/made, and the last to let go removes every marked one.
DEVNODES = Path("/run/lens-test-devnodes")


def _marker(path: Path) -> Path:
    return DEVNODES / "made" / str(path).strip("/").replace("/", "%")


@contextlib.contextmanager
def shared_char_devices(nodes: Iterable[tuple[Path, int, int]]) -> Iterator[None]:
    """The nodes, (path, major, minor), made where missing while the block runs; removed
    after it by the last process of the tests using any (a node the tests did not make,
    a real GPU's, stays)."""
    nodes = list(nodes)
    (DEVNODES / "made").mkdir(parents=True, exist_ok=True)
    with open(DEVNODES / "lock", "a") as lock:  # its descriptor is the lock
        while True:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for path, major, minor in nodes:
                if make_char_device(path, major, minor):
                    _marker(path).write_text(str(path))
            # shared from here; the change lets the lock go for an instant, in which the
            # last other user may have removed them: then again
            fcntl.flock(lock, fcntl.LOCK_SH)
            if all(path.exists() for path, _, _ in nodes):
                break
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no one else holds it
                for mark in (DEVNODES / "made").iterdir():
                    path = Path(mark.read_text())
                    path.unlink(missing_ok=True)
                    mark.unlink()
                    with contextlib.suppress(OSError):  # not empty: others' nodes
                        path.parent.rmdir()


def gpu_and_rdma_nodes() -> Iterator[tuple[str, str]]:
    """A fixture's body: /dev/dri/renderD128 (an AMD GPU's render node, 226:128) and
    /dev/infiniband/uverbs0 (an RDMA device's, 231:192) for containers to be given, made
    where missing and removed afterwards (shared_char_devices)."""
    render, uverbs = Path("/dev/dri/renderD128"), Path("/dev/infiniband/uverbs0")
    with shared_char_devices([(render, 226, 128), (uverbs, 231, 192)]):
        yield str(render), str(uverbs)
