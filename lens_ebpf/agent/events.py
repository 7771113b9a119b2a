"""Typed events, the one filter every consumer uses, and the bus that fans them out.

Each event kind is a frozen dataclass made by a decoder. Its fields carry the names the
proto and `trace --json` use (`cls` is written `class`); `ev["name"]` and `ev.get()` read
them by those names, for consumers that take events as records.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypedDict, TypeVar, cast

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import counter, gauge

_WIRE = {"cls": "class"}  # field -> name outside Python (a keyword there)
WIRE_ATTRS = {v: k for k, v in _WIRE.items()}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    """What every event has: its kind, and the bus's sequence number and wall time
    (stamped once by EventBus.publish, before any subscriber sees the event)."""

    KINDS: ClassVar[tuple[str, ...]] = ()
    kind: str
    seq: int = 0
    ts_unix_nano: int = 0
    # its wire encoding once made (api/convert.wire): no part of its value, equality or repr
    _wire: bytes = dataclasses.field(default=b"", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"{type(self).__name__} has no kind {self.kind!r}")

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, WIRE_ATTRS.get(name, name))
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, WIRE_ATTRS.get(name, name), default)

    def to_dict(self) -> dict[str, Any]:
        """The event by its wire names (trace --json, the reference collector)."""
        return {
            _WIRE.get(f.name, f.name): getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.init
        }


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Owner(Event):
    """Who a process belongs to; empty strings for the host."""

    container_id: str = ""
    container: str = ""
    pod: str = ""
    namespace: str = ""
    pod_uid: str = ""
    workload_kind: str = ""
    workload: str = ""


class OwnerFields(TypedDict):
    container_id: str
    container: str
    pod: str
    namespace: str
    pod_uid: str
    workload_kind: str
    workload: str


def owner_fields(who: dict[str, str]) -> OwnerFields:
    """An Owner's fields from an identity (Enrichment.pid, PodResources labels) that may
    name only some of them; the rest empty."""
    g = who.get
    return OwnerFields(
        container_id=g("container_id", ""),
        container=g("container", ""),
        pod=g("pod", ""),
        namespace=g("namespace", ""),
        pod_uid=g("pod_uid", ""),
        workload_kind=g("workload_kind", ""),
        workload=g("workload", ""),
    )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FlowClosed(Event):
    """A TCP flow that ended; abnormal_flow: one the policy's lists single out."""

    KINDS = ("flow_closed", "abnormal_flow")
    kind: str = "flow_closed"
    ts_ns: int
    pid: int
    comm: str
    cgroup_id: int
    family: str
    laddr: str
    lport: int
    raddr: str
    rport: int
    direction: str
    cls: str
    sent_bytes: int
    received_bytes: int
    retransmits: int
    duration_ns: int
    reason: str
    # the remote, when the cluster index knows its address
    remote_namespace: str = ""
    remote_pod: str = ""
    remote_workload_kind: str = ""
    remote_workload: str = ""
    remote_service: str = ""
    # the pod on this node that holds the local address
    namespace: str = ""
    pod: str = ""
    workload_kind: str = ""
    workload: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ProcessEvent(Owner):
    """exec, exit or OOM kill of a process, with the container and pod it ran in."""

    KINDS = ("process_exec", "process_exit", "oom_kill")
    ts_ns: int
    pid: int
    ppid: int
    comm: str
    cgroup_id: int
    cgroup: str
    filename: str = ""  # process_exec
    exit_code: int = 0  # process_exit: -1 unknown
    signal: int = 0
    oom_killed: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ContainerChange(Owner):
    KINDS = ("container_start", "container_exit")
    ts_ns: int
    devices: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DeviceChange(Event):
    """A GPU or RDMA port that appeared, disappeared or changed, with its full record
    (also an entry of a device_inventory)."""

    KINDS = ("device_change",)
    kind: str = "device_change"
    vendor: str
    bdf: str
    change: str  # appeared, disappeared, changed; "" in an inventory
    device_kind: str  # gpu, rdma_port
    key: str
    index: int = 0
    model: str = ""
    uuid: str = ""
    serial: str = ""
    driver_version: str = ""
    firmware_version: str = ""
    vbios_version: str = ""
    port_state: str = ""
    link_layer: str = ""
    rate: str = ""
    retired_pages_pending: bool = False
    row_remap_pending: bool = False
    row_remap_failure: bool = False
    recovery_action: str = ""  # NVIDIA: none, gpu_reset, node_reboot, ...; "": not reported
    holder: str = ""  # a GPU: namespace/pod of the pod the kubelet gave it; "": none
    fields: tuple[str, ...] = ()  # changed: which fields differ from the last record
    slot: str = ""  # where it sits: a GPU's BDF, an RDMA device/port


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DeviceInventory(Event):
    """Every device of the node (at start, and on each reporter (re)connect)."""

    KINDS = ("device_inventory",)
    kind: str = "device_inventory"
    devices: tuple[DeviceChange, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GpuFault(Owner):
    """A GPU fault, and (as the owner) the pod that held the GPU when it happened."""

    KINDS = ("gpu_fault",)
    kind: str = "gpu_fault"
    gpu_index: int
    bdf: str
    uuid: str
    vendor: str
    fault: str
    code: str
    message: str
    pid: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RdmaUse(Owner):
    """A container opened its first RDMA queue pair on a device (rdma_open), or has closed
    its last (rdma_close)."""

    KINDS = ("rdma_open", "rdma_close")
    device: str
    queue_pairs: int  # open now on the device (0 on rdma_close)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NodeTuned(Event):
    """The system tuner raised a kernel setting."""

    KINDS = ("node_tuned",)
    kind: str = "node_tuned"
    setting: str
    old_value: int
    new_value: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Gap(Event):
    """Events a consumer did not get, and why."""

    KINDS = ("gap",)
    kind: str = "gap"
    lost: int
    reason: str


EVENT_TYPES: tuple[type[Event], ...] = (
    FlowClosed,
    ProcessEvent,
    ContainerChange,
    DeviceChange,
    DeviceInventory,
    GpuFault,
    NodeTuned,
    RdmaUse,
    Gap,
)
KINDS: dict[str, type[Event]] = {k: t for t in EVENT_TYPES for k in t.KINDS}


@dataclasses.dataclass(frozen=True)
class EventFilter:
    """Which events a consumer wants: gRPC Subscribe and `lens-ebpf trace` build one each.
    An empty criterion takes everything; class only applies to events that have one."""

    kinds: frozenset[str] = frozenset()
    namespace: str = ""
    pod: str = ""
    container: str = ""  # name, or a prefix of the id
    comm: str = ""
    cls: str = ""

    @property
    def kinds_only(self) -> bool:
        """Whether it asks nothing of an event but its kind."""
        return not (self.namespace or self.pod or self.container or self.comm or self.cls)

    def __call__(self, ev: Event) -> bool:
        if self.kinds and ev.get("kind") not in self.kinds:
            return False
        if self.namespace and ev.get("namespace") != self.namespace:
            return False
        if self.pod and ev.get("pod") != self.pod:
            return False
        if self.comm and ev.get("comm") != self.comm[:15]:
            return False
        if self.cls and ev.get("class") not in (None, self.cls):
            return False
        return not (
            self.container
            and not (
                ev.get("container") == self.container
                or str(ev.get("container_id", "")).startswith(self.container)
            )
        )


class Subscription:
    """A bounded queue; when full the oldest event goes and the loss is counted."""

    def __init__(
        self,
        name: str,
        maxsize: int,
        accept: Callable[[Event], bool] | None = None,
        notify: Callable[[], None] | None = None,
        raw: bool = False,
    ) -> None:
        self.name = name
        self.accept = accept
        # raw: it takes what the bus holds as it is, a compiled event (native.Packed: its
        # kind, seq and wire bytes) or an Event; else get and drain make each compiled
        # one's Python event as it leaves the queue
        self.raw = raw
        # how the bus asks accept about a batch of compiled events (publish_batch): an
        # EventFilter on kinds alone by their kind, any other filter event by event
        self.kinds_only = isinstance(accept, EventFilter) and accept.kinds_only
        self.notify = notify  # told when a put finds the queue empty (a reader's wake-up)
        # the kinds it can accept (empty: any); producers skip work no one can take
        self.kinds = accept.kinds if isinstance(accept, EventFilter) else frozenset[str]()
        self.dropped = 0
        self.last_dropped_seq = 0
        self._queue: collections.deque[Event] = collections.deque()
        self._maxsize = maxsize
        # the queue's lock, taken bare on the publishing side (a Condition's own `with`
        # is Python code, ~1 us a put); the reader waits on a Condition over it
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    def put(self, event: Event) -> None:
        with self._lock:
            q = self._queue
            was_empty = not q
            if len(q) >= self._maxsize:
                self.last_dropped_seq = q.popleft().seq
                self.dropped += 1
            q.append(event)
            # a reader waits only on an empty queue, and drains it before it waits again:
            # telling it when the queue was empty is enough
            if was_empty:
                self._cond.notify()
        if self.notify is not None and was_empty:
            self.notify()

    def put_many(self, events: list[Event]) -> None:
        """put() for each of events, in order, under one take of the lock."""
        if not events:
            return
        with self._lock:
            q = self._queue
            was_empty = not q
            q.extend(events)
            over = len(q) - self._maxsize
            if over > 0:
                for _ in range(over):
                    self.last_dropped_seq = q.popleft().seq
                self.dropped += over
            if was_empty:
                self._cond.notify()
        if self.notify is not None and was_empty:
            self.notify()

    def get(self, timeout: float | None = None) -> Event | None:
        with self._cond:
            if not self._queue:
                self._cond.wait(timeout)
            ev = self._queue.popleft() if self._queue else None
        return ev if self.raw or ev is None else python_event(ev)

    def take(self, most: int, timeout: float | None = None) -> list[Event]:
        """drain(most), waiting up to timeout seconds for the first event."""
        with self._cond:
            if not self._queue:
                self._cond.wait(timeout)
        return self.drain(most)

    def drain(self, most: int) -> list[Event]:
        """Up to most events held now, oldest first (no wait)."""
        with self._lock:
            q = self._queue
            if len(q) <= most:
                out = list(q)
                q.clear()
            else:
                out = [q.popleft() for _ in range(most)]
        return out if self.raw else [python_event(e) for e in out]

    def __len__(self) -> int:
        return len(self._queue)


E = TypeVar("E", bound="Event")


class _NoPacked:
    """Stands for native.Packed where the compiled path is not built: nothing is one."""


# the compiled path's event type (native._native.Packed), which Subscription.get and drain
# turn into Python events for the subscribers that take those
PACKED: type = _NoPacked


def python_event(ev: Any) -> Event:
    """The Python event of what the bus holds (a compiled event's made now)."""
    return cast(Event, cast(Any, ev).event()) if type(ev) is PACKED else cast(Event, ev)


def set_packed(cls: type) -> None:
    global PACKED
    PACKED = cls


# the slot an event keeps its wire encoding in (api/convert.wire)
WIRE = "_wire"


def maker(cls: type[E], positional: tuple[str, ...] = ()) -> Callable[..., E]:
    """A function making a cls event from arguments, the fields named in positional first
    and in that order, the others by keyword (a field not passed takes its default);
    each field set through its slot: what the decoders call once per ring record. The
    frozen class's own __init__ sets each field through object.__setattr__ and checks
    the kind (2.0 us for a closed flow); this does neither (its callers pass kinds of the
    class). Its source is made here, from the class's fields, as dataclasses makes
    __init__."""
    env: dict[str, Any] = {"new": object.__new__, "C": cls}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(positional) - {n for n, f in fields.items() if f.init}
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)} to pass")
    params, keywords, body = list(positional), [], []
    for name, f in fields.items():
        env[f"set_{name}"] = getattr(cls, name).__set__
        if f.default is not dataclasses.MISSING:
            env[f"default_{name}"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{name}: maker takes no default_factory")
        body.append(f"    set_{name}(ev, {name if f.init else f'default_{name}'})")
        if f.init and name not in positional:
            has_default = f.default is not dataclasses.MISSING
            keywords.append(f"{name}=default_{name}" if has_default else name)
    signature = ", ".join([*params, "*", *keywords] if keywords else params)
    source = f"def make({signature}):\n    ev = new(C)\n" + "\n".join(body)
    exec(source + "\n    return ev\n", env)  # noqa: S102 - the source above, from its fields
    make: Callable[..., E] = env["make"]
    return make


def numbered(event: E, seq: int, ts_unix_nano: int) -> E:
    """A copy of event with its sequence number and wall time (for events that others
    may hold: published events are frozen)."""
    return dataclasses.replace(event, seq=seq, ts_unix_nano=ts_unix_nano)


class EventBus:
    """Numbers events (seq, strictly increasing per agent process, from 1), keeps a bounded
    history for resume, and publishes each to every subscriber whose filter accepts it, in
    order. instance names this numbering: made once per bus (one per agent process), so
    whoever holds its seqs (the reporter's collector) tells a restarted agent's seq 1 from
    the one before it."""

    def __init__(self, queue_size: int, history: int = 0, node: tuple[str, str] = ("", "")) -> None:
        self.queue_size = queue_size
        # the node's name and IP: what the compiled path writes into each event's wire
        # bytes (the streams and the reporter send the same node's)
        self.node = node
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()
        self.published: collections.Counter[str] = collections.Counter()
        self.seq = 0
        self.instance = uuid.uuid4().hex  # whose seqs these are (a restart: another)
        # maxlen 0 keeps nothing: no history without a flag to say so
        self.history: collections.deque[Event] = collections.deque(maxlen=history)
        self._dropped_gone: collections.Counter[str] = collections.Counter()
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call listener() after each subscribe and unsubscribe (from that thread)."""
        self._listeners.append(listener)

    def wants(self, kinds: frozenset[str]) -> bool:
        """Whether any subscriber now can accept an event of one of these kinds."""
        with self._lock:
            return any(not sub.kinds or sub.kinds & kinds for sub in self._subs)

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()

    def subscribe(
        self,
        name: str,
        accept: Callable[[Event], bool] | None = None,
        maxsize: int | None = None,
        notify: Callable[[], None] | None = None,
        raw: bool = False,
    ) -> Subscription:
        sub = Subscription(name, maxsize or self.queue_size, accept, notify, raw)
        with self._lock:
            self._subs.append(sub)
        self._changed()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)
                self._dropped_gone[sub.name] += sub.dropped
        self._changed()

    def publish(self, event: Event, owned: bool = False) -> Event:
        """Number the event (a copy: events are frozen) and hand it to every subscriber
        that accepts it; the numbered event. owned: the caller made the event for this
        call and no one else holds it (a decoder's), so it is numbered in place."""
        with self._lock:
            self.seq += 1
            ts = event.ts_unix_nano or time.time_ns()
            if owned:
                object.__setattr__(event, "seq", self.seq)
                object.__setattr__(event, "ts_unix_nano", ts)
            else:
                event = numbered(event, self.seq, ts)
            self.published[event.kind] += 1
            self.history.append(event)
            for sub in self._subs:
                if sub.accept is None or sub.accept(event):
                    sub.put(event)
        return event

    def publish_batch(self, make: Callable[[int, int], list[Any]]) -> list[Any]:
        """Publish the events make(seq0, ts_unix_nano) returns, already numbered from seq0
        on (consecutively) and stamped with that time: the compiled path's (native.flows,
        whose wire bytes carry both, so they are made under the bus's lock). Each goes to
        every subscriber whose filter accepts it, in order; the events."""
        with self._lock:
            events = make(self.seq + 1, time.time_ns())
            if not events:
                return events
            self.seq = events[-1].seq
            self.published.update(ev.kind for ev in events)
            self.history.extend(events)
            for sub in self._subs:
                accept = sub.accept
                if accept is None:
                    sub.put_many(events)
                elif sub.kinds_only:
                    kinds = sub.kinds
                    sub.put_many([e for e in events if e.kind in kinds] if kinds else events)
                elif isinstance(accept, EventFilter):  # fields through Packed.get
                    sub.put_many([e for e in events if accept(e)])
                else:  # a filter of the caller's own: it is given Python events
                    sub.put_many([e for e in events if accept(python_event(e))])
        return events

    def since(self, seq: int) -> tuple[list[Event], int]:
        """Events with seq >= the given one still held, and how many older ones are gone."""
        with self._lock:
            held = [e for e in self.history if e.seq >= seq]
            first = self.history[0].seq if self.history else self.seq + 1
        return held, max(0, first - seq)

    def dropped_by_subscriber(self) -> dict[str, int]:
        with self._lock:
            out = collections.Counter(self._dropped_gone)
            for sub in self._subs:
                out[sub.name] += sub.dropped
        return dict(out)

    def subscriptions(self) -> list[Subscription]:
        with self._lock:
            return list(self._subs)


class EventBusCollector(Collector):
    """Events published by kind, and events each subscriber lost to a full queue."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        pub = counter("lens_agent_events_published", "Events published by kind")
        for kind, n in sorted(self._bus.published.items()):
            pub.add({"kind": kind}, n)
        lost = counter(
            "lens_agent_subscriber_events_dropped",
            "Events a subscriber lost because its queue was full",
        )
        for name, n in sorted(self._bus.dropped_by_subscriber().items()):
            lost.add({"subscriber": name}, n)
        live = gauge("lens_agent_subscribers", "Subscribers attached to the event bus")
        counts = collections.Counter(s.name for s in self._bus.subscriptions())
        for name, n in sorted(counts.items()):
            live.add({"subscriber": name}, n)
        yield pub
        yield lost
        yield live
