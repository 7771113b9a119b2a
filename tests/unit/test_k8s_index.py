"""The pod/service index driven by the real kubernetes client against a local API server
that speaks list and watch: adds, changes, deletes, bookmarks, 410 Gone, dropped and
killed connections, owner chains."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_ebpf.agent.config import KubernetesConfig
from lens_ebpf.agent.pods.cluster import ClusterWatch, read_cluster_networks
from lens_ebpf.agent.pods.index import Identity
from lens_ebpf.k8s.client import NotConfiguredError, api_client
from tests.k8slab import FakeApiServer, eventually, owned, pod, service


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    server.put("deployments", owned("Deployment", "web"))
    server.put("replicasets", owned("ReplicaSet", "web-7d9f", owner=("Deployment", "web")))
    server.put("cronjobs", owned("CronJob", "nightly", "batch"))
    server.put("jobs", owned("Job", "nightly-2911", "batch", owner=("CronJob", "nightly")))
    server.put("statefulsets", owned("StatefulSet", "db"))
    server.put("pods", pod("web-7d9f-abc", "10.244.1.5", owner=("ReplicaSet", "web-7d9f")))
    server.put(
        "pods",
        pod(
            "host-agent",
            "192.0.2.10",
            "kube-system",
            host_network=True,
            owner=("DaemonSet", "agent"),
        ),
    )
    server.put("services", service("web", "10.96.0.20"))
    yield server
    server.kill()


@pytest.fixture
def watch(api: FakeApiServer, tmp_path: Path) -> Iterator[ClusterWatch]:
    k = KubernetesConfig(
        watch_timeout_seconds=30, backoff_max_seconds=0.5, request_timeout_seconds=2
    )
    client = api_client("kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")))
    w = ClusterWatch(client, k)
    w.start()
    assert w.wait_synced(5)
    eventually(lambda: api.open_watches() == 2)
    yield w
    w.stop()


def test_list_resolves_owner_chain_and_skips_host_network(watch: ClusterWatch) -> None:
    idx = watch.index
    assert idx.lookup("10.244.1.5") == Identity(
        "pod", "default", "web-7d9f-abc", "Deployment", "web", "node-a", "uid-web-7d9f-abc"
    )
    assert idx.lookup("10.96.0.20") == Identity("service", "default", "web")
    # a hostNetwork pod holds the node's address: that address is not a pod
    assert idx.lookup("192.0.2.10") is None
    assert idx.pod("kube-system", "host-agent").workload == "agent"  # type: ignore[union-attr]
    assert idx.counts() == {"pods": 2, "services": 1}


def test_add_modify_delete_within_two_seconds(api: FakeApiServer, watch: ClusterWatch) -> None:
    idx = watch.index
    api.put("pods", pod("job-pod", "10.244.2.7", "batch", owner=("Job", "nightly-2911")))
    eventually(lambda: idx.lookup("10.244.2.7") is not None)
    assert idx.lookup("10.244.2.7").workload_kind == "CronJob"  # type: ignore[union-attr]
    assert idx.lookup("10.244.2.7").workload == "nightly"  # type: ignore[union-attr]
    api.put("pods", pod("db-0", "10.244.3.3", owner=("StatefulSet", "db")))
    eventually(lambda: idx.lookup("10.244.3.3") is not None)
    assert idx.lookup("10.244.3.3").workload_kind == "StatefulSet"  # type: ignore[union-attr]
    # modify: the pod moves to a new IP; the old one no longer names it
    api.put("pods", pod("db-0", "10.244.3.9", owner=("StatefulSet", "db")))
    eventually(lambda: idx.lookup("10.244.3.9") is not None and idx.lookup("10.244.3.3") is None)
    # a pod that finished has released its IP
    api.put(
        "pods",
        pod("job-pod", "10.244.2.7", "batch", owner=("Job", "nightly-2911"), phase="Succeeded"),
    )
    eventually(lambda: idx.lookup("10.244.2.7") is None)
    api.delete("pods", "default", "db-0")
    eventually(lambda: idx.lookup("10.244.3.9") is None)
    api.put("services", service("db", "10.96.0.30"))
    eventually(lambda: idx.lookup("10.96.0.30") == Identity("service", "default", "db"))
    api.delete("services", "default", "web")
    eventually(lambda: idx.lookup("10.96.0.20") is None)
    pods = watch.reflectors[0]
    assert pods.lists == 1  # all of that came through the one watch
    assert pods.events["ADDED"] == 2 and pods.events["DELETED"] == 1


def test_bookmarks_move_the_resource_version(api: FakeApiServer, watch: ClusterWatch) -> None:
    pods = watch.reflectors[0]
    before = int(pods.resource_version)
    api.put("services", service("other", "10.96.0.40"))  # moves the global version only
    eventually(lambda: pods.events.get("BOOKMARK", 0) > 0 and int(pods.resource_version) > before)


def test_410_gone_relists_and_converges(api: FakeApiServer, watch: ClusterWatch) -> None:
    pods = watch.reflectors[0]
    api.compact()
    api.drop_watches()  # the watch resumes from a compacted version: 410, then a relist
    api.put("pods", pod("late", "10.244.4.4", owner=("ReplicaSet", "web-7d9f")))
    eventually(lambda: pods.restarts["gone"] >= 1, timeout=5)
    eventually(lambda: watch.index.lookup("10.244.4.4") is not None)
    assert pods.lists >= 2
    assert watch.index.lookup("10.244.4.4").workload == "web"  # type: ignore[union-attr]


def test_dropped_connection_resumes_without_relisting(
    api: FakeApiServer, watch: ClusterWatch
) -> None:
    pods = watch.reflectors[0]
    api.drop_watches()
    eventually(lambda: api.watches("pods") >= 2)
    api.put("pods", pod("after-drop", "10.244.5.5"))
    eventually(lambda: watch.index.lookup("10.244.5.5") is not None)
    assert pods.lists == 1  # resumed from its resourceVersion


def test_killed_api_keeps_index_and_reconnects(api: FakeApiServer, watch: ClusterWatch) -> None:
    api.kill()
    pods = watch.reflectors[0]
    eventually(lambda: not pods.connected, timeout=5)
    eventually(lambda: pods.restarts["error"] >= 1, timeout=5)  # reconnects fail meanwhile
    assert watch.index.lookup("10.244.1.5").workload == "web"  # type: ignore[union-attr]
    api.put("pods", pod("while-down", "10.244.6.6"))  # etcd moved on meanwhile
    api.delete("services", "default", "web")
    api.start()
    eventually(lambda: watch.index.lookup("10.244.6.6") is not None, timeout=5)
    eventually(lambda: watch.index.lookup("10.96.0.20") is None, timeout=5)
    assert pods.connected


def test_owner_lookup_failure_falls_back_to_the_direct_owner(
    api: FakeApiServer, watch: ClusterWatch
) -> None:
    api.fail_gets.add("replicasets")
    api.put("replicasets", owned("ReplicaSet", "api-55c", owner=("Deployment", "api")))
    api.put("pods", pod("api-55c-x", "10.244.7.7", owner=("ReplicaSet", "api-55c")))
    eventually(lambda: watch.index.lookup("10.244.7.7") is not None)
    ident = watch.index.lookup("10.244.7.7")
    assert (ident.workload_kind, ident.workload) == ("ReplicaSet", "api-55c")  # type: ignore[union-attr]
    assert watch.owners.lookups["error"] >= 1


def test_index_is_bounded_and_counts_refusals(api: FakeApiServer, tmp_path: Path) -> None:
    k = KubernetesConfig(max_pods=1, backoff_max_seconds=0.5, request_timeout_seconds=2)
    w = ClusterWatch(api_client("kubeconfig", str(api.kubeconfig(tmp_path / "kc"))), k)
    w.start()
    try:
        assert w.wait_synced(5)
        assert w.index.counts()["pods"] == 1
        assert w.index.refused["pods"] == 1
        api.put("pods", pod("one-more", "10.244.8.8"))
        eventually(lambda: w.index.refused["pods"] == 2)
        assert w.index.lookup("10.244.8.8") is None
    finally:
        w.stop()


def test_standalone_and_bad_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(NotConfiguredError, match="standalone"):
        api_client("auto", "", tmp_path)
    with pytest.raises(NotConfiguredError):
        api_client("off", "/whatever", tmp_path)
    with pytest.raises(ValueError, match="kubeconfig .*missing"):
        api_client("auto", str(tmp_path / "missing"), tmp_path)
    with pytest.raises(ValueError, match="no service account"):
        api_client("in-cluster", "", tmp_path)


def test_cluster_networks_sources() -> None:
    kubeadm = {
        "data": {
            "ClusterConfiguration": (
                "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\nnetworking:\n"
                "  dnsDomain: cluster.local\n  podSubnet: 10.32.0.0/12,fd00:10:32::/56\n"
                "  serviceSubnet: 10.112.0.0/12\n"
            )
        }
    }
    nodes = {
        "items": [
            {"metadata": {"name": "a"}, "spec": {"podCIDRs": ["10.1.0.0/24"]}},
            {"metadata": {"name": "b"}, "spec": {"podCIDR": "10.1.1.0/24"}},
        ]
    }
    got = read_cluster_networks(lambda: kubeadm, lambda: nodes)
    assert [str(n) for n in got.pods] == ["10.32.0.0/12", "fd00:10:32::/56"]
    assert [str(n) for n in got.services] == ["10.112.0.0/12"]
    assert got.source == "kubeadm-config"

    def missing() -> dict:
        raise RuntimeError("404")

    got = read_cluster_networks(missing, lambda: nodes)
    assert [str(n) for n in got.pods] == ["10.1.0.0/24", "10.1.1.0/24"]
    assert got.services == () and got.source == "node podCIDRs"
    broken = {"data": {"ClusterConfiguration": "networking: [unclosed"}}
    got = read_cluster_networks(lambda: broken, missing)  # both bad: empty, no crash
    assert got.pods == () and got.services == () and got.source == ""
    bad_cidr = {"data": {"ClusterConfiguration": "networking:\n  podSubnet: 10.0.0.0/33\n"}}
    got = read_cluster_networks(lambda: bad_cidr, lambda: nodes)
    assert [str(n) for n in got.pods] == ["10.1.0.0/24", "10.1.1.0/24"]


def test_remote_identity_refines_class_for_mapped_ipv4_and_keeps_unknowns() -> None:
    from lens_ebpf.agent.net import identity
    from lens_ebpf.agent.pods.index import ClusterIndex
    from lens_ebpf.agent.tcp import decode

    idx = ClusterIndex()
    idx.replace_pods([pod("p", "10.244.1.5", "ns1", owner=("StatefulSet", "db"))])
    idx.replace_services([service("s", "fd00:96::10", "ns2")])
    # an IPv4 peer of a dual-stack socket, as the decoder spells it for every lookup
    mapped = decode.format_addr(decode.AF_INET6, bytes(10) + b"\xff\xff" + bytes([10, 244, 1, 5]))
    assert identity.remote(idx.lookup, "internalHosts", mapped) == (
        "k8sPod",
        ("ns1", "p", "StatefulSet", "db", ""),
    )
    assert identity.remote(idx.lookup, "internalHosts", "fd00:96::10") == (
        "k8sSvc",
        ("ns2", "", "", "", "s"),
    )
    assert identity.remote(idx.lookup, "externalHosts", "8.8.8.8") == (
        "externalHosts",
        identity.NO_IDENTITY,
    )
    assert identity.remote(None, "k8sPod", "10.244.1.5") == ("k8sPod", identity.NO_IDENTITY)
    got = identity.flow_fields(idx.lookup, "internalHosts", "fd00:96::10", "10.244.1.5")
    assert got["cls"] == "k8sSvc" and got["remote_service"] == "s"
    assert (got["namespace"], got["pod"], got["workload"]) == ("ns1", "p", "db")


def test_identity_fields_reach_the_grpc_messages() -> None:
    from lens_ebpf.agent.events import FlowClosed, ProcessEvent
    from lens_ebpf.agent.stream.convert import to_pb

    flow = FlowClosed(
        seq=3,
        ts_ns=1,
        pid=1,
        comm="curl",
        cgroup_id=0,
        family="ipv4",
        laddr="10.244.1.5",
        lport=40000,
        raddr="10.96.0.20",
        rport=80,
        direction="egress",
        cls="k8sSvc",
        sent_bytes=0,
        received_bytes=0,
        retransmits=0,
        duration_ns=0,
        reason="normal",
        remote_namespace="default",
        remote_service="web",
        namespace="ns1",
        pod="p",
        workload_kind="StatefulSet",
        workload="db",
    )
    fc = to_pb(flow, "n", "1.2.3.4").flow_closed
    assert (fc.remote_service, fc.remote_namespace, fc.pod, fc.workload) == (
        "web",
        "default",
        "p",
        "db",
    )
    ex = ProcessEvent(
        kind="process_exec",
        ts_ns=1,
        pid=2,
        ppid=1,
        comm="sh",
        cgroup_id=0,
        cgroup="/",
        namespace="ns1",
        pod="p",
        container="c",
        workload_kind="StatefulSet",
        workload="db",
    )
    ident = to_pb(ex, "n", "").process_exec.identity
    assert (ident.pod, ident.workload_kind, ident.workload) == ("p", "StatefulSet", "db")


def test_check_reports_the_api_and_its_version(
    api: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lens_ebpf.agent.check import kubernetes_check

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    kc = str(api.kubeconfig(tmp_path / "kc"))
    ok = kubernetes_check(kc)
    assert (ok.ok, ok.value, ok.detail) == (True, api.url, "reachable, v1.31.2")
    api.kill()
    down = kubernetes_check(kc, timeout=1)
    assert not down.ok and down.detail.startswith("unreachable")
    alone = kubernetes_check("")
    assert (alone.ok, alone.value) == (False, "standalone")


def test_standalone_is_decided_without_the_client_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No account and no kubeconfig: standalone (the feature off, the agent ready), also
    where the kubernetes package is not installed (a GPU node's own Python); a configured
    API still needs it, and says so."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # what import finds when absent
    with pytest.raises(NotConfiguredError, match="no in-cluster account and no kubeconfig"):
        api_client("auto", "", sa_dir=tmp_path)
    with pytest.raises(ValueError, match="no service account is mounted"):
        api_client("in-cluster", "", sa_dir=tmp_path)
    with pytest.raises(ImportError):
        api_client("auto", str(tmp_path / "kubeconfig"), sa_dir=tmp_path)
