"""The gRPC event API against the running agent: filters, slow subscribers, the reporter
and its replay, TLS, malformed requests, and the generated code's drift."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import signal
import subprocess
import threading
import uuid
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests.agentproc import LENS_CMD, AgentProc, free_port, run_cli
from tests.conftest import hang_guard, wait_for
from tests.containerlab import Containerd
from tests.containerlab import unavailable as containers_unavailable
from tests.grpclab import make_certs, spawn_execs

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def start_agent(tmp: Path, extra: str = "", *args: str) -> tuple[AgentProc, str]:
    port = free_port()
    cfg = tmp / f"lens-{uuid.uuid4().hex[:6]}.yaml"
    cfg.write_text(f"grpc:\n  listen: 127.0.0.1:{port}\n{extra}")
    agent = AgentProc("--config", str(cfg), "--no-collector.tcp", *args)
    agent.wait_ready()
    return agent, f"127.0.0.1:{port}"


def wait_subscribers(agent: AgentProc, n: int, timeout: float = 10) -> None:
    wait_for(
        lambda: agent.sample("lens_agent_subscribers", {"subscriber": "grpc"}) == n,
        f"{n} subscriptions",
        timeout,
    )


class Reader:
    """Reads a Subscribe stream in a thread of its own."""

    def __init__(self, stub: lens_pb2_grpc.EventServiceStub, req: pb.SubscribeRequest) -> None:
        self.events: list[pb.Event] = []
        self.stream = stub.Subscribe(req)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for ev in self.stream:
                self.events.append(ev)
        except grpc.RpcError:
            pass

    def close(self) -> list[pb.Event]:
        self.stream.cancel()
        self.thread.join(5)
        return self.events


def test_filtered_subscriber_gets_exactly_its_containers_execs(tmp_path: Path) -> None:
    if reason := containers_unavailable():
        pytest.skip(reason)
    ctd = Containerd(Path(f"/tmp/lens-ctd-g{os.getpid()}"))
    agent, addr = start_agent(tmp_path, f"containers:\n  containerd_state: {ctd.state}\n")
    one, two = "g1" + uuid.uuid4().hex[:6], "g2" + uuid.uuid4().hex[:6]
    try:
        stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(addr))
        filtered = Reader(stub, pb.SubscribeRequest(kinds=["process_exec"], container=one))
        everything = Reader(stub, pb.SubscribeRequest(kinds=["process_exec"]))
        wait_subscribers(agent, 2)
        # Each container lives until its events are read: one whose whole life passes
        # before the agent's threads run (a few ms on a starved node) is the limit
        # docs/agent/containers.md names, not what this test is about (5ae623b's CI lost one so).
        for cid in (one, two):
            run = ctd.run(cid, "/bin/sh", "-c", "/bin/echo hi; exec /bin/sleep 60", detach=True)
            assert run.returncode == 0, run.stderr

        def slept(reader: Reader, cid: str) -> bool:  # the last exec each stream waits for
            return any(
                e.process_exec.identity.container_id == cid
                and e.process_exec.filename == "/bin/sleep"
                for e in reader.events
            )

        def seen() -> str:  # what each stream has of /bin/*, for a failure's message
            def of(reader: Reader) -> list[tuple[str, str, int]]:
                return [
                    (
                        e.process_exec.filename,
                        e.process_exec.identity.container_id,
                        e.process_exec.cgroup_id,
                    )
                    for e in reader.events
                    if e.process_exec.filename.startswith("/bin/")
                ]

            return f"both sleeps ({one}, {two}); all: {of(everything)}; {one}'s: {of(filtered)}"

        wait_for(lambda: slept(everything, two) and slept(filtered, one), seen)
        got, allev = filtered.close(), everything.close()
        assert {e.process_exec.identity.container_id for e in got} == {one}
        assert [
            e.process_exec.filename for e in got if e.process_exec.filename.startswith("/bin/")
        ] == ["/bin/sh", "/bin/echo", "/bin/sleep"]
        mine = [e for e in allev if e.process_exec.identity.container_id == one]
        assert [e.seq for e in mine] == [e.seq for e in got]  # the same events, same numbers
        assert any(e.process_exec.identity.container_id == two for e in allev)
        assert all(e.node_name and e.seq for e in allev)
        assert [e.seq for e in allev] == sorted(e.seq for e in allev)
    finally:
        for cid in (one, two):
            ctd.remove(cid)
        agent.stop()
        ctd.stop()


def test_malformed_requests_are_invalid_argument(tmp_path: Path) -> None:
    agent, addr = start_agent(tmp_path)
    try:
        stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(addr))
        for req, needle in (
            (pb.SubscribeRequest(kinds=["tcp_dance"]), "unknown kind"),
            (pb.SubscribeRequest(from_seq=-5), "from_seq"),
        ):
            with pytest.raises(grpc.RpcError) as err:
                next(iter(stub.Subscribe(req)))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert needle in err.value.details()
        # bytes that are no protobuf at all: the caller's error too, not INTERNAL
        channel = grpc.insecure_channel(addr)
        for method, call in (
            ("/lens.v1.EventService/Subscribe", channel.unary_stream),
            ("/lens.v1.NodeService/GetNode", channel.unary_unary),
        ):
            rpc = call(method, request_serializer=lambda b: b, response_deserializer=bytes)
            with pytest.raises(grpc.RpcError) as err:
                got = rpc(b"\xff" * 5000, timeout=hang_guard(5))
                next(iter(got)) if method.endswith("Subscribe") else got
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert err.value.details().startswith("request is not a lens.v1.")
            assert "5000 bytes" in err.value.details()
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(addr))
        resp = health.Check(health_pb2.HealthCheckRequest(service="lens.v1.EventService"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        node = lens_pb2_grpc.NodeServiceStub(grpc.insecure_channel(addr)).GetNode(
            pb.GetNodeRequest()
        )
        assert node.features["processes"] == "attached" and node.version
    finally:
        agent.stop()


def test_500_idle_subscribers_starve_no_one_and_the_limit_is_counted(tmp_path: Path) -> None:
    """Streams wait on the event loop, not in a thread each: health, GetNode and new
    streams still answer; beyond grpc.max_subscribers a stream is refused, and counted."""
    agent, addr = start_agent(tmp_path, "  max_subscribers: 500\n", "--no-collector.processes")
    channel = grpc.insecure_channel(addr)
    stub = lens_pb2_grpc.EventServiceStub(channel)
    streams = [stub.Subscribe(pb.SubscribeRequest(kinds=["oom_kill"])) for _ in range(500)]
    try:
        wait_subscribers(agent, 500, timeout=60)
        health = health_pb2_grpc.HealthStub(grpc.insecure_channel(addr))
        resp = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=hang_guard(5))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        node = lens_pb2_grpc.NodeServiceStub(grpc.insecure_channel(addr)).GetNode(
            pb.GetNodeRequest(), timeout=hang_guard(5)
        )
        assert node.version
        with pytest.raises(grpc.RpcError) as err:
            next(iter(stub.Subscribe(pb.SubscribeRequest(), timeout=hang_guard(5))))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "grpc.max_subscribers" in err.value.details()
        assert agent.sample("lens_agent_grpc_streams_refused_total") == 1
        assert agent.sample("lens_agent_grpc_streams") == 500
    finally:
        for st in streams:
            st.cancel()
        agent.stop()


def test_a_second_agent_on_the_same_grpc_port_exits_2(tmp_path: Path) -> None:
    agent, addr = start_agent(tmp_path, "", "--no-collector.processes")
    try:
        cfg = tmp_path / "second.yaml"
        cfg.write_text(f"grpc:\n  listen: {addr}\n")
        res = run_cli(
            "run",
            "--config",
            str(cfg),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--no-collector.tcp",
            "--no-collector.processes",
            timeout=60,
        )
        assert res.returncode == 2, (res.returncode, res.stderr)
        lines = res.stderr.strip().splitlines()
        want = f"gRPC: cannot listen on {addr}: Address already in use"
        assert len(lines) == 1 and want in lines[0], res.stderr
    finally:
        agent.stop()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_a_subscriber_that_never_reads_is_bounded_and_delays_no_one(tmp_path: Path) -> None:
    agent, addr = start_agent(tmp_path, "  subscriber_queue: 1000\n")
    try:
        stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(addr))
        # the stalled client keeps HTTP/2's default 64 KiB window (no BDP growth), so the
        # transport soon stops taking its messages, as a stuck client's would
        tight = grpc.insecure_channel(addr, options=[("grpc.http2.bdp_probe", 0)])
        stalled = lens_pb2_grpc.EventServiceStub(tight).Subscribe(
            pb.SubscribeRequest(kinds=["process_exec"])
        )  # never read
        fast = Reader(stub, pb.SubscribeRequest(kinds=["process_exec"]))
        wait_subscribers(agent, 2)
        rss0 = rss_kb(agent.proc.pid)
        gen = spawn_execs(3000)  # 3x what the stalled subscriber's queue holds
        gen.wait(hang_guard(120))

        def fast_got() -> list[pb.Event]:
            return [e for e in list(fast.events) if e.process_exec.ppid == gen.pid]

        wait_for(lambda: len(fast_got()) >= 3000, lambda: f"3000 execs ({len(fast_got())})")
        grew_mb = (rss_kb(agent.proc.pid) - rss0) / 1024
        fast.close()
        assert len(fast_got()) == 3000  # the reading subscriber missed nothing
        assert grew_mb < 40, grew_mb
        dropped = agent.sample("lens_agent_subscriber_events_dropped_total", {"subscriber": "grpc"})
        assert dropped and dropped > 0
        # when it finally reads (past what the transport held), it is told what it lost
        gaps, before = [], 0
        for n, ev in enumerate(stalled):
            if ev.HasField("gap"):
                gaps.append(ev)
                break
            before = ev.seq
            assert n < 5000, "no gap marker"
        assert gaps and gaps[0].gap.reason == "slow_subscriber"
        # the gap counts what was dropped until it was sent; the counter, read after it,
        # has at least that (other processes' execs may have been dropped meanwhile)
        after = agent.sample("lens_agent_subscriber_events_dropped_total", {"subscriber": "grpc"})
        assert 0 < gaps[0].gap.lost <= (after or 0)
        # numbered in the stream: as the newest event it stands for, after those read
        assert gaps[0].seq > before
        stalled.cancel()
    finally:
        agent.stop()


def collector(port: int, out: Path) -> subprocess.Popen:
    p = subprocess.Popen(
        [*LENS_CMD, "collect", "--listen", f"127.0.0.1:{port}", "--out", str(out)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stderr is not None and "listening" in p.stderr.readline()
    return p


def records(out: Path) -> tuple[list[int], list[dict]]:
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    return [int(r["seq"]) for r in lines if "seq" in r], [r["gap"] for r in lines if "gap" in r]


def wait_acked(agent: AgentProc, want: float, timeout: float = 20) -> None:
    wait_for(
        lambda: (agent.sample("lens_agent_reporter_acked_seq") or 0) >= want,
        f"the reporter's events acked up to {want}",
        timeout,
        every=0.3,
    )


def last_seq(addr: str) -> int:
    stub = lens_pb2_grpc.NodeServiceStub(grpc.insecure_channel(addr))
    return int(stub.GetNode(pb.GetNodeRequest(), timeout=hang_guard(5)).last_seq)


def run_execs(agent: AgentProc, n: int) -> None:
    """n execs of /bin/true, and their exits published: records of a cgroup the agent has
    named wait for their batch's wake-up (docs/agent/containers.md), up to 100 ms after
    the spawner is gone."""
    exits = {"kind": "process_exit"}
    before = agent.sample("lens_agent_events_published_total", exits) or 0
    spawn_execs(n).wait(hang_guard(60))
    wait_for(
        lambda: (agent.sample("lens_agent_events_published_total", exits) or 0) >= before + n,
        f"{n} exits published",
        every=0.1,
    )


def test_reporter_replays_every_event_after_a_collector_outage(tmp_path: Path) -> None:
    cport = free_port()
    out = tmp_path / "events.jsonl"
    col = collector(cport, out)
    rep = f"reporter:\n  target: 127.0.0.1:{cport}\n  buffer: 100000\n  backoff_max_seconds: 2\n"
    agent, addr = start_agent(tmp_path, rep)
    try:
        # events before, during and after the outage: 200 execs (exec and exit) each
        run_execs(agent, 200)
        wait_acked(agent, last_seq(addr))
        col.send_signal(signal.SIGKILL)
        col.wait()
        run_execs(agent, 200)  # while the collector is gone
        wait_for(lambda: agent.sample("lens_agent_reporter_connected") == 0, "the reporter down")
        col = collector(cport, out)
        run_execs(agent, 200)
        node = lens_pb2_grpc.NodeServiceStub(grpc.insecure_channel(addr)).GetNode(
            pb.GetNodeRequest()
        )
        wait_acked(agent, node.last_seq)
        seqs, gaps = records(out)
        assert gaps == []
        assert len(seqs) == len(set(seqs))  # no duplicates written
        assert seqs == list(range(seqs[0], seqs[-1] + 1))  # and no hole
        assert seqs[-1] >= node.last_seq - 5 and len(seqs) > 1200
        assert agent.sample("lens_agent_reporter_lost_total") == 0
        assert agent.sample("lens_agent_reporter_reconnects_total") >= 1
        # the device inventory again on each connect: the collector's restart sees one
        lines = [json.loads(x) for x in out.read_text().splitlines()]
        inventories = [int(r["seq"]) for r in lines if "device_inventory" in r]
        assert len(inventories) >= 2 and inventories[-1] > seqs[0] + 800, inventories
    finally:
        agent.stop()
        col.terminate()


def test_loss_beyond_the_buffer_is_counted_and_reported(tmp_path: Path) -> None:
    cport = free_port()
    out = tmp_path / "events.jsonl"
    col = collector(cport, out)
    rep = f"reporter:\n  target: 127.0.0.1:{cport}\n  buffer: 50\n  backoff_max_seconds: 1\n"
    agent, addr = start_agent(tmp_path, rep)
    try:
        col.send_signal(signal.SIGKILL)
        col.wait()
        spawn_execs(300).wait(hang_guard(60))  # 600+ events into a 50-event buffer
        col = collector(cport, out)
        wait_for(lambda: records(out)[1], "a gap record at the collector", every=0.3)
        _, gaps = records(out)
        # the gap stands for both: those never sent (lost) and those sent on the stream
        # the collector's death cut before it acknowledged them (unconfirmed)
        lost = agent.sample("lens_agent_reporter_lost_total")
        unconfirmed = agent.sample("lens_agent_reporter_unconfirmed_total") or 0
        assert gaps and gaps[0]["reason"] == "reporter_buffer" and int(gaps[0]["lost"]) > 0
        assert lost and lost + unconfirmed >= int(gaps[0]["lost"])
    finally:
        agent.stop()
        col.terminate()


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    d = tmp_path / "pki"
    d.mkdir()
    return make_certs(d)


def get_node(addr: str, creds: grpc.ChannelCredentials | None) -> pb.NodeInfo:
    chan = grpc.secure_channel(addr, creds) if creds else grpc.insecure_channel(addr)
    stub = lens_pb2_grpc.NodeServiceStub(chan)
    return stub.GetNode(pb.GetNodeRequest(), timeout=hang_guard(5))


def test_tls_and_mutual_tls(tmp_path: Path, certs: dict[str, Path]) -> None:
    tls = f"  tls:\n    cert: {certs['server.crt']}\n    key: {certs['server.key']}\n"
    agent, addr = start_agent(tmp_path, tls)
    try:
        ca = certs["ca.crt"].read_bytes()
        assert get_node(addr, grpc.ssl_channel_credentials(ca)).node_name
        with pytest.raises(grpc.RpcError):  # no CA: the server's certificate is not trusted
            get_node(addr, grpc.ssl_channel_credentials())
        with pytest.raises(grpc.RpcError):  # plaintext to a TLS port
            get_node(addr, None)
    finally:
        agent.stop()
    agent, addr = start_agent(tmp_path, tls + f"    client_ca: {certs['ca.crt']}\n")
    try:
        with pytest.raises(grpc.RpcError):  # mTLS: a client without a certificate is refused
            get_node(addr, grpc.ssl_channel_credentials(ca))
        creds = grpc.ssl_channel_credentials(
            ca, certs["client.key"].read_bytes(), certs["client.crt"].read_bytes()
        )
        assert get_node(addr, creds).node_name
    finally:
        agent.stop()


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)], check=True)
    for sub, gen, stem in (
        ("api", "lens_ebpf/protocol/gen", "lens"),
        ("k8s", "lens_ebpf/k8s/gen", "podresources_v1"),
        ("cluster", "lens_ebpf/recorder/gen", "remote_write_v1"),
        ("cluster", "lens_ebpf/recorder/gen", "remote_write_v2"),
    ):
        grpc_code = () if sub == "cluster" else (f"{stem}_pb2_grpc.py",)
        for name in (f"{stem}_pb2.py", f"{stem}_pb2.pyi", *grpc_code):
            assert filecmp.cmp(
                tmp_path / sub / name, ROOT / gen / name, shallow=False
            ), f"{name} is stale: run make protos"


def test_collector_dedups_and_recovers_from_its_file(tmp_path: Path) -> None:
    from lens_ebpf.protocol.collector_server import recover

    out = tmp_path / "e.jsonl"
    # lines of a collector older than the agent instance (instance ""), then of two
    # instances of n1 (a restarted agent numbers from 1 again)
    out.write_text(
        '{"node": "n1", "seq": "7"}\n{"node": "n1", "seq": "9"}\n{"node": "n2", '
        '"seq": "3"}\nnot json\n'
        '{"node": "n1", "instance": "b", "seq": "2"}\n'
        '{"node": "n1", "instance": "a", "seq": "4"}\n'
        '{"node": "n1", "instance": "b", "seq": "3"}\n'
    )
    got = recover(out)
    assert got == {"n1": {"": 9, "a": 4, "b": 3}, "n2": {"": 3}}
    assert list(got["n1"]) == ["", "a", "b"]  # in the order they last wrote
