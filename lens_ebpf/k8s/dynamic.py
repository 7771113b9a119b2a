"""A dynamic Kubernetes client over raw JSON: any namespaced kind of a named group found by
API discovery (client-go's dynamic client and RESTMapper in one), and nodes through the
core API. The recorder follows pods' owners (Deployment, Job, PyTorchJob, ...) with it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from lens_ebpf.k8s.reflector import call_raw

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
NODE_LABELS_TTL = 600.0


def split_api_version(api_version: str) -> tuple[str, str]:
    """("apps", "v1") from "apps/v1"; ("", "v1") for the core group."""
    group, _, version = api_version.rpartition("/")
    return group, version


def status_code(exc: Exception) -> int | None:
    """The HTTP status an API call failed with (an ApiException's), else None."""
    code = getattr(exc, "status", None)
    return code if isinstance(code, int) else None


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


class DynamicApi:
    """The API calls the recorder makes, as raw JSON: any namespaced kind of a named group
    through discovery (the dynamic client's way), pods and nodes through the core API."""

    def __init__(self, api_client: Any, timeout: float) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout = timeout
        self._plurals: dict[tuple[str, str], dict[str, str]] = {}
        self._nodes: dict[str, tuple[float, dict[str, str]]] = {}

    def kind(self, api_version: str, kind: str) -> Kind | None:
        """The collection serving kind in api_version; None for the core group (Node,
        ReplicationController: not followed) or a kind the server does not serve."""
        group, version = split_api_version(api_version)
        if not group:
            return None
        found = self._plurals.get((group, version))
        if found is None or kind not in found:
            doc = call_raw(self.custom.get_api_resources, group, version, timeout=self.timeout)
            found = {
                str(r["kind"]): str(r["name"])
                for r in doc.get("resources") or ()
                if isinstance(r, dict)
                and r.get("kind")
                and "/" not in str(r.get("name"))
                and r.get("namespaced")
            }
            self._plurals[(group, version)] = found
        plural = found.get(kind)
        return Kind(group, version, plural) if plural else None

    def get(self, k: Kind, namespace: str, name: str) -> dict[str, Any]:
        return call_raw(
            self.custom.get_namespaced_custom_object,
            k.group,
            k.version,
            namespace,
            k.plural,
            name,
            timeout=self.timeout,
        )

    def patch(self, k: Kind, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return call_raw(
            self.custom.patch_namespaced_custom_object,
            k.group,
            k.version,
            namespace,
            k.plural,
            name,
            body,
            timeout=self.timeout,
            _content_type=MERGE_PATCH,
        )

    def lister(self, k: Kind) -> Callable[..., Any]:
        return partial(self.custom.list_cluster_custom_object, k.group, k.version, k.plural)

    def node_labels(self, node: str) -> dict[str, str]:
        """A node's labels (the GPU product labels), read again after NODE_LABELS_TTL: GPU
        feature discovery may label a node after its first pods start."""
        hit = self._nodes.get(node)
        if hit is None or time.monotonic() > hit[0]:
            try:
                labels = (
                    call_raw(self.core.read_node, node, timeout=self.timeout)
                    .get("metadata", {})
                    .get("labels")
                    or {}
                )
            except Exception as exc:  # 404, 403: no model, not an error
                log.debug("node %s: %s", node, exc)
                labels = {}
            hit = (time.monotonic() + NODE_LABELS_TTL, {str(k): str(v) for k, v in labels.items()})
            self._nodes[node] = hit
        return hit[1]
