"""The kubelet's HTTPS API (port 10250): /pods for GPU allocation, /stats/summary for
ephemeral storage.

TLS is verified against the cluster CA (the service account's ca.crt) unless
kubernetes.kubelet.insecure_skip_verify is set; a certificate that does not verify
fails the call and says why, it never falls back to plain trust. Every call has a
timeout, and the bearer token is read again for each call (projected tokens rotate).
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric

from lens_ebpf.core.collector import CollectorError, PeriodicCollector
from lens_ebpf.core.exposition import gauge
from lens_ebpf.k8s.objects import ObjectError
from lens_ebpf.k8s.resources import effective_request

log = logging.getLogger(__name__)

SA_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
HTTP_HINTS = {
    401: "unauthorized (service account token?)",
    403: "forbidden (RBAC: nodes/proxy and nodes/stats)",
}


# -- pure parsing ---------------------------------------------------------------
@dataclass
class Allocation:
    requested: dict[str, int] = field(default_factory=dict)  # resource -> devices
    pods: int = 0  # running pods counted
    bad_pods: int = 0  # pods skipped as malformed


def gpu_allocation(pod_list: dict[str, Any], resources: Iterable[str]) -> Allocation:
    """GPUs requested by the running pods of a kubelet /pods answer, each pod once."""
    items = pod_list.get("items") if isinstance(pod_list, dict) else None
    if not isinstance(items, list):
        raise ObjectError("kubelet /pods: no items list")
    out = Allocation(requested=dict.fromkeys(resources, 0))
    seen: set[str] = set()
    for pod in items:
        if not isinstance(pod, dict):
            out.bad_pods += 1
            continue
        meta = pod.get("metadata") or {}
        key = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
        if key in seen or (pod.get("status") or {}).get("phase") != "Running":
            continue
        seen.add(key)
        try:
            reqs = {r: effective_request(pod, r) for r in out.requested}
        except ObjectError as exc:
            out.bad_pods += 1
            log.warning("kubelet /pods: %s", exc)
            continue
        out.pods += 1
        for r, n in reqs.items():
            out.requested[r] += n
    return out


@dataclass(frozen=True)
class Volume:
    """A pod's PersistentVolumeClaim volume as the kubelet measures it."""

    namespace: str
    pod: str
    claim: str
    volume: str
    used: int | None
    capacity: int | None
    available: int | None
    inodes_used: int | None


@dataclass
class Storage:
    node: str
    used: int | None
    available: int | None
    capacity: int | None
    pods: list[tuple[str, str, int]]  # (namespace, pod, used bytes)
    volumes: list[Volume] = field(default_factory=list)  # PVCs only (kubelet_volume_stats_*)


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def ephemeral_storage(summary: dict[str, Any]) -> Storage:
    """Node and pod ephemeral storage from a kubelet /stats/summary answer."""
    node = summary.get("node") if isinstance(summary, dict) else None
    if not isinstance(node, dict):
        raise ObjectError("kubelet /stats/summary: no node section")
    fs = node.get("fs") or {}
    pods = []
    volumes = []
    for p in summary.get("pods") or ():
        ref = p.get("podRef") or {} if isinstance(p, dict) else {}
        used = _int((p.get("ephemeral-storage") or {}).get("usedBytes")) if ref else None
        if ref.get("name") and used is not None:
            pods.append((str(ref.get("namespace", "")), str(ref["name"]), used))
        for v in (p.get("volume") or ()) if ref.get("name") else ():
            pvc = v.get("pvcRef") if isinstance(v, dict) else None
            if not isinstance(pvc, dict) or not pvc.get("name"):
                continue  # not a claim (a projected token, an emptyDir): the kubelet's too
            sizes = (
                _int(v.get(k))
                for k in ("usedBytes", "capacityBytes", "availableBytes", "inodesUsed")
            )
            volumes.append(
                Volume(
                    str(ref.get("namespace", "")),
                    str(ref["name"]),
                    str(pvc["name"]),
                    str(v.get("name", "")),
                    *sizes,
                )
            )
    return Storage(
        str(node.get("nodeName", "")),
        _int(fs.get("usedBytes")),
        _int(fs.get("availableBytes")),
        _int(fs.get("capacityBytes")),
        pods,
        volumes,
    )


# -- HTTPS ----------------------------------------------------------------------
def tls_context(ca_file: str, insecure: bool) -> ssl.SSLContext:
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise CollectorError("tls", f"kubelet CA {ca_file}: cannot load: {exc}") from None


