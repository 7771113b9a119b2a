"""The node agent's Kubernetes part against a real kube-apiserver (1.20.2) with RBAC on,
acting as the ServiceAccount deploy/serviceaccount.yaml names with deploy/namespace.yaml and
deploy/rbac.yaml applied as shipped: a verb missing there fails here. The test plays the
controllers and the kubelet (objects made through the API, pod status by PUT).

What it shows: the agent's ClusterWatch (built as the kubernetes feature builds it, from a
kubeconfig of the ServiceAccount's token) lists and watches pods and services, follows
each pod's owners to the top workload (Deployment through its ReplicaSet, a batch/v1beta1
CronJob through its Job, a StatefulSet, a DaemonSet), reads the cluster CIDRs from the
nodes and then from kubeadm-config, and follows a pod's end and its successor by watch
events, with no failure counted and nothing logged as forbidden; the kubelet would let the
same account read /pods and /stats; `watch` taken off pods in a copy of the RBAC, the same
check fails, and it recovers once the shipped RBAC is back."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from lens_ebpf.agent.check import Check, kubernetes_check
from lens_ebpf.agent.config import KubernetesConfig
from lens_ebpf.agent.pods.cluster import ClusterCollector, ClusterWatch
from lens_ebpf.agent.pods.index import Identity
from lens_ebpf.k8s.client import api_client
from tests.conftest import hang_guard, wait_for
from tests.kube.apiserver import KubeApiServer, unavailable
from tests.kube.recorders import apply

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
AGENT_NS = "lens-ebpf"  # deploy/namespace.yaml's, where deploy/serviceaccount.yaml puts it
AGENT_SA = "lens-ebpf"
USER = f"system:serviceaccount:{AGENT_NS}:{AGENT_SA}"
GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{AGENT_NS}", "system:authenticated"]
NS = "ml"
NODE, NODE_IP = "gpu-1", "10.0.0.1"
CLUSTER_CONFIGURATION = """\
apiVersion: kubeadm.k8s.io/v1beta2
kind: ClusterConfiguration
kubernetesVersion: v1.20.2
networking:
  dnsDomain: cluster.local
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/12
"""


# -- the test plays the controllers and the kubelet ---------------------------------------
def ok(got: tuple[int, Any], *codes: int) -> Any:
    status, body = got
    assert status in (codes or (200, 201)), (status, body)
    return body


def controlled_by(owner: dict[str, Any]) -> list[dict[str, Any]]:
    """The ownerReferences a controller writes on what it makes: its own apiVersion (a
    1.20 CronJob's Jobs name batch/v1beta1), kind, name and uid."""
    return [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def template(labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "main", "image": "trainer:1"}], **spec},
    }


