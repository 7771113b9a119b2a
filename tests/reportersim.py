"""Many node agents' reporters at once, simulated on one asyncio loop: each node its own
gRPC connection and Report stream (as its agent's reporter has), sending events
numbered 1..N and holding the stream until the collector acknowledges the last.
Used by the recorder's tests (a hundred nodes) and bench.reporters (a thousand)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import grpc.aio

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc


def event(node: int, seq: int) -> pb.Event:
    """A container_start on node with one GPU, as an agent sends it."""
    ident = pb.Identity(
        namespace="ml",
        pod=f"job-{node}-{seq}",
        pod_uid=f"uid-{node}-{seq}",
        container="worker",
        container_id=f"c{node}x{seq}",
    )
    start = pb.ContainerChange(identity=ident, devices=[f"/dev/nvidia{seq % 8}"])
    return pb.Event(
        seq=seq,
        ts_unix_nano=1_795_000_000_000_000_000 + seq,
        node_name=f"gpu-{node}",
        container_start=start,
    )


@dataclass
class Outcome:
    acked: dict[str, int]  # node -> the last seq the collector acknowledged
    seconds: float  # from the moment every stream was open to the last acknowledged
    cpu_seconds: float = 0.0  # the CPU the reporters' process used meanwhile
    acks: int = 0  # acknowledgements received, all streams
    connect_seconds: float = 0.0  # from the first stream opened to the last one open


EventFn = Callable[[int, int], pb.Event]


class _Start:
    """The streams open first (each has the collector's first ack, as a connected agent
    has); then all send at once, so the figures are the ingest's, not the connection
    storm's."""

    def __init__(self, nodes: int) -> None:
        self.waiting = nodes
        self.go = asyncio.Event()
        self.at = 0.0
        self.cpu = 0.0

    def opened(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            self.at, self.cpu = time.monotonic(), time.process_time()
            self.go.set()


# a channel of its own connection, as each agent has (channels to one target in one
# process otherwise share one connection)
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


async def _report(
    target: str,
    node: int,
    events: int,
    timeout: float,
    make: EventFn,
    per_message: int,
    start: _Start,
    own: bool = False,
) -> tuple[str, int, int]:
    name = f"gpu-{node}"
    done = asyncio.Event()

    async def requests():  # noqa: ANN202 (an async generator of pb.Event or pb.EventBatch)
        await start.go.wait()
        for first in range(1, events + 1, per_message):
            evs = [make(node, seq) for seq in range(first, min(first + per_message, events + 1))]
            yield pb.EventBatch(events=evs) if per_message > 1 else evs[0]
        await done.wait()  # the stream stays open until the last acknowledgement

    acked = acks = 0
    async with grpc.aio.insecure_channel(target, options=OWN_CONNECTION if own else ()) as channel:
        stub = lens_pb2_grpc.CollectorServiceStub(channel)
        rpc = stub.ReportBatch if per_message > 1 else stub.Report
        call = rpc(requests(), metadata=(("lens-node", name),), timeout=timeout)
        async for ack in call:
            acked, acks = ack.seq, acks + 1
            if acks == 1:
                start.opened()
            if acked >= events:
                break
        done.set()
        call.cancel()
    return name, acked, acks


async def _all(
    target: str, nodes: int, events: int, timeout: float, make: EventFn, per_message: int, own: bool
) -> Outcome:
    opened, start = time.monotonic(), _Start(nodes)
    got = await asyncio.gather(
        *(_report(target, n, events, timeout, make, per_message, start, own) for n in range(nodes))
    )
    if not start.go.is_set():  # a stream ended before every one was open
        start.at, start.cpu = opened, 0.0
    return Outcome(
        {name: acked for name, acked, _ in got},
        time.monotonic() - start.at,
        time.process_time() - start.cpu,
        sum(n for _, _, n in got),
        start.at - opened,
    )


def simulate(
    target: str,
    nodes: int,
    events: int,
    timeout: float = 600,
    make: EventFn = event,
    per_message: int = 1,
    own_connections: bool = False,
) -> Outcome:
    """nodes reporters, each sending events (make(node, seq)), all at once once every
    stream is open; a stream ends at its last ack, or at timeout (a hang guard).
    per_message > 1: ReportBatch messages of that many events (as an agent's reporter
    sends what it holds); 1: Report, one event per message (as agents older than
    ReportBatch do). own_connections: each stream on a connection of its own, as each
    agent has (by default the channels share one: the service's cost without the
    connections')."""
    return asyncio.run(_all(target, nodes, events, timeout, make, per_message, own_connections))


async def _paced(
    node: int,
    events: int,
    pace: float,
    acked: int,
    first: list[int],
    ready: asyncio.Event,
    done: asyncio.Event,
):  # noqa: ANN201 (EventBatch gen)
    """A stream's events: after what it resumes from (known once ready), one every pace
    seconds; then held open until done."""
    await ready.wait()
    for seq in range(max(first[0], acked) + 1, events + 1):
        yield pb.EventBatch(events=[event(node, seq)])
        await asyncio.sleep(pace)
    await done.wait()


async def _resuming(
    target: str, node: int, events: int, pace: float, deadline: float
) -> tuple[str, int, int]:
    """One node's reporter as an agent's behaves across a collector's failure: each stream
    resumes after what was acknowledged (the collector's first Ack, or what an earlier
    stream had acknowledged, whichever is more), sends the rest one event every `pace`
    seconds, and ends at the last acknowledgement; a broken stream is opened again."""
    name, acked, streams = f"gpu-{node}", 0, 0
    loop = asyncio.get_running_loop()
    while acked < events:
        if loop.time() > deadline:
            raise TimeoutError(f"{name}: {acked} of {events} acknowledged by the deadline")
        streams += 1
        first: list[int] = []
        ready, done = asyncio.Event(), asyncio.Event()
        try:
            # a connection of its own, as each agent has (channels to one target in one
            # process share one otherwise: a hundred reporters would be one connection)
            async with grpc.aio.insecure_channel(
                target, options=(("grpc.use_local_subchannel_pool", 1),)
            ) as channel:
                stub = lens_pb2_grpc.CollectorServiceStub(channel)
                sent = _paced(node, events, pace, acked, first, ready, done)
                call = stub.ReportBatch(sent, metadata=(("lens-node", name),))
                async for ack in call:
                    if not first:
                        first.append(ack.seq)
                        ready.set()
                    else:
                        acked = max(acked, ack.seq)
                    if max(acked, first[0]) >= events:
                        acked = max(acked, first[0])
                        break
                done.set()
                call.cancel()
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.2)  # the collector went: the next connection, elsewhere
    return name, acked, streams