class KubeletClient:
    def __init__(
        self, url: str, ca_file: str, token_file: str, insecure: bool, timeout: float
    ) -> None:
        self.url = url.rstrip("/")
        self.ca_file = ca_file
        self.token_file = token_file
        self.insecure = insecure
        self.timeout = timeout

    def get(self, path: str) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        with contextlib.suppress(OSError):  # no token: the kubelet says 401, and so will we
            headers["Authorization"] = "Bearer " + Path(self.token_file).read_text().strip()
        ctx = tls_context(self.ca_file, self.insecure)
        req = urllib.request.Request(self.url + path, headers=headers)
        where = f"kubelet {self.url}{path}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=ctx) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            why = HTTP_HINTS.get(exc.code, exc.reason)
            raise CollectorError("http", f"{where}: HTTP {exc.code} {why}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise CollectorError(
                    "tls",
                    f"{where}: TLS verification failed ({reason.verify_message}) against CA "
                    f"{self.ca_file}; set kubernetes.kubelet.ca_file to the CA that signed "
                    "the kubelet's serving certificate",
                ) from None
            raise CollectorError("connect", f"{where}: {reason}") from None
        except TimeoutError:
            raise CollectorError("timeout", f"{where}: no answer in {self.timeout}s") from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise CollectorError("parse", f"{where}: not JSON") from None
        if not isinstance(doc, dict):
            raise CollectorError("parse", f"{where}: not a JSON object")
        return doc


class KubeletCollector(PeriodicCollector):
    """node_k8s_gpu_allocation_rate and the ephemeral storage families."""

    name = "kubelet"

    def __init__(
        self,
        interval: float,
        client: KubeletClient,
        node: str,
        resources: list[str],
        gpu_count: Callable[[], int],
    ) -> None:
        super().__init__(interval)
        self.client = client
        self.node = node
        self.resources = resources
        self.gpu_count = gpu_count

    def refresh(self) -> list[Metric]:
        fams: list[Metric] = []
        errors: list[CollectorError] = []
        for part in (self._allocation, self._storage):
            try:
                fams.extend(part())
            except CollectorError as exc:  # one endpoint failing keeps the other
                errors.append(exc)
        if errors:
            if len(errors) == 2:
                raise errors[0]
            self.count_error(errors[0].reason)
            log.warning("collector kubelet: %s", errors[0])
        return fams

    def _allocation(self) -> list[Metric]:
        try:
            alloc = gpu_allocation(self.client.get("/pods"), self.resources)
        except ObjectError as exc:
            raise CollectorError("parse", str(exc)) from None
        if alloc.bad_pods:
            self.count_error("bad_pod")
        req = gauge("lens_k8s_gpu_requested", "GPUs requested by running pods")
        for r, n in sorted(alloc.requested.items()):
            req.add({"resource": r}, n)
        out: list[Metric] = [req]
        gpus = self.gpu_count()
        if gpus > 0:  # a node without GPUs has no allocation rate, not 0
            rate = gauge(
                "node_k8s_gpu_allocation_rate",
                "Percent of the node's GPUs requested by running pods",
            )
            rate.add({}, sum(alloc.requested.values()) / gpus * 100)
            out.append(rate)
        return out

    def _storage(self) -> list[Metric]:
        try:
            st = ephemeral_storage(self.client.get("/stats/summary"))
        except ObjectError as exc:
            raise CollectorError("parse", str(exc)) from None
        node = {"node": st.node or self.node}
        out: list[Metric] = []

        def put(name: str, help_text: str, value: float | None) -> None:
            if value is not None:
                m = gauge(name, help_text)
                m.add(node, value)
                out.append(m)

        put("node_ephemeral_storage_usage_bytes", "Node filesystem used (kubelet nodefs)", st.used)
        put("node_ephemeral_storage_available_bytes", "Node filesystem available", st.available)
        put("node_ephemeral_storage_capacity_bytes", "Node filesystem capacity", st.capacity)
        if st.used is not None and st.capacity:
            put(
                "node_ephemeral_storage_usage_percent",
                "Node filesystem used, percent",
                st.used / st.capacity * 100,
            )
        pods = gauge("pod_ephemeral_storage_usage_bytes", "Ephemeral storage used by a pod")
        for ns, pod, used in sorted(st.pods):
            pods.add({"namespace": ns, "pod": pod, **node}, used)
        out.append(pods)
        out.extend(volume_families(st.volumes, node))
        return out


# a pod's claim volumes: kubelet_volume_stats_*'s meaning, per pod
VOLUME_FAMILIES = (
    ("lens_pod_volume_used_bytes", "used", "Bytes used on a pod's PersistentVolumeClaim"),
    ("lens_pod_volume_capacity_bytes", "capacity", "Capacity of a pod's PersistentVolumeClaim"),
    (
        "lens_pod_volume_available_bytes",
        "available",
        "Bytes available on a pod's PersistentVolumeClaim",
    ),
    ("lens_pod_volume_inodes_used", "inodes_used", "Inodes used on a pod's PersistentVolumeClaim"),
)


def volume_families(volumes: list[Volume], node: dict[str, str]) -> list[Metric]:
    """lens_pod_volume_*{namespace,pod,persistentvolumeclaim,volume,node}: the kubelet's
    measure of each claim a pod mounts (where it measured it)."""
    fams: list[Metric] = []
    for name, attr, help_text in VOLUME_FAMILIES:
        m = gauge(name, help_text)
        for v in sorted(volumes, key=lambda v: (v.namespace, v.pod, v.volume)):
            value = getattr(v, attr)
            if value is not None:
                m.add(
                    {
                        "namespace": v.namespace,
                        "pod": v.pod,
                        "persistentvolumeclaim": v.claim,
                        "volume": v.volume,
                        **node,
                    },
                    value,
                )
        fams.append(m)
    return fams
