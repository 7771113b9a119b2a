"""EventService.SubscribeBatch on a real grpc.aio server: the bus's events, several to a
message, each the bytes Subscribe sends for it (serialized once), in order, with the
history's gap first when a subscriber asks for more than it holds."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import grpc
import pytest

from lens_ebpf.agent.events import EventBus
from lens_ebpf.agent.stream import convert
from lens_ebpf.agent.stream.convert import BATCH_EVENTS
from lens_ebpf.agent.stream.grpc_server import GrpcServer
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests.conftest import hang_guard
from tests.k8slab import eventually
from tests.unit.test_events import EXEC, FLOW

NODE = ("gpu-1", "10.0.0.1")
Served = tuple[EventBus, lens_pb2_grpc.EventServiceStub]


@pytest.fixture()
def served() -> Iterator[Served]:
    bus = EventBus(queue_size=10_000, history=50)
    srv = GrpcServer("127.0.0.1:0", bus, NODE, lambda: {})
    srv.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{srv.port}")
    yield bus, lens_pb2_grpc.EventServiceStub(channel)
    channel.close()
    srv.stop()


def take(stream: Iterator[pb.EventBatch], n: int) -> tuple[list[pb.Event], int]:
    """n events off a SubscribeBatch stream (on a thread: a hang fails, not blocks), and
    the messages they came in."""
    got: list[pb.Event] = []
    messages = 0

    def read() -> None:
        nonlocal messages
        for batch in stream:
            messages += 1
            got.extend(batch.events)
            if len(got) >= n:
                return

    th = threading.Thread(target=read, daemon=True)
    th.start()
    th.join(hang_guard(20))
    assert len(got) >= n, f"{len(got)} of {n} events"
    return got, messages


def test_a_batch_stream_delivers_every_event_in_order(served: Served) -> None:
    bus, stub = served
    stream = stub.SubscribeBatch(pb.SubscribeRequest(kinds=["flow_closed"]))
    eventually(lambda: len(bus.subscriptions()) == 1, timeout=10)
    published = []
    for i in range(1_200):
        published.append(bus.publish(dataclasses.replace(FLOW, pid=i)))
        bus.publish(EXEC)  # not asked for
    got, messages = take(stream, 1_200)
    stream.cancel()
    assert [e.flow_closed.pid for e in got] == list(range(1_200))
    assert [e.seq for e in got] == [ev.seq for ev in published]
    # the bytes Subscribe sends for the same event: encoded once, kept on the event
    assert [e.SerializeToString() for e in got] == [
        convert.to_pb(ev, *NODE).SerializeToString() for ev in published
    ]
    assert all(
        convert.wire(ev, *NODE) == e.SerializeToString()
        for ev, e in zip(published, got, strict=True)
    )
    assert 1_200 / BATCH_EVENTS <= messages < 1_200  # several to a message


def test_a_batch_stream_says_what_the_history_no_longer_holds(served: Served) -> None:
    bus, stub = served
    for i in range(100):
        bus.publish(dataclasses.replace(FLOW, pid=i))
    stream = stub.SubscribeBatch(pb.SubscribeRequest(from_seq=1))
    got, _ = take(stream, 51)
    # the numbering's process: a client resuming across an agent restart sees another
    assert ("lens-agent-instance", bus.instance) in stream.initial_metadata()
    stream.cancel()
    assert (got[0].WhichOneof("payload"), got[0].gap.lost, got[0].gap.reason, got[0].seq) == (
        "gap",
        50,
        "history",
        50,
    )
    assert [e.flow_closed.pid for e in got[1:]] == list(range(50, 100))
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.SubscribeBatch(pb.SubscribeRequest(kinds=["nope"]))))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
