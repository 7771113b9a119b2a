"""A TCP balancer in front of several backends, as kube-proxy puts a Service in front of a
Deployment's pods: each new connection goes to the next backend in turn that accepts
it (a dead one is passed over), and its bytes are piped both ways until either side
closes. What a client of a Service sees when a replica dies: its connection ends, and
its next one lands on a live replica."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading


class Balancer:
    def __init__(self, backends: list[tuple[str, int]]) -> None:
        self.backends = list(backends)
        self._next = itertools.count()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(512)
        self.port = int(self._sock.getsockname()[1])
        self.connections: dict[tuple[str, int], int] = dict.fromkeys(self.backends, 0)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name="balancer").start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _connect(self) -> tuple[socket.socket, tuple[str, int]] | None:
        for _ in range(len(self.backends)):
            backend = self.backends[next(self._next) % len(self.backends)]
            try:
                return socket.create_connection(backend, timeout=2), backend
            except OSError:
                continue
        return None

    def _serve(self, client: socket.socket) -> None:
        got = self._connect()
        if got is None:
            client.close()
            return
        upstream, backend = got
        upstream.settimeout(None)
        with self._lock:
            self.connections[backend] += 1
            self._open |= {client, upstream}
        done = threading.Event()

        def pipe(src: socket.socket, dst: socket.socket) -> None:
            try:
                while chunk := src.recv(65536):
                    dst.sendall(chunk)
            except OSError:
                pass
            finally:
                done.set()

        for a, b in ((upstream, client), (client, upstream)):
            threading.Thread(target=pipe, args=(a, b), daemon=True).start()
        done.wait()  # either side ended: both end (the other's recv wakes on shutdown)
        for s in (client, upstream):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        with self._lock:
            self._open -= {client, upstream}

    def stop(self) -> None:
        self._stopped.set()
        self._sock.close()
        with self._lock:
            held = list(self._open)
        for s in held:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
