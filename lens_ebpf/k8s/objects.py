"""Pure readers of Kubernetes objects as the API serves them (JSON dicts): the few fields
either service keeps, so an index holds small records rather than whole objects."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import yaml

from lens_ebpf.core.networks import Network, NetworkError, parse_networks

# Pods in these phases have released their IPs (a new pod may hold one now).
FINISHED = ("Succeeded", "Failed")


class ObjectError(ValueError):
    """An object or document without the fields the agent needs."""


@dataclass(frozen=True)
class OwnerRef:
    kind: str
    name: str


@dataclass(frozen=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    node: str
    ips: tuple[str, ...]
    host_network: bool
    phase: str
    owner: OwnerRef | None
    resource_version: str = ""

    @property
    def routable_ips(self) -> tuple[str, ...]:
        """The IPs that name this pod: none for hostNetwork pods (they hold the node's) or
        for finished pods (their IPs are free)."""
        if self.host_network or self.phase in FINISHED:
            return ()
        return self.ips


@dataclass(frozen=True)
class ServiceRecord:
    namespace: str
    name: str
    ips: tuple[str, ...]


def _meta(obj: Any) -> dict[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not meta.get("name"):
        raise ObjectError("object without metadata.name")
    return meta


def _canonical(ip: str) -> str | None:
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return None


def controller_ref(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The controlling owner reference of an object as the API wrote it, if any."""
    for ref in _meta(obj).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") and ref.get("name"):
            return ref
    return None


def controller_of(obj: dict[str, Any]) -> OwnerRef | None:
    """The controlling owner reference of an object, if any."""
    ref = controller_ref(obj)
    return OwnerRef(str(ref["kind"]), str(ref["name"])) if ref else None


def pod_record(obj: dict[str, Any]) -> PodRecord:
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    st = obj.get("status") or {}
    raw = [p.get("ip", "") for p in st.get("podIPs") or () if isinstance(p, dict)]
    if not raw and st.get("podIP"):
        raw = [st["podIP"]]
    ips = tuple(ip for ip in (_canonical(str(r)) for r in raw) if ip)
    return PodRecord(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta["name"]),
        node=str(spec.get("nodeName", "")),
        ips=ips,
        host_network=bool(spec.get("hostNetwork")),
        phase=str(st.get("phase", "")),
        owner=controller_of(obj),
        resource_version=str(meta.get("resourceVersion", "")),
    )


def service_record(obj: dict[str, Any]) -> ServiceRecord:
    meta = _meta(obj)
    spec = obj.get("spec") or {}
    raw = list(spec.get("clusterIPs") or ()) or [spec.get("clusterIP") or ""]
    # headless services ("None") have no cluster IP: their endpoints are pod IPs
    ips = tuple(ip for ip in (_canonical(str(r)) for r in raw if r and r != "None") if ip)
    return ServiceRecord(str(meta.get("namespace", "")), str(meta["name"]), ips)


def _cidrs(value: Any, source: str, key: str) -> tuple[Network, ...]:
    """CIDRs as the cluster writes them: a list, or one string, comma-separated for
    dual-stack (kubeadm's podSubnet: "10.244.0.0/16,fd00:10:244::/56")."""
    if value in (None, ""):
        return ()
    items = value.split(",") if isinstance(value, str) else value
    try:
        return parse_networks(items, f"{source}: {key}")
    except NetworkError as exc:
        raise ObjectError(str(exc)) from None


def kubeadm_networks(configmap: dict[str, Any]) -> tuple[tuple[Network, ...], tuple[Network, ...]]:
    """(pod CIDRs, service CIDRs) from the kubeadm-config ConfigMap's ClusterConfiguration."""
    text = (configmap.get("data") or {}).get("ClusterConfiguration")
    if not isinstance(text, str):
        raise ObjectError("kubeadm-config: no data.ClusterConfiguration")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ObjectError("kubeadm-config: ClusterConfiguration is not valid YAML") from None
    net = doc.get("networking") if isinstance(doc, dict) else None
    if not isinstance(net, dict):
        raise ObjectError("kubeadm-config: ClusterConfiguration has no networking section")
    return (
        _cidrs(net.get("podSubnet"), "kubeadm-config", "networking.podSubnet"),
        _cidrs(net.get("serviceSubnet"), "kubeadm-config", "networking.serviceSubnet"),
    )


def node_pod_cidrs(node: dict[str, Any]) -> tuple[Network, ...]:
    """A node's spec.podCIDRs (or the older single spec.podCIDR)."""
    spec = node.get("spec") or {}
    name = _meta(node)["name"]
    value = spec.get("podCIDRs") or spec.get("podCIDR")
    return _cidrs(value, f"node {name}", "spec.podCIDRs")
