"""Flows to pods and services, classified by the live cluster index on the real kernel."""

from __future__ import annotations

import socket

import pytest

from lens_ebpf.agent.net.identity import NO_IDENTITY
from lens_ebpf.agent.pods.index import ClusterIndex, OwnerResolver
from lens_ebpf.agent.tcp.tcp_rtt import LENS
from tests.conftest import wait_for
from tests.k8slab import owned, pod, service
from tests.netlab import exchange, in_netns, listener, recv_exact

from .conftest import FlowRig

pytestmark = pytest.mark.bpf

POD_IP = "198.51.100.7"  # externalHosts by the test policy; a pod by the index
SVC_IP = "10.53.0.53"  # dns by the test policy; a service by the index
K8S = "primus_lens_network_k8s_tcp_flow"
POD_CIDR_IP = "10.244.7.2"  # k8sPod by the test policy: a pod the index may not know yet
OPENED, CLOSED = "lens_tcp_connections_opened_total", "lens_tcp_connections_closed_total"
SENT, RECV = "lens_tcp_sent_bytes_total", "lens_tcp_received_bytes_total"


@pytest.fixture
def indexed(rig: FlowRig):
    objects = {
        ("ReplicaSet", "web-5d"): owned("ReplicaSet", "web-5d", "shop", owner=("Deployment", "web"))
    }
    getters = {
        "ReplicaSet": lambda ns, name: objects[("ReplicaSet", name)],
        "Deployment": lambda ns, name: owned("Deployment", name, ns),
    }
    idx = ClusterIndex(owners=OwnerResolver(getters))
    idx.replace_pods([pod("web-5d-x7k", POD_IP, "shop", owner=("ReplicaSet", "web-5d"))])
    idx.replace_services([service("kube-dns", SVC_IP, "kube-system")])
    rig.flows.enrich.index = idx
    yield idx
    rig.flows.enrich.index = None


@pytest.fixture
def index(rig: FlowRig):
    """An index the test fills, owners followed (a ReplicaSet's pods to their Deployment)."""
    getters = {
        "ReplicaSet": lambda ns, name: owned(
            "ReplicaSet", name, ns, owner=("Deployment", name.rsplit("-", 1)[0])
        ),
        "Deployment": lambda ns, name: owned("Deployment", name, ns),
    }
    idx = ClusterIndex(owners=OwnerResolver(getters))
    rig.flows.enrich.index = idx
    yield idx
    rig.flows.enrich.index = None


def test_pod_and_service_remotes_get_identity(rig: FlowRig, lab, indexed: ClusterIndex) -> None:
    rig.flows.read()
    k8s_before = {c: rig.cache.get(K8S, (c,)) or 0 for c in ("k8sPod", "k8sSvc")}
    ours = (POD_IP, SVC_IP)  # the host may have flows of its own meanwhile
    sub = rig.bus.subscribe(
        "identity", accept=lambda e: e.get("raddr") in ours or e.get("laddr") in ours
    )
    try:
        srv = listener(POD_IP, ns=lab.ns)
        port, _ = exchange(srv, POD_IP, 5000, 700)
        srv.close()
        svc = listener(SVC_IP, ns=lab.ns)
        sport, _ = exchange(svc, SVC_IP, 300, 40)
        svc.close()
        events = rig.wait_events(sub, 4)
    finally:
        rig.bus.unsubscribe(sub)
    rig.flows.read()
    web = ("shop", "web-5d-x7k", "Deployment", "web", "")
    key = ("egress", "k8sPod", POD_IP, str(port), *web)
    assert rig.cache.get("lens_tcp_sent_bytes_total", key) == 5000
    assert rig.cache.get("lens_tcp_received_bytes_total", key) == 700
    assert rig.cache.get("lens_tcp_connections_opened_total", key) == 1
    dns = ("kube-system", "", "", "", "kube-dns")
    assert (
        rig.cache.get("lens_tcp_sent_bytes_total", ("egress", "k8sSvc", SVC_IP, str(sport), *dns))
        == 300
    )
    # the seed families follow the refined class: pod and service bytes by class only
    assert (rig.cache.get(K8S, ("k8sPod",)) or 0) - k8s_before["k8sPod"] == 5700
    assert (rig.cache.get(K8S, ("k8sSvc",)) or 0) - k8s_before["k8sSvc"] == 340
    assert (
        rig.cache.get(
            "primus_lens_network_tcp_flow_egress", (POD_IP, str(port), "egress", "externalHosts")
        )
        is None
    )
    rtt = rig.cache.get(LENS, ("egress", "k8sPod", POD_IP, *web))
    assert rtt is not None and sum(rtt[0]) > 0
    # events: the remote's identity on the client side; the local pod on the server side
    by = {
        (e["raddr"] if e["direction"] == "egress" else e["laddr"], e["direction"]): e
        for e in events
    }
    eg = by[(POD_IP, "egress")]
    assert (eg["class"], eg["remote_namespace"], eg["remote_pod"], eg["remote_workload"]) == (
        "k8sPod",
        "shop",
        "web-5d-x7k",
        "web",
    )
    ing = by[(POD_IP, "ingress")]
    assert (ing["namespace"], ing["pod"], ing["workload_kind"]) == (
        "shop",
        "web-5d-x7k",
        "Deployment",
    )
    assert by[(SVC_IP, "egress")]["remote_service"] == "kube-dns"
    assert by[(SVC_IP, "egress")]["class"] == "k8sSvc"


