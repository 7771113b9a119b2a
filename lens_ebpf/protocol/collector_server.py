"""`lens-ebpf collect`: a reference collector that receives reporters' events.

Writes one JSON object per event (and per gap) to --out (appending) or stdout,
drops duplicates by sequence number per node, and acknowledges what it holds. On
start it reads --out back, so after a restart it asks each reporter to resume
exactly after the last event it wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import grpc
import grpc.aio
from google.protobuf.json_format import MessageToDict

from lens_ebpf.core.commandline import CliError, run_command
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from lens_ebpf.protocol.jsondict import to_dict
from lens_ebpf.protocol.tls import server_credentials

# how long a stream waits after something became acknowledgeable before it acknowledges
ACK_COALESCE_SECONDS = 0.1


class Collector(lens_pb2_grpc.CollectorServiceServicer):
    """Acknowledges what it holds; subclasses store events elsewhere (_store) and may
    hold them for good later than they accept them (_held, then call _changed).

    Report runs on grpc.aio: a reporter's stream is a coroutine, not a thread, so a
    thousand agents cost a thousand waiting coroutines. The state is under a lock:
    a subclass's commits arrive from its writer's thread."""

    def __init__(self, out: TextIO | None, last: dict[str, int] | None = None) -> None:
        self.out = out
        self.last = dict(last or {})  # the newest seq accepted per node
        self.duplicates = 0
        self.streams = 0
        self._lock = threading.Lock()
        # node -> its streams' wake-ups (a node has one reporter; a reconnect may overlap)
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the streams' loop
        self._moved: set[str] = set()  # nodes whose streams are to wake

    def _changed(self, node: str) -> None:
        """Wake node's streams to see whether its acknowledgement moved (from any thread);
        only that node's: a thousand streams must not all wake for each commit. Calls
        before the loop runs the wake-up join it (one hop to the loop per batch of
        commits, not per event)."""
        with self._lock:
            first = not self._moved
            self._moved.add(node)
            loop = self._loop
        if first and loop is not None:
            loop.call_soon_threadsafe(self._wake_moved)

    def _wake_moved(self) -> None:
        """On the loop: wake the streams of the nodes _changed named."""
        with self._lock:
            nodes, self._moved = self._moved, set()
            wakes = [w for n in nodes for w in self._waiters.get(n, ())]
        for wake in wakes:
            wake.set()

    # async generators both (grpc.aio runs a plain function on a thread)
    async def Report(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.Event], context: Any
    ) -> AsyncIterator[pb.Ack]:
        async for ack in self._serve(request_iterator, context, lambda ev: (ev,)):
            yield ack

    async def ReportBatch(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.EventBatch], context: Any
    ) -> AsyncIterator[pb.Ack]:
        async for ack in self._serve(request_iterator, context, lambda batch: batch.events):
            yield ack

    async def _serve(self, request_iterator: AsyncIterator[Any], context: Any,
                     events: Callable[[Any], Iterable[pb.Event]],
                     ) -> AsyncIterator[pb.Ack]:  # fmt: skip
        """One reporter's stream: its events accepted in order, acknowledged as held."""
        node = self._source(dict(context.invocation_metadata()))
        with self._lock:
            sent = self._held(node)
        yield pb.Ack(seq=sent)  # where the reporter resumes
        wake, ended = asyncio.Event(), asyncio.Event()

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    with self._lock:
                        for ev in events(msg):
                            self._accept(node, ev)
                        # held already (this class), else its commit calls _changed
                        moved = self._held(node) > sent
                    if moved:
                        wake.set()
            except Exception:  # the stream ended under us (cancelled, disconnected)
                pass
            finally:
                ended.set()
                wake.set()

        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._waiters.setdefault(node, set()).add(wake)
        self.streams += 1
        reader = asyncio.create_task(read())
        try:
            while True:
                await wake.wait()
                if not ended.is_set():
                    # what the next moments hold joins this acknowledgement: an ack
                    # per commit or per event costs a gRPC message each
                    await asyncio.sleep(ACK_COALESCE_SECONDS)
                wake.clear()
                with self._lock:
                    seq = self._held(node)
                    finished = ended.is_set() and seq >= self.last.get(node, 0)
                if seq > sent:
                    sent = seq
                    yield pb.Ack(seq=seq)
                if finished:
                    return
        finally:
            self.streams -= 1
            with self._lock:
                mine = self._waiters.get(node, set())
                mine.discard(wake)
                if not mine:
                    self._waiters.pop(node, None)
            reader.cancel()

    def _source(self, meta: dict[str, str]) -> str:
        """Whose stream this is (sequence numbers are per source): the reporter's node."""
        return meta.get("lens-node", "unknown")

    def _accept(self, node: str, ev: pb.Event) -> None:
        """One event of node's stream, with the lock held."""
        if ev.HasField("gap"):
            self._store(node, ev)
        elif ev.seq <= self.last.get(node, 0):
            self.duplicates += 1
        elif self._store(node, ev):  # else not held: the reporter sends it again
            self.last[node] = ev.seq

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
            record = {"node": node, **to_dict(ev)}
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


