"""Flows to pods and services, classified by the live cluster index on the real kernel."""

from __future__ import annotations

import pytest

from lens_ebpf.agent.pods.index import ClusterIndex, OwnerResolver
from lens_ebpf.agent.tcp.tcp_rtt import LENS
from tests.k8slab import owned, pod, service
from tests.netlab import exchange, listener

from .conftest import FlowRig

pytestmark = pytest.mark.bpf

POD_IP = "198.51.100.7"  # externalHosts by the test policy; a pod by the index
SVC_IP = "10.53.0.53"  # dns by the test policy; a service by the index
K8S = "primus_lens_network_k8s_tcp_flow"


@pytest.fixture
def indexed(rig: FlowRig):
    objects = {("ReplicaSet", "web-5d"): owned("ReplicaSet", "web-5d", "shop",
                                               owner=("Deployment", "web"))}  # fmt: skip
    getters = {"ReplicaSet": lambda ns, name: objects[("ReplicaSet", name)],
               "Deployment": lambda ns, name: owned("Deployment", name, ns)}  # fmt: skip
    idx = ClusterIndex(owners=OwnerResolver(getters))
    idx.replace_pods([pod("web-5d-x7k", POD_IP, "shop", owner=("ReplicaSet", "web-5d"))])
    idx.replace_services([service("kube-dns", SVC_IP, "kube-system")])
    rig.flows.enrich.index = idx
    yield idx
    rig.flows.enrich.index = None


def test_pod_and_service_remotes_get_identity(rig: FlowRig, lab, indexed: ClusterIndex) -> None:
    rig.flows.read()
    k8s_before = {c: rig.cache.get(K8S, (c,)) or 0 for c in ("k8sPod", "k8sSvc")}
    ours = (POD_IP, SVC_IP)  # the host may have flows of its own meanwhile
    sub = rig.bus.subscribe("identity", accept=lambda e: e.get("raddr") in ours
                            or e.get("laddr") in ours)  # fmt: skip
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
    assert rig.cache.get("lens_tcp_sent_bytes_total", ("egress", "k8sSvc", SVC_IP, str(sport),
                                                       *dns)) == 300  # fmt: skip
    # the seed families follow the refined class: pod and service bytes by class only
    assert (rig.cache.get(K8S, ("k8sPod",)) or 0) - k8s_before["k8sPod"] == 5700
    assert (rig.cache.get(K8S, ("k8sSvc",)) or 0) - k8s_before["k8sSvc"] == 340
    assert rig.cache.get("primus_lens_network_tcp_flow_egress",
                         (POD_IP, str(port), "egress", "externalHosts")) is None  # fmt: skip
    rtt = rig.cache.get(LENS, ("egress", "k8sPod", POD_IP, *web))
    assert rtt is not None and sum(rtt[0]) > 0
    # events: the remote's identity on the client side; the local pod on the server side
    by = {(e["raddr"] if e["direction"] == "egress" else e["laddr"], e["direction"]): e
          for e in events}  # fmt: skip
    eg = by[(POD_IP, "egress")]
    assert (eg["class"], eg["remote_namespace"], eg["remote_pod"], eg["remote_workload"]) == (
        "k8sPod",
        "shop",
        "web-5d-x7k",
        "web",
    )
    ing = by[(POD_IP, "ingress")]
    assert (ing["namespace"], ing["pod"], ing["workload_kind"]) == ("shop", "web-5d-x7k",
                                                                    "Deployment")  # fmt: skip
    assert by[(SVC_IP, "egress")]["remote_service"] == "kube-dns"
    assert by[(SVC_IP, "egress")]["class"] == "k8sSvc"
