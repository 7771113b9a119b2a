"""The maps remote write copies by: node -> device -> the pod the kubelet gave it, and when
(GPUs: the agents' device records and their holder changes; RDMA devices: the agents'
rdma_open/rdma_close of a pod's queue pairs), and pod -> the workloads above it (every
level). Read from the database every `remote_write.cache_seconds`; a read that finds
nothing changed keeps the generation, so the per-series answers stay cached. Between two
reads, a series that names what the maps do not know on a node (a device, a pod, a device
nobody held then, the node itself) has that node's entries read again, at most once a
second per node, so a pod that just started has its first samples copied."""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import ChainMap
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, or_, select
from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.core.times import utc
from lens_ebpf.recorder.store import schema
from lens_ebpf.recorder.store.schema import Scoped, scoped

HISTORY = timedelta(days=1)  # holder changes and RDMA opens looked back on
ALWAYS = (-math.inf, math.inf)
AGAIN_SECONDS = 1.0  # a node's entries are read again on a miss at most this often
ASKED_MIN = 1024  # nodes whose last read is remembered, at least (those of the last second)
REFRESHES = ("changed", "unchanged", "failed")

log = logging.getLogger(__name__)


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
    # node (or the name a series gave an unknown one) -> how often its entries were read
    # anew and changed within this generation: a series resolved at another count is
    # resolved again
    stamps: dict[str, int] = field(default_factory=dict)

    def node(self, value: str) -> str:
        """A node named by a label: its name, or host:port / an address (instance)."""
        if value in self.nodes:
            return value
        h = host(value)
        if h in self.nodes:
            return h
        return self.addresses.get(h, "")

    def held(self, node: str, slot: str, at_ms: float) -> list[str]:
        """The pods holding that device at that time."""
        return [
            uid for start, end, uid in self.holders.get((node, slot), ()) if start <= at_ms < end
        ]


def host(value: str) -> str:
    """A node label's value without its port (instance's host:port)."""
    h = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return h.strip("[]")


def bdf(value: str) -> str:
    """A PCI address as the agents write it: lower case, a four-digit domain
    (dcgm-exporter's pci_bus_id has eight)."""
    v = value.strip().lower()
    dom, sep, rest = v.partition(":")
    if sep and rest.count(":") == 1 and len(dom) > 4 and set(dom[:-4]) <= {"0"}:
        return f"{dom[-4:]}:{rest}"
    return v


def _ms(at: Any) -> float:
    return utc(at).timestamp() * 1000


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
    _pods(conn, t, idx, since)
    _holders(idx, _devices(conn, t, idx, since), idx.by_name)
    return idx


@dataclass
class _Held:
    """Who held devices, as the tables say it: GPUs' holders ("namespace/pod") now and
    their changes, RDMA devices' users (pod uids) by their queue pairs."""

    current: dict[tuple[str, str], str] = field(default_factory=dict)
    changes: dict[tuple[str, str], list[tuple[float, str, str]]] = field(default_factory=dict)
    rdma: dict[tuple[str, str], list[tuple[float, float, str]]] = field(default_factory=dict)


