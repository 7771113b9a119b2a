"""Kubernetes objects for the recorder's tests: workloads with fixed uids, GPU pods with
secrets in their env, and the states a kubelet reports."""

from __future__ import annotations

import copy
from typing import Any

from lens_ebpf.recorder.lifecycle import FINALIZER
from tests.k8slab import FakeApiServer, eventually, pod

NS = "ml"
T0 = "2026-11-23T06:00:00Z"
GPU1, GPU2 = "gpu-1", "gpu-2"
H100, MI300 = "NVIDIA-H100-80GB-HBM3", "AMD-Instinct-MI300X"
U = {
    "trainer": "uid-dep-trainer",
    "trainer-5d9f": "uid-rs-trainer",
    "nightly": "uid-cj-nightly",
    "nightly-29000": "uid-job-nightly",
    "bert": "uid-pt-bert",
}
KIND = {
    "trainer": ("apps/v1", "Deployment", "deployments"),
    "trainer-5d9f": ("apps/v1", "ReplicaSet", "replicasets"),
    "nightly": ("batch/v1", "CronJob", "cronjobs"),
    "nightly-29000": ("batch/v1", "Job", "jobs"),
    "bert": ("kubeflow.org/v1", "PyTorchJob", "pytorchjobs"),
}


def template(resource: str, n: int) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "x"}},
        "spec": {
            "containers": [
                {"name": "main", "image": "trainer:1", "resources": {"limits": {resource: str(n)}}}
            ]
        },
    }


def owner_refs(owner: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": KIND[owner][0],
            "kind": KIND[owner][1],
            "name": owner,
            "uid": U[owner],
            "controller": True,
        }
    ]


def workload(
    name: str, spec: dict[str, Any], status: dict[str, Any], owner: str | None = None
) -> dict[str, Any]:
    api_version, kind, _ = KIND[name]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": U[name],
        "labels": {"app": name},
        "creationTimestamp": T0,
    }
    if owner:
        meta["ownerReferences"] = owner_refs(owner)
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": meta,
        "spec": spec,
        "status": status,
    }


def gpu_pod(name: str, owner: str, resource: str, n: int, node: str) -> dict[str, Any]:
    p = pod(
        name,
        "",
        NS,
        node=node,
        phase="Pending",
        containers=[
            {
                "name": "main",
                "image": "trainer:1",
                "env": [
                    {"name": "HF_TOKEN", "value": "s3cret-token"},
                    {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}},
                ],
                "resources": {"limits": {resource: str(n)}},
            }
        ],
    )
    p["metadata"]["ownerReferences"] = [
        {
            "apiVersion": KIND[owner][0],
            "kind": KIND[owner][1],
            "name": owner,
            "uid": U[owner],
            "controller": True,
        }
    ]
    p["metadata"]["creationTimestamp"] = T0
    p["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{s3cret}"}
    return p


def state(
    p: dict[str, Any], phase: str, ready: bool | None = None, restarts: int = 0
) -> dict[str, Any]:
    """The pod as the kubelet reports it next."""
    p = copy.deepcopy(p)
    st: dict[str, Any] = {"phase": phase, "hostIP": "192.0.2.10"}
    if ready is not None:
        st["conditions"] = [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastProbeTime": None,
                "lastTransitionTime": T0,
            }
        ]
        st["containerStatuses"] = [
            {"name": "main", "ready": ready, "restartCount": restarts, "image": "trainer:1"}
        ]
        st["startTime"] = T0
    p["status"] = st
    return p


def conds(*true: str, false: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "conditions": [{"type": c, "status": "True", "lastTransitionTime": T0} for c in true]
        + [{"type": c, "status": "False", "lastTransitionTime": T0} for c in false]
    }


def has_finalizer(api: FakeApiServer, name: str) -> bool:
    obj = api.get(KIND[name][2], NS, name)
    return obj is not None and FINALIZER in (obj["metadata"].get("finalizers") or ())


def gone(api: FakeApiServer, name: str) -> bool:
    return api.get(KIND[name][2], NS, name) is None


def delete_workload(api: FakeApiServer, name: str) -> None:
    """kubectl delete: the finalizer holds it until the recorder has stored it."""
    assert has_finalizer(api, name)
    api.request_delete(KIND[name][2], NS, name)
    eventually(lambda: gone(api, name), timeout=15)
