"""inotify on containerd's task directories: a new container is indexed the moment its
spec (config.json) and then its init.pid are written, however short its life, rather
than whenever the next exec or read cycle happens to look."""

from __future__ import annotations

import ctypes
import logging
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from lens_ebpf.agent.containers.runtime import TASK_DIRS

log = logging.getLogger(__name__)

IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x8, 0x80, 0x100, 0x200
IN_ISDIR, IN_NONBLOCK, IN_CLOEXEC = 0x40000000, 0x800, 0x80000
MASK = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE
EVENT = struct.Struct("iIII")


class RuntimeWatcher:
    """Calls on_change when containerd adds or removes a task or writes its files."""

    def __init__(self, state_dir: Path, on_change: Callable[[], object]) -> None:
        self.state_dir = state_dir
        self.on_change = on_change
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._watched: dict[int, Path] = {}
        self._paths: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runtime-watch", daemon=True)

    def _watch(self, path: Path) -> None:
        if path in self._paths or not path.is_dir():
            return
        wd = self._libc.inotify_add_watch(self._fd, str(path).encode(), MASK)
        if wd >= 0:
            self._watched[wd] = path
            self._paths.add(path)

    def _watch_tree(self) -> None:
        """The task roots, each containerd namespace, and each container directory."""
        for task_dir in TASK_DIRS:
            root = self.state_dir / task_dir
            self._watch(root)
            for ns in (p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
                self._watch(ns)
                for c in (p for p in ns.iterdir() if p.is_dir()):
                    self._watch(c)

    def start(self) -> None:
        self._watch_tree()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self._fd)

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 1.0)
            if not ready:
                self._watch_tree()  # a task root containerd created since
                continue
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                continue
            changed = False
            off = 0
            while off + EVENT.size <= len(data):
                wd, mask, _cookie, length = EVENT.unpack_from(data, off)
                name = data[off + EVENT.size : off + EVENT.size + length].rstrip(b"\0")
                off += EVENT.size + length
                parent = self._watched.get(wd)
                if parent is not None and mask & IN_CREATE and mask & IN_ISDIR:
                    self._watch(parent / name.decode(errors="replace"))
                changed = True
            if changed:
                try:
                    self.on_change()
                except Exception:  # the watcher must outlive a bad refresh
                    log.exception("container refresh failed")
