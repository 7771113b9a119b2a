"""The live index of pods and services: IP -> identity, bounded, fed by reflectors.

Readers (the flow path, the GPU and process collectors) only look things up; they
never wait on the API. Owner workloads are resolved when a pod enters the index,
through a cache, so a pod is looked up with its Deployment (not its ReplicaSet).
When the API goes away the index keeps what it had until a relist replaces it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lens_ebpf.k8s.objects import (
    ObjectError,
    OwnerRef,
    PodRecord,
    ServiceRecord,
    controller_of,
    pod_record,
    service_record,
)

log = logging.getLogger(__name__)

# How far owner references are followed (Pod -> ReplicaSet -> Deployment is two).
MAX_OWNER_HOPS = 4


@dataclass(frozen=True)
class Identity:
    """Who holds an address: a pod (with its workload) or a service."""

    kind: str  # "pod" or "service"
    namespace: str
    name: str
    workload_kind: str = ""
    workload: str = ""
    node: str = ""
    uid: str = ""

    @property
    def pod(self) -> str:
        return self.name if self.kind == "pod" else ""

    @property
    def service(self) -> str:
        return self.name if self.kind == "service" else ""


# kind -> getter(namespace, name) returning the object as a dict
Getter = Callable[[str, str], dict[str, Any]]


class OwnerResolver:
    """Follows controller owner references to the top workload, with a TTL cache."""

    def __init__(
        self,
        getters: dict[str, Getter],
        ttl: float = 600.0,
        failure_ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.getters = getters
        self.ttl = ttl
        self.failure_ttl = failure_ttl
        self.clock = clock
        self._cache: dict[tuple[str, str, str], tuple[float, OwnerRef | None, bool]] = {}
        self.lookups = {"hit": 0, "fetched": 0, "error": 0}

    def _parent(self, namespace: str, ref: OwnerRef) -> OwnerRef | None:
        """The controller of one owner; raises when the API cannot say."""
        key = (namespace, ref.kind, ref.name)
        hit = self._cache.get(key)
        now = self.clock()
        if hit is not None and now < hit[0]:
            self.lookups["hit"] += 1
            if not hit[2]:
                raise LookupError(f"{ref.kind}/{ref.name}: lookup failed recently")
            return hit[1]
        try:
            parent = controller_of(self.getters[ref.kind](namespace, ref.name))
        except Exception as exc:
            self.lookups["error"] += 1
            self._cache[key] = (now + self.failure_ttl, None, False)
            if getattr(exc, "status", None) == 404:
                raise LookupError(f"{ref.kind}/{ref.name} not found") from None
            raise LookupError(f"{ref.kind}/{ref.name}: {type(exc).__name__}") from None
        self.lookups["fetched"] += 1
        self._cache[key] = (now + self.ttl, parent, True)
        return parent

    def workload(self, namespace: str, owner: OwnerRef | None) -> OwnerRef | None:
        """The top controller above owner; the highest one reached when a lookup fails."""
        current = owner
        for _ in range(MAX_OWNER_HOPS):
            if current is None or current.kind not in self.getters:
                break
            try:
                parent = self._parent(namespace, current)
            except LookupError as exc:
                log.debug("owner of %s/%s: %s", namespace, current.name, exc)
                break
            if parent is None:
                break
            current = parent
        return current


class ClusterIndex:
    """Pods and services by IP; bounded, thread-safe, refusals counted."""

    def __init__(
        self,
        max_pods: int = 100_000,
        max_services: int = 50_000,
        owners: OwnerResolver | None = None,
    ) -> None:
        self.max_pods = max_pods
        self.max_services = max_services
        self.owners = owners
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], tuple[PodRecord, Identity]] = {}
        self._pod_ip: dict[str, tuple[str, str]] = {}
        self._services: dict[tuple[str, str], ServiceRecord] = {}
        self._svc_ip: dict[str, tuple[str, str]] = {}
        self.refused = {"pods": 0, "services": 0}
        self.bad_objects = 0
        self.changes = 0  # bumped on every change, so users can tell the index moved on

    # -- pods ---------------------------------------------------------------
    def _pod_entry(self, rec: PodRecord) -> tuple[PodRecord, Identity]:
        old = self._pods.get((rec.namespace, rec.name))
        if old is not None and old[0].owner == rec.owner and old[0].uid == rec.uid:
            ident = old[1]
        else:
            top = self.owners.workload(rec.namespace, rec.owner) if self.owners else rec.owner
            ident = Identity("pod", rec.namespace, rec.name,
                             top.kind if top else "", top.name if top else "",
                             rec.node, rec.uid)  # fmt: skip
        if ident.node != rec.node:
            ident = Identity(ident.kind, ident.namespace, ident.name, ident.workload_kind,
                             ident.workload, rec.node, rec.uid)  # fmt: skip
        return rec, ident

    def _parse(self, parse: Callable[[dict[str, Any]], Any], obj: dict[str, Any]) -> Any:
        try:
            return parse(obj)
        except ObjectError as exc:
            self.bad_objects += 1
            log.warning("k8s: skipping an object: %s", exc)
            return None

    def replace_pods(self, objs: Iterable[dict[str, Any]]) -> None:
        """A full list: the index becomes exactly these pods (within the bound)."""
        entries: dict[tuple[str, str], tuple[PodRecord, Identity]] = {}
        for obj in objs:
            rec = self._parse(pod_record, obj)
            if rec is None:
                continue
            if len(entries) >= self.max_pods:
                self.refused["pods"] += 1
                continue
            entries[(rec.namespace, rec.name)] = self._pod_entry(rec)
        by_ip = {ip: key for key, (rec, _) in entries.items() for ip in rec.routable_ips}
        with self._lock:
            self._pods, self._pod_ip = entries, by_ip
            self.changes += 1

    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        rec = self._parse(pod_record, obj)
        if rec is None:
            return
        key = (rec.namespace, rec.name)
        entry = None if kind == "DELETED" else self._pod_entry(rec)
        with self._lock:
            old = self._pods.pop(key, None)
            if old is not None:
                for ip in old[0].routable_ips:
                    if self._pod_ip.get(ip) == key:
                        del self._pod_ip[ip]
            if entry is not None:
                if old is None and len(self._pods) >= self.max_pods:
                    self.refused["pods"] += 1
                    return
                self._pods[key] = entry
                for ip in rec.routable_ips:
                    self._pod_ip[ip] = key
            self.changes += 1

    # -- services -------------------------------------------------------------
    def replace_services(self, objs: Iterable[dict[str, Any]]) -> None:
        entries: dict[tuple[str, str], ServiceRecord] = {}
        for obj in objs:
            rec = self._parse(service_record, obj)
            if rec is None:
                continue
            if len(entries) >= self.max_services:
                self.refused["services"] += 1
                continue
            entries[(rec.namespace, rec.name)] = rec
        by_ip = {ip: key for key, rec in entries.items() for ip in rec.ips}
        with self._lock:
            self._services, self._svc_ip = entries, by_ip
            self.changes += 1

    def service_event(self, kind: str, obj: dict[str, Any]) -> None:
        rec = self._parse(service_record, obj)
        if rec is None:
            return
        key = (rec.namespace, rec.name)
        with self._lock:
            old = self._services.pop(key, None)
            if old is not None:
                for ip in old.ips:
                    if self._svc_ip.get(ip) == key:
                        del self._svc_ip[ip]
            if kind != "DELETED":
                if old is None and len(self._services) >= self.max_services:
                    self.refused["services"] += 1
                    return
                self._services[key] = rec
                for ip in rec.ips:
                    self._svc_ip[ip] = key
            self.changes += 1

    # -- lookups --------------------------------------------------------------
    def lookup(self, ip: str) -> Identity | None:
        """The pod or service that holds ip (already in canonical text form)."""
        with self._lock:
            key = self._pod_ip.get(ip)
            if key is not None:
                return self._pods[key][1]
            key = self._svc_ip.get(ip)
            if key is not None:
                return Identity("service", key[0], key[1])
        return None

    def pod(self, namespace: str, name: str) -> Identity | None:
        with self._lock:
            entry = self._pods.get((namespace, name))
        return entry[1] if entry else None

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"pods": len(self._pods), "services": len(self._services)}

    def pods_on(self, node: str) -> list[Identity]:
        with self._lock:
            return [ident for _, ident in self._pods.values() if ident.node == node]


def raw_getter(fn: Callable[..., Any], timeout: float) -> Getter:
    """A kubernetes client read_namespaced_* method as a getter of the raw JSON object."""

    def get(namespace: str, name: str) -> dict[str, Any]:
        resp = fn(name, namespace, _preload_content=False, _request_timeout=timeout)
        doc: dict[str, Any] = json.loads(resp.data)
        return doc

    return get
