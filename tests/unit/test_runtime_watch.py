"""The container runtime watcher on a real inotify: containerd's task tree made after the
agent started, a container of a few milliseconds, and one whose name comes back. The
once-a-second poll is switched off (an hour), so only inotify can find them; and the
poll walks the tree only while part of it is unwatched."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from lens_ebpf.agent.containers.runtime import TASK_DIRS
from lens_ebpf.agent.containers.watch import RuntimeWatcher
from tests.conftest import hang_guard


class Seen:
    """on_change: the init.pid each call found in the container's directory."""

    def __init__(self, container: Path) -> None:
        self.container = container
        self.pids: list[str] = []
        self.changed = threading.Condition()

    def __call__(self) -> None:
        try:
            pid = (self.container / "init.pid").read_text()
        except OSError:
            pid = ""
        with self.changed:
            self.pids.append(pid)
            self.changed.notify_all()

    def wait(self, pid: str) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: pid in self.pids, hang_guard(10))


def test_a_task_root_made_after_the_start_is_watched_and_its_first_container_seen(
    tmp_path: Path,
) -> None:
    """containerd makes its task root, the namespace and the container's directory with
    the first container, all at once; the container writes its pid and ends: the watcher
    saw it while its directory stood."""
    c1 = tmp_path / TASK_DIRS[0] / "default" / "c1"
    seen = Seen(c1)
    watcher = RuntimeWatcher(tmp_path, seen, poll_seconds=3600)
    watcher.start()
    try:
        c1.mkdir(parents=True)
        (c1 / "config.json").write_text("{}")
        (c1 / "init.pid").write_text("101")
        assert seen.wait("101"), seen.pids
        shutil.rmtree(c1)  # it ended; the same name again is a new container, watched
        c1.mkdir()
        (c1 / "init.pid").write_text("202")
        assert seen.wait("202"), seen.pids
    finally:
        watcher.stop()


def test_the_rest_of_containerds_state_is_not_watched(tmp_path: Path) -> None:
    """Only the task roots under the state directory: containerd's other directories
    (its CRI plugin's, its sockets) are none of the watcher's."""
    (tmp_path / "io.containerd.grpc.v1.cri" / "sandboxes").mkdir(parents=True)
    c2 = tmp_path / TASK_DIRS[0] / "k8s.io" / "c2"
    seen = Seen(c2)
    watcher = RuntimeWatcher(tmp_path, seen, poll_seconds=3600)
    watcher.start()
    try:
        (tmp_path / "io.containerd.grpc.v1.cri" / "containers").mkdir()
        c2.mkdir(parents=True)
        (c2 / "init.pid").write_text("303")
        assert seen.wait("303"), seen.pids
        watched = {p.relative_to(tmp_path).as_posix() for p in watcher._paths}
        assert watched == {".", TASK_DIRS[0], f"{TASK_DIRS[0]}/k8s.io", f"{TASK_DIRS[0]}/k8s.io/c2"}
    finally:
        watcher.stop()


def test_the_tree_is_walked_again_only_while_part_of_it_is_unwatched(tmp_path: Path) -> None:
    """A state directory made after the start is found by the poll (every 50 ms here);
    once it is watched, inotify alone tells what changes: no walk of the tree again."""
    state = tmp_path / "state"
    c3 = state / TASK_DIRS[0] / "default" / "c3"
    seen = Seen(c3)
    watcher = RuntimeWatcher(state, seen, poll_seconds=0.05)
    watcher.start()
    try:
        deadline = time.monotonic() + hang_guard(10)
        while watcher.walks < 3:  # the start's, and the poll's while the directory is absent
            assert time.monotonic() < deadline, watcher.walks
            time.sleep(0.01)
        c3.mkdir(parents=True)
        (c3 / "init.pid").write_text("404")
        assert seen.wait("404"), seen.pids
        walks = watcher.walks
        for pid in ("405", "406"):  # changes, and quiet time: no walk for either
            (c3 / "init.pid").write_text(pid)
            assert seen.wait(pid), seen.pids
        time.sleep(0.5)
        assert watcher.walks == walks
    finally:
        watcher.stop()
