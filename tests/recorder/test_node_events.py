"""The recorder serves the reporters' collector protocol: the agent's own Reporter pushes a
node's events into node_events, once per (node, agent instance, seq), acknowledged only once
stored; a container_start's GPU devices land in pod_resources."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from lens_ebpf.agent.events import ContainerChange, EventBus
from lens_ebpf.agent.stream.reporter import Reporter
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests import pglab
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.reportersim import simulate


def container_start(n: int, devices: tuple[str, ...]) -> ContainerChange:
    return ContainerChange(
        kind="container_start",
        ts_ns=time.monotonic_ns(),
        container_id=f"c{n}",
        container=f"worker-{n}",
        pod=f"bert-{n}",
        namespace="ml",
        pod_uid=f"uid-bert-{n}",
        devices=devices,
    )


NV = ("/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm")
AMD = ("/dev/kfd", "/dev/dri/card1", "/dev/dri/renderD129")


@contextlib.contextmanager
def reporting(app: Any, bus: EventBus | None = None) -> Iterator[tuple[EventBus, Reporter]]:
    """The agent's own Reporter, pushing a bus's events (a new bus's: an agent process's)
    to the recorder."""
    bus = bus or EventBus(1000)
    reporter = Reporter(f"127.0.0.1:{app.collect_port}", bus, ("gpu-1", "192.0.2.11"), 1000)
    reporter.start()
    try:
        yield bus, reporter
    finally:
        reporter.stop()


def report(port: int, node: str, events: list[pb.Event], instance: str = "") -> list[int]:
    """One Report stream (of an agent instance, or of an agent that says none): the acks
    received while sending events."""
    meta = (("lens-node", node), *((("lens-agent-instance", instance),) if instance else ()))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = lens_pb2_grpc.CollectorServiceStub(ch)
        return [a.seq for a in stub.Report(iter(events), metadata=meta)]


def raw(seq: int) -> pb.Event:
    return pb.Event(
        seq=seq,
        ts_unix_nano=1_795_000_000_000_000_000 + seq,
        node_name="gpu-9",
        oom_kill=pb.OomKill(pid=seq, comm="python"),
    )


def test_a_reporter_pushes_a_nodes_events_exactly_once(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    app = recorder_app(db_url)
    with reporting(app) as (bus, reporter):
        bus.publish(container_start(1, NV))
        bus.publish(container_start(2, AMD))
        bus.publish(container_start(3, ("/dev/null",)))  # no GPU: an event, no resources
        eventually(lambda: reporter.acked == 3, timeout=15)
        assert reporter.batched  # ReportBatch: the recorder takes it
    got = [
        (r["node"], r["seq"], r["kind"], r["namespace"], r["pod"], r["pod_uid"], r["container"])
        for r in rows(db_url, "node_events")
    ]
    assert got == [
        ("gpu-1", n, "container_start", "ml", f"bert-{n}", f"uid-bert-{n}", f"worker-{n}")
        for n in (1, 2, 3)
    ]
    assert rows(db_url, "node_events")[0]["payload"]["devices"] == list(NV)
    res = {
        (r["pod_uid"], r["container"], r["source"], r["resource"], r["count"], tuple(r["devices"]))
        for r in rows(db_url, "pod_resources")
    }
    assert res == {
        ("uid-bert-1", "worker-1", "agent", "nvidia.com/gpu", 2, ("/dev/nvidia0", "/dev/nvidia3")),
        ("uid-bert-2", "worker-2", "agent", "amd.com/gpu", 1, ("/dev/dri/renderD129",)),
    }


def test_duplicates_are_dropped_and_a_restart_resumes_after_the_last_stored(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    app = recorder_app(db_url)
    acks = report(app.collect_port, "gpu-9", [raw(n) for n in range(1, 6)])
    assert acks[0] == 0  # where to resume: nothing stored yet
    assert app.writer.flush(10)
    acks = report(app.collect_port, "gpu-9", [raw(n) for n in range(3, 8)])
    assert acks[0] == 5  # resumes after what it stored
    assert app.writer.flush(10)
    assert app.node_events.duplicates == 3
    assert [r["seq"] for r in rows(db_url, "node_events")] == [1, 2, 3, 4, 5, 6, 7]
    app.stop()
    app = recorder_app(db_url)  # the resume point comes back from the database
    assert report(app.collect_port, "gpu-9", [])[0] == 7
    assert report(app.collect_port, "gpu-8", [])[0] == 0


def test_a_restarted_agent_is_stored_beside_its_predecessor(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """A node's agent restarts (a DaemonSet upgrade, a crash; the recorder's database kept):
    the new process numbers from 1 while the table holds the old one's events up to 5. It
    is connected at once, no ack refused, its events stored beside the old ones, none a
    duplicate; after the recorder's restart each instance resumes after its own last (read
    back from the database), and two instances' faults of the same seq are two alerts."""
    from datetime import UTC, datetime

    from lens_ebpf.recorder.alerts.findings import faults

    app = recorder_app(db_url)
    old, new = EventBus(1000), EventBus(1000)
    a, b = old.instance, new.instance
    with reporting(app, old) as (bus, reporter):
        for n in range(1, 6):
            bus.publish(container_start(n, NV))
        eventually(lambda: reporter.acked == 5, timeout=hang_guard(15))
    with reporting(app, new) as (bus, reporter):
        for n in (6, 7):
            bus.publish(container_start(n, NV))
        eventually(lambda: reporter.acked == 2, timeout=hang_guard(15))
        assert (reporter.reconnects, reporter.acks_refused, reporter.acked_events) == (0, 0, 2)
    assert app.node_events.duplicates == 0
    got = [(r["instance"], r["seq"], r["pod"]) for r in rows(db_url, "node_events")]
    assert got == [(a, n, f"bert-{n}") for n in range(1, 6)] + [(b, 1, "bert-6"), (b, 2, "bert-7")]
    assert len(rows(db_url, "pod_resources")) == 7  # each event's effects too
    app.stop()

    app = recorder_app(db_url)  # the resume points come back from the database
    ne = app.node_events
    assert (
        ne.ack_seq("local/gpu-1", a),
        ne.ack_seq("local/gpu-1", b),
        ne.ack_seq("local/gpu-1"),
    ) == (5, 2, 0)

    def fault(seq: int) -> pb.Event:
        bad = pb.GpuFault(gpu_index=0, vendor="nvidia", fault="xid", code="79", message="off")
        return pb.Event(seq=seq, ts_unix_nano=time.time_ns(), node_name="gpu-1", gpu_fault=bad)

    assert report(app.collect_port, "gpu-1", [fault(6)], instance=a)[0] == 5
    assert report(app.collect_port, "gpu-1", [fault(n) for n in range(3, 7)], instance=b)[0] == 2
    assert report(app.collect_port, "gpu-1", [fault(6)], instance=b)[0] == 6  # once
    assert app.writer.flush(10)
    assert ne.duplicates == 1
    got = [(r["instance"], r["seq"]) for r in rows(db_url, "node_events")]
    assert got[7:] == [(a, 6), (b, 3), (b, 4), (b, 5), (b, 6)]
    with app.engine.connect() as conn:  # a's seq 6 and b's: two faults, two alerts
        ids = {x.id for x in faults(conn, "local", datetime.now(UTC))}
    assert len(ids) == 5, ids


