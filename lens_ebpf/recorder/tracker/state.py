"""The tracker's records and the state its parts share: what it knows of each pod and
workload, the counters it keeps, and what a malformed object raises."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lens_ebpf.k8s.dynamic import DynamicApi, Kind
from lens_ebpf.k8s.objects import ObjectError
from lens_ebpf.k8s.reflector import Reflector
from lens_ebpf.recorder.store.writer import Writer

log = logging.getLogger("lens_ebpf.recorder.tracker")

MAX_OWNER_HOPS = 5
# what reading a malformed object raises (a missing field, a wrong type, a bad quantity)
BAD_OBJECT = (ObjectError, TypeError, AttributeError, ValueError)
MODEL_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "amd.com/gpu.family")


def now_utc() -> datetime:
    return datetime.now(UTC)


@dataclass
class Workload:
    kind: Kind
    kind_name: str
    namespace: str
    name: str
    uid: str
    parent: dict[str, str] | None  # the controlling owner reference
    row: dict[str, Any] = field(default_factory=dict)
    finalizing: bool = False  # its final state is written; the finalizer comes off


@dataclass
class PodState:
    row: dict[str, Any]
    snap: dict[str, Any]
    refs: tuple[str, ...] = ()  # workload uids referenced, bottom to top
    resolved: bool = True  # False: an owner lookup failed; tried again at the next change


@dataclass(frozen=True)
class TrackedPod:
    uid: str
    namespace: str
    name: str
    node: str
    running: bool
    workload_uid: str  # the top owner ("" for a pod no workload owns)
    workload_kind: str
    workload_name: str


class UnresolvedError(Exception):
    """An owner the API could not tell about just now (not a 404)."""


class TrackerState:
    """What the tracker's parts (pods, owners, finalizers) share; WorkloadTracker sets it."""

    api: DynamicApi
    cluster: str  # every row it writes and reads is this cluster's
    writer: Writer
    resources: list[str]
    finalizers: bool
    opts: dict[str, Any]
    clock: Callable[[], datetime]
    _lock: threading.RLock
    pods: dict[str, PodState]
    names: dict[tuple[str, str], str]  # (namespace, name) -> uid of pods
    workloads: dict[str, Workload]
    kinds: dict[Kind, tuple[Reflector, threading.Event, threading.Thread]]
    malformed: dict[str, int]
    lookups: dict[str, int]
    finalizer_ops: dict[tuple[str, str], int]
    watchers_collected: int
    _fin: queue.Queue[tuple[str, str, Kind, str, str]]
    _stop: threading.Event

    def _malformed(self, resource: str, what: str, exc: Exception) -> None:
        self.malformed[resource] += 1
        log.warning("recorder: %s: %s", what, exc)
