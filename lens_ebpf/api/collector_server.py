"""`lens-ebpf collect`: a reference collector that receives reporters' events.

Writes one JSON object per event (and per gap) to --out (appending) or stdout,
drops duplicates by sequence number per node, and acknowledges what it holds. On
start it reads --out back, so after a restart it asks each reporter to resume
exactly after the last event it wrote.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf.json_format import MessageToDict

from lens_ebpf.api.gen import lens_pb2 as pb
from lens_ebpf.api.gen import lens_pb2_grpc


class Collector(lens_pb2_grpc.CollectorServiceServicer):
    """Acknowledges what it holds; subclasses store events elsewhere (_store) and may
    acknowledge later than they accept (ack_seq)."""

    def __init__(self, out: TextIO | None, last: dict[str, int] | None = None) -> None:
        self.out = out
        self.last = dict(last or {})
        self.duplicates = 0
        self._lock = threading.Lock()

    def Report(self, request_iterator: Iterator[pb.Event], context: Any) -> Iterator[pb.Ack]:  # noqa: N802
        meta = dict(context.invocation_metadata())
        node = meta.get("lens-node", "unknown")
        yield pb.Ack(seq=self.ack_seq(node))
        for ev in request_iterator:
            with self._lock:
                if ev.HasField("gap"):
                    self._store(node, ev)
                    continue
                if ev.seq <= self.last.get(node, 0):
                    self.duplicates += 1
                    continue
                if not self._store(node, ev):
                    continue  # not held: the reporter sends it again
                self.last[node] = ev.seq
            yield pb.Ack(seq=self.ack_seq(node))

    def ack_seq(self, node: str) -> int:
        """The highest sequence number of node's events held for good."""
        with self._lock:
            return self.last.get(node, 0)

    def _store(self, node: str, ev: pb.Event) -> bool:
        """Hold one event (a gap too); False when it could not be held."""
        if ev.HasField("gap"):
            record = {"node": node, "gap": MessageToDict(ev.gap)}
        else:
            record = {"node": node, **MessageToDict(ev, preserving_proto_field_name=True)}
        assert self.out is not None
        self.out.write(json.dumps(record, sort_keys=True) + "\n")
        self.out.flush()
        return True


def recover(path: Path) -> dict[str, int]:
    """Highest sequence number per node already written to path."""
    last: dict[str, int] = {}
    if not path.exists():
        return last
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "seq" in rec:
            node = rec.get("node", "unknown")
            last[node] = max(last.get(node, 0), int(rec["seq"]))
    return last


def start(collector: Collector, listen: str,
          credentials: grpc.ServerCredentials | None) -> tuple[grpc.Server, int]:  # fmt: skip
    """A started gRPC server with collector behind it, and its port; OSError when listen is
    taken."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    lens_pb2_grpc.add_CollectorServiceServicer_to_server(collector, server)
    try:
        port = server.add_secure_port(listen, credentials) if credentials else \
            server.add_insecure_port(listen)  # fmt: skip
    except RuntimeError:  # grpcio >= 1.66 raises where older ones answered 0
        port = 0
    if not port:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    return server, port


def serve(listen: str, out_path: str | None, credentials: grpc.ServerCredentials | None) -> int:
    """Serve until SIGTERM or SIGINT."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    path = Path(out_path) if out_path else None
    out = open(path, "a") if path else sys.stdout  # noqa: SIM115 (open while serving)
    server, _ = start(Collector(out, recover(path) if path else {}), listen, credentials)
    print(f"lens-ebpf collect: listening on {listen}", file=sys.stderr, flush=True)
    while not stop.wait(1):
        pass
    server.stop(grace=1)
    return 0
