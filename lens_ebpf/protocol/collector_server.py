"""`lens-ebpf collect`: a reference collector that receives reporters' events.

Writes one JSON object per event (and per gap) to --out (appending) or stdout,
drops duplicates by sequence number per node and agent instance, and acknowledges what
it holds. On start it reads --out back, so after a restart it asks each reporter to
resume exactly after the last event it wrote.

Sequence numbers are an agent process's own (agent/events.py EventBus: from 1 in each
process), so they are kept per (node, instance): the reporter says its instance in the
`lens-agent-instance` metadata (EventBus.instance, made once per process), and a stream's
first Ack is the last seq held for that instance (0 for one never seen: a restarted agent
sends its whole buffer). A stream without it (an agent older than the instance) is
instance "" and is taken as before. Memory: a node keeps its INSTANCES_KEPT (4) instances
whose events were accepted last; an older one is forgotten, and should it report again it
is resumed from 0 (it sends its buffer again; a store keyed by the seq, as the recorder's
table, holds each event once all the same).

Who may report (EventReceiver.guard, protocol/stream_auth.py): a stream is admitted before its
first message is read; a node's state moves only by its own admitted streams, and a
sequence number more than max_seq_jump past its instance's last is refused
(INVALID_ARGUMENT: no agent numbers so far ahead, and one such event would hold every later
one as a duplicate), and so is an instance that is not 1 to 64 letters, digits, '.', '_' or
'-'. A stream under another instance moves only that instance's state: it cannot hold the
real agent's events as duplicates.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, TextIO

import grpc
import grpc.aio
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError

from lens_ebpf.core.commandline import CliError, run_command
from lens_ebpf.core.loop import EventLoopThread
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from lens_ebpf.protocol.jsondict import to_dict
from lens_ebpf.protocol.stream_auth import Claim, CollectorAuthConfig, Guard
from lens_ebpf.protocol.tls import server_credentials

log = logging.getLogger(__name__)
# how long a stream waits after something became acknowledgeable before it acknowledges
ACK_COALESCE_SECONDS = 0.1
# the most a node's sequence number may move past its last at once (grpc.max_seq_jump)
MAX_SEQ_JUMP = 10**12
# the reporter's metadata naming its agent process (EventBus.instance), and what one may be
INSTANCE_KEY = "lens-agent-instance"
INSTANCE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# a node's instances kept (those whose events were accepted last)
INSTANCES_KEPT = 4

# node -> instance -> the newest seq, the instances in the order their events last came
Seqs = dict[str, dict[str, int]]


def keep(seqs: Seqs, node: str, instance: str, seq: int) -> None:
    """seqs[node][instance] = seq, that instance the node's newest; the node's oldest
    forgotten beyond INSTANCES_KEPT."""
    held = seqs.setdefault(node, {})
    if held and next(reversed(held)) != instance:
        held.pop(instance, None)  # to the end: the newest
    held[instance] = seq
    while len(held) > INSTANCES_KEPT:
        del held[next(iter(held))]


def bounded(seqs: Seqs | None) -> Seqs:
    """A copy of seqs (each node's instances oldest first) with each node's newest
    INSTANCES_KEPT."""
    return {node: dict(list(held.items())[-INSTANCES_KEPT:]) for node, held in (seqs or {}).items()}


class SeqRefusedError(Exception):
    """An event numbered beyond what its node can have sent."""


class EventReceiver(lens_pb2_grpc.CollectorServiceServicer):
    """The gRPC CollectorService's servicer: receives the agents' event streams (not a
    prometheus_client Collector). Acknowledges what it holds; subclasses store events
    elsewhere (_store) and may hold them for good later than they accept them (_held,
    then call _changed).

    Report runs on grpc.aio: a reporter's stream is a coroutine, not a thread, so a
    thousand agents cost a thousand waiting coroutines. The state is under a lock:
    a subclass's commits arrive from its writer's thread."""

    def __init__(self, out: TextIO | None, last: Seqs | None = None) -> None:
        self.out = out
        self.last = bounded(last)  # the newest seq accepted per node and instance
        self.duplicates = 0
        self.streams = 0
        self._lock = threading.Lock()
        # (node, instance) -> its streams' wake-ups (one reporter; a reconnect may overlap)
        self._waiters: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the streams' loop
        self._moved: set[tuple[str, str]] = set()  # whose streams are to wake
        self.guard: Guard | None = None  # who may report; None: anyone (tests of the protocol)
        self.max_seq_jump = MAX_SEQ_JUMP
        self.seq_refused = 0  # streams ended for an event beyond max_seq_jump
        self.instance_refused = 0  # streams refused for their lens-agent-instance

    def _changed(self, node: str, instance: str) -> None:
        """Wake the streams of node's instance to see whether their acknowledgement moved
        (from any thread); only those: a thousand streams must not all wake for each
        commit. Calls before the loop runs the wake-up join it (one hop to the loop per
        batch of commits, not per event)."""
        with self._lock:
            first = not self._moved
            self._moved.add((node, instance))
            loop = self._loop
        if first and loop is not None:
            loop.call_soon_threadsafe(self._wake_moved)

    def _wake_moved(self) -> None:
        """On the loop: wake the streams _changed named."""
        with self._lock:
            moved, self._moved = self._moved, set()
            wakes = [w for key in moved for w in self._waiters.get(key, ())]
        for wake in wakes:
            wake.set()

    # async generators both (grpc.aio runs a plain function on a thread)
    async def Report(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.Event], context: Any
    ) -> AsyncIterator[pb.Ack]:
        async for ack in self._serve(request_iterator, context, lambda ev: (ev,), "lens.v1.Event"):
            yield ack

    async def ReportBatch(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.EventBatch], context: Any
    ) -> AsyncIterator[pb.Ack]:
        async for ack in self._serve(
            request_iterator, context, lambda batch: batch.events, "lens.v1.EventBatch"
        ):
            yield ack

    async def _serve(
        self,
        request_iterator: AsyncIterator[Any],
        context: Any,
        events: Callable[[Any], Iterable[pb.Event]],
        kind: str,
    ) -> AsyncIterator[pb.Ack]:
        """One reporter's stream, once admitted: its events accepted in order,
        acknowledged as held; a message that does not decode as kind ends it with
        INVALID_ARGUMENT (not silently, with what followed it dropped)."""
        meta = dict(context.invocation_metadata() or ())
        node = self._source(meta)
        if self.guard is not None:  # before anything of the stream is read or said
            await self.guard.admit(context, self._claim(meta))
        instance = meta.get(INSTANCE_KEY, "")
        if instance and not INSTANCE.fullmatch(instance):
            self.instance_refused += 1
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{INSTANCE_KEY} is not 1 to 64 letters, digits, '.', '_' " "or '-'",
            )
        key = (node, instance)
        with self._lock:
            sent = self._held(node, instance)
        yield pb.Ack(seq=sent)  # where the reporter resumes
        wake, ended = asyncio.Event(), asyncio.Event()
        refused: list[str] = []

        async def read() -> None:
            try:
                async for msg in request_iterator:
                    with self._lock:
                        for ev in events(msg):
                            self._accept(node, instance, ev)
                        # held already (this class), else its commit calls _changed
                        moved = self._held(node, instance) > sent
                    if moved:
                        wake.set()
            except SeqRefusedError as exc:
                refused.append(str(exc))
            except DecodeError:  # what came before it is held; the reporter hears why
                refused.append(f"a message that is not a {kind}: the stream ends here")
            except Exception:  # the stream ended under us (cancelled, disconnected)
                pass
            finally:
                ended.set()
                wake.set()

        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._waiters.setdefault(key, set()).add(wake)
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
                    seq = self._held(node, instance)
                    finished = ended.is_set() and seq >= self._last(node, instance)
                if seq > sent:
                    sent = seq
                    yield pb.Ack(seq=seq)
                if refused:  # what came before it is held and acknowledged
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused[0])
                if finished:
                    return
        finally:
            self.streams -= 1
            with self._lock:
                mine = self._waiters.get(key, set())
                mine.discard(wake)
                if not mine:
                    self._waiters.pop(key, None)
            reader.cancel()

    def _source(self, meta: dict[str, str]) -> str:
        """Whose stream this is (sequence numbers are per source): the reporter's node."""
        return meta.get("lens-node", "unknown")

    def _claim(self, meta: dict[str, str]) -> Claim:
        """The node the stream reports for, as the guard checks it."""
        return Claim(meta.get("lens-node", "unknown"))

    def _last(self, node: str, instance: str) -> int:
        """The newest seq accepted of node's instance (0: none, or forgotten)."""
        return self.last.get(node, {}).get(instance, 0)

    def _accept(self, node: str, instance: str, ev: pb.Event) -> None:
        """One event of the stream of node's instance, with the lock held; SeqRefusedError for
        a number no agent can have reached since that instance's last."""
        last = self._last(node, instance)
        if ev.HasField("gap"):
            self._store(node, instance, ev)
        elif ev.seq <= last:
            self.duplicates += 1
        elif ev.seq - last > self.max_seq_jump:
            self.seq_refused += 1
            log.warning(
                "collector: %s (instance %r) sent seq %d, %d past its last (%d): "
                "refused (grpc.max_seq_jump %d)",
                node,
                instance,
                ev.seq,
                ev.seq - last,
                last,
                self.max_seq_jump,
            )
            raise SeqRefusedError(
                f"seq {ev.seq} is {ev.seq - last} past the last of the node's "
                f"instance ({last}): more than grpc.max_seq_jump "
                f"({self.max_seq_jump})"
            )
        elif self._store(node, instance, ev):  # else not held: the reporter sends it again
            keep(self.last, node, instance, ev.seq)

    def ack_seq(self, node: str, instance: str = "") -> int:
        """The highest sequence number of the events of node's instance held for good."""
        with self._lock:
            return self._held(node, instance)

    def _held(self, node: str, instance: str) -> int:
        """ack_seq with the lock held."""
        return self._last(node, instance)

    def _store(self, node: str, instance: str, ev: pb.Event) -> bool:
        """Hold one event (a gap too); False when it could not be held."""
        if ev.HasField("gap"):
            record = {"node": node, "instance": instance, "gap": MessageToDict(ev.gap)}
        else:
            record = {"node": node, "instance": instance, **to_dict(ev)}
        assert self.out is not None
        self.out.write(json.dumps(record, sort_keys=True) + "\n")
        self.out.flush()
        return True


def recover(path: Path) -> Seqs:
    """The highest sequence number per node and instance already written to path (a line
    without an instance: ""), each node's instances in the order they last wrote."""
    last: Seqs = {}
    if not path.exists():
        return last
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "seq" in rec:
            node, instance = rec.get("node", "unknown"), rec.get("instance", "")
            held = last.setdefault(node, {})
            seq = max(held.pop(instance, 0), int(rec["seq"]))
            held[instance] = seq  # the node's newest
    return last


class CollectorServer:
    """The collector behind a grpc.aio server on loop (or one of its own)."""

    def __init__(
        self,
        collector: EventReceiver,
        listen: str,
        credentials: grpc.ServerCredentials | None,
        loop: EventLoopThread | None = None,
    ) -> None:
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
            port = (
                self.server.add_secure_port(listen, credentials)
                if credentials
                else self.server.add_insecure_port(listen)
            )
        except RuntimeError:  # grpc.aio raises where the sync server answered 0
            port = 0
        if not port:
            raise OSError(f"cannot listen on {listen}")
        await self.server.start()
        if self.collector.guard is not None:
            self.collector.guard.announce()
        return int(port)

    def stop(self, grace: float = 1.0) -> None:
        with contextlib.suppress(Exception):
            self._loop.call(self.server.stop(grace), timeout=grace + 10)
        if self._own_loop:
            self._loop.close()


def main(argv: list[str] | None = None) -> int:
    """`lens-ebpf collect`."""
    ap = argparse.ArgumentParser(
        prog="lens-ebpf collect",
        description="reference collector for the event reporter",
        epilog="Who may report: a reporter presents a token of --tokens-file for its node "
        "(reporter.token_file); without one, a stream is taken only as --anonymous "
        "says (by default while --listen is loopback). docs/security.md.",
    )
    ap.add_argument("--listen", default="0.0.0.0:9472", help="HOST:PORT (default 0.0.0.0:9472)")
    ap.add_argument("--out", help="append JSON lines here (default: stdout)")
    ap.add_argument("--tls-cert", default="")
    ap.add_argument("--tls-key", default="")
    ap.add_argument("--tls-client-ca", default="", help="require client certificates (mTLS)")
    ap.add_argument(
        "--tokens-file",
        default="",
        help="lines '<node> <token>': the token each node's reporter presents",
    )
    ap.add_argument(
        "--anonymous",
        choices=("loopback", "always", "never"),
        default="loopback",
        help="streams without a token: taken while --listen is loopback "
        "(default), always, never",
    )
    ap.add_argument(
        "--max-seq-jump",
        type=int,
        default=MAX_SEQ_JUMP,
        help="refuse a seq more than this past its node's last",
    )
    args = ap.parse_args(argv)

    def run() -> int:
        creds = server_credentials(args.tls_cert, args.tls_key, args.tls_client_ca)
        auth = CollectorAuthConfig(
            tokenreview=False, tokens_file=args.tokens_file, anonymous=args.anonymous
        )
        guard = Guard(auth, args.listen, "collect", node_bound=True)
        try:
            return serve(args.listen, args.out, creds, guard, args.max_seq_jump)
        except OSError as exc:
            raise CliError(f"collect: {exc}") from None

    return run_command(run)


def serve(
    listen: str,
    out_path: str | None,
    credentials: grpc.ServerCredentials | None,
    guard: Guard | None = None,
    max_seq_jump: int = MAX_SEQ_JUMP,
) -> int:
    """Serve until SIGTERM or SIGINT."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    path = Path(out_path) if out_path else None
    out = open(path, "a") if path else sys.stdout  # noqa: SIM115 (open while serving)
    collector = EventReceiver(out, recover(path) if path else {})
    collector.guard, collector.max_seq_jump = guard, max_seq_jump
    server = CollectorServer(collector, listen, credentials)
    print(f"lens-ebpf collect: listening on {listen}", file=sys.stderr, flush=True)
    stop.wait()  # set by SIGTERM or SIGINT
    server.stop(grace=1)
    return 0
