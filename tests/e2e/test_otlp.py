"""collectors.otlp end to end: the real agent, real TCP traffic and a container, and an
OTLP/HTTP receiver that decodes what comes with opentelemetry-proto (tests/otlplab.py; no
OpenTelemetry Collector installs from the registries the tests reach). Every flow
counter and RTT histogram it receives equals /metrics for the same flows, exactly; the
resources name the pods; a receiver down for 30 s loses nothing the queues held, and
what they dropped beyond their bounds is counted, one by one."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import AgentProc, parse_samples
from tests.conftest import wait_for
from tests.containerlab import Containerd, private_containerd
from tests.k8slab import FakeApiServer, eventually, owned, pod
from tests.netlab import exchange, listener, recv_exact
from tests.otlplab import OtlpReceiver, Sample, attrs, samples

pytestmark = pytest.mark.e2e

POLICY = "localhost: [127.0.0.0/8]\n"
KUBEADM = {
    "kind": "ConfigMap",
    "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
    "data": {
        "ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta3\n"
        "kind: ClusterConfiguration\nnetworking:\n  podSubnet: 127.0.5.0/24\n"
        "  serviceSubnet: 127.0.6.0/24\n"
    },
}
SERVER, CLIENT = "127.0.0.81", "127.0.5.17"  # the web pod's address, the client pod's
OURS = {SERVER, CLIENT}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.put("configmaps", KUBEADM)
    for name, rs, ip in (("web", "web-5d", SERVER), ("client", "client-7f", CLIENT)):
        server.put("deployments", owned("Deployment", name, "shop"))
        server.put("replicasets", owned("ReplicaSet", rs, "shop", owner=("Deployment", name)))
        server.put("pods", pod(f"{rs}-x7k", ip, "shop", owner=("ReplicaSet", rs)))
    yield server
    server.kill()


@pytest.fixture
def ctd() -> Iterator[Containerd]:
    yield from private_containerd("o")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    rx = OtlpReceiver().start()
    yield rx
    rx.stop()


def otlp_env(rx: OtlpReceiver, **more: str) -> dict[str, str]:
    return {
        "LENS_COLLECTORS__OTLP__ENABLED": "true",
        "LENS_COLLECTORS__OTLP__ENDPOINT": rx.endpoint,
        "LENS_COLLECTORS__OTLP__METRICS__INTERVAL_SECONDS": "1",
        "LENS_COLLECTORS__OTLP__LOGS__LINGER_SECONDS": "0.2",
        **{f"LENS_COLLECTORS__OTLP__{k.upper()}": v for k, v in more.items()},
    }


def ping_pong(seconds: float) -> None:
    """One connection from the client pod's address to the web pod's, a byte each way
    every 20 ms, so RTT samples come in several sample periods."""
    srv = listener(SERVER)
    cli = socket.socket()
    cli.bind((CLIENT, 0))
    cli.connect(srv.getsockname())
    conn, _ = srv.accept()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        cli.sendall(b"p")
        recv_exact(conn, 1)
        conn.sendall(b"q")
        recv_exact(cli, 1)
        time.sleep(0.02)
    cli.close()
    conn.close()
    srv.close()


def flow_series(got: dict[Sample, float]) -> dict[Sample, float]:
    """The flow families' series of the test's own addresses (the agent sees every flow
    of the host: its scrapes, its OTLP requests, other tests), the pods' k8s seed counter,
    and the container families of the test's pod; counters named without _total."""
    out = {}
    for (name, labels), v in got.items():
        lbl = dict(labels)
        flows = name.startswith(("lens_tcp_", "primus_lens_network_")) and (
            lbl.get("raddr") in OURS or name == "primus_lens_network_k8s_tcp_flow"
        )
        if flows or name.startswith("lens_container_") and lbl.get("pod") == "p-0":
            out[(name.removesuffix("_total"), labels)] = v
    return out


