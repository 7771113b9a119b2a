"""The optional kubelet Service and Endpoints: every node's kubelet address and ports in
one headless Service (kube-system/kubelet by default), which Prometheus scrape configs and
ServiceMonitors select. Kept in sync with the node list every interval; a node that goes
away leaves it at the next sync."""

from __future__ import annotations

from typing import Any

from lens_ebpf.k8s.reflector import call_raw

LABELS = {"k8s-app": "kubelet", "app.kubernetes.io/managed-by": "lens-ebpf-recorder"}


def node_addresses(nodes: dict[str, Any]) -> list[dict[str, Any]]:
    """Endpoints addresses: each node's InternalIP (else its first address), by name."""
    out = []
    for node in nodes.get("items") or ():
        if not isinstance(node, dict):
            continue
        meta = node.get("metadata") or {}
        addrs = [
            a
            for a in (node.get("status") or {}).get("addresses") or ()
            if isinstance(a, dict) and a.get("address")
        ]
        ip = next((a["address"] for a in addrs if a.get("type") == "InternalIP"), None)
        ip = ip or next((a["address"] for a in addrs if a.get("type") != "Hostname"), None)
        if not ip or not meta.get("name"):
            continue
        out.append(
            {
                "ip": str(ip),
                "nodeName": str(meta["name"]),
                "targetRef": {
                    "kind": "Node",
                    "name": str(meta["name"]),
                    "uid": str(meta.get("uid", "")),
                },
            }
        )
    return sorted(out, key=lambda a: a["nodeName"])


def desired(
    namespace: str, name: str, ports: dict[str, int], addresses: list[dict[str, Any]]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Service and the Endpoints as they should be."""
    meta = {"name": name, "namespace": namespace, "labels": dict(LABELS)}
    svc_ports = [
        {"name": n, "port": p, "protocol": "TCP", "targetPort": p} for n, p in sorted(ports.items())
    ]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": dict(meta),
        "spec": {"clusterIP": "None", "type": "ClusterIP", "ports": svc_ports},
    }
    subsets = (
        [
            {
                "addresses": addresses,
                "ports": [
                    {"name": n, "port": p, "protocol": "TCP"} for n, p in sorted(ports.items())
                ],
            }
        ]
        if addresses
        else []
    )
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": dict(meta),
        "subsets": subsets,
    }
    return service, endpoints


def _same_ports(have: dict[str, Any], want: dict[str, Any]) -> bool:
    """A Service as wanted: its ports (the cluster fills in the rest of its spec)."""
    ports = (have.get("spec") or {}).get("ports") or ()
    return [(p.get("name"), p.get("port")) for p in ports] == [
        (p["name"], p["port"]) for p in want["spec"]["ports"]
    ]


def _same_subsets(have: dict[str, Any], want: dict[str, Any]) -> bool:
    return bool(have.get("subsets") == want["subsets"])


class KubeletService:
    """Creates the Service and its Endpoints, and keeps the Endpoints equal to the nodes."""

    def __init__(
        self,
        core: Any,
        namespace: str,
        name: str,
        ports: dict[str, int],
        interval: float,
        timeout: float,
    ) -> None:
        self.core, self.namespace, self.name = core, namespace, name
        self.ports, self.interval, self.timeout = ports, interval, timeout
        self.syncs: dict[str, int] = {"unchanged": 0, "created": 0, "updated": 0, "error": 0}

    def sync(self) -> str:
        nodes = call_raw(self.core.list_node, timeout=self.timeout)
        service, endpoints = desired(self.namespace, self.name, self.ports, node_addresses(nodes))
        result = "unchanged"
        for kind, body, same_as in (
            ("service", service, _same_ports),
            ("endpoints", endpoints, _same_subsets),
        ):
            read = getattr(self.core, f"read_namespaced_{kind}")
            try:
                have = call_raw(read, self.name, self.namespace, timeout=self.timeout)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise
                create = getattr(self.core, f"create_namespaced_{kind}")
                call_raw(create, self.namespace, body, timeout=self.timeout)
                result = "created"
                continue
            if not same_as(have, body):
                body = {
                    **body,
                    "metadata": {
                        **body["metadata"],
                        "resourceVersion": (have.get("metadata") or {}).get("resourceVersion"),
                    },
                }
                if kind == "service":  # the cluster keeps its allocated fields
                    body["spec"] = {**have.get("spec", {}), "ports": body["spec"]["ports"]}
                replace = getattr(self.core, f"replace_namespaced_{kind}")
                call_raw(replace, self.name, self.namespace, body, timeout=self.timeout)
                result = "updated" if result == "unchanged" else result
        return result

    def sync_counted(self) -> None:
        """sync(), counted by result (the runner's job; it logs a failure: the API down,
        RBAC)."""
        try:
            result = self.sync()
        except Exception:
            self.syncs["error"] += 1
            raise
        self.syncs[result] += 1