def simulate_resuming(
    target: str, nodes: int, events: int, pace: float = 0.02, timeout: float = 120
) -> dict[str, tuple[int, int]]:
    """nodes reporters that survive their collector's failure (simulate()'s, resuming as
    an agent's reporter does); node -> (the last seq acknowledged, streams opened)."""

    async def run() -> dict[str, tuple[int, int]]:
        deadline = asyncio.get_running_loop().time() + timeout
        got = await asyncio.gather(
            *(_resuming(target, n, events, pace, deadline) for n in range(nodes))
        )
        return {name: (acked, streams) for name, acked, streams in got}

    return asyncio.run(run())


@dataclass
class Answer:
    acks: list[int]  # what the collector acknowledged, the resume point first
    code: grpc.StatusCode | None  # how the stream ended; None: it took every event
    details: str = ""


def report_once(
    target: str,
    node: str,
    events: list[pb.Event],
    token: str = "",
    cluster: str = "",
    timeout: float = 10,
    instance: str = "",
) -> Answer:
    """One ReportBatch stream as anyone who reaches the port can open it: node (and
    cluster, and agent instance) in the metadata, a bearer token or none; it ends once
    the collector acknowledged the newest of events, or refused the stream."""
    meta = [
        ("lens-node", node),
        *([("lens-cluster", cluster)] if cluster else []),
        *([("lens-agent-instance", instance)] if instance else []),
        *([("authorization", f"Bearer {token}")] if token else []),
    ]
    newest = max((e.seq for e in events if not e.HasField("gap")), default=0)
    done = threading.Event()

    def requests():  # noqa: ANN202 (a generator of pb.EventBatch)
        yield pb.EventBatch(events=events)
        done.wait(timeout)

    channel = grpc.insecure_channel(target)
    call = lens_pb2_grpc.CollectorServiceStub(channel).ReportBatch(
        requests(), metadata=meta, timeout=timeout
    )
    acks: list[int] = []
    try:
        for ack in call:
            acks.append(ack.seq)
            if ack.seq >= newest:
                break
        return Answer(acks, None)
    except grpc.RpcError as exc:
        return Answer(acks, exc.code(), exc.details() or "")
    finally:
        done.set()
        call.cancel()
        channel.close()
