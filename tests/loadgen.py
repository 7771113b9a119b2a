"""Connection load in a process of its own: `python -m tests.loadgen SERVER CLIENT N`.

Runs a listener on SERVER and N connect/close cycles from CLIENT, the client at
most 1000 connections ahead of the accept loop so the accept queue never
overflows. The client always closes first (TIME_WAIT stays on its side) and its
port is chosen at connect() by 4-tuple (IP_BIND_ADDRESS_NO_PORT), so repeated runs
neither run out of ports nor collide with old TIME_WAIT sockets. Prints the
listener's port. A separate process keeps the load off the test's GIL, where the
ring-buffer callbacks run.
"""

from __future__ import annotations

import socket
import sys
import threading

IP_BIND_ADDRESS_NO_PORT = 24


def burst(server: str, client: str, n: int) -> int:
    srv = socket.socket()
    srv.bind((server, 0))
    srv.listen(4096)
    port = int(srv.getsockname()[1])
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
        if not ahead.acquire(timeout=30):
            raise SystemExit("accept loop stalled")
        c = socket.socket()
        c.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        c.bind((client, 0))
        c.connect((server, port))
        c.close()
    t.join()
    srv.close()
    return port


if __name__ == "__main__":
    print(burst(sys.argv[1], sys.argv[2], int(sys.argv[3])))
