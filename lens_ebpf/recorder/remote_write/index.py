"""The maps remote write copies by: node -> device -> the pod the kubelet gave it, and when
(GPUs: the agents' device records and their holder changes; RDMA devices: the agents'
rdma_open/rdma_close of a pod's queue pairs), and pod -> the workloads above it (every
level). Read from the database every `remote_write.cache_seconds`; a read that finds
nothing changed keeps the generation, so the per-series answers stay cached."""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, or_, select
from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.core.times import aware
from lens_ebpf.recorder.store.schema import Scoped, scoped

HISTORY = timedelta(days=1)  # holder changes and RDMA opens looked back on
ALWAYS = (-math.inf, math.inf)


@dataclass(frozen=True)
class Pod:
    uid: str
    namespace: str
    name: str
    node: str
    workloads: tuple[tuple[str, str, str], ...]  # (kind, name, uid), bottom to top


@dataclass
class Index:
    generation: int = 0
    built: datetime | None = None
    nodes: set[str] = field(default_factory=set)
    addresses: dict[str, str] = field(default_factory=dict)  # InternalIP -> node
    # node -> (match, value) -> a GPU's slot (match: index, uuid, serial, bdf)
    gpus: dict[str, dict[tuple[str, str], str]] = field(default_factory=dict)
    # (node, GPU slot or RDMA device) -> [(from ms, to ms, pod uid)], oldest first
    holders: dict[tuple[str, str], list[tuple[float, float, str]]] = field(default_factory=dict)
    rdma: dict[str, set[str]] = field(default_factory=dict)  # node -> its RDMA devices
    pods: dict[str, Pod] = field(default_factory=dict)
    by_name: dict[tuple[str, str], str] = field(default_factory=dict)  # (ns, name) -> uid
    names: dict[str, list[str]] = field(default_factory=dict)  # name -> uids

    def node(self, value: str) -> str:
        """A node named by a label: its name, or host:port / an address (instance)."""
        if value in self.nodes:
            return value
        host = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
        host = host.strip("[]")
        if host in self.nodes:
            return host
        return self.addresses.get(host, "")

    def held(self, node: str, slot: str, at_ms: float) -> list[str]:
        """The pods holding that device at that time."""
        return [uid for start, end, uid in self.holders.get((node, slot), ())
                if start <= at_ms < end]  # fmt: skip


def bdf(value: str) -> str:
    """A PCI address as the agents write it: lower case, a four-digit domain
    (dcgm-exporter's pci_bus_id has eight)."""
    v = value.strip().lower()
    dom, sep, rest = v.partition(":")
    if sep and rest.count(":") == 1 and len(dom) > 4 and set(dom[:-4]) <= {"0"}:
        return f"{dom[-4:]}:{rest}"
    return v


def _ms(at: Any) -> float:
    return aware(at).timestamp() * 1000  # type: ignore[union-attr]


def _spans(changes: list[tuple[float, str, str]], current: str) -> list[tuple[float, float, str]]:
    """Holder intervals (from, to, "ns/pod") from holder changes (at, old, new), oldest
    first, and the holder now."""
    if not changes:
        return [(*ALWAYS, current)] if current else []
    out, start, holder = [], -math.inf, changes[0][1]
    for at, _, new in changes:
        if holder:
            out.append((start, at, holder))
        start, holder = at, new
    if holder:
        out.append((start, math.inf, holder))
    return out


