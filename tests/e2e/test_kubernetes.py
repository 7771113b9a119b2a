"""The agent with a Kubernetes API (a local stand-in reached through a kubeconfig):
flows to pods carry the pod's identity, cluster CIDRs fill the policy, and an API
server killed mid-watch loses nothing: flows keep being counted, known pods keep
their labels, and the watch reconnects when the server returns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agentproc import AgentProc, parse_samples
from tests.k8slab import FakeApiServer, eventually, owned, pod, service
from tests.netlab import exchange, listener

pytestmark = pytest.mark.e2e

# k8sPod is left empty on purpose: the cluster's podSubnet fills it
POLICY = "localhost: [127.0.0.0/8]\ninternalHosts: [10.0.0.0/8]\n"
KUBEADM = {
    "kind": "ConfigMap",
    "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
    "data": {
        "ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta3\n"
        "kind: ClusterConfiguration\nnetworking:\n  podSubnet: 127.0.5.0/24\n"
        "  serviceSubnet: 127.0.6.0/24\n"
    },
}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.put("configmaps", KUBEADM)
    server.put("deployments", owned("Deployment", "web", "shop"))
    server.put("replicasets", owned("ReplicaSet", "web-5d", "shop", owner=("Deployment", "web")))
    server.put("pods", pod("web-5d-x7k", "127.0.0.81", "shop", owner=("ReplicaSet", "web-5d")))
    server.put("services", service("cache", "127.0.0.82", "shop"))
    yield server
    server.kill()


def flow_labels(addr: str, port: int, cls: str, **who: str) -> dict[str, str]:
    return {
        "direction": "egress",
        "type": cls,
        "raddr": addr,
        "port": str(port),
        **{f"remote_{k}": v for k, v in who.items()},
    }


WEB = {"namespace": "shop", "pod": "web-5d-x7k", "workload_kind": "Deployment", "workload": "web"}


def connect(addr: str, n: int = 100) -> int:
    srv = listener(addr)
    port, _ = exchange(srv, addr, n, 10)
    srv.close()
    return port


def test_identity_cidrs_and_api_killed_mid_watch(api: FakeApiServer, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    agent = AgentProc(
        "--policy",
        str(policy),
        env={
            "LENS_KUBERNETES__KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")),
            "LENS_KUBERNETES__BACKOFF_MAX_SECONDS": "1",
            "LENS_KUBERNETES__REQUEST_TIMEOUT_SECONDS": "2",
            "LENS_KUBERNETES__POD_RESOURCES__SOCKET": str(tmp_path / "no-kubelet.sock"),
            "LENS_KUBERNETES__KUBELET__ENABLED": "false",
            "LENS_COLLECTORS__PROCESSES__ENABLED": "false",
            "LENS_COLLECTORS__DROPS__ENABLED": "false",
        },
    )
    try:
        agent.wait_ready()

        def k8s() -> dict:
            return agent.json("/readyz")[1]["kubernetes"] or {}

        eventually(lambda: k8s().get("watches", {}).get("pods", {}).get("synced"), 10, 0.2)
        eventually(
            lambda: k8s()["cluster_cidrs"]["policy_classes_filled"] == ["k8sPod", "k8sSvc"], 10, 0.2
        )
        assert k8s()["cluster_cidrs"]["source"] == "kubeadm-config"
        assert agent.json("/readyz")[1]["features"]["kubernetes"]["state"] == "running"

        port = connect("127.0.0.81", 300)
        opened = "lens_tcp_connections_opened_total"
        assert agent.wait_sample(opened, flow_labels("127.0.0.81", port, "k8sPod", **WEB), 1) == 1
        assert (
            agent.sample(
                "lens_tcp_sent_bytes_total", flow_labels("127.0.0.81", port, "k8sPod", **WEB)
            )
            == 300
        )
        sport = connect("127.0.0.82")
        assert (
            agent.wait_sample(
                opened,
                flow_labels("127.0.0.82", sport, "k8sSvc", namespace="shop", service="cache"),
                1,
            )
            == 1
        )
        # not in the index, but inside the cluster's podSubnet: k8sPod from the kernel's trie
        cport = connect("127.0.5.9")
        assert agent.wait_sample(opened, flow_labels("127.0.5.9", cport, "k8sPod"), 1) == 1

        api.kill()
        up = {"resource": "pods"}
        assert agent.wait_sample("lens_k8s_watch_connected", up, 0) == 0
        port2 = connect("127.0.0.81", 500)  # the API is gone; the flow still counts, labelled
        assert (
            agent.wait_sample(
                "lens_tcp_sent_bytes_total", flow_labels("127.0.0.81", port2, "k8sPod", **WEB), 500
            )
            == 500
        )
        api.put("pods", pod("late-0", "127.0.0.83", "shop", owner=("StatefulSet", "late")))
        api.put("statefulsets", owned("StatefulSet", "late", "shop"))
        # reconnects fail meanwhile, with backoff
        eventually(
            lambda: (agent.sample("lens_k8s_watch_restarts_total", {**up, "reason": "error"}) or 0)
            >= 1
        )
        api.start()  # same port, same objects, and the pod created while it was down
        assert agent.wait_sample("lens_k8s_watch_connected", up, 1, timeout=15) == 1
        eventually(lambda: k8s()["index"]["pods"] == 2, 10, 0.2)
        lport = connect("127.0.0.83")
        late = {
            "namespace": "shop",
            "pod": "late-0",
            "workload_kind": "StatefulSet",
            "workload": "late",
        }
        assert agent.wait_sample(opened, flow_labels("127.0.0.83", lport, "k8sPod", **late), 1) == 1
        assert agent.sample("lens_k8s_index_objects", {"kind": "pods"}) == 2
    finally:
        rc = agent.stop()
    assert rc == 0, agent.output()


def test_a_pod_the_api_shows_after_its_first_connections_gets_them(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Issue 74 as a node showed it: a Deployment's pod connects 7 times to a dual-stack
    server on its node before the API has told the agent its IP. The ingress side spells
    the client 127.0.5.17 (not ::ffff:127.0.5.17), and once the pod is known its 7
    connections are its own, with no unlabelled series left counting them."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    agent = AgentProc(
        "--policy",
        str(policy),
        env={
            "LENS_KUBERNETES__KUBECONFIG": str(api.kubeconfig(tmp_path / "kubeconfig")),
            "LENS_KUBERNETES__POD_RESOURCES__SOCKET": str(tmp_path / "no-kubelet.sock"),
            "LENS_KUBERNETES__KUBELET__ENABLED": "false",
            "LENS_COLLECTORS__PROCESSES__ENABLED": "false",
            "LENS_COLLECTORS__DROPS__ENABLED": "false",
        },
    )
    try:
        agent.wait_ready()

        def k8s() -> dict:
            return agent.json("/readyz")[1]["kubernetes"] or {}

        eventually(lambda: k8s().get("watches", {}).get("pods", {}).get("synced"), 10, 0.2)
        eventually(
            lambda: k8s()["cluster_cidrs"]["policy_classes_filled"] == ["k8sPod", "k8sSvc"], 10, 0.2
        )
        srv = listener("::")  # the server pod's dual-stack listener
        try:
            for _ in range(7):  # the client pod, in the podSubnet, in its first instant
                port, _ = exchange(srv, "127.0.0.88", 100, 1000, bind="127.0.5.17")
        finally:
            srv.close()
        ing = {"direction": "ingress", "type": "k8sPod", "raddr": "127.0.5.17", "port": str(port)}
        opened = "lens_tcp_connections_opened_total"
        assert agent.wait_sample(opened, ing, 7) == 7
        assert "::ffff:" not in agent.metrics_text()
        api.put("deployments", owned("Deployment", "client", "shop"))
        api.put(
            "replicasets", owned("ReplicaSet", "client-7f", "shop", owner=("Deployment", "client"))
        )
        api.put(
            "pods", pod("client-7f-abc", "127.0.5.17", "shop", owner=("ReplicaSet", "client-7f"))
        )
        client = {
            **ing,
            "remote_namespace": "shop",
            "remote_pod": "client-7f-abc",
            "remote_workload_kind": "Deployment",
            "remote_workload": "client",
        }
        assert agent.wait_sample(opened, client, 7) == 7
        for name, want in (
            ("lens_tcp_connections_closed_total", 7),
            ("lens_tcp_sent_bytes_total", 7000),
            ("lens_tcp_received_bytes_total", 700),
        ):
            assert agent.wait_sample(name, client, want) == want, name
        text = agent.metrics_text()
        # the lens_tcp_ families carry who the remote is (the seed ones never do)
        unlabelled = [
            (name, labels)
            for name, labels, _ in parse_samples(text)
            if name.startswith("lens_tcp_")
            and labels.get("raddr") == "127.0.5.17"
            and "remote_pod" not in labels
        ]
        assert unlabelled == []
        assert "::ffff:" not in text
    finally:
        rc = agent.stop()
    assert rc == 0, agent.output()


def test_standalone_without_an_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    agent = AgentProc(
        "--policy",
        str(policy),
        env={
            "LENS_COLLECTORS__PROCESSES__ENABLED": "false",
            "LENS_COLLECTORS__DROPS__ENABLED": "false",
            "LENS_KUBERNETES__KUBECONFIG": "",
        },
    )
    try:
        agent.wait_ready()
        ready = agent.json("/readyz")[1]
        assert ready["features"]["kubernetes"]["state"] == "off"
        assert "standalone" in ready["features"]["kubernetes"]["reason"]
        assert ready["features"]["kubelet"]["state"] == "off"
        assert ready["kubernetes"] is None
        assert agent.sample("lens_agent_feature_up", {"feature": "kubernetes"}) == 0
    finally:
        rc = agent.stop()
    assert rc == 0, agent.output()
