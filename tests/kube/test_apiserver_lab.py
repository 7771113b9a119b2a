"""The real API server lab itself: kubectl creates through it, a ServiceAccount token is
refused (403) until a Role binds it, and the server comes back after a kill -9 with its
objects (etcd kept them). Later tests build on these three promises."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.kube import apiserver
from tests.kube.apiserver import KubeApiServer


@pytest.fixture(scope="module")
def lab() -> Iterator[KubeApiServer]:
    why = apiserver.unavailable()
    if why:
        pytest.skip(why)
    with KubeApiServer() as server:
        yield server


def pod(name: str, namespace: str) -> str:
    """A pod manifest; nothing schedules or runs it here (no scheduler, no kubelet)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": "lab"}},
            "spec": {
                "containers": [
                    {"name": "main", "image": "busybox:1.36", "command": ["sleep", "3600"]}
                ]
            },
        }
    )


def reader_role(namespace: str, serviceaccount: str) -> str:
    """get and list on pods in `namespace`, bound to the ServiceAccount; nothing else."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "pod-reader", "namespace": namespace},
                    "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "pod-reader", "namespace": namespace},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "pod-reader",
                    },
                    "subjects": [
                        {"kind": "ServiceAccount", "name": serviceaccount, "namespace": namespace}
                    ],
                },
            ],
        }
    )


def test_kubectl_creates_a_namespace_and_a_pod(lab: KubeApiServer) -> None:
    assert lab.kubectl("create", "namespace", "made").stdout.strip() == "namespace/made created"
    out = lab.kubectl("apply", "-f", "-", input=pod("sleeper", "made")).stdout
    assert out.strip() == "pod/sleeper created"
    got = json.loads(lab.kubectl("get", "pod", "sleeper", "-n", "made", "-o", "json").stdout)
    assert got["metadata"]["uid"]
    assert got["status"]["phase"] == "Pending"  # no scheduler: never bound to a node
    assert "nodeName" not in got["spec"]
    # The same object through the API, as the admin (system:masters) reads it.
    status, body = lab.request("GET", "/api/v1/namespaces/made/pods/sleeper")
    assert status == 200 and body["metadata"]["uid"] == got["metadata"]["uid"]
    # Real validation: an invalid name is refused by the server, not by a fake.
    status, body = lab.request(
        "POST", "/api/v1/namespaces/made/pods", json.loads(pod("Not_A_Name", "made"))
    )
    assert status == 422 and body["reason"] == "Invalid"


def test_a_serviceaccount_token_is_forbidden_until_a_role_binds_it(
    lab: KubeApiServer, tmp_path: Path
) -> None:
    lab.kubectl("create", "namespace", "rbac")
    lab.kubectl("apply", "-f", "-", input=pod("target", "rbac"))
    token = lab.token_for("rbac", "reader")
    pods = "/api/v1/namespaces/rbac/pods"

    status, body = lab.request("GET", pods, token=token)
    assert status == 403, body
    assert body["reason"] == "Forbidden"
    assert "system:serviceaccount:rbac:reader" in body["message"]
    assert lab.request("GET", pods, token="not-a-token")[0] == 401

    lab.kubectl("apply", "-f", "-", input=reader_role("rbac", "reader"))
    # RBAC reads its bindings from a watch: allowed as soon as the binding is seen.
    wait_for(
        lambda: lab.request("GET", pods, token=token)[0] == 200,
        "200 for the ServiceAccount after its RoleBinding",
        timeout=10,
    )
    status, body = lab.request("GET", pods, token=token)
    assert status == 200
    assert [p["metadata"]["name"] for p in body["items"]] == ["target"]
    # Only what the Role grants: no delete, no other namespace.
    assert lab.request("DELETE", f"{pods}/target", token=token)[0] == 403
    assert lab.request("GET", "/api/v1/namespaces/default/pods", token=token)[0] == 403

    # kubectl with the ServiceAccount's kubeconfig agrees.
    config = lab.kubeconfig_for("rbac", "reader", tmp_path / "reader.kubeconfig")
    assert lab.kubectl("get", "pods", "-o", "name", kubeconfig=config).stdout == "pod/target\n"
    denied = lab.kubectl("delete", "pod", "target", kubeconfig=config, check=False)
    assert denied.returncode != 0 and "Forbidden" in denied.stderr


def test_the_server_comes_back_after_a_kill_with_its_objects(lab: KubeApiServer) -> None:
    lab.kubectl("create", "namespace", "survives")
    lab.kill()
    with pytest.raises(OSError):
        lab.request("GET", "/readyz", timeout=2)
    lab.start()
    assert lab.request("GET", "/api/v1/namespaces/survives")[0] == 200