def build(conn: Connection, now: datetime, t: Scoped) -> Index:
    """The maps from one cluster's tables."""
    idx = Index(built=now)
    since = now - HISTORY
    for r in conn.execute(select(t.nodes.c.name, t.nodes.c.address)):
        idx.nodes.add(r.name)
        if r.address:
            idx.addresses[r.address] = r.name
    # pods: those not deleted, and those deleted within HISTORY (their samples may come late)
    p, refs, w = t.gpu_pods, t.workload_pod_references, t.gpu_workloads
    kinds = {r.uid: (r.kind, r.name) for r in conn.execute(select(w.c.uid, w.c.kind, w.c.name))}
    above: dict[str, list[str]] = {}
    for r in conn.execute(select(refs.c.pod_uid, refs.c.workload_uid)):
        above.setdefault(r.pod_uid, []).append(r.workload_uid)
    live = or_(p.c.deleted.is_(False), p.c.deleted_at >= since)
    for r in conn.execute(select(p.c.uid, p.c.namespace, p.c.name, p.c.node, p.c.workload_uid,
                                 p.c.created_at).where(live).order_by(p.c.created_at)):  # fmt: skip
        top = r.workload_uid
        # the top workload last (its references are the pod's whole chain)
        chain = sorted(above.get(r.uid, ()), key=lambda u, top=top: (u == top, u))
        workloads = tuple((*kinds[u], u) for u in chain if u in kinds)
        idx.pods[r.uid] = Pod(r.uid, r.namespace, r.name, r.node, workloads)
        idx.by_name[(r.namespace, r.name)] = r.uid  # the newest of a name reused
        idx.names.setdefault(r.name, []).append(r.uid)
    # GPUs, and who held them when
    nd, cl = t.node_devices, t.device_changelog
    current: dict[tuple[str, str], str] = {}
    for r in conn.execute(select(nd.c.node, nd.c.kind, nd.c.slot, nd.c.idx, nd.c.uuid,
                                 nd.c.serial, nd.c.bdf, nd.c.holder)):  # fmt: skip
        if r.kind != "gpu":
            if r.kind == "rdma_port":
                idx.rdma.setdefault(r.node, set()).add(r.slot.split("/")[0])
            continue
        gpus = idx.gpus.setdefault(r.node, {})
        gpus[("index", str(r.idx))] = r.slot
        for match, value in (("uuid", r.uuid), ("serial", r.serial), ("bdf", bdf(r.bdf))):
            if value:
                gpus[(match, value)] = r.slot
        current[(r.node, r.slot)] = r.holder
    changes: dict[tuple[str, str], list[tuple[float, str, str]]] = {}
    for r in conn.execute(select(cl.c.node, cl.c.slot, cl.c.at, cl.c.old_value, cl.c.new_value)
                          .where(cl.c.field == "holder", cl.c.at >= since)
                          .order_by(cl.c.at, cl.c.id)):  # fmt: skip
        changes.setdefault((r.node, r.slot), []).append((_ms(r.at), r.old_value, r.new_value))
    for key, holder in current.items():
        spans = [(a, b, idx.by_name.get(tuple(h.split("/", 1)), ""))  # type: ignore[arg-type]
                 for a, b, h in _spans(changes.get(key, []), holder) if "/" in h]  # fmt: skip
        idx.holders[key] = [s for s in spans if s[2]]
    # RDMA devices: a pod holds one while its queue pairs are open on it
    ne = t.node_events
    opened: dict[tuple[str, str, str], float] = {}
    for r in conn.execute(select(ne.c.node, ne.c.at, ne.c.kind, ne.c.pod_uid, ne.c.payload)
                          .where(ne.c.kind.in_(("rdma_open", "rdma_close")), ne.c.at >= since)
                          .order_by(ne.c.at, ne.c.id)):  # fmt: skip
        payload = r.payload or {}
        dev = str(payload.get("device", ""))
        if not dev or not r.pod_uid:
            continue
        use = (str(r.node), dev, str(r.pod_uid))
        idx.rdma.setdefault(r.node, set()).add(dev)
        if r.kind == "rdma_open" and int(payload.get("queue_pairs", 0) or 0) > 0:
            opened.setdefault(use, _ms(r.at))
        elif use in opened:
            idx.holders.setdefault((r.node, dev), []).append((opened.pop(use), _ms(r.at),
                                                              r.pod_uid))  # fmt: skip
    for (node, dev, uid), start in opened.items():
        idx.holders.setdefault((node, dev), []).append((start, math.inf, uid))
    return idx


def fingerprint(idx: Index) -> str:
    """What the copies depend on (not when it was read)."""
    h = hashlib.sha1()
    parts = (sorted(idx.nodes), sorted(idx.addresses.items()),
             sorted((n, sorted(g.items())) for n, g in idx.gpus.items()),
             sorted(idx.holders.items()), sorted(idx.pods.items()),
             sorted((n, sorted(d)) for n, d in idx.rdma.items()))  # fmt: skip
    for part in parts:
        h.update(repr(part).encode())
    return h.hexdigest()


class Indexer:
    """Keeps the newest Index, read again every interval."""

    def __init__(self, engine: Engine, interval: float, clock: Callable[[], datetime],
                 cluster: str = "local") -> None:  # fmt: skip
        self.engine, self.interval, self.clock = engine, interval, clock
        self.cluster = cluster  # the series come from this cluster's exporters
        self.index = Index()
        self._print = ""
        self.refreshes = 0
        self.errors = 0
        self._lock = threading.Lock()

    def refresh(self) -> Index:
        now = self.clock()
        with self.engine.connect() as conn:
            idx = build(conn, now, scoped(self.cluster))
        mark = fingerprint(idx)
        with self._lock:
            idx.generation = self.index.generation + (mark != self._print)
            self._print = mark
            self.index = idx
            self.refreshes += 1
        return idx

    def refresh_counted(self) -> None:
        """refresh(), its failures counted (the runner's job; it logs them)."""
        try:
            self.refresh()
        except SQLAlchemyError:
            self.errors += 1
            raise