def workload(
    lab: KubeApiServer,
    group_version: str,
    plural: str,
    kind: str,
    name: str,
    spec: dict[str, Any],
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = controlled_by(owner)
    body = {"apiVersion": group_version, "kind": kind, "metadata": meta, "spec": spec}
    made: dict[str, Any] = ok(
        lab.request("POST", f"/apis/{group_version}/namespaces/{NS}/" f"{plural}", body)
    )
    return made


def running_pod(
    lab: KubeApiServer, name: str, ip: str, owner: dict[str, Any], host_network: bool = False
) -> dict[str, Any]:
    """A pod on gpu-1 as its controller makes it, then Running with its IP as the kubelet
    reports it (PUT .../status)."""
    spec: dict[str, Any] = {"nodeName": NODE, "containers": [{"name": "main", "image": "x:1"}]}
    if host_network:
        spec["hostNetwork"] = True
    body = {"metadata": {"name": name, "ownerReferences": controlled_by(owner)}, "spec": spec}
    path = f"/api/v1/namespaces/{NS}/pods"
    made = ok(lab.request("POST", path, body))
    made["status"] = {
        "phase": "Running",
        "hostIP": NODE_IP,
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    done: dict[str, Any] = ok(lab.request("PUT", f"{path}/{name}/status", made))
    return done


def service(lab: KubeApiServer, name: str, cluster_ip: str) -> None:
    ok(
        lab.request(
            "POST",
            f"/api/v1/namespaces/{NS}/services",
            {
                "metadata": {"name": name},
                "spec": {
                    "clusterIP": cluster_ip,
                    "selector": {"app": name},
                    "ports": [{"port": 80, "targetPort": 8080}],
                },
            },
        )
    )


def make_cluster(lab: KubeApiServer) -> dict[str, str]:
    """A node and a workload of each kind the agent follows; pod name -> uid."""
    ok(lab.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}}))
    ok(
        lab.request(
            "POST",
            "/api/v1/nodes",
            {
                "metadata": {"name": NODE},
                "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
            },
        )
    )
    web = {"app": "web"}
    deploy = workload(
        lab,
        "apps/v1",
        "deployments",
        "Deployment",
        "web",
        {"selector": {"matchLabels": web}, "template": template(web)},
    )
    rs_labels = {**web, "pod-template-hash": "5d8f7"}
    rs = workload(
        lab,
        "apps/v1",
        "replicasets",
        "ReplicaSet",
        "web-5d8f7",
        {"selector": {"matchLabels": rs_labels}, "template": template(rs_labels)},
        owner=deploy,
    )
    job_spec = {"template": template({"app": "nightly"}, restartPolicy="Never")}
    cron = workload(
        lab,
        "batch/v1beta1",
        "cronjobs",
        "CronJob",
        "nightly",
        {"schedule": "0 3 * * *", "jobTemplate": {"spec": job_spec}},
    )
    job = workload(lab, "batch/v1", "jobs", "Job", "nightly-27000000", job_spec, owner=cron)
    db = {"app": "db"}
    sts = workload(
        lab,
        "apps/v1",
        "statefulsets",
        "StatefulSet",
        "db",
        {"serviceName": "db", "selector": {"matchLabels": db}, "template": template(db)},
    )
    probe = {"app": "node-probe"}
    ds = workload(
        lab,
        "apps/v1",
        "daemonsets",
        "DaemonSet",
        "node-probe",
        {"selector": {"matchLabels": probe}, "template": template(probe, hostNetwork=True)},
    )
    pods = [
        running_pod(lab, "web-5d8f7-x2v9k", "10.244.1.5", rs),
        running_pod(lab, "nightly-27000000-7bq4n", "10.244.1.6", job),
        running_pod(lab, "db-0", "10.244.1.7", sts),
        running_pod(lab, "node-probe-8kx2p", NODE_IP, ds, host_network=True),
    ]
    service(lab, "web", "10.96.0.20")
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


def allowed(
    lab: KubeApiServer, verb: str, resource: str, subresource: str = "", name: str = ""
) -> bool:
    """The server's answer to whether the agent's ServiceAccount may: a SubjectAccessReview,
    as a kubelet sends for each call it is asked (and as RBAC decides a request)."""
    attrs = {"verb": verb, "resource": resource, "subresource": subresource, "name": name}
    got = ok(
        lab.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {"user": USER, "groups": GROUPS, "resourceAttributes": attrs},
            },
        )
    )
    return bool(got["status"].get("allowed"))


