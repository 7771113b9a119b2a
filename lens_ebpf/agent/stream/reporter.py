"""Pushes events to a central collector, resuming after what the collector acknowledged.

Events wait in a bounded replay buffer until acknowledged. On failure the reporter
reconnects with exponential backoff and jitter; the collector's first Ack says
where to resume. Events that fell out of the buffer before acknowledgement are
announced with a gap marker, never dropped silently, and counted by what is known of
them: lost (never sent: the bus's or the buffer's overflow while the collector was
away), or unconfirmed (sent, but gone from the buffer before the collector's ack: it
may hold them). The events it acknowledged are counted too.

The reporter presents its token (reporter.token_file: its projected ServiceAccount token,
read again at each connect, since the kubelet rotates it) as `authorization: Bearer`.
Its seqs are its agent process's (EventBus.seq, from 1 in each process): it says whose in
the `lens-agent-instance` metadata (EventBus.instance, the same on each reconnect), and
the collector resumes it after the last seq held for that instance (0 for an instance it
has never seen: a restarted agent sends its whole buffer). An acknowledgement beyond the
newest seq this agent has numbered is refused: the collector claims events the agent never
sent (a forged stream's, or another agent's of the same name and instance), and taking it
would drop the buffer unsent; the stream is closed, the buffer kept, and the reporter tries
again with its backoff.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.agent.events import Event, EventBus, EventFilter, Gap
from lens_ebpf.agent.stream import convert
from lens_ebpf.core.backoff import Backoff
from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.protocol.gen import lens_pb2 as pb

log = logging.getLogger(__name__)


# events moved from the bus's queue to the buffer at a time
FILL_BATCH = 4096


class Reporter:
    def __init__(
        self,
        target: str,
        bus: EventBus,
        node: tuple[str, str],
        buffer: int,
        credentials: grpc.ChannelCredentials | None = None,
        backoff_max: float = 30.0,
        kinds: frozenset[str] = frozenset(),
        cluster: str = "",
        token_file: str = "",
    ) -> None:
        self.target = target
        self.node = node
        self.bus = bus
        self.token_file = token_file  # the bearer token, read at each connect; "": none
        self.acks_refused = 0  # acknowledgements beyond the newest seq the bus numbered
        self._warned = ""  # the kind of problem last logged (once until a good connect)
        self.cluster = cluster  # said to the collector (lens-cluster); "": its home cluster
        self.credentials = credentials
        self.backoff_max = backoff_max
        self.pending: collections.deque[Event] = collections.deque()  # not acknowledged
        # of those, not sent on this stream yet (rebuilt from pending on each connect)
        self.unsent: collections.deque[Event] = collections.deque()
        self.buffer = buffer
        self.acked = 0  # the collector's last acknowledged seq
        self.acked_events = 0  # events the collector's acks took off the buffer
        self.lost = 0  # never sent: the bus's overflow, or the buffer's before sending
        self.unconfirmed = 0  # sent, then gone from the buffer before an ack
        self.unreported_lost = 0
        self.last_lost_seq = 0  # the newest event lost, which a gap is numbered after
        self.sent = 0
        self.connected = False
        self.reconnects = 0
        self.on_connect: Callable[[], object] = lambda: None  # each (re)connect
        self.batched = True  # ReportBatch, until a collector answers UNIMPLEMENTED
        self._seen_bus_drops = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        # gaps always pass: a reporter that leaves kinds out still says what it lost
        accept = EventFilter(kinds=kinds | {"gap"}) if kinds else None
        # raw: compiled events stay their wire bytes (native.Packed), sent as they are
        self._sub = bus.subscribe("reporter", accept=accept, maxsize=buffer, raw=True)
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for target in (self._fill, self._run):
            t = threading.Thread(target=target, name=f"reporter{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout=5)

    def _fill(self) -> None:
        """Move events from the bus into the replay buffer, counting what overflows."""
        while not self._stop.is_set():
            # what the bus holds, at once: a lock and a wake-up of the sender per batch
            events = self._sub.take(FILL_BATCH, timeout=0.5)
            with self._cond:
                bus_lost = self._sub.dropped - self._seen_bus_drops
                if bus_lost:
                    self._seen_bus_drops = self._sub.dropped
                    self.lost += bus_lost
                    self.unreported_lost += bus_lost
                    self.last_lost_seq = max(self.last_lost_seq, self._sub.last_dropped_seq)
                if not events:
                    continue
                self.pending.extend(events)
                self.unsent.extend(events)
                while len(self.pending) > self.buffer:
                    dropped = self.pending.popleft()
                    if self.unsent and self.unsent[0] is dropped:
                        self.unsent.popleft()
                        self.lost += 1
                    else:  # sent on this stream or an earlier one, not acknowledged
                        self.unconfirmed += 1
                    self.last_lost_seq = max(self.last_lost_seq, dropped.seq)
                    self.unreported_lost += 1
                self._cond.notify_all()

    def _requests(
        self,
        ready: threading.Event,
        done: threading.Event,
    ) -> Iterator[list[bytes]]:
        """The events to send, serialized (convert.wire: the bytes the event's subscribers
        send too, made once), in order, each once after what the collector holds: what is
        ready at once in lists of convert.wire_chunks' bounds."""
        deadline = time.monotonic() + 30
        while not ready.wait(timeout=0.2):  # the collector's first Ack: where to resume
            if done.is_set() or self._stop.is_set() or time.monotonic() > deadline:
                return
        with self._cond:  # after what the collector holds: each pending event once
            self.unsent = collections.deque(e for e in self.pending if e.seq > self.acked)
        while not self._stop.is_set() and not done.is_set():
            with self._cond:
                if self.unreported_lost:
                    # numbered as the last event it stands for
                    gap = Gap(
                        lost=self.unreported_lost, reason="reporter_buffer", seq=self.last_lost_seq
                    )
                    self.unreported_lost = 0
                    batch: list[Event] = [gap]
                elif self.unsent:
                    batch, self.unsent = list(self.unsent), collections.deque()
                else:
                    self._cond.wait(timeout=0.5)
                    continue
            for chunk in convert.wire_chunks(batch, *self.node):
                self.sent += len(chunk)
                yield chunk

    def _run(self) -> None:
        backoff = Backoff(self.backoff_max, jitter=(0.5, 1.5))
        while not self._stop.is_set():
            ready, done = threading.Event(), threading.Event()
            try:
                channel = (
                    grpc.secure_channel(self.target, self.credentials)
                    if self.credentials
                    else grpc.insecure_channel(self.target)
                )
                meta = (
                    ("lens-node", self.node[0]),
                    ("lens-node-ip", self.node[1]),
                    ("lens-agent-instance", self.bus.instance),
                    *((("lens-cluster", self.cluster),) if self.cluster else ()),
                    *self._authorization(),
                )
                chunks = self._requests(ready, done)
                # the requests go as the bytes _requests made (an EventBatch framed from
                # them, or each event's): nothing is serialized twice
                method = "ReportBatch" if self.batched else "Report"
                call = channel.stream_stream(
                    f"/lens.v1.CollectorService/{method}",
                    request_serializer=bytes,
                    response_deserializer=pb.Ack.FromString,
                )
                acks = (
                    call((convert.batch_wire(c) for c in chunks), metadata=meta)
                    if self.batched
                    else call((ev for c in chunks for ev in c), metadata=meta)
                )
                for ack in acks:
                    if ack.seq > self.bus.seq:  # never numbered here: never sent
                        self._refuse_ack(ack.seq)
                        acks.cancel()
                        break
                    with self._cond:
                        self.acked = ack.seq if not ready.is_set() else max(self.acked, ack.seq)
                        while self.pending and self.pending[0].seq <= self.acked:
                            self.pending.popleft()
                            self.acked_events += 1
                    if not ready.is_set():
                        self.connected = True
                        self._warned = ""
                        backoff.reset()
                        ready.set()
                        self.on_connect()  # e.g. the device inventory, sent anew
                    if self._stop.is_set():
                        break
            except grpc.RpcError as exc:
                code = exc.code()
                if self.batched and code == grpc.StatusCode.UNIMPLEMENTED:
                    # a collector older than ReportBatch: one event per message from now on
                    log.info("reporter: %s does not take ReportBatch; using Report", self.target)
                    self.batched = False
                    continue
                if code in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.INVALID_ARGUMENT,
                ):
                    self._warn(
                        code.name,
                        f"{self.target} refused the stream: {code.name}: " f"{exc.details()}",
                    )
                else:
                    log.debug("reporter: %s", exc)
            finally:
                done.set()
                self.connected = False
            if self._stop.is_set():
                break
            self.reconnects += 1
            self._stop.wait(backoff.next())

    def _authorization(self) -> tuple[tuple[str, str], ...]:
        """The token's metadata, read now (a rotated token is the file's new content)."""
        if not self.token_file:
            return ()
        try:
            with open(self.token_file) as f:
                token = f.read().strip()
        except OSError as exc:
            self._warn("token_file", f"reporter.token_file: {exc}; connecting without a token")
            return ()
        return (("authorization", f"Bearer {token}"),) if token else ()

    def _refuse_ack(self, seq: int) -> None:
        self.acks_refused += 1
        self._warn(
            "ack",
            f"{self.target} acknowledged seq {seq}, beyond the newest this agent "
            f"numbered ({self.bus.seq}): refused, the buffer kept (a forged stream's "
            "events, or another agent reporting as node "
            f"{self.node[0]!r}, are held there)",
        )

    def _warn(self, kind: str, problem: str) -> None:
        """Log a kind of problem once until another comes or a stream is up again."""
        if kind != self._warned:
            log.warning("reporter: %s", problem)
            self._warned = kind


