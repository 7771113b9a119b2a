"""inotify on containerd's task directories: a new container is indexed the moment its
spec (config.json) and then its init.pid are written, however short its life, rather
than whenever the next exec or read cycle happens to look.

The tree is state/<task root>/<namespace>/<container>. containerd makes a task root and
a namespace's directory only with their first container, so the state directory itself
is watched for a task root, and a directory created under a watched one is walked as
soon as it is watched: whatever was made in it before the watch took is watched too, and
counts as a change. (Before, a task root made after the agent started was found by a
once-a-second poll: the first containers of a runtime that had run none, a few
milliseconds each, came and went unseen.) The whole tree is walked again, once a
poll_seconds, only while some of it is not watched: the state directory not made yet, or
a watch the kernel refused; otherwise inotify alone says what changed."""

from __future__ import annotations

import ctypes
import logging
import os
import select
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from lens_ebpf.agent.containers.runtime import TASK_DIRS

log = logging.getLogger(__name__)

IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x8, 0x80, 0x100, 0x200
IN_ISDIR, IN_NONBLOCK, IN_CLOEXEC = 0x40000000, 0x800, 0x80000
IN_Q_OVERFLOW, IN_IGNORED = 0x4000, 0x8000  # sent whatever the mask
MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE
EVENT = struct.Struct("iIII")
CONTAINER_DEPTH = 3  # state/<task root>/<namespace>/<container>
TICK = 0.5  # how soon stop() is heard


class RuntimeWatcher:
    """Calls on_change when containerd adds or removes a task or writes its files."""

    def __init__(
        self, state_dir: Path, on_change: Callable[[], object], poll_seconds: float = 1.0
    ) -> None:
        self.state_dir = state_dir
        self.on_change = on_change
        # how often the tree is walked again while some of it is not watched: the state
        # directory not made yet, or a watch the kernel refused (fs.inotify.max_user_watches)
        self.poll_seconds = poll_seconds
        self._unwatched = False
        self.walks = 0  # whole-tree walks, the first included
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._watched: dict[int, Path] = {}
        self._paths: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runtime-watch", daemon=True)

    def _watch(self, path: Path) -> bool:
        """Watch one directory; whether it was not watched before."""
        if path in self._paths or not path.is_dir():
            return False
        wd = self._libc.inotify_add_watch(self._fd, str(path).encode(), MASK)
        if wd < 0:
            self._unwatched = self._unwatched or path.is_dir()  # refused, not gone: again later
            return False
        self._watched[wd] = path
        self._paths.add(path)
        return True

    def _watch_tree(self) -> bool:
        """The state directory, the task roots, each containerd namespace and each
        container directory; whether any of them was not watched before."""
        self.walks += 1
        self._unwatched = False
        return self._watch_below(self.state_dir, 0)

    def _watch_below(self, path: Path, depth: int) -> bool:
        """path (depth 0 the state directory, 1 a task root, 2 a namespace, 3 a container)
        and the directories below it down to the containers'; whether any of them was not
        watched before."""
        new = self._watch(path)
        if depth == 0:
            below = [path / task_dir for task_dir in TASK_DIRS]
        else:
            below = _subdirs(path) if depth < CONTAINER_DEPTH else []
        for child in below:
            new |= self._watch_below(child, depth + 1)
        return new

    def _depth(self, path: Path) -> int:
        return len(path.relative_to(self.state_dir).parts)

    def start(self) -> None:
        self._watch_tree()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self._fd)

    def _run(self) -> None:
        polled = time.monotonic()
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], min(TICK, self.poll_seconds))
            partial = self._unwatched or self.state_dir not in self._paths
            if partial and time.monotonic() - polled >= self.poll_seconds:
                polled = time.monotonic()
                if self._watch_tree():  # the state directory made since, or a watch taken
                    self._changed()
            if not ready:
                continue
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            changed, made = False, []  # made: (a new directory, its depth)
            off = 0
            while off + EVENT.size <= len(data):
                wd, mask, _cookie, length = EVENT.unpack_from(data, off)
                name = data[off + EVENT.size : off + EVENT.size + length].rstrip(b"\0")
                off += EVENT.size + length
                if mask & IN_Q_OVERFLOW:  # events were lost: look at everything
                    made.append((self.state_dir, 0))
                    changed = True
                    continue
                parent = self._watched.get(wd)
                if parent is None:
                    continue
                if mask & IN_IGNORED:  # the directory went: a new one of its name is new
                    del self._watched[wd]
                    self._paths.discard(parent)
                    continue
                depth, child = self._depth(parent), name.decode(errors="replace")
                if depth == 0 and child not in TASK_DIRS:
                    continue  # the rest of containerd's state: not containers
                if mask & IN_CREATE and mask & IN_ISDIR and depth < CONTAINER_DEPTH:
                    made.append((parent / child, depth + 1))
                changed = True
            for path, depth in made:  # each, and what was made in it before its watch
                self._watch_below(path, depth)
            if changed:
                self._changed()

    def _changed(self) -> None:
        try:
            self.on_change()
        except Exception:  # the watcher must outlive a bad refresh
            log.exception("container refresh failed")


def _subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir()]
    except OSError:  # not made yet, or gone
        return []