def scraped(agent: AgentProc) -> dict[Sample, float]:
    return flow_series(
        {(n, frozenset(lbl.items())): v for n, lbl, v in parse_samples(agent.metrics_text())}
    )


def test_the_export_equals_metrics_for_the_same_flows_and_names_the_pods(
    api: FakeApiServer, ctd: Containerd, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    agent = AgentProc(
        "--policy",
        str(policy),
        env={
            **otlp_env(receiver),
            "LENS_KUBERNETES__KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")),
            "LENS_KUBERNETES__POD_RESOURCES__SOCKET": str(tmp_path / "no-kubelet.sock"),
            "LENS_KUBERNETES__KUBELET__ENABLED": "false",
            "LENS_CONTAINERS__CONTAINERD_STATE": str(ctd.state),
        },
    )
    try:
        agent.wait_ready()

        def k8s() -> dict:
            return agent.json("/readyz")[1]["kubernetes"] or {}

        eventually(lambda: k8s().get("watches", {}).get("pods", {}).get("synced"), 10, 0.2)
        eventually(lambda: k8s()["index"]["pods"] == 2, 10, 0.2)
        srv = listener(SERVER)
        sport = srv.getsockname()[1]
        sent = [300, 1000, 4096]
        ports = [exchange(srv, SERVER, n, 10 * (i + 1), bind=CLIENT)[1] for i, n in enumerate(sent)]
        srv.close()
        ping_pong(3.0)
        cid = "otlp" + uuid.uuid4().hex[:8]
        res = ctd.run(
            cid,
            "/bin/sh",
            "-c",
            "/bin/echo hi",
            labels={
                "io.kubernetes.pod.name": "p-0",
                "io.kubernetes.pod.namespace": "team-p",
                "io.kubernetes.container.name": "c",
            },
        )
        assert res.returncode == 0, res.stderr

        # /metrics once it holds all of it and stands still (two reads a second apart)
        def settled() -> dict[Sample, float] | None:
            first = scraped(agent)
            names = {n for n, _ in first}
            if (
                not {
                    "lens_tcp_rtt_seconds_count",
                    "lens_tcp_sent_bytes",
                    "lens_container_process_execs",
                }
                <= names
            ):
                return None
            time.sleep(1.0)
            return first if scraped(agent) == first else None

        want = wait_for(settled, "the flows' and the container's series, settled", 30)
        mark = time.time_ns()

        def exported() -> dict[Sample, float] | None:
            for r in receiver.metrics():
                points = [
                    p
                    for rm in r.message.resource_metrics
                    for sm in rm.scope_metrics
                    for m in sm.metrics
                    if m.name == "lens_tcp_sent_bytes"
                    for p in m.sum.data_points
                ]
                if points and points[0].time_unix_nano > mark:
                    return flow_series(samples(r.message))
            return None

        got = wait_for(exported, "a snapshot taken after /metrics settled", 15)
        assert scraped(agent) == want  # nothing moved meanwhile
        assert got == want
        # what the comparison covers: the flows' bytes both ways, RTT histograms, the execs
        sent_bytes = {
            dict(lbl)["direction"]: v
            for (n, lbl), v in got.items()
            if n == "lens_tcp_sent_bytes" and dict(lbl)["port"] == str(sport)
        }
        assert sent_bytes == {"egress": sum(sent), "ingress": 60}
        rtt = {
            dict(lbl)["direction"]: v
            for (n, lbl), v in got.items()
            if n == "lens_tcp_rtt_seconds_count"
        }
        assert set(rtt) == {"egress", "ingress"} and min(rtt.values()) > 0
        assert sum(1 for n, _ in got if n == "primus_lens_network_tcp_flow_rtt_bucket") > 0
        # the resources: the node, and the container's pod
        last = receiver.metrics()[-1].message
        resources = [attrs(rm.resource.attributes) for rm in last.resource_metrics]
        node = resources[0]
        assert node["host.name"] == node["k8s.node.name"] == socket.gethostname()
        assert node["service.name"] == "lens-ebpf-agent"
        assert {
            **node,
            "k8s.namespace.name": "team-p",
            "k8s.pod.name": "p-0",
            "k8s.container.name": "c",
        } in resources
        opened = [
            attrs(p.attributes)
            for rm in last.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "lens_tcp_connections_opened"
            for p in m.sum.data_points
        ]
        assert {
            "direction": "egress",
            "type": "k8sPod",
            "raddr": SERVER,
            "port": str(sport),
            "remote_namespace": "shop",
            "remote_pod": "web-5d-x7k",
            "remote_workload_kind": "Deployment",
            "remote_workload": "web",
        } in opened

        # the events: each flow under its local pod's resource, the exec under its pod's
        def records() -> list[tuple[dict[str, Any], dict[str, Any], Any]]:
            return [
                (attrs(rl.resource.attributes), attrs(rec.attributes), rec)
                for r in receiver.logs()
                for rl in r.message.resource_logs
                for sl in rl.scope_logs
                for rec in sl.log_records
            ]

        def flows() -> list[tuple[dict[str, Any], dict[str, Any], Any]] | None:
            got = [
                x
                for x in records()
                if x[2].event_name == "flow_closed"
                and (x[1].get("lport") in ports or x[1].get("rport") in ports)
            ]
            return got if len(got) >= 2 * len(ports) else None

        closed = wait_for(flows, "both ends of the test's flows as log records", 15)
        for res_attrs, rec_attrs, rec in closed:
            egress = rec_attrs["direction"] == "egress"
            mine, theirs = ("client", "web") if egress else ("web", "client")
            assert res_attrs["k8s.namespace.name"] == "shop"
            assert res_attrs["k8s.pod.name"] == ("client-7f-x7k" if egress else "web-5d-x7k")
            assert res_attrs["k8s.deployment.name"] == mine
            assert rec_attrs["remote_workload"] == theirs
            assert rec_attrs["class"] == "k8sPod"
            assert rec.time_unix_nano > 0 and rec.severity_text == "INFO"
            i = ports.index(rec_attrs["lport"] if egress else rec_attrs["rport"])
            assert rec_attrs["sent_bytes"] == (sent[i] if egress else 10 * (i + 1))
        execs = wait_for(
            lambda: [
                x
                for x in records()
                if x[2].event_name == "process_exec" and x[0].get("k8s.pod.name") == "p-0"
            ],
            "the exec records",
        )
        assert {
            "k8s.namespace.name": "team-p",
            "k8s.container.name": "c",
            "container.id": cid,
        }.items() <= execs[0][0].items()
        assert "/bin/echo" in [x[1].get("filename") for x in execs]
        assert agent.sample("lens_agent_otlp_exported_total", {"signal": "logs"}) >= 8
        assert agent.sample("lens_agent_feature_up", {"feature": "otlp"}) == 1
    finally:
        rc = agent.stop()
    assert rc == 0, agent.output()