def _pods(
    conn: Connection,
    t: Scoped,
    idx: Index,
    since: datetime,
    only: tuple[str, Collection[str], Collection[tuple[str, str]]] | None = None,
) -> set[str]:
    """Pods not deleted, and those deleted within HISTORY (their samples may come late),
    with the workloads above them (every level); only (node, uids, names): those on node
    ("" none), those of uids, and those of names ((namespace, name)) not on node. The
    uids of those not deleted."""
    p, refs, w = t.gpu_pods, t.workload_pod_references, t.gpu_workloads
    live = or_(p.c.deleted.is_(False), p.c.deleted_at >= since)
    q = (
        select(
            p.c.uid,
            p.c.namespace,
            p.c.name,
            p.c.node,
            p.c.workload_uid,
            p.c.deleted,
            p.c.created_at,
        )
        .where(live)
        .order_by(p.c.created_at)
    )
    if only is not None:
        # two reads, not one with an OR: uids by their key, the node's pods by its rows
        node, uids, names = only
        rows = list(conn.execute(q.where(p.c.node == node))) if node else []
        on_node = {(r.namespace, r.name) for r in rows}
        for ns, name in sorted(set(names) - on_node):  # (a series' pod: a few at most)
            rows += conn.execute(q.where(p.c.namespace == ns, p.c.name == name))
        if uids:
            rows += conn.execute(q.where(p.c.uid.in_(sorted(uids))))
        rows.sort(key=lambda r: _ms(r.created_at) if r.created_at else -math.inf)
        # by the pod_uid index: with the cluster in the WHERE, SQLite reads the whole
        # cluster's rows by the primary key (it covers the columns read): 10 ms at 100,000
        every = schema.workload_pod_references
        ref_q = select(every.c.cluster, every.c.pod_uid, every.c.workload_uid).where(
            every.c.pod_uid.in_(sorted({r.uid for r in rows}))
        )
    else:
        rows = list(conn.execute(q))
        ref_q = select(refs.c.pod_uid, refs.c.workload_uid)
    above: dict[str, list[str]] = {}
    if rows:
        for r in conn.execute(ref_q):
            if only is None or r.cluster == t.cluster:
                above.setdefault(r.pod_uid, []).append(r.workload_uid)
    w_q = select(w.c.uid, w.c.kind, w.c.name)
    if only is not None:
        w_q = w_q.where(w.c.uid.in_(sorted({u for us in above.values() for u in us})))
    kinds: dict[str, tuple[str, str]] = {}
    if above:
        kinds = {r.uid: (r.kind, r.name) for r in conn.execute(w_q)}
    alive = set()
    for r in rows:
        if r.uid in idx.pods:
            continue
        top = r.workload_uid
        # the top workload last (its references are the pod's whole chain)
        chain = sorted(above.get(r.uid, ()), key=lambda u, top=top: (u == top, u))
        workloads = tuple((*kinds[u], u) for u in chain if u in kinds)
        idx.pods[r.uid] = Pod(r.uid, r.namespace, r.name, r.node, workloads)
        idx.by_name[(r.namespace, r.name)] = r.uid  # the newest of a name reused
        idx.names.setdefault(r.name, []).append(r.uid)
        if not r.deleted:
            alive.add(r.uid)
    return alive


def _devices(conn: Connection, t: Scoped, idx: Index, since: datetime, node: str = "") -> _Held:
    """GPUs and RDMA devices (every node's, or node's), and who held them when."""
    nd, cl, ne = t.node_devices, t.device_changelog, t.node_events
    held = _Held()
    q = select(
        nd.c.node, nd.c.kind, nd.c.slot, nd.c.idx, nd.c.uuid, nd.c.serial, nd.c.bdf, nd.c.holder
    )
    for r in conn.execute(q.where(nd.c.node == node) if node else q):
        if r.kind != "gpu":
            if r.kind == "rdma_port":
                idx.rdma.setdefault(r.node, set()).add(r.slot.split("/")[0])
            continue
        gpus = idx.gpus.setdefault(r.node, {})
        gpus[("index", str(r.idx))] = r.slot
        for match, value in (("uuid", r.uuid), ("serial", r.serial), ("bdf", bdf(r.bdf))):
            if value:
                gpus[(match, value)] = r.slot
        held.current[(r.node, r.slot)] = r.holder
    q = (
        select(cl.c.node, cl.c.slot, cl.c.at, cl.c.old_value, cl.c.new_value)
        .where(cl.c.field == "holder", cl.c.at >= since)
        .order_by(cl.c.at, cl.c.id)
    )
    for r in conn.execute(q.where(cl.c.node == node) if node else q):
        held.changes.setdefault((r.node, r.slot), []).append((_ms(r.at), r.old_value, r.new_value))
    # RDMA devices: a pod holds one while its queue pairs are open on it
    opened: dict[tuple[str, str, str], float] = {}
    q = (
        select(ne.c.node, ne.c.at, ne.c.kind, ne.c.pod_uid, ne.c.payload)
        .where(ne.c.kind.in_(("rdma_open", "rdma_close")), ne.c.at >= since)
        .order_by(ne.c.at, ne.c.id)
    )
    for r in conn.execute(q.where(ne.c.node == node) if node else q):
        payload = r.payload or {}
        dev = str(payload.get("device", ""))
        if not dev or not r.pod_uid:
            continue
        use = (str(r.node), dev, str(r.pod_uid))
        idx.rdma.setdefault(r.node, set()).add(dev)
        if r.kind == "rdma_open" and int(payload.get("queue_pairs", 0) or 0) > 0:
            opened.setdefault(use, _ms(r.at))
        elif use in opened:
            held.rdma.setdefault((r.node, dev), []).append((opened.pop(use), _ms(r.at), r.pod_uid))
    for (n, dev, uid), start in opened.items():
        held.rdma.setdefault((n, dev), []).append((start, math.inf, uid))
    return held


