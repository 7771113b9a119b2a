"""Issue 69, defect 1, against a real kube-apiserver 1.20.2: who may report on the recorder's
collector port, and who may subscribe on the agent's.

deploy/'s ServiceAccounts and RBAC applied as shipped (the recorder's and the agent's
system:auth-delegator bindings among them); the test plays the kubelet and the scheduler:
an agent pod on each of two nodes, their ServiceAccount tokens bound to them as the
DaemonSet's projected volume binds them (TokenRequest with the pod as boundObjectRef and
the collector's audience). The recorder runs as its own ServiceAccount, the agent's real
reporter on the other side, its token read from a file.

What it shows: forged streams (no token, another ServiceAccount's token, the token of the
agent on another node, a token for another audience, one bound to no pod, another
cluster's name, and the node's own token with seq 2^62) are refused with
UNAUTHENTICATED, PERMISSION_DENIED or INVALID_ARGUMENT, before any acknowledgement; the
node's own token under an agent instance of its own moves that instance's numbering only;
the real agent's buffer, acknowledgements and stored events are as if they had never come,
across a recorder restart (its resume point, per instance, read back from the database);
the refusals are counted by code. The agent's port refuses a subscriber without a token,
with another ServiceAccount's, or for another audience, and serves the recorder's."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import create_engine, select

from lens_ebpf.agent.config import GrpcConfig, KubernetesConfig, NodeConfig, ReporterConfig
from lens_ebpf.agent.events import EventBus, NodeTuned
from lens_ebpf.agent.stream.event_api import EventApi
from lens_ebpf.agent.stream.reporter import Reporter
from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from lens_ebpf.protocol.stream_auth import SubscriberAuthConfig
from lens_ebpf.recorder.store import schema as t
from tests.agentproc import free_port
from tests.conftest import hang_guard, wait_for
from tests.kube.apiserver import KubeApiServer, unavailable
from tests.kube.recorders import apply
from tests.reportersim import Answer, report_once

ROOT = Path(__file__).resolve().parents[2]
NS = "lens-ebpf"  # deploy/'s
AGENT_SA, RECORDER_SA = "lens-ebpf", "lens-ebpf-recorder"
COLLECTOR, AGENT_PORT = "lens-ebpf-collector", "lens-ebpf-agent"  # the audiences
FORGED = 2**62
UNAUTH, DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def ok(got: tuple[int, Any]) -> Any:
    status, body = got
    assert status in (200, 201), (status, body)
    return body


def pod_on(lab: KubeApiServer, ns: str, name: str, sa: str, node: str) -> dict[str, Any]:
    """A pod the scheduler put on node (spec.nodeName), running as sa."""
    body = {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": sa,
            "containers": [{"name": "main", "image": "lens-ebpf:0.1.0"}],
        },
    }
    made: dict[str, Any] = ok(lab.request("POST", f"/api/v1/namespaces/{ns}/pods", body))
    return made


def bound_token(lab: KubeApiServer, pod: dict[str, Any], sa: str, audience: str) -> str:
    """The token the kubelet mounts for pod's projected serviceAccountToken volume: sa's,
    bound to the pod, for audience."""
    meta = pod["metadata"]
    spec = {
        "audiences": [audience],
        "expirationSeconds": 3600,
        "boundObjectRef": {
            "kind": "Pod",
            "apiVersion": "v1",
            "name": meta["name"],
            "uid": meta["uid"],
        },
    }
    path = f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    got = ok(lab.request("POST", path, body))
    return str(got["status"]["token"])


@pytest.fixture(scope="module")
def lab() -> Iterator[KubeApiServer]:
    why = unavailable()
    if why:
        pytest.skip(why)
    with KubeApiServer() as server:
        apply(
            server,
            *(ROOT / "deploy" / f for f in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml")),
            *(ROOT / "deploy" / "recorder" / f for f in ("serviceaccount.yaml", "rbac.yaml")),
        )
        for node in ("gpu-1", "gpu-2"):
            ok(server.request("POST", "/api/v1/nodes", {"metadata": {"name": node}}))
        yield server


@pytest.fixture(scope="module")
def pods(lab: KubeApiServer) -> dict[str, dict[str, Any]]:
    ok(lab.request("POST", "/api/v1/namespaces", {"metadata": {"name": "ml"}}))
    ok(
        lab.request(
            "POST", "/api/v1/namespaces/ml/serviceaccounts", {"metadata": {"name": "trainer"}}
        )
    )
    return {
        "agent-1": pod_on(lab, NS, "lens-ebpf-a1", AGENT_SA, "gpu-1"),
        "agent-2": pod_on(lab, NS, "lens-ebpf-a2", AGENT_SA, "gpu-2"),
        "trainer": pod_on(lab, "ml", "trainer-0", "trainer", "gpu-1"),
        "recorder": pod_on(lab, NS, "lens-ebpf-recorder-0", RECORDER_SA, "gpu-2"),
    }


class Recorders:
    """`lens-ebpf recorder` in this process as its ServiceAccount, on one database and one
    collector port across restarts; the agents' tokens checked (no anonymous streams,
    though it listens on loopback)."""

    def __init__(self, lab: KubeApiServer, tmp: Path) -> None:
        self.kubeconfig = lab.kubeconfig_for(NS, RECORDER_SA, tmp / "recorder.kubeconfig")
        self.url = f"sqlite:///{tmp / 'recorder.db'}"
        self.port = free_port()
        self.app: Any = None

    def start(self) -> Any:
        from lens_ebpf.k8s.client import api_client
        from lens_ebpf.recorder import config
        from lens_ebpf.recorder.service import RecorderApp

        cfg = config.load(
            env={},
            overrides={
                ("recorder", "database_url"): self.url,
                ("recorder", "listen"): "127.0.0.1:0",
                ("recorder", "collect_listen"): f"127.0.0.1:{self.port}",
                ("recorder", "jobs", "allocation_seconds"): 3600,
                ("recorder", "reports", "weekly"): False,
                ("grpc", "auth", "anonymous"): "never",
            },
        )
        self.app = RecorderApp(cfg, api_client("kubeconfig", str(self.kubeconfig)))
        self.app.start()
        wait_for(self.app.tracker.pod_reflector.synced.is_set, "the recorder's pod list")
        return self.app

    def stop(self) -> None:
        if self.app is not None and not self.app._stop.is_set():
            self.app.stop(flush_timeout=5)

    def refused(self, code: str) -> float | None:
        got: float | None = self.app.registry.get_sample_value(
            "lens_recorder_collect_refused_total", {"code": code}
        )
        return got


def stored(url: str, node: str, instance: str | None = None) -> list[tuple[int | None, str]]:
    """node's events in the database (of one agent instance, or all): (seq, kind); a gap
    has no seq."""
    eng = create_engine(url)
    try:
        with eng.connect() as conn:
            ne = t.node_events
            which = [
                ne.c.node == node,
                *([ne.c.instance == instance] if instance is not None else []),
            ]
            rows = conn.execute(select(ne.c.seq, ne.c.kind).where(*which).order_by(ne.c.id))
            return [(r.seq, r.kind) for r in rows]
    finally:
        eng.dispose()


def tuned(i: int) -> NodeTuned:
    return NodeTuned(setting="vm.max_map_count", old_value=i, new_value=i + 1)


def fault(seq: int, node: str) -> pb.Event:
    bad = pb.GpuFault(gpu_index=0, vendor="nvidia", fault="xid", code="79", message="off the bus")
    return pb.Event(seq=seq, node_name=node, gpu_fault=bad)


@pytest.fixture(autouse=True)
def namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The services' own namespace (the recorder's POD_NAMESPACE; the agent's account's):
    grpc.auth.service_accounts' bare names are there."""
    monkeypatch.setenv("POD_NAMESPACE", NS)