def test_a_pod_indexed_after_its_first_connections_gets_them(
    rig: FlowRig, lab, index: ClusterIndex
) -> None:
    """Issue 74: a client pod connects to a server on the node in its first instant,
    before the index knows its address. Once the index learns it, the connections are
    the pod's, counted exactly once: none left on an unlabelled series."""
    for _ in range(20):  # a port no earlier flow from this address had
        srv = listener(lab.host_v4)
        ing = ("ingress", "k8sPod", POD_CIDR_IP, str(srv.getsockname()[1]))
        if rig.value(OPENED, *ing) == 0:
            break
        srv.close()
    port = srv.getsockname()[1]

    def ours(e: dict) -> bool:
        return POD_CIDR_IP in (e.get("raddr"), e.get("laddr"))

    sub = rig.bus.subscribe("t-late-pod", accept=ours)
    try:
        for _ in range(7):
            exchange(srv, lab.host_v4, 100, 1000, ns=lab.ns, bind=POD_CIDR_IP)
        early = rig.wait_events(sub, 14)  # both ends of each

        def connect() -> socket.socket:
            cli = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            cli.bind((POD_CIDR_IP, 0))
            cli.connect((lab.host_v4, port))
            return cli

        cli = in_netns(lab.ns, connect)  # an eighth, open while the index learns the pod
        conn, _ = srv.accept()
        assert rig.wait_value(OPENED, *ing, want=8) == 8, rig.explain(*ing)
        assert rig.value(RECV, *ing) == 700
        index.pod_event(
            "ADDED", pod("client-7f-abc", POD_CIDR_IP, "shop", owner=("ReplicaSet", "client-7f"))
        )
        rig.flows.read()
        cli.sendall(b"x" * 5)
        assert recv_exact(conn, 5) == 5
        cli.close()
        conn.close()
        late = rig.wait_events(sub, 2)
    finally:
        rig.bus.unsubscribe(sub)
        srv.close()
    client = ("shop", "client-7f-abc", "Deployment", "client", "")

    def closed() -> float | None:  # the last close's transitions can land a moment late
        rig.flows.read()
        return rig.cache.get(CLOSED, (*ing, *client))

    wait_for(lambda: closed() == 8, lambda: f"{CLOSED} of the pod: {closed()}, not 8")
    got = {
        name: (rig.cache.get(name, (*ing, *client)), rig.cache.get(name, (*ing, *NO_IDENTITY)))
        for name in (OPENED, CLOSED, SENT, RECV)
    }
    assert got == {OPENED: (8, None), CLOSED: (8, None), SENT: (7000, None), RECV: (705, None)}
    rtt = rig.cache.get(LENS, ("ingress", "k8sPod", POD_CIDR_IP, *client))
    assert rtt is not None and sum(rtt[0]) > 0
    assert rig.cache.get(LENS, ("ingress", "k8sPod", POD_CIDR_IP, *NO_IDENTITY)) is None
    # events are what was known when each flow closed: the seven before, the eighth after
    assert {e["remote_pod"] for e in early if e["direction"] == "ingress"} == {""}
    by = {e["direction"]: e for e in late}
    assert (by["ingress"]["remote_pod"], by["ingress"]["remote_workload"]) == (
        "client-7f-abc",
        "client",
    )
    assert (by["egress"]["pod"], by["egress"]["workload_kind"]) == ("client-7f-abc", "Deployment")


def test_a_dual_stack_listener_spells_its_ipv4_peers_as_ipv4(
    rig: FlowRig, lab, index: ClusterIndex
) -> None:
    """An IPv4 client of a listener on :: is the AF_INET6 socket's ::ffff:a.b.c.d: the
    ingress side spells it a.b.c.d as the egress side does, in labels and events, and
    the index finds the pod behind the mapped local address."""
    index.pod_event("ADDED", pod("server-0", POD_CIDR_IP, "shop", owner=("StatefulSet", "server")))
    srv = listener("::", ns=lab.ns)
    assert srv.family == socket.AF_INET6
    sub = rig.bus.subscribe("t-dual", accept=lambda e: e.get("raddr") in (lab.host_v4, POD_CIDR_IP))
    try:
        port, _ = exchange(srv, POD_CIDR_IP, 3000, 400)
        events = rig.wait_events(sub, 2)
    finally:
        rig.bus.unsubscribe(sub)
        srv.close()
    ing = ("ingress", "internalHosts", lab.host_v4, str(port))
    assert [rig.value(n, *ing) for n in (OPENED, SENT, RECV)] == [1, 400, 3000], rig.explain(*ing)
    assert (
        rig.value(
            "primus_lens_network_tcp_flow_ingress",
            str(port),
            lab.host_v4,
            "ingress",
            "internalHosts",
        )
        == 3400
    )
    server = ("shop", "server-0", "StatefulSet", "server", "")
    assert rig.cache.get(OPENED, ("egress", "k8sPod", POD_CIDR_IP, str(port), *server)) == 1
    mapped = [
        (fam.name, labels)
        for fam, series in rig.cache.snapshot()
        for labels, _ in series
        if any(v.startswith("::ffff:") for v in labels)
    ]
    assert mapped == []
    by = {e["direction"]: e for e in events}
    ingress = by["ingress"]
    assert (ingress["family"], ingress["raddr"], ingress["laddr"], ingress["lport"]) == (
        "ipv4",
        lab.host_v4,
        POD_CIDR_IP,
        port,
    )
    assert (ingress["namespace"], ingress["pod"]) == ("shop", "server-0")
    assert (by["egress"]["raddr"], by["egress"]["remote_pod"]) == (POD_CIDR_IP, "server-0")