def _pod_key(holder: str) -> tuple[str, str]:
    """A holder ("namespace/pod") as by_name's key."""
    ns, _, name = holder.partition("/")
    return ns, name


def _holders(idx: Index, held: _Held, by_name: Mapping[tuple[str, str], str]) -> None:
    """idx's holders: each GPU's holder names as pod uids (by_name), RDMA devices' users."""
    for key, holder in held.current.items():
        spans = [
            (a, b, by_name.get(_pod_key(h), ""))
            for a, b, h in _spans(held.changes.get(key, []), holder)
            if "/" in h
        ]
        idx.holders[key] = [s for s in spans if s[2]]
    for key, uses in held.rdma.items():
        idx.holders.setdefault(key, []).extend(uses)


def fingerprint(idx: Index) -> str:
    """What the copies depend on (not when it was read)."""
    h = hashlib.sha1()
    parts = (
        sorted(idx.nodes),
        sorted(idx.addresses.items()),
        sorted((n, sorted(g.items())) for n, g in idx.gpus.items()),
        sorted(idx.holders.items()),
        sorted(idx.pods.items()),
        sorted((n, sorted(d)) for n, d in idx.rdma.items()),
    )
    for part in parts:
        h.update(repr(part).encode())
    return h.hexdigest()


@dataclass
class NodeEntries:
    """One node's part of the maps, read on its own."""

    node: str  # its name ("": no node by that name or address)
    asked: str  # what a series named it by
    part: Index  # its devices and who held them, the pods read
    alive: set[str]  # of those pods, the ones not deleted
    unfound: frozenset[tuple[str, str]]  # holders (namespace, pod) no pod was found for


def read_node(
    conn: Connection,
    now: datetime,
    t: Scoped,
    asked: str,
    known: Index,
    uids: Collection[str] = (),
    sought: frozenset[tuple[str, str]] = frozenset(),
    pods: Collection[tuple[str, str]] = (),
) -> NodeEntries:
    """A node's entries (asked: its name, or the name or address a series gave a node
    known does not know): its devices and who held them; the pods on it when a holder or
    a pod a series named (pods: (namespace, name)) is one known does not know (unless
    the same ones were sought before: sought), a named one not on it by its name (as
    the full read finds it), and the pods of uids (RDMA users, a series' uid label)
    known does not know, by their key."""
    part = Index(built=now)
    since = now - HISTORY
    node = asked if asked in known.nodes else ""
    if not node:
        n = t.nodes
        for r in conn.execute(
            select(n.c.name, n.c.address)
            .where(or_(n.c.name == asked, n.c.address == asked))
            .order_by(n.c.name)
            .limit(1)
        ):
            node = r.name
            if r.address:
                part.addresses[r.address] = r.name
    if not node:
        return NodeEntries("", asked, part, set(), frozenset())
    part.nodes.add(node)
    held = _devices(conn, t, part, since, node)
    named = {h for h in held.current.values() if "/" in h}
    named.update(
        h
        for changes in held.changes.values()
        for _, old, new in changes
        for h in (old, new)
        if "/" in h
    )
    missing = frozenset(k for k in map(_pod_key, named) if k not in known.by_name)
    asked_for = frozenset(k for k in pods if k[1] and k not in known.by_name)
    missing |= asked_for
    want = {u for uses in held.rdma.values() for _, _, u in uses} | set(uids)
    want = {u for u in want if u and u not in known.pods}
    scan = not missing <= sought
    alive = (
        _pods(conn, t, part, since, (node if scan else "", want, asked_for if scan else ()))
        if scan or want
        else set()
    )
    _holders(part, held, ChainMap(part.by_name, known.by_name))
    unfound = frozenset(k for k in missing if k not in part.by_name)
    return NodeEntries(node, asked, part, alive, unfound)


