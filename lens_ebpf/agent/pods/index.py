"""The live index of pods and services: IP -> identity, bounded, fed by reflectors.

Readers (the flow path, the GPU and process collectors) only look things up; they
never wait on the API. Owner workloads are resolved when a pod enters the index,
through a cache, so a pod is looked up with its Deployment (not its ReplicaSet).
When the API goes away the index keeps what it had until a relist replaces it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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


Parse = Callable[[dict[str, Any]], Any]  # an objects.py reader: API dict -> record


@dataclass
class _Entry:
    ips: tuple[str, ...]
    ident: Identity
    owner: OwnerRef | None = None  # what the workload was resolved from


@dataclass
class _Table:
    """Entries by (namespace, name), and by IP; at most bound entries."""

    bound: int
    entries: dict[tuple[str, str], _Entry] = field(default_factory=dict)
    by_ip: dict[str, tuple[str, str]] = field(default_factory=dict)
    by_uid: dict[str, tuple[str, str]] = field(default_factory=dict)  # pods'
    refused: int = 0


class ClusterIndex:
    """Pods and services by IP; bounded, thread-safe, refusals counted."""

    def __init__(
        self,
        max_pods: int = 100_000,
        max_services: int = 50_000,
        owners: OwnerResolver | None = None,
    ) -> None:
        self.owners = owners
        self._lock = threading.Lock()
        self._pods = _Table(max_pods)
        self._services = _Table(max_services)
        self.bad_objects = 0
        self.changes = 0  # bumped on every change, so users can tell the index moved on

    @property
    def refused(self) -> dict[str, int]:
        return {"pods": self._pods.refused, "services": self._services.refused}

    def _pod_entry(self, rec: PodRecord) -> _Entry:
        old = self._pods.entries.get((rec.namespace, rec.name))
        if old is not None and old.owner == rec.owner and old.ident.uid == rec.uid:
            kind, name = old.ident.workload_kind, old.ident.workload  # resolved already
        else:
            top = self.owners.workload(rec.namespace, rec.owner) if self.owners else rec.owner
            kind, name = (top.kind, top.name) if top else ("", "")
        ident = Identity("pod", rec.namespace, rec.name, kind, name, rec.node, rec.uid)
        return _Entry(rec.routable_ips, ident, rec.owner)

    @staticmethod
    def _service_entry(rec: ServiceRecord) -> _Entry:
        return _Entry(rec.ips, Identity("service", rec.namespace, rec.name))

    def _parse(self, parse: Parse, obj: dict[str, Any]) -> Any:
        try:
            return parse(obj)
        except ObjectError as exc:
            self.bad_objects += 1
            log.warning("k8s: skipping an object: %s", exc)
            return None

    def _replace(
        self,
        table: _Table,
        parse: Parse,
        entry: Callable[[Any], _Entry],
        objs: Iterable[dict[str, Any]],
    ) -> None:
        """A full list: the table becomes exactly these objects (within its bound)."""
        new: dict[tuple[str, str], _Entry] = {}
        for obj in objs:
            rec = self._parse(parse, obj)
            if rec is None:
                continue
            if len(new) >= table.bound:
                table.refused += 1
                continue
            new[(rec.namespace, rec.name)] = entry(rec)
        by_ip = {ip: key for key, e in new.items() for ip in e.ips}
        by_uid = {e.ident.uid: key for key, e in new.items() if e.ident.uid}
        with self._lock:
            table.entries, table.by_ip, table.by_uid = new, by_ip, by_uid
            self.changes += 1

    def _event(
        self,
        table: _Table,
        parse: Parse,
        entry: Callable[[Any], _Entry],
        kind: str,
        obj: dict[str, Any],
    ) -> None:
        """One watch event: ADDED and MODIFIED replace the entry, DELETED removes it."""
        rec = self._parse(parse, obj)
        if rec is None:
            return
        key = (rec.namespace, rec.name)
        new = None if kind == "DELETED" else entry(rec)  # owner lookups outside the lock
        with self._lock:
            old = table.entries.pop(key, None)
            if old is not None:
                for ip in old.ips:
                    if table.by_ip.get(ip) == key:
                        del table.by_ip[ip]
                if table.by_uid.get(old.ident.uid) == key:
                    del table.by_uid[old.ident.uid]
            if new is not None:
                if old is None and len(table.entries) >= table.bound:
                    table.refused += 1
                    return
                table.entries[key] = new
                for ip in new.ips:
                    table.by_ip[ip] = key
                if new.ident.uid:
                    table.by_uid[new.ident.uid] = key
            self.changes += 1

    def replace_pods(self, objs: Iterable[dict[str, Any]]) -> None:
        self._replace(self._pods, pod_record, self._pod_entry, objs)

    def pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._event(self._pods, pod_record, self._pod_entry, kind, obj)

    def replace_services(self, objs: Iterable[dict[str, Any]]) -> None:
        self._replace(self._services, service_record, self._service_entry, objs)

    def service_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._event(self._services, service_record, self._service_entry, kind, obj)

    # -- lookups --------------------------------------------------------------
    def lookup(self, ip: str) -> Identity | None:
        """The pod or service that holds ip (already in canonical text form)."""
        with self._lock:
            for table in (self._pods, self._services):
                key = table.by_ip.get(ip)
                if key is not None:
                    return table.entries[key].ident
        return None

    def pod(self, namespace: str, name: str) -> Identity | None:
        with self._lock:
            entry = self._pods.entries.get((namespace, name))
        return entry.ident if entry else None

    def pod_by_uid(self, uid: str) -> Identity | None:
        """The pod of that uid (a container's cgroup names its pod by uid alone)."""
        with self._lock:
            key = self._pods.by_uid.get(uid)
            entry = self._pods.entries.get(key) if key else None
        return entry.ident if entry else None

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"pods": len(self._pods.entries), "services": len(self._services.entries)}
