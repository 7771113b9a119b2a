"""Connection load in a process of its own, so the load stays off the test's GIL, where
the ring-buffer callbacks run. Prints the listener's port.

    python -m tests.loadgen SERVER CLIENT N
        N connect/close cycles, the client at most 1000 connections ahead of the accept
        loop so the accept queue never overflows.
    python -m tests.loadgen --split SEND REPLY --threads T SERVER CLIENT N
        N connections, T at a time: the client writes SEND bytes in two halves with a
        pause between them; the server peeks, then reads all SEND bytes with one
        MSG_WAITALL recv (it copies the first half, waits, copies the rest), and answers
        REPLY bytes the same way. Reads that span a wait, peeks and several connections
        at once: what a byte counter must not count twice.

The client always closes first (TIME_WAIT stays on its side) and its port is chosen at
connect() by 4-tuple (IP_BIND_ADDRESS_NO_PORT), so repeated runs neither run out of
ports nor collide with old TIME_WAIT sockets.
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

IP_BIND_ADDRESS_NO_PORT = 24
PAUSE = 0.002  # between the two halves of a write: the reader is waiting by then


def _listen(server: str) -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind((server, 0))
    srv.listen(4096)
    return srv, int(srv.getsockname()[1])


def _connect(client: str, server: str, port: int) -> socket.socket:
    c = socket.socket()
    c.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
    c.bind((client, 0))
    c.connect((server, port))
    return c


def burst(server: str, client: str, n: int) -> int:
    srv, port = _listen(server)
    ahead = threading.Semaphore(1000)

    def serve() -> None:
        for _ in range(n):
            conn, _ = srv.accept()
            ahead.release()
            conn.recv(1)  # the client's FIN
            conn.close()

    t = threading.Thread(target=serve)
    t.start()
    for _ in range(n):
        if not ahead.acquire(timeout=600):  # a hang guard, however slow the machine
            raise SystemExit("accept loop stalled")
        _connect(client, server, port).close()
    t.join()
    srv.close()
    return port


def _write_in_halves(s: socket.socket, n: int, byte: bytes) -> None:
    s.sendall(byte * (n // 2))
    time.sleep(PAUSE)
    s.sendall(byte * (n - n // 2))


def _read_all_at_once(s: socket.socket, n: int) -> None:
    """One MSG_WAITALL recv for all n bytes (a signal may cut it short: read on)."""
    got = 0
    while got < n:
        chunk = s.recv(n - got, socket.MSG_WAITALL)
        if not chunk:
            raise SystemExit(f"connection closed after {got} of {n} bytes")
        got += len(chunk)


def split(server: str, client: str, n: int, send: int, reply: int, threads: int) -> int:
    srv, port = _listen(server)

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.recv(16, socket.MSG_PEEK)  # a peek reads nothing out: it must count nothing
            _read_all_at_once(conn, send)
            _write_in_halves(conn, reply, b"r")
            conn.recv(1)  # the client's FIN

    def serve() -> None:
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(n):
                pool.submit(handle, srv.accept()[0])

    def one(_: int) -> None:
        with _connect(client, server, port) as c:
            _write_in_halves(c, send, b"s")
            _read_all_at_once(c, reply)

    t = threading.Thread(target=serve)
    t.start()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(n)))  # re-raises a client's failure
    t.join()
    srv.close()
    return port


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m tests.loadgen",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("server")
    ap.add_argument("client")
    ap.add_argument("n", type=int)
    ap.add_argument("--split", nargs=2, type=int, metavar=("SEND", "REPLY"))
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    if args.split:
        send, reply = args.split
        print(split(args.server, args.client, args.n, send, reply, args.threads))
    else:
        print(burst(args.server, args.client, args.n))


if __name__ == "__main__":
    main()