class ReporterCollector(Collector):
    """What the reporter sent, had acknowledged, lost and cannot say, and whether it is
    connected."""

    def __init__(self, reporter: Reporter) -> None:
        self._r = reporter

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        r = self._r
        for name, family, value, text in (
            (
                "lens_agent_reporter_sent",
                counter,
                r.sent,
                "Events sent to the collector (sent again after a reconnect: counted again)",
            ),
            (
                "lens_agent_reporter_acked",
                counter,
                r.acked_events,
                "Events the collector acknowledged (stored there)",
            ),
            (
                "lens_agent_reporter_lost",
                counter,
                r.lost,
                "Events never sent: the reporter's bus subscription or its buffer overflowed "
                "before they could go (announced to the collector in a gap)",
            ),
            (
                "lens_agent_reporter_unconfirmed",
                counter,
                r.unconfirmed,
                "Events sent but gone from the buffer before the collector acknowledged them: "
                "it may hold them (announced in a gap all the same)",
            ),
            (
                "lens_agent_reporter_acked_seq",
                gauge,
                r.acked,
                "The newest seq the collector acknowledged",
            ),
            (
                "lens_agent_reporter_connected",
                gauge,
                1 if r.connected else 0,
                "1 while the reporter's stream is up",
            ),
            (
                "lens_agent_reporter_reconnects",
                counter,
                r.reconnects,
                "Streams opened again after a failure",
            ),
            (
                "lens_agent_reporter_acks_refused",
                counter,
                r.acks_refused,
                "Acknowledgements refused: beyond the newest seq this agent numbered (the "
                "collector holds events the agent never sent; the buffer is kept)",
            ),
        ):
            yield family(name, text, value)