def merged(base: Index, e: NodeEntries) -> Index | None:
    """base with e's node's entries in place of its own and e's pods added (copies, base
    unchanged: a request reading it reads it whole); None when that changes nothing."""
    n, part = e.node, e.part
    mine = {(n, slot) for slot in base.gpus.get(n, {}).values()}
    mine.update((n, dev) for dev in base.rdma.get(n, ()))
    pods = {uid: p for uid, p in part.pods.items() if base.pods.get(uid) != p}
    addresses = {a: m for a, m in part.addresses.items() if base.addresses.get(a) != m}
    if (
        n in base.nodes
        and not pods
        and not addresses
        and base.gpus.get(n, {}) == part.gpus.get(n, {})
        and base.rdma.get(n, set()) == part.rdma.get(n, set())
        and {k: base.holders[k] for k in mine if k in base.holders} == part.holders
    ):
        return None
    idx = Index(
        generation=base.generation,
        built=base.built,
        nodes=base.nodes | {n},
        addresses={**base.addresses, **addresses},
        gpus=dict(base.gpus),
        holders=dict(base.holders),
        rdma=dict(base.rdma),
        pods={**base.pods, **pods},
        by_name=dict(base.by_name),
        names=dict(base.names),
        stamps=dict(base.stamps),
    )
    if n in part.gpus:
        idx.gpus[n] = part.gpus[n]
    else:
        idx.gpus.pop(n, None)
    if n in part.rdma:
        idx.rdma[n] = part.rdma[n]
    else:
        idx.rdma.pop(n, None)
    for k in mine:
        idx.holders.pop(k, None)
    idx.holders.update(part.holders)
    for uid in pods:
        p = part.pods[uid]
        key = (p.namespace, p.name)
        if uid in e.alive or key not in idx.by_name:  # a live pod is the newest of its name
            idx.by_name[key] = uid
        if uid not in idx.names.get(p.name, ()):
            idx.names[p.name] = [*idx.names.get(p.name, ()), uid]
    for name in {n, e.asked}:
        idx.stamps[name] = idx.stamps.get(name, 0) + 1
    return idx