def test_events_are_acknowledged_only_once_stored(
    api: FakeApiServer, recorder_app: Any, postgres: pglab.Postgres
) -> None:
    url = postgres.create_database("acks")
    app = recorder_app(url)
    with reporting(app) as (bus, reporter):
        bus.publish(container_start(1, NV))
        eventually(lambda: reporter.acked == 1, timeout=15)
        postgres.stop()
        try:
            for n in range(2, 7):
                bus.publish(container_start(n, NV))
            eventually(lambda: app.writer.depth() == 5, timeout=15)
            time.sleep(0.5)
            assert reporter.acked == 1 and len(reporter.pending) == 5  # held at both ends
        finally:
            postgres.start()
        eventually(lambda: reporter.acked == 6, timeout=20)
    assert [r["seq"] for r in rows(url, "node_events")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("per_message", [1, 7], ids=["Report", "ReportBatch"])
def test_a_hundred_reporters_at_once_every_event_written(
    api: FakeApiServer, recorder_app: Any, db_url: str, per_message: int
) -> None:
    """Streams on the collector's event loop, none holding a thread: each node's events
    written once and acknowledged to the last (bench.reporters runs a thousand), one per
    message or in batches (20 = 7 + 7 + 6)."""
    nodes, events = 100, 20
    app = recorder_app(db_url)
    got = simulate(
        f"127.0.0.1:{app.collect_port}",
        nodes,
        events,
        timeout=hang_guard(120),
        per_message=per_message,
    )
    assert got.acked == {f"gpu-{n}": events for n in range(nodes)}
    stored = rows(db_url, "node_events")
    assert len(stored) == nodes * events
    per_node: dict[str, list[int]] = {}
    for r in stored:
        per_node.setdefault(r["node"], []).append(r["seq"])
    assert {n: sorted(s) for n, s in per_node.items()} == {
        f"gpu-{n}": list(range(1, events + 1)) for n in range(nodes)
    }
    # every stream ends: the server's side of a stream closes after the client has its
    # last acknowledgement (a fresh machine saw 4 of 100 still closing)
    eventually(lambda: app.node_events.streams == 0, timeout=15)
    assert len(rows(db_url, "pod_resources")) == nodes * events  # one GPU each, from the agent


def test_a_collector_without_report_batch_gets_report(tmp_path: Any) -> None:
    """A collector older than ReportBatch (the method unknown to its server: UNIMPLEMENTED):
    the agent's reporter sends the same events with Report, each once, in order."""
    from lens_ebpf.core.loop import EventLoopThread
    from lens_ebpf.protocol.collector_server import EventReceiver

    out = io.StringIO()
    collector, loop = EventReceiver(out), EventLoopThread("old-collector")

    async def serve() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        only_report = grpc.stream_stream_rpc_method_handler(
            collector.Report,
            request_deserializer=pb.Event.FromString,
            response_serializer=pb.Ack.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "lens.v1.CollectorService", {"Report": only_report}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = loop.call(serve())
    bus = EventBus(1000)
    reporter = Reporter(f"127.0.0.1:{port}", bus, ("gpu-1", "192.0.2.11"), 1000)
    reporter.start()
    try:
        for n in (1, 2, 3):
            bus.publish(container_start(n, NV))
        eventually(lambda: reporter.acked == 3, timeout=hang_guard(15))
        assert not reporter.batched
        assert reporter.reconnects == 0  # the switch is not a failure
    finally:
        reporter.stop()
        loop.call(server.stop(0))
        loop.close()
    got = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["node"], r["seq"], r["container_start"]["identity"]["pod"]) for r in got] == [
        ("gpu-1", str(n), f"bert-{n}") for n in (1, 2, 3)
    ]