def test_forged_streams_are_refused_and_the_real_agent_is_untouched(
    lab: KubeApiServer,
    pods: dict[str, dict[str, Any]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rec = Recorders(lab, tmp_path)
    app = rec.start()
    target = f"127.0.0.1:{rec.port}"
    token1 = bound_token(lab, pods["agent-1"], AGENT_SA, COLLECTOR)
    token_file = tmp_path / "token"  # the agent's projected volume
    token_file.write_text(token1 + "\n")
    bus = EventBus(1000)
    reporter = Reporter(
        target, bus, ("gpu-1", "10.0.0.1"), 1000, backoff_max=0.5, token_file=str(token_file)
    )
    reporter.start()
    try:
        for i in range(3):
            bus.publish(tuned(i))
        wait_for(lambda: reporter.acked == 3, "the agent's first events acknowledged", 30)
        assert stored(rec.url, "gpu-1") == [(1, "node_tuned"), (2, "node_tuned"), (3, "node_tuned")]

        # -- anyone on the cluster network ----------------------------------------
        def forge(node: str, token: str, cluster: str = "", instance: str = "") -> Answer:
            return report_once(
                target,
                node,
                [fault(FORGED, node)],
                token,
                cluster,
                timeout=hang_guard(20),
                instance=instance,
            )

        with caplog.at_level(logging.WARNING):
            tries = {
                "no token": (forge("gpu-1", ""), UNAUTH),
                "another ServiceAccount's": (
                    forge("gpu-1", bound_token(lab, pods["trainer"], "trainer", COLLECTOR)),
                    DENIED,
                ),
                "the agent's on gpu-2": (
                    forge("gpu-1", bound_token(lab, pods["agent-2"], AGENT_SA, COLLECTOR)),
                    DENIED,
                ),
                "the API's audience": (
                    forge(
                        "gpu-1",
                        bound_token(
                            lab,
                            pods["agent-1"],
                            AGENT_SA,
                            "https://kubernetes.default.svc.cluster.local",
                        ),
                    ),
                    UNAUTH,
                ),
                "bound to no pod": (
                    forge("gpu-1", lab.token_for(NS, AGENT_SA, [COLLECTOR])),
                    DENIED,
                ),
                "another cluster's node": (forge("gpu-1", token1, cluster="b"), UNAUTH),
            }
            for what, (got, code) in tries.items():
                # refused before the stream says anything (not even where it resumes)
                assert (got.code, got.acks) == (code, []), (what, got)
            # the node's own token, stolen (and its agent's instance): numbered beyond
            # anything it sent
            stolen = forge("gpu-1", token1, instance=bus.instance)
        assert (stolen.code, stolen.acks) == (INVALID, [3]), stolen
        assert "grpc.max_seq_jump" in stolen.details
        # stolen, under an agent instance of its own: its events are that instance's, the
        # real agent's numbering is not moved (nothing of its is taken as a duplicate)
        other = report_once(
            target,
            "gpu-1",
            [fault(n, "gpu-1") for n in range(1, 8)],
            token1,
            timeout=hang_guard(20),
            instance="stolen",
        )
        assert (other.code, other.acks[0], other.acks[-1]) == (None, 0, 7), other
        why = {what: got.details for what, (got, _) in tries.items()}
        assert "runs on node 'gpu-2', not 'gpu-1'" in why["the agent's on gpu-2"]
        assert "ml:trainer is not one of the allowed" in why["another ServiceAccount's"]
        assert "bound to no pod" in why["bound to no pod"]
        # logged once for the peer, counted each time
        assert sum("refused a call from" in r.getMessage() for r in caplog.records) == 1
        assert (
            rec.refused("unauthenticated"),
            rec.refused("permission_denied"),
            rec.refused("invalid_argument"),
        ) == (3, 3, 1)

        # -- the real agent: nothing of that reached it --------------------------
        for i in range(3, 6):
            bus.publish(tuned(i))
        wait_for(lambda: reporter.acked == 6, "the agent's later events acknowledged", 30)
        assert (
            reporter.acked_events,
            reporter.lost,
            reporter.unconfirmed,
            reporter.acks_refused,
        ) == (6, 0, 0, 0)
        want = [(seq, "node_tuned") for seq in range(1, 7)]
        assert stored(rec.url, "gpu-1", bus.instance) == want  # no gap, no fault
        assert stored(rec.url, "gpu-1", "") == []
        assert stored(rec.url, "gpu-2") == []
        assert app.node_events.ack_seq("local/gpu-1", bus.instance) == 6
        assert app.node_events.duplicates == 0

        # -- across a restart: the resume point read back is the agent's ---------
        rec.stop()
        wait_for(lambda: not reporter.connected, "the reporter down")
        for i in range(6, 9):
            bus.publish(tuned(i))
        app = rec.start()
        assert app.node_events.ack_seq("local/gpu-1", bus.instance) == 6
        assert app.node_events.ack_seq("local/gpu-1", "stolen") == 7
        wait_for(lambda: reporter.acked == 9, "the events of the outage acknowledged", 30)
        assert stored(rec.url, "gpu-1", bus.instance) == [
            (seq, "node_tuned") for seq in range(1, 10)
        ]
        assert (
            reporter.acked_events,
            reporter.lost,
            reporter.unconfirmed,
            reporter.acks_refused,
        ) == (9, 0, 0, 0)
        # and after it, the same forgery is refused the same way
        assert forge("gpu-1", "").code == UNAUTH
        assert forge("gpu-1", bound_token(lab, pods["agent-2"], AGENT_SA, COLLECTOR)).code == DENIED
        assert stored(rec.url, "gpu-1", bus.instance)[-1] == (9, "node_tuned")
    finally:
        reporter.stop()
        rec.stop()


def test_the_agents_port_takes_only_the_recorders_token(
    lab: KubeApiServer, pods: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """The agent as its ServiceAccount (deploy/rbac.yaml's auth-delegator binding) checks
    its callers with TokenReview: grpc.auth's defaults, no anonymous calls."""
    kubeconfig = lab.kubeconfig_for(NS, AGENT_SA, tmp_path / "agent.kubeconfig")
    bus = EventBus(1000, history=100)
    grpc_cfg = GrpcConfig(listen="127.0.0.1:0", auth=SubscriberAuthConfig(anonymous="never"))
    api = EventApi(
        NodeConfig(name="gpu-1", ip="10.0.0.1"),
        grpc_cfg,
        ReporterConfig(),
        bus,
        lambda: {},
        kubernetes=KubernetesConfig(mode="kubeconfig", kubeconfig=str(kubeconfig)),
    )
    api.bind()
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    api.start(registry)
    assert api.grpc is not None
    channel = grpc.insecure_channel(f"127.0.0.1:{api.grpc.port}")
    try:
        for i in range(3):
            bus.publish(tuned(i))
        stub = lens_pb2_grpc.EventServiceStub(channel)

        def first(token: str) -> pb.Event | grpc.StatusCode:
            meta = (("authorization", f"Bearer {token}"),) if token else ()
            try:
                return next(
                    iter(
                        stub.Subscribe(
                            pb.SubscribeRequest(from_seq=1), metadata=meta, timeout=hang_guard(20)
                        )
                    )
                )
            except grpc.RpcError as exc:
                return exc.code()

        assert first("") == UNAUTH
        # the agents' own account is not the recorder's
        assert first(bound_token(lab, pods["agent-2"], AGENT_SA, AGENT_PORT)) == DENIED
        recorder = pods["recorder"]
        # the recorder's, for the collector's audience: not this port's
        assert first(bound_token(lab, recorder, RECORDER_SA, COLLECTOR)) == UNAUTH
        got = first(bound_token(lab, recorder, RECORDER_SA, AGENT_PORT))
        assert isinstance(got, pb.Event) and got.seq == 1 and got.node_name == "gpu-1"
        for code, n in (("unauthenticated", 2), ("permission_denied", 1)):
            assert (
                registry.get_sample_value("lens_agent_grpc_calls_refused_total", {"code": code})
                == n
            )
    finally:
        channel.close()
        api.stop()