class CollectorServer:
    """The collector behind a grpc.aio server on loop (or one of its own)."""

    def __init__(self, collector: Collector, listen: str,
                 credentials: grpc.ServerCredentials | None,
                 loop: EventLoopThread | None = None) -> None:  # fmt: skip
        self.collector = collector
        self._own_loop = loop is None
        self._loop = loop or EventLoopThread("collect")
        try:
            self.port = self._loop.call(self._start(listen, credentials))
        except BaseException:
            if self._own_loop:
                self._loop.close()
            raise

    async def _start(self, listen: str, credentials: grpc.ServerCredentials | None) -> int:
        """Bound and started; OSError when listen is taken."""
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        lens_pb2_grpc.add_CollectorServiceServicer_to_server(self.collector, self.server)
        try:
            port = self.server.add_secure_port(listen, credentials) if credentials else \
                self.server.add_insecure_port(listen)  # fmt: skip
        except RuntimeError:  # grpc.aio raises where the sync server answered 0
            port = 0
        if not port:
            raise OSError(f"cannot listen on {listen}")
        await self.server.start()
        return int(port)

    def stop(self, grace: float = 1.0) -> None:
        with contextlib.suppress(Exception):
            self._loop.call(self.server.stop(grace), timeout=grace + 10)
        if self._own_loop:
            self._loop.close()


def main(argv: list[str] | None = None) -> int:
    """`lens-ebpf collect`."""
    ap = argparse.ArgumentParser(
        prog="lens-ebpf collect", description="reference collector for the event reporter"
    )
    ap.add_argument("--listen", default="0.0.0.0:9472", help="HOST:PORT (default 0.0.0.0:9472)")
    ap.add_argument("--out", help="append JSON lines here (default: stdout)")
    ap.add_argument("--tls-cert", default="")
    ap.add_argument("--tls-key", default="")
    ap.add_argument("--tls-client-ca", default="", help="require client certificates (mTLS)")
    args = ap.parse_args(argv)

    def run() -> int:
        creds = server_credentials(args.tls_cert, args.tls_key, args.tls_client_ca)
        try:
            return serve(args.listen, args.out, creds)
        except OSError as exc:
            raise CliError(f"collect: {exc}") from None

    return run_command(run)


def serve(listen: str, out_path: str | None, credentials: grpc.ServerCredentials | None) -> int:
    """Serve until SIGTERM or SIGINT."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    path = Path(out_path) if out_path else None
    out = open(path, "a") if path else sys.stdout  # noqa: SIM115 (open while serving)
    server = CollectorServer(Collector(out, recover(path) if path else {}), listen, credentials)
    print(f"lens-ebpf collect: listening on {listen}", file=sys.stderr, flush=True)
    stop.wait()  # set by SIGTERM or SIGINT
    server.stop(grace=1)
    return 0