class Indexer:
    """Keeps the newest Index: read again every interval, and a node's entries on a miss
    (at most once a second per node). Per process, from the database: every replica has
    its own."""

    def __init__(
        self,
        engine: Engine,
        interval: float,
        clock: Callable[[], datetime],
        cluster: str = "local",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine, self.interval, self.clock = engine, interval, clock
        self.monotonic = monotonic
        self.cluster = cluster  # the series come from this cluster's exporters
        self.index = Index()
        self._print = ""
        self.refreshes = 0
        self.errors = 0
        self.node_refreshes: dict[str, int] = dict.fromkeys(REFRESHES, 0)
        self._lock = threading.Lock()  # held to swap the maps, never across a read
        self._asked: dict[str, float] = {}  # node -> when its entries were last read on a miss
        self._reading: dict[str, threading.Event] = {}  # node -> its read in flight: set when done
        # node -> holders its last read found no pod for (not sought again until the next
        # full read)
        self._sought: dict[str, frozenset[tuple[str, str]]] = {}
        # node reads since the full read began (newer than what it reads: kept over it)
        self._parts: dict[str, tuple[float, NodeEntries]] = {}
        self._began = -math.inf  # when the read of the maps' full tables began
        self._patched = False  # node reads changed the maps since the last full read
        self._held_off = -math.inf  # after a failed node read, none until then

    def refresh(self) -> Index:
        began = self.monotonic()
        now = self.clock()
        with self.engine.connect() as conn:
            idx = build(conn, now, scoped(self.cluster))
        mark = fingerprint(idx)
        with self._lock:
            # a node read that began after this read did is newer for its node: kept
            parts = {n: (at, e) for n, (at, e) in self._parts.items() if at > began}
            idx.generation = self.index.generation + (mark != self._print or self._patched)
            for _, e in parts.values():
                idx = merged(idx, e) or idx
            self._parts, self._patched = parts, bool(parts)
            self._sought.clear()
            self._print, self._began = mark, began
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

    def look_again(
        self, node: str, uid: str = "", pod: tuple[str, str] | None = None
    ) -> tuple[bool, Index]:
        """On a miss on node (its name, or what a series named one the maps do not know by;
        uid: the pod uid it named; pod: the (namespace, name) it named, read as the full
        read would find it): node's entries read again, unless they were within the
        last second; a read in flight (another request's, its series sent by another shard)
        is waited for, a second at most. Whether they were read for it, and the newest
        maps."""
        now = self.monotonic()
        with self._lock:
            reading = self._reading.get(node)
            mine = reading is None and self._may_read(node, now)
            if mine:
                reading = self._reading[node] = threading.Event()
            base, sought = self.index, self._sought.get(node, frozenset())
        if reading is None:
            return False, base
        if not mine:
            reading.wait(AGAIN_SECONDS)
            return True, self.index
        try:
            return True, self._read_node(node, uid, now, base, sought, pod)
        finally:
            with self._lock:
                del self._reading[node]
            reading.set()

    def _may_read(self, node: str, now: float) -> bool:
        """Whether node's entries may be read now (its last read a second ago or more, no
        failure just before, not a flood of names); if so, now is its last. Under the
        lock."""
        if now - self._asked.get(node, -math.inf) < AGAIN_SECONDS or now < self._held_off:
            return False
        most = max(ASKED_MIN, 2 * len(self.index.nodes))
        if len(self._asked) >= most:  # only the last second's matter
            self._asked = {k: at for k, at in self._asked.items() if now - at < AGAIN_SECONDS}
            if len(self._asked) >= most:  # that many names within a second: not read
                return False
        self._asked[node] = now
        return True

    def _read_node(
        self,
        node: str,
        uid: str,
        now: float,
        base: Index,
        sought: frozenset[tuple[str, str]],
        pod: tuple[str, str] | None = None,
    ) -> Index:
        """look_again's read: the newest maps after it."""
        try:
            with self.engine.connect() as conn:
                e = read_node(
                    conn,
                    self.clock(),
                    scoped(self.cluster),
                    node,
                    base,
                    (uid,) if uid else (),
                    sought,
                    (pod,) if pod else (),
                )
        except SQLAlchemyError as exc:
            with self._lock:
                self.node_refreshes["failed"] += 1
                self._held_off = now + self.interval
            log.warning(
                "remote write: reading node %s's entries again failed (none read "
                "again for %g s): %s",
                node,
                self.interval,
                exc,
            )
            return self.index
        with self._lock:
            if e.unfound:
                self._sought[e.node] = e.unfound
            else:
                self._sought.pop(e.node, None)
            # (a full read that began after this one is newer than it)
            new = merged(self.index, e) if e.node and now >= self._began else None
            if new is None:
                self.node_refreshes["unchanged"] += 1
            else:
                self.node_refreshes["changed"] += 1
                self.index = new
                self._parts[e.node] = (now, e)
                self._patched = True
            return self.index
