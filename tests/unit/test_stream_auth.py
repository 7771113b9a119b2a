"""Who may call the gRPC ports without an API server (issue 69, defect 1): the collector
port's static per-node tokens, the seq bound, the reporter's token and its refusal of an
acknowledgement beyond what it numbered, the agent's port refusing a subscriber without
the right token, the guard's cache, counts and logging. tests/kube/test_node_streams.py
shows the same against a real API server's TokenReview."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lens_ebpf.agent.events import EventBus, NodeTuned
from lens_ebpf.agent.stream.grpc_server import GrpcServer
from lens_ebpf.agent.stream.reporter import Reporter, ReporterCollector
from lens_ebpf.protocol.collector_server import (
    INSTANCES_KEPT,
    CollectorServer,
    EventReceiver,
    recover,
)
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from lens_ebpf.protocol.stream_auth import (
    Claim,
    CollectorAuthConfig,
    Guard,
    RefusedError,
    SubscriberAuthConfig,
)
from tests.agentproc import free_port
from tests.conftest import hang_guard, wait_for
from tests.reportersim import report_once

FORGED = 2**62
UNAUTH, DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def fault(seq: int, node: str) -> pb.Event:
    bad = pb.GpuFault(gpu_index=0, vendor="nvidia", fault="xid", code="79", message="off the bus")
    return pb.Event(seq=seq, node_name=node, gpu_fault=bad)


def tuned(i: int) -> NodeTuned:
    return NodeTuned(setting="vm.max_map_count", old_value=i, new_value=i + 1)


@pytest.fixture()
def tokens(tmp_path: Path) -> Path:
    f = tmp_path / "tokens"
    f.write_text("# node token\ngpu-1 t-one\ngpu-2 t-two\nb/gpu-1 t-b-one\n")
    return f


@pytest.fixture()
def collector(tokens: Path) -> Iterator[tuple[EventReceiver, io.StringIO, str]]:
    """The reference collector on loopback, refusing streams without a token (anonymous:
    never), each node's token from the file."""
    out = io.StringIO()
    col = EventReceiver(out)
    col.guard = Guard(
        CollectorAuthConfig(tokenreview=False, tokens_file=str(tokens), anonymous="never"),
        "127.0.0.1:0",
        "collect",
        node_bound=True,
    )
    srv = CollectorServer(col, "127.0.0.1:0", None)
    yield col, out, f"127.0.0.1:{srv.port}"
    srv.stop()