def seqs(rx: OtlpReceiver) -> dict[int, float]:
    """Each log record's event seq -> when its request arrived."""
    return {
        int(attrs(rec.attributes)["seq"]): r.at
        for r in rx.logs()
        for rl in r.message.resource_logs
        for sl in rl.scope_logs
        for rec in sl.log_records
    }


def test_a_receiver_down_for_30_s_loses_nothing_the_queues_held(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    # every kind, so the bus's seq numbers each event this exporter is given: what did not
    # arrive is exactly what the queue dropped
    agent = AgentProc(
        "--policy",
        str(policy),
        env={
            **otlp_env(
                receiver,
                logs__kinds="[]",
                logs__queue="20",
                logs__batch="5",
                metrics__queue="3",
                backoff_max_seconds="0.5",
            ),
            "LENS_KUBERNETES__MODE": "off",
            "LENS_COLLECTORS__PROCESSES__ENABLED": "false",
        },
    )
    try:
        agent.wait_ready()
        srv = listener("127.0.0.91")
        exchange(srv, "127.0.0.91", 100, 100)
        wait_for(lambda: receiver.metrics() and seqs(receiver), "the first requests", 15)
        receiver.stop()
        down = time.time()
        time.sleep(0.2)  # a request the receiver was taking is in
        before = seqs(receiver)
        stop = threading.Event()

        def load() -> None:  # ~2 closed flows (both ends) 5 times a second
            while not stop.wait(0.2):
                exchange(srv, "127.0.0.91", 100, 100)

        t = threading.Thread(target=load)
        t.start()
        time.sleep(30)
        receiver.start()  # the same port
        up = time.time()
        time.sleep(1)
        stop.set()
        t.join()
        srv.close()

        def accounted() -> tuple[dict[int, float], int] | None:
            dropped = agent.sample(
                "lens_agent_otlp_dropped_total", {"signal": "logs", "reason": "queue_full"}
            )
            got = seqs(receiver)
            again = agent.sample(
                "lens_agent_otlp_dropped_total", {"signal": "logs", "reason": "queue_full"}
            )
            first, last = min(before), max(got)
            missing = [s for s in range(first, last + 1) if s not in got]
            return (got, int(dropped)) if dropped == again and len(missing) == dropped else None

        got, dropped = wait_for(
            accounted, lambda: f"missing seqs to equal the drops: " f"{agent.output()[-2000:]}", 20
        )
        # the outage's drops: the oldest beyond the queue, one run of them after the batch
        # that was in hand when the receiver went (a tiny queue drops in bursts at other
        # times too: counted all the same)
        last = max(before)
        start = next(x for x in range(last + 1, max(got)) if x not in got)
        end = next(x for x in range(start, max(got)) if x in got) - 1
        assert dropped >= end - start + 1 > 20
        # held: that batch, sent again, and the queue's 20, each once the receiver was back
        held_batch = range(last + 1, start)
        assert 1 <= len(held_batch) <= 5 and all(got[x] >= up for x in held_batch)
        assert all(x in got and got[x] >= up for x in range(end + 1, end + 21))

        # metrics: a snapshot a second, three waiting: each one made was sent, dropped
        # (counted), is waiting or is in hand
        def snapshots() -> dict[str, float] | None:
            m = {"signal": "metrics"}
            n = {
                r: agent.sample("lens_agent_otlp_batches_total", {**m, "result": r}) or 0.0
                for r in ("exported", "dropped")
            }
            made = agent.sample("lens_agent_otlp_batches_made_total", m) or 0.0
            waiting = agent.sample("lens_agent_otlp_queue", m) or 0.0
            unsent = made - n["exported"] - n["dropped"] - waiting
            arrived = len({_time(r) for r in receiver.metrics()})  # a request sent twice: once
            return n if 0 <= unsent <= 1 and arrived == n["exported"] else None

        counts = wait_for(snapshots, "the metric snapshots accounted for", 10)
        assert counts["dropped"] >= 15  # about 30 made while it was down
        assert (
            agent.sample(
                "lens_agent_otlp_dropped_total", {"signal": "metrics", "reason": "queue_full"}
            )
            > 0
        )
        held = [r for r in receiver.metrics(since=up) if _time(r) < up * 1e9]
        assert 3 <= len(held) <= 4  # the one in hand, the queue's (a new one may push one)
        assert all(down * 1e9 - 2e9 < _time(r) for r in held)
        assert (
            agent.sample("lens_agent_otlp_requests_total", {"signal": "logs", "result": "retry"})
            > 0
        )
    finally:
        rc = agent.stop()
    assert rc == 0, agent.output()


def _time(r: Any) -> int:
    """A metrics request's snapshot time: its first data point's."""
    m = r.message.resource_metrics[0].scope_metrics[0].metrics[0]
    return int(getattr(m, m.WhichOneof("data")).data_points[0].time_unix_nano)
