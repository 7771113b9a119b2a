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
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import grpc
from google.protobuf.json_format import MessageToDict

from lens_ebpf.api.gen import lens_pb2 as pb
from lens_ebpf.api.gen import lens_pb2_grpc


class Collector(lens_pb2_grpc.CollectorServiceServicer):
    """Acknowledges what it holds; subclasses store events elsewhere (_store) and may
    hold them for good later than they accept them (_held, then notify _acked)."""

    def __init__(self, out: TextIO | None, last: dict[str, int] | None = None) -> None:
        self.out = out
        self.last = dict(last or {})  # the newest seq accepted per node
        self.duplicates = 0
        self._lock = threading.Lock()
        self._acked = threading.Condition(self._lock)

    def Report(self, request_iterator: Iterator[pb.Event], context: Any) -> Iterator[pb.Ack]:  # noqa: N802
        meta = dict(context.invocation_metadata())
        node = meta.get("lens-node", "unknown")
        with self._lock:
            sent = self._held(node)
        yield pb.Ack(seq=sent)  # where the reporter resumes
        done = threading.Event()
        reader = threading.Thread(target=self._read, args=(node, request_iterator, done),
                                  name=f"collect-{node}", daemon=True)  # fmt: skip
        reader.start()
        while context.is_active():
            with self._acked:
                self._acked.wait_for(partial(self._moved, node, sent, done), 1.0)
                seq = self._held(node)
                finished = done.is_set() and seq >= self.last.get(node, 0)
            if seq > sent:
                sent = seq
                yield pb.Ack(seq=seq)
            if finished:
                return

    def _read(self, node: str, request_iterator: Iterator[pb.Event],
              done: threading.Event) -> None:  # fmt: skip
        try:
            for ev in request_iterator:
                with self._acked:
                    if ev.HasField("gap"):
                        self._store(node, ev)
                    elif ev.seq <= self.last.get(node, 0):
                        self.duplicates += 1
                    elif self._store(node, ev):  # else not held: the reporter sends it again
                        self.last[node] = ev.seq
                    self._acked.notify_all()
        except Exception:  # the stream ended under us (cancelled, disconnected)
            pass
        finally:
            done.set()
            with self._acked:
                self._acked.notify_all()

    def _moved(self, node: str, sent: int, done: threading.Event) -> bool:
        return done.is_set() or self._held(node) > sent

    def ack_seq(self, node: str) -> int:
        """The highest sequence number of node's events held for good."""
        with self._lock:
            return self._held(node)

    def _held(self, node: str) -> int:
        """ack_seq with the lock held."""
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