def stored(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_forged_streams_are_refused_and_move_no_nodes_state(
    collector: tuple[EventReceiver, io.StringIO, str], caplog: pytest.LogCaptureFixture
) -> None:
    col, out, addr = collector
    assert report_once(addr, "gpu-1", [fault(1, "gpu-1"), fault(2, "gpu-1")], "t-one").acks[-1] == 2
    with caplog.at_level(logging.WARNING):
        for token, node, code in (
            ("", "gpu-1", UNAUTH),  # no token
            ("t-nobody", "gpu-1", UNAUTH),  # none of the file's
            ("t-two", "gpu-1", DENIED),  # gpu-2's token, for gpu-1
            ("t-b-one", "gpu-1", DENIED),
        ):  # cluster b's gpu-1
            got = report_once(addr, node, [fault(FORGED, node)], token)
            assert (got.code, got.acks) == (code, []), (token, got)
    # a node's own token, but a number no agent reaches: refused, what came before kept
    got = report_once(addr, "gpu-1", [fault(3, "gpu-1"), fault(FORGED, "gpu-1")], "t-one")
    assert got.code == grpc.StatusCode.INVALID_ARGUMENT and "grpc.max_seq_jump" in got.details
    assert col.last == {"gpu-1": {"": 3}} and col.seq_refused == 1
    assert [r["seq"] for r in stored(out)] == ["1", "2", "3"]
    assert col.guard is not None and dict(col.guard.refused) == {
        "unauthenticated": 2,
        "permission_denied": 2,
    }
    # one line for the peer, whatever it tried after
    refusals = [r for r in caplog.records if "refused a call from" in r.getMessage()]
    assert len(refusals) == 1 and "ipv" in refusals[0].getMessage()
    # the real node goes on from where it was
    assert report_once(addr, "gpu-1", [fault(4, "gpu-1")], "t-one").acks == [3, 4]

    # the node's own token under agent instances of its own: each its own numbering (the
    # seq bound too), none holds the real agent's ("" here) events as duplicates, even
    # once enough of them have made the collector forget the real one's last
    jump = report_once(addr, "gpu-1", [fault(FORGED, "gpu-1")], "t-one", instance="f0")
    assert (jump.code, jump.acks) == (INVALID, [0]) and col.seq_refused == 2
    for i in range(INSTANCES_KEPT):
        got = report_once(
            addr, "gpu-1", [fault(n, "gpu-1") for n in range(1, 10)], "t-one", instance=f"f{i}"
        )
        assert (got.code, got.acks) == (None, [0, 9]), got
    assert list(col.last["gpu-1"]) == [f"f{i}" for i in range(INSTANCES_KEPT)]  # bounded
    assert report_once(addr, "gpu-1", [fault(5, "gpu-1")], "t-one").acks[-1] == 5
    assert [r["seq"] for r in stored(out) if r["instance"] == ""] == ["1", "2", "3", "4", "5"]
    assert col.duplicates == 0
    # an instance that is not one: refused before anything is said
    bad = report_once(addr, "gpu-1", [fault(6, "gpu-1")], "t-one", instance="a b")
    assert (bad.code, bad.acks) == (INVALID, []) and "lens-agent-instance" in bad.details
    assert col.instance_refused == 1


def test_a_reporter_presents_its_token_read_again_at_each_connect(
    collector: tuple[EventReceiver, io.StringIO, str], tokens: Path, tmp_path: Path
) -> None:
    col, out, addr = collector
    token = tmp_path / "token"
    token.write_text("t-two\n")  # another node's: refused
    bus = EventBus(100)
    rep = Reporter(addr, bus, ("gpu-1", ""), 100, backoff_max=0.2, token_file=str(token))
    rep.start()
    try:
        for i in range(3):
            bus.publish(tuned(i))
        wait_for(
            lambda: col.guard and col.guard.refused["permission_denied"] >= 2,
            "the reporter refused, twice",
        )
        assert rep.acked == 0 and len(rep.pending) == 3 and not rep.connected
        token.write_text("t-one\n")  # rotated: the next connect presents it
        wait_for(lambda: rep.acked == 3, "the buffer acknowledged")
        assert [r["seq"] for r in stored(out)] == ["1", "2", "3"]
    finally:
        rep.stop()


class ClaimingCollector(lens_pb2_grpc.CollectorServiceServicer):
    """A collector that says it holds seq `holds` of every node: what the recorder said
    after one forged event was stored."""

    def __init__(self, port: int, holds: int) -> None:
        self.holds, self.streams = holds, 0
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        lens_pb2_grpc.add_CollectorServiceServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()

    def ReportBatch(self, request_iterator: Iterator[Any], context: Any) -> Iterator[pb.Ack]:  # noqa: N802
        self.streams += 1
        yield pb.Ack(seq=self.holds)
        for _ in request_iterator:
            yield pb.Ack(seq=self.holds)

    def stop(self) -> None:
        self.server.stop(grace=None).wait()


def test_the_reporter_refuses_an_ack_beyond_what_it_numbered(tmp_path: Path) -> None:
    port = free_port()
    liar = ClaimingCollector(port, FORGED)
    bus = EventBus(100)
    rep = Reporter(f"127.0.0.1:{port}", bus, ("gpu-1", ""), 100, backoff_max=0.2)
    rep.start()
    try:
        for i in range(5):
            bus.publish(tuned(i))
        wait_for(lambda: liar.streams >= 2 and rep.acks_refused >= 2, "two streams refused")
        # nothing taken off the buffer, nothing said to be acknowledged
        assert (len(rep.pending), rep.acked, rep.acked_events) == (5, 0, 0)
        assert not rep.connected
        got = {m.name: m.samples[0].value for m in ReporterCollector(rep).collect()}
        assert got["lens_agent_reporter_acks_refused"] == rep.acks_refused
        liar.stop()
        # a collector that holds what it says: every event there
        out = io.StringIO()
        srv = CollectorServer(EventReceiver(out), f"127.0.0.1:{port}", None)
        try:
            wait_for(lambda: rep.acked == 5, "the buffer acknowledged")
            assert [json.loads(x)["seq"] for x in out.getvalue().splitlines()] == [
                "1",
                "2",
                "3",
                "4",
                "5",
            ]
        finally:
            srv.stop()
    finally:
        rep.stop()
        liar.stop()


def test_a_restarted_agent_resumes_under_its_own_instance(tmp_path: Path) -> None:
    """A node's agent restarts (a DaemonSet upgrade, a crash): its new process numbers from
    1 again while the collector holds the old one's events up to 5. The new one is
    connected at once, every event of its stored, none taken as a duplicate, no ack
    refused; after the collector's own restart (its state read back from --out) each
    instance resumes after its own last."""
    port, path = free_port(), tmp_path / "events.jsonl"
    target = f"127.0.0.1:{port}"

    def serve() -> tuple[EventReceiver, CollectorServer]:
        col = EventReceiver(open(path, "a"), recover(path))  # noqa: SIM115 (closed below)
        return col, CollectorServer(col, target, None)

    def lines() -> list[tuple[str, int]]:
        return [(r["instance"], int(r["seq"])) for r in map(json.loads, path.open())]

    col, srv = serve()
    old, new = EventBus(100), EventBus(100)
    a, b = old.instance, new.instance
    first = Reporter(target, old, ("gpu-1", ""), 100, backoff_max=0.2)
    second = Reporter(target, new, ("gpu-1", ""), 100, backoff_max=0.2)
    try:
        first.start()
        for i in range(5):
            old.publish(tuned(i))
        wait_for(lambda: first.acked == 5, "the first agent's events acknowledged")
        first.stop()  # the agent restarts: a new bus, numbering from 1
        for i in range(2):
            new.publish(tuned(i))
        second.start()
        wait_for(lambda: second.acked == 2, "the new agent's events acknowledged")
        assert (second.reconnects, second.acks_refused, second.acked_events, col.duplicates) == (
            0,
            0,
            2,
            0,
        )
        assert col.last == {"gpu-1": {a: 5, b: 2}}
        assert lines() == [(a, 1), (a, 2), (a, 3), (a, 4), (a, 5), (b, 1), (b, 2)]

        srv.stop()  # the collector restarts
        assert col.out is not None
        col.out.close()
        wait_for(lambda: not second.connected, "the reporter down")
        new.publish(tuned(2))
        assert recover(path) == {"gpu-1": {a: 5, b: 2}}
        col, srv = serve()
        assert (col.ack_seq("gpu-1", a), col.ack_seq("gpu-1", b), col.ack_seq("gpu-1")) == (5, 2, 0)
        wait_for(lambda: second.acked == 3, "the outage's event acknowledged")
        # the old instance's stream resumes at its own last too
        assert report_once(target, "gpu-1", [], instance=a).acks == [5]
        assert (second.acks_refused, second.lost, second.unconfirmed, col.duplicates) == (
            0,
            0,
            0,
            0,
        )
        assert lines()[7:] == [(b, 3)]
    finally:
        first.stop()
        second.stop()
        srv.stop()
        if col.out is not None:
            col.out.close()


@pytest.fixture()
def agent_port(tmp_path: Path) -> Iterator[tuple[EventBus, str, GrpcServer]]:
    f = tmp_path / "subscribers"
    f.write_text("dashboard s-dash\n")
    guard = Guard(
        SubscriberAuthConfig(tokenreview=False, tokens_file=str(f), anonymous="never"),
        "127.0.0.1:0",
        "gRPC",
    )
    bus = EventBus(queue_size=1000, history=50)
    srv = GrpcServer("127.0.0.1:0", bus, ("gpu-1", "10.0.0.1"), lambda: {}, guard=guard)
    srv.start()
    yield bus, f"127.0.0.1:{srv.port}", srv
    srv.stop()


def test_the_agents_port_refuses_a_subscriber_without_the_right_token(
    agent_port: tuple[EventBus, str, GrpcServer],
) -> None:
    bus, addr, srv = agent_port
    for i in range(3):
        bus.publish(tuned(i))
    channel = grpc.insecure_channel(addr)
    events = lens_pb2_grpc.EventServiceStub(channel)
    nodes = lens_pb2_grpc.NodeServiceStub(channel)
    for meta, code in (
        ((), UNAUTH),
        ((("authorization", "Bearer s-wrong"),), UNAUTH),
        ((("authorization", "Basic s-dash"),), UNAUTH),
    ):
        with pytest.raises(grpc.RpcError) as err:
            next(
                iter(
                    events.Subscribe(
                        pb.SubscribeRequest(from_seq=1), metadata=meta, timeout=hang_guard(5)
                    )
                )
            )
        assert err.value.code() == code
        with pytest.raises(grpc.RpcError) as err:
            nodes.GetNode(pb.GetNodeRequest(), metadata=meta, timeout=hang_guard(5))
        assert err.value.code() == code
    # nothing of the request is read before: garbage is refused the same way
    raw = channel.unary_stream(
        "/lens.v1.EventService/SubscribeBatch",
        request_serializer=lambda b: b,
        response_deserializer=bytes,
    )
    with pytest.raises(grpc.RpcError) as err:
        next(iter(raw(b"\xff" * 100, timeout=hang_guard(5))))
    assert err.value.code() == UNAUTH
    # the kubelet's health probe presents nothing: still answered
    health = health_pb2_grpc.HealthStub(channel)
    assert (
        health.Check(health_pb2.HealthCheckRequest(service=""), timeout=hang_guard(5)).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    ok = (("authorization", "Bearer s-dash"),)
    first = next(
        iter(events.Subscribe(pb.SubscribeRequest(from_seq=1), metadata=ok, timeout=hang_guard(5)))
    )
    assert first.seq == 1 and first.node_tuned.setting == "vm.max_map_count"
    assert nodes.GetNode(pb.GetNodeRequest(), metadata=ok, timeout=hang_guard(5)).node_name
    got = {
        (s.name, s.labels.get("code")): s.value
        for m in srv.collector().collect()
        for s in m.samples
    }
    assert got[("lens_agent_grpc_calls_refused_total", "unauthenticated")] == 7
    assert got[("lens_agent_grpc_calls_refused_total", "permission_denied")] == 0
    channel.close()


@pytest.mark.parametrize(
    ("listen", "anonymous", "taken"),
    [
        ("127.0.0.1:9471", "loopback", True),
        ("[::1]:9471", "loopback", True),
        ("localhost:9471", "loopback", True),
        ("0.0.0.0:9471", "loopback", False),
        (":9471", "loopback", False),
        ("10.0.0.1:9471", "always", True),
        ("127.0.0.1:9471", "never", False),
    ],
)
def test_a_call_without_a_token_is_taken_only_as_anonymous_says(
    listen: str, anonymous: str, taken: bool
) -> None:
    guard = Guard(SubscriberAuthConfig(tokenreview=False, anonymous=anonymous), listen, "gRPC")
    if taken:
        assert asyncio.run(guard.check("", Claim())) == "anonymous"
    else:
        with pytest.raises(RefusedError) as err:
            asyncio.run(guard.check("", Claim()))
        assert err.value.code == UNAUTH and "no bearer token" in err.value.why


@dataclass(frozen=True)
class Said:
    result: str
    why: str = ""
    identity: str = ""


def jwt(exp: float) -> str:
    body = base64.urlsafe_b64encode(json.dumps({"exp": exp}).encode()).decode().rstrip("=")
    return f"e30.{body}.sig"


def test_verdicts_are_cached_briefly_and_never_past_the_tokens_expiry() -> None:
    now = [1000.0]
    calls: list[tuple[str, Claim]] = []
    answers = {
        "good": Said("ok", identity="lens-ebpf/lens-ebpf"),
        "bad": Said("permission_denied", "pod runs on gpu-2"),
        "down": Said("unavailable", "TokenReview: connection refused"),
    }

    def verify(token: str, claim: Claim) -> Said:
        calls.append((token, claim))
        return answers.get(token.split("#")[0], Said("unauthenticated", "not valid"))

    guard = Guard(
        CollectorAuthConfig(cache_seconds=60),
        "0.0.0.0:9472",
        "collector",
        verify,
        node_bound=True,
        clock=lambda: now[0],
    )

    def check(token: str, node: str = "gpu-1") -> str:
        try:
            return asyncio.run(guard.check(token, Claim(node)))
        except RefusedError as r:
            return r.code.name

    assert [check("good") for _ in range(3)] == ["lens-ebpf/lens-ebpf"] * 3
    assert len(calls) == 1
    assert check("good", "gpu-2") == "lens-ebpf/lens-ebpf" and len(calls) == 2  # its own claim
    assert [check("bad"), check("bad")] == ["PERMISSION_DENIED"] * 2 and len(calls) == 3
    assert [check("down"), check("down")] == ["UNAVAILABLE"] * 2 and len(calls) == 5  # not kept
    now[0] += 11  # a refusal is kept 10 s at most, a good verdict cache_seconds
    assert check("bad") == "PERMISSION_DENIED" and check("good") and len(calls) == 6
    now[0] += 50
    assert check("good") and len(calls) == 7
    # a token that expires in 5 s is kept no longer than that
    soon = "good#" + jwt(time.time() + 5)
    assert check(soon) and check(soon) and len(calls) == 8
    now[0] += 6
    assert check(soon) and len(calls) == 9


def test_tokens_file_changes_are_read_again(tmp_path: Path) -> None:
    f = tmp_path / "tokens"
    f.write_text("gpu-1 first\n")
    guard = Guard(
        CollectorAuthConfig(tokenreview=False, tokens_file=str(f)),
        "0.0.0.0:1",
        "collector",
        node_bound=True,
    )
    assert asyncio.run(guard.check("first", Claim("gpu-1"))) == "gpu-1"
    f.write_text("gpu-1 second-token\n")
    with pytest.raises(RefusedError):
        asyncio.run(guard.check("first", Claim("gpu-1")))
    assert asyncio.run(guard.check("second-token", Claim("gpu-1"))) == "gpu-1"


def test_the_recorders_settings_have_safe_defaults() -> None:
    from lens_ebpf.agent import config as agent_config
    from lens_ebpf.recorder import config as recorder_config

    rec = recorder_config.load(env={}).grpc
    assert (rec.auth.tokenreview, rec.auth.audience, rec.auth.anonymous) == (
        True,
        "lens-ebpf-collector",
        "loopback",
    )
    # the agents' account in the recorder's own namespace (the release's, deploy/'s)
    assert rec.auth.accounts("gpu-watch") == ["gpu-watch/lens-ebpf"]
    assert rec.max_seq_jump == 10**12
    agent = agent_config.load(env={})
    assert (agent.grpc.auth.tokenreview, agent.grpc.auth.audience) == (True, "lens-ebpf-agent")
    assert agent.grpc.auth.accounts("lens-ebpf") == ["lens-ebpf/lens-ebpf-recorder"]
    assert agent.reporter.token_file == ""
    named = recorder_config.load(env={"LENS_GRPC__AUTH__SERVICE_ACCOUNTS": '["ops/a", "b"]'})
    assert named.grpc.auth.accounts("lens-ebpf") == ["ops/a", "lens-ebpf/b"]
    with pytest.raises(Exception, match="namespace/name or a name"):
        recorder_config.load(env={"LENS_GRPC__AUTH__SERVICE_ACCOUNTS": '["ops/"]'})


def test_a_guard_with_no_way_to_check_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Once its port serves (announce()), not when it is made: binding may still fail on
    another port, and that failure is the service's one line (e2e test_port_in_use)."""
    with caplog.at_level(logging.WARNING):
        guard = Guard(CollectorAuthConfig(tokenreview=False), "0.0.0.0:9472", "collector")
        assert caplog.text == ""
        guard.announce()
    assert "every call is refused" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Guard(CollectorAuthConfig(tokenreview=False), "127.0.0.1:9472", "collector").announce()
    assert caplog.text == ""
