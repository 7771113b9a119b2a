"""Many node agents' reporters at once, simulated on one asyncio loop: each node its own
gRPC connection and Report stream (as its agent's reporter has), sending events
numbered 1..N and holding the stream until the collector acknowledges the last.
Used by the cluster service's tests (a hundred nodes) and bench.reporters (a thousand)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc.aio

from lens_ebpf.api.gen import lens_pb2 as pb
from lens_ebpf.api.gen import lens_pb2_grpc


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
    seconds: float  # from the first stream opened to the last acknowledged


EventFn = Callable[[int, int], pb.Event]


async def _report(target: str, node: int, events: int, timeout: float,
                  make: EventFn = event) -> tuple[str, int]:  # fmt: skip
    name = f"gpu-{node}"
    done = asyncio.Event()

    async def requests():  # noqa: ANN202 (an async generator of pb.Event)
        for seq in range(1, events + 1):
            yield make(node, seq)
        await done.wait()  # the stream stays open until the last acknowledgement

    acked = 0
    async with grpc.aio.insecure_channel(target) as channel:
        stub = lens_pb2_grpc.CollectorServiceStub(channel)
        call = stub.Report(requests(), metadata=(("lens-node", name),), timeout=timeout)
        async for ack in call:
            acked = ack.seq
            if acked >= events:
                break
        done.set()
        call.cancel()
    return name, acked


async def _all(target: str, nodes: int, events: int, timeout: float,
               make: EventFn = event) -> Outcome:  # fmt: skip
    started = time.monotonic()
    got = await asyncio.gather(*(_report(target, n, events, timeout, make)
                                 for n in range(nodes)))  # fmt: skip
    return Outcome(dict(got), time.monotonic() - started)


def simulate(target: str, nodes: int, events: int, timeout: float = 600,
             make: EventFn = event) -> Outcome:  # fmt: skip
    """nodes reporters, each sending events (make(node, seq)), all at once; a stream ends
    at its last ack, or at timeout (a hang guard)."""
    return asyncio.run(_all(target, nodes, events, timeout, make))
