"""Many node agents' reporters at once, simulated on one asyncio loop: each node its own
gRPC connection and Report stream (as its agent's reporter has), sending events
numbered 1..N and holding the stream until the collector acknowledges the last.
Used by the recorder's tests (a hundred nodes) and bench.reporters (a thousand)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc.aio

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc


def event(node: int, seq: int) -> pb.Event:
    """A container_start on node with one GPU, as an agent sends it."""
    ident = pb.Identity(namespace="ml", pod=f"job-{node}-{seq}", pod_uid=f"uid-{node}-{seq}",
                        container="worker", container_id=f"c{node}x{seq}")  # fmt: skip
    start = pb.ContainerChange(identity=ident, devices=[f"/dev/nvidia{seq % 8}"])
    return pb.Event(seq=seq, ts_unix_nano=1_795_000_000_000_000_000 + seq,
                    node_name=f"gpu-{node}", container_start=start)  # fmt: skip


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


async def _report(target: str, node: int, events: int, timeout: float,
                  make: EventFn, per_message: int,
                  start: _Start) -> tuple[str, int, int]:  # fmt: skip
    name = f"gpu-{node}"
    done = asyncio.Event()

    async def requests():  # noqa: ANN202 (an async generator of pb.Event or pb.EventBatch)
        await start.go.wait()
        for first in range(1, events + 1, per_message):
            evs = [make(node, seq) for seq in range(first, min(first + per_message, events + 1))]
            yield pb.EventBatch(events=evs) if per_message > 1 else evs[0]
        await done.wait()  # the stream stays open until the last acknowledgement

    acked = acks = 0
    async with grpc.aio.insecure_channel(target) as channel:
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


async def _all(target: str, nodes: int, events: int, timeout: float,
               make: EventFn, per_message: int) -> Outcome:  # fmt: skip
    opened, start = time.monotonic(), _Start(nodes)
    got = await asyncio.gather(*(_report(target, n, events, timeout, make, per_message, start)
                                 for n in range(nodes)))  # fmt: skip
    if not start.go.is_set():  # a stream ended before every one was open
        start.at, start.cpu = opened, 0.0
    return Outcome({name: acked for name, acked, _ in got}, time.monotonic() - start.at,
                   time.process_time() - start.cpu, sum(n for _, _, n in got),
                   start.at - opened)  # fmt: skip


def simulate(target: str, nodes: int, events: int, timeout: float = 600,
             make: EventFn = event, per_message: int = 1) -> Outcome:  # fmt: skip
    """nodes reporters, each sending events (make(node, seq)), all at once once every
    stream is open; a stream ends at its last ack, or at timeout (a hang guard).
    per_message > 1: ReportBatch messages of that many events (as an agent's reporter
    sends what it holds); 1: Report, one event per message (as agents older than
    ReportBatch do)."""
    return asyncio.run(_all(target, nodes, events, timeout, make, per_message))
