"""The reporter's counters say what happened to each event that left its buffer unacknowledged
(issue 60): sent to a collector that took the stream and never acknowledged (hung), then
gone from the buffer: unconfirmed, not lost; published while no collector was there and
gone before it could be sent: lost. The real reference collector (`lens-ebpf collect`)
then gets the gap that announces them, and what it acknowledges is counted as acked."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from lens_ebpf.agent.events import EventBus, NodeTuned
from lens_ebpf.agent.stream.reporter import Reporter, ReporterCollector
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests.agentproc import LENS_CMD, free_port
from tests.conftest import wait_for

BUFFER = 50


class HungCollector(lens_pb2_grpc.CollectorServiceServicer):
    """Takes a reporter's stream, says where to resume (seq 0) and then never
    acknowledges again: what a collector whose database hangs looks like. got: the
    events' seqs it read."""

    def __init__(self, port: int) -> None:
        self.got: list[int] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        lens_pb2_grpc.add_CollectorServiceServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()
        self.done = threading.Event()

    def ReportBatch(self, request_iterator: Iterator[Any], context: Any) -> Iterator[pb.Ack]:  # noqa: N802
        yield pb.Ack(seq=0)
        for batch in request_iterator:
            self.got += [e.seq for e in batch.events]
            if self.done.is_set():
                return

    def stop(self) -> None:
        self.done.set()
        self.server.stop(grace=None).wait()


def tuned(i: int) -> NodeTuned:
    return NodeTuned(setting="vm.max_map_count", old_value=i, new_value=i + 1)


def metrics(rep: Reporter) -> dict[str, float]:
    return {m.name: m.samples[0].value for m in ReporterCollector(rep).collect()}


def test_unconfirmed_and_lost_are_told_apart(tmp_path: Path) -> None:
    port = free_port()
    hung = HungCollector(port)
    bus = EventBus(1000)
    rep = Reporter(f"127.0.0.1:{port}", bus, ("n1", ""), BUFFER, backoff_max=0.2)
    rep.start()
    col = None
    try:
        wait_for(lambda: rep.connected, "the reporter's stream")
        # 1. each event sent before the next comes: the 150 the buffer lets go were sent
        for i in range(200):
            ev = bus.publish(tuned(i))
            wait_for(lambda ev=ev: ev.seq in hung.got, f"event {i} at the collector", every=0.002)
        assert (rep.lost, rep.unconfirmed, rep.acked_events) == (0, 150, 0)
        # 2. no collector: 100 more; the 50 sent ones go first (unconfirmed), then 50 of
        # the new ones that were never sent (lost)
        hung.stop()
        wait_for(lambda: not rep.connected, "the reporter down")
        for i in range(100):
            bus.publish(tuned(1000 + i))
        wait_for(lambda: rep.unconfirmed + rep.lost == 250, "every overflow counted")
        assert (rep.lost, rep.unconfirmed) == (50, 200)
        # 3. the reference collector: the gap for the 100 gone while nobody listened, then
        # the 50 the buffer held, acknowledged
        out = tmp_path / "events.jsonl"
        col = subprocess.Popen(
            [*LENS_CMD, "collect", "--listen", f"127.0.0.1:{port}", "--out", str(out)],
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: rep.acked_events == BUFFER, "the buffer acknowledged", timeout=30)
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        gaps = [r["gap"] for r in lines if "gap" in r]
        assert [int(g["lost"]) for g in gaps] == [100]
        assert len([r for r in lines if "node_tuned" in r]) == BUFFER
        got = metrics(rep)
        assert (
            got["lens_agent_reporter_lost"],
            got["lens_agent_reporter_unconfirmed"],
            got["lens_agent_reporter_acked"],
        ) == (50, 200, BUFFER)
    finally:
        rep.stop()
        hung.stop()
        if col is not None:
            col.terminate()
            col.wait()
