"""The node agent's objects as deploy/agent's kustomization builds them (its resources, its
ConfigMap generator with the generator options), from the byte copy of deploy/agent
packaged beside this module (agent/; tests/unit/test_management_parts.py keeps it equal),
and their installation into a cluster through its API: each object created, or replaced
with what the manifest says where it exists (its resourceVersion kept), in the order
kustomize writes them (namespaces and accounts before what uses them)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import yaml

AGENT = resources.files("lens_ebpf.recorder.management") / "agent"
# kustomize's order of kinds (its legacy sort): what others need comes first
ORDER = (
    "Namespace",
    "ResourceQuota",
    "StorageClass",
    "CustomResourceDefinition",
    "ServiceAccount",
    "PodSecurityPolicy",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
    "ConfigMap",
    "Secret",
    "Endpoints",
    "Service",
    "LimitRange",
    "PriorityClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Deployment",
    "StatefulSet",
    "CronJob",
    "PodDisruptionBudget",
    "DaemonSet",
)
# where each kind the manifest holds is served: (its API path's base, namespaced)
PATHS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Service": ("/api/v1", "services", True),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
}
AGENT_NAME = "app.kubernetes.io/name=lens-ebpf"  # the DaemonSet's label (its selector's)


def _read(name: str) -> str:
    return (AGENT / name).read_text()


def objects(image: str = "") -> list[dict[str, Any]]:
    """Every object of deploy/agent, in kustomize's order; image: the agent container's
    (\"\": the manifest's)."""
    kust = yaml.safe_load(_read("kustomization.yaml"))
    out: list[dict[str, Any]] = []
    for res in kust.get("resources") or []:
        out += [d for d in yaml.safe_load_all(_read(res)) if d]
    opts = kust.get("generatorOptions") or {}
    for gen in kust.get("configMapGenerator") or []:
        data = {}
        for f in gen.get("files") or []:
            key, _, path = f.partition("=")
            data[key if path else f] = _read(path or f)
        meta: dict[str, Any] = {"name": gen["name"]}
        if opts.get("labels"):
            meta["labels"] = dict(opts["labels"])
        if gen.get("namespace"):
            meta["namespace"] = gen["namespace"]
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    out.sort(
        key=lambda d: (
            ORDER.index(d["kind"]) if d["kind"] in ORDER else len(ORDER),
            d["metadata"].get("namespace", ""),
            d["metadata"]["name"],
        )
    )
    if image:
        for d in out:
            if d["kind"] == "DaemonSet":
                for c in d["spec"]["template"]["spec"]["containers"]:
                    c["image"] = image
    return out


def agent_image() -> str:
    """The image deploy/agent's DaemonSet names."""
    ds = next(d for d in objects() if d["kind"] == "DaemonSet")
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


def split_image(image: str) -> tuple[str, str]:
    """(repository, tag) of an image reference (tag "latest" when it names none)."""
    ref = image.split("@", 1)[0]
    head, _, last = ref.rpartition("/")
    name, sep, tag = last.partition(":")
    return (f"{head}/{name}" if head else name), (tag if sep else "latest")


def path_of(doc: dict[str, Any], named: bool = True) -> str:
    base, plural, namespaced = PATHS[doc["kind"]]
    ns = doc["metadata"].get("namespace", "")
    where = f"{base}/namespaces/{ns}/{plural}" if namespaced else f"{base}/{plural}"
    return f"{where}/{doc['metadata']['name']}" if named else where


class RawApi:
    """A cluster's API as raw JSON both ways (no client models): call(method, path, body);
    an ApiException carries the status."""

    def __init__(self, api_client: Any, timeout: float) -> None:
        self.client, self.timeout = api_client, timeout

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        c = self.client
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if hasattr(c, "param_serialize"):  # kubernetes >= 31
            m, url, hdrs, sent, post = c.param_serialize(
                method=method,
                resource_path=path,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = c.call_api(
                m,
                url,
                header_params=hdrs,
                body=sent,
                post_params=post,
                _request_timeout=self.timeout,
            )
            resp.read()
        else:  # pragma: no cover - older clients
            resp = c.call_api(
                path,
                method,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.timeout,
                _return_http_data_only=True,
            )
        if not 200 <= resp.status < 300:
            raise ApiException(http_resp=resp)
        doc = json.loads(resp.data or b"{}")
        if not isinstance(doc, dict):
            raise ValueError(f"{method} {path}: answer is not a JSON object")
        return doc

    def version(self) -> str:
        """The API server's version (GET /version): v1.20.2."""
        return str(self.call("GET", "/version").get("gitVersion", ""))


def status_of(exc: Exception) -> int | None:
    return getattr(exc, "status", None)


def apply(api: RawApi, docs: list[dict[str, Any]], say: Callable[[str], None]) -> None:
    """Each object created, or replaced where it exists; say() is told of each. The first
    refusal stops it (raised: the objects before it stay)."""
    for doc in docs:
        doc = copy.deepcopy(doc)
        m = doc["metadata"]
        what = (
            f"{doc['kind']} {m.get('namespace', '') + '/' if m.get('namespace') else ''}"
            f"{m['name']}"
        )
        try:
            api.call("POST", path_of(doc, named=False), doc)
            say(f"created {what}")
            continue
        except Exception as exc:
            if status_of(exc) != 409:
                raise
        cur = api.call("GET", path_of(doc))
        m["resourceVersion"] = cur.get("metadata", {}).get("resourceVersion", "")
        if doc["kind"] == "Service" and "clusterIP" in (cur.get("spec") or {}):
            doc.setdefault("spec", {})["clusterIP"] = cur["spec"]["clusterIP"]  # immutable
        api.call("PUT", path_of(doc), doc)
        say(f"replaced {what} (it existed)")


def daemonsets(api: RawApi) -> list[dict[str, Any]]:
    """The agent's DaemonSets in a cluster (any namespace), by their label."""
    got = api.call("GET", f"/apis/apps/v1/daemonsets?labelSelector={AGENT_NAME}")
    return [d for d in got.get("items") or [] if isinstance(d, dict)]