# -- the agent ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lab() -> Iterator[KubeApiServer]:
    why = unavailable()
    if why:
        pytest.skip(why)
    with KubeApiServer() as server:
        apply(server, *(DEPLOY / f for f in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml")))
        yield server


@pytest.fixture(scope="module")
def uids(lab: KubeApiServer) -> dict[str, str]:
    return make_cluster(lab)


@pytest.fixture(scope="module")
def kubeconfig(lab: KubeApiServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("agent") / "kubeconfig"
    return lab.kubeconfig_for(AGENT_NS, AGENT_SA, path)


@contextmanager
def agent_watch(kubeconfig: Path) -> Iterator[ClusterWatch]:
    """The ClusterWatch the kubernetes feature builds from its config (kubeconfig mode)."""
    k = KubernetesConfig(
        mode="kubeconfig",
        kubeconfig=str(kubeconfig),
        request_timeout_seconds=5,
        backoff_max_seconds=0.5,
    )
    w = ClusterWatch(api_client(k.mode, k.kubeconfig), k)
    w.start()
    try:
        yield w
    finally:
        w.stop()
        # none left watching: an open watch holds the API server's SIGTERM up to 60 s
        assert [t.name for t in threading.enumerate() if t.name.startswith("k8s-")] == []


def problems(w: ClusterWatch, caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """What the agent itself says went wrong: a collection not listed, a watch not
    connected or failed, an owner lookup failed, or a 403 logged; empty when all is well."""
    out = []
    for r in w.reflectors:
        if not r.synced.is_set():
            out.append((r.resource, "not listed"))
        if not r.connected:
            out.append((r.resource, "not connected"))
        if r.restarts["error"]:
            out.append((r.resource, "watch failed"))
    if w.owners.lookups["error"]:
        out.append(("owners", "lookup failed"))
    if "Forbidden" in caplog.text or "403" in caplog.text:
        out.append(("log", "forbidden"))
    return out


def test_the_agent_follows_the_cluster_as_its_serviceaccount(
    lab: KubeApiServer,
    uids: dict[str, str],
    kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="lens_ebpf")
    with agent_watch(kubeconfig) as w:
        assert w.wait_synced(hang_guard(10)), [r.last_error for r in w.reflectors]
        idx = w.index

        # -- every pod with the workload at the top of its owners ------------------------
        def pod(name: str, kind: str, top: str) -> Identity:
            return Identity("pod", NS, name, kind, top, NODE, uids[name])

        assert idx.lookup("10.244.1.5") == pod("web-5d8f7-x2v9k", "Deployment", "web")
        assert idx.lookup("10.244.1.6") == pod("nightly-27000000-7bq4n", "CronJob", "nightly")
        assert idx.lookup("10.244.1.7") == pod("db-0", "StatefulSet", "db")
        # a hostNetwork pod holds the node's address: that address is no pod's
        assert idx.lookup(NODE_IP) is None
        probe = pod("node-probe-8kx2p", "DaemonSet", "node-probe")
        assert idx.pod(NS, "node-probe-8kx2p") == probe
        assert idx.lookup("10.96.0.20") == Identity("service", NS, "web")
        assert idx.lookup("10.96.0.1") == Identity("service", "default", "kubernetes")
        assert idx.counts() == {"pods": 4, "services": 2}
        # ReplicaSet, Deployment, Job, CronJob, StatefulSet, DaemonSet: each read once
        assert w.owners.lookups == {"hit": 0, "fetched": 6, "error": 0}

        # -- the cluster CIDRs: the nodes' podCIDRs, then kubeadm-config ----------------
        nets = w.networks()
        got = (nets.source, [str(n) for n in nets.pods], [str(n) for n in nets.services])
        assert got == ("node podCIDRs", ["10.244.1.0/24"], [])
        ok(
            lab.request(
                "POST",
                "/api/v1/namespaces/kube-system/configmaps",
                {
                    "metadata": {"name": "kubeadm-config"},
                    "data": {"ClusterConfiguration": CLUSTER_CONFIGURATION},
                },
            )
        )
        nets = w.networks()
        got = (nets.source, [str(n) for n in nets.pods], [str(n) for n in nets.services])
        assert got == ("kubeadm-config", ["10.244.0.0/16"], ["10.96.0.0/12"])

        # -- a change, through the watches: a pod ends, its successor takes its IP --------
        ok(
            lab.request(
                "DELETE",
                f"/api/v1/namespaces/{NS}/pods/web-5d8f7-x2v9k",
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0},
            )
        )
        wait_for(lambda: idx.lookup("10.244.1.5") is None, "the ended pod out of the index")
        rs = ok(lab.request("GET", f"/apis/apps/v1/namespaces/{NS}/replicasets/web-5d8f7"))
        new = running_pod(lab, "web-5d8f7-q4r8t", "10.244.1.5", rs)
        want = Identity(
            "pod", NS, "web-5d8f7-q4r8t", "Deployment", "web", NODE, new["metadata"]["uid"]
        )
        wait_for(lambda: idx.lookup("10.244.1.5") == want, "the successor in the index")
        service(lab, "db", "10.96.0.30")
        wait_for(
            lambda: idx.lookup("10.96.0.30") == Identity("service", NS, "db"),
            "the new service in the index",
        )
        assert idx.counts() == {"pods": 4, "services": 3}
        pods, services = w.reflectors
        assert (pods.lists, services.lists) == (1, 1)  # all of it came through the watches
        # the end: MODIFIED (deletionTimestamp, grace 0), DELETED; the successor: ADDED,
        # MODIFIED (its status)
        assert {k: v for k, v in pods.events.items() if k != "BOOKMARK"} == {
            "ADDED": 1,
            "MODIFIED": 2,
            "DELETED": 1,
        }
        assert {k: v for k, v in services.events.items() if k != "BOOKMARK"} == {"ADDED": 1}
        assert w.owners.lookups == {"hit": 2, "fetched": 6, "error": 0}  # RS, Deployment

        # -- the agent's own health: nothing failed, nothing forbidden -------------------
        assert problems(w, caplog) == []
        registry = CollectorRegistry()
        registry.register(ClusterCollector(w))
        for res in ("pods", "services"):
            assert registry.get_sample_value("lens_k8s_watch_connected", {"resource": res}) == 1
            assert registry.get_sample_value("lens_k8s_lists_total", {"resource": res}) == 1
            restarts = {
                why: registry.get_sample_value(
                    "lens_k8s_watch_restarts_total", {"resource": res, "reason": why}
                )
                for why in ("error", "gone", "ended")
            }
            assert restarts == {"error": 0, "gone": 0, "ended": 0}
        assert registry.get_sample_value("lens_k8s_owner_lookups_total", {"result": "error"}) == 0
        assert registry.get_sample_value("lens_k8s_bad_objects_total", {}) == 0
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []

    # -- the kubelet feature: the kubelet asks the API server whether the account may read
    # its /pods (nodes/proxy) and /stats/summary (nodes/stats)
    assert allowed(lab, "get", "nodes", "proxy", NODE)
    assert allowed(lab, "get", "nodes", "stats", NODE)
    assert not allowed(lab, "create", "pods")  # what RBAC does not grant it is refused
    # -- `lens-ebpf check`'s probe of the API, with the same kubeconfig
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kubernetes_check(str(kubeconfig)) == Check(
        "kubernetes", True, lab.url, "reachable, v1.20.2"
    )


def without_pods_watch(shipped: Path, out: Path) -> Path:
    """deploy/rbac.yaml with `watch` taken off pods (services and nodes keep theirs)."""
    docs = list(yaml.safe_load_all(shipped.read_text()))
    (role,) = (d for d in docs if d["kind"] == "ClusterRole")
    (rule,) = (r for r in role["rules"] if "pods" in r["resources"])
    assert "watch" in rule["verbs"]
    rule["resources"] = [r for r in rule["resources"] if r != "pods"]
    role["rules"].append(
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": [v for v in rule["verbs"] if v != "watch"],
        }
    )
    out.write_text(yaml.safe_dump_all(docs))
    return out


def test_a_verb_missing_from_the_rbac_fails_the_check(
    lab: KubeApiServer,
    uids: dict[str, str],
    kubeconfig: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lens_ebpf")
    lab.kubectl(
        "apply", "-f", str(without_pods_watch(DEPLOY / "rbac.yaml", tmp_path / "rbac.yaml"))
    )
    try:
        wait_for(lambda: not allowed(lab, "watch", "pods"), "watch on pods refused")
        assert allowed(lab, "list", "pods") and allowed(lab, "watch", "services")
        with agent_watch(kubeconfig) as w:
            assert w.wait_synced(hang_guard(10))  # the lists are still allowed
            pods, services = w.reflectors
            wait_for(lambda: pods.restarts["error"] >= 1, "the pods watch refused")
            assert problems(w, caplog) == [
                ("pods", "not connected"),
                ("pods", "watch failed"),
                ("log", "forbidden"),
            ]
            assert pods.last_error.startswith(  # the Status's words, not the headers
                'ForbiddenException: 403 Forbidden: pods is forbidden: User "system:'
                'serviceaccount:lens-ebpf:lens-ebpf" cannot watch resource "pods"'
            )
            assert (services.connected, services.restarts["error"]) == (True, 0)

            # the shipped RBAC back: the agent's retries get through, and events flow
            apply(lab, DEPLOY / "rbac.yaml")
            wait_for(lambda: pods.connected, "the pods watch connected again", timeout=15)
            sts = ok(lab.request("GET", f"/apis/apps/v1/namespaces/{NS}/statefulsets/db"))
            running_pod(lab, "late", "10.244.1.9", sts)
            wait_for(lambda: w.index.lookup("10.244.1.9") is not None, "the late pod")
            got = w.index.lookup("10.244.1.9")
            assert got is not None and (got.workload_kind, got.workload) == ("StatefulSet", "db")
            assert pods.connected and pods.lists == 1  # resumed from its list: no relist
    finally:
        apply(lab, DEPLOY / "rbac.yaml")
