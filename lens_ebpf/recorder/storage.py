"""Storage: a scan every `recorder.storage.scan_seconds` of the StorageClasses, their
provisioners (CSI drivers from CSIDriver objects), PersistentVolumes and claims with
their state, and the claims' usage from the agents' volume metrics through Prometheus
(lens_pod_volume_*: a claim mounted by several pods on several nodes counts once); the
routes storage/overview and storage/volumes answer from the newest scan.

A backend (a StorageClass) is unhealthy when a claim of it stays Pending longer than
`storage.pending_seconds`, a volume of it is Failed, or a claim of it (or a pod mounting
one) had a Warning event ProvisioningFailed, FailedMount or FailedAttachVolume in the scan
window (one scan interval, or back to the scan before when it was longer ago); the
answer names each reason.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import counter, gauge
from lens_ebpf.k8s.quantity import whole
from lens_ebpf.k8s.reflector import call_raw
from lens_ebpf.recorder import prom
from lens_ebpf.recorder.config import StorageConfig
from lens_ebpf.recorder.errors import Unavailable
from lens_ebpf.recorder.lifecycle import parse_time

log = logging.getLogger(__name__)
WARNINGS = ("ProvisioningFailed", "FailedMount", "FailedAttachVolume")
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
NAMED = 5  # objects a reason names before it says "and N more"


@dataclass
class Claim:
    namespace: str
    name: str
    storage_class: str
    phase: str
    volume: str
    access_modes: list[str]
    requested: int
    capacity: int
    created: datetime | None
    used: float | None = None
    available: float | None = None
    pods: list[str] = field(default_factory=list)  # namespace/pod
    nodes: list[str] = field(default_factory=list)


@dataclass
class Backend:
    storage_class: str
    provisioner: str = ""
    csi_driver: str = ""  # the CSIDriver object serving its provisioner ("": none)
    default: bool = False
    pvs: int = 0
    capacity: int = 0  # its PersistentVolumes' capacity
    reasons: list[str] = field(default_factory=list)


@dataclass
class Scan:
    at: datetime
    backends: dict[str, Backend]
    claims: list[Claim]
    incomplete: list[str]


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:NAMED])
    return shown + (f" and {len(items) - NAMED} more" if len(items) > NAMED else "")


class StorageScan(Collector):
    def __init__(
        self,
        api_client: Any,
        timeout: float,
        metrics: prom.Prom,
        cfg: StorageConfig,
        clock: Callable[[], datetime],
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.storage = client.StorageV1Api(api_client)
        self.timeout, self.metrics, self.cfg, self.clock = timeout, metrics, cfg, clock
        self.last: Scan | None = None
        self.runs: dict[str, int] = {"ok": 0, "error": 0}
        self._lock = threading.Lock()

    def _list(self, fn: Callable[..., Any]) -> list[dict[str, Any]]:
        return [
            o for o in call_raw(fn, timeout=self.timeout).get("items") or () if isinstance(o, dict)
        ]

    def scan(self, now: datetime) -> Scan:
        backends: dict[str, Backend] = {}
        for sc in self._list(self.storage.list_storage_class):
            m = sc.get("metadata") or {}
            name = str(m.get("name", ""))
            backends[name] = Backend(
                name,
                str(sc.get("provisioner", "")),
                default=(m.get("annotations") or {}).get(DEFAULT_CLASS) == "true",
            )
        drivers = {
            str((d.get("metadata") or {}).get("name", ""))
            for d in self._list(self.storage.list_csi_driver)
        }
        for b in backends.values():
            b.csi_driver = b.provisioner if b.provisioner in drivers else ""
        failed: dict[str, list[str]] = {}
        for pv in self._list(self.core.list_persistent_volume):
            spec, st = pv.get("spec") or {}, pv.get("status") or {}
            b = backends.setdefault(
                str(spec.get("storageClassName") or ""),
                Backend(str(spec.get("storageClassName") or "")),
            )
            b.pvs += 1
            b.capacity += whole((spec.get("capacity") or {}).get("storage"))
            if st.get("phase") == "Failed":
                failed.setdefault(b.storage_class, []).append(
                    str((pv.get("metadata") or {}).get("name", ""))
                )
        claims = []
        for pvc in self._list(self.core.list_persistent_volume_claim_for_all_namespaces):
            m, spec, st = pvc.get("metadata") or {}, pvc.get("spec") or {}, pvc.get("status") or {}
            cls = str(spec.get("storageClassName") or "")
            claims.append(
                Claim(
                    str(m.get("namespace", "")),
                    str(m.get("name", "")),
                    cls,
                    str(st.get("phase", "")),
                    str(spec.get("volumeName") or ""),
                    list(spec.get("accessModes") or []),
                    whole(((spec.get("resources") or {}).get("requests") or {}).get("storage")),
                    whole((st.get("capacity") or {}).get("storage")),
                    parse_time(m.get("creationTimestamp")),
                )
            )
            backends.setdefault(cls, Backend(cls))
        by_claim = {(c.namespace, c.name): c for c in claims}
        pending = timedelta(seconds=self.cfg.pending_seconds)
        stuck: dict[str, list[str]] = {}
        for c in claims:
            if c.phase == "Pending" and c.created is not None and now - c.created > pending:
                stuck.setdefault(c.storage_class, []).append(f"{c.namespace}/{c.name}")
        for cls, names in stuck.items():
            wait = f"{self.cfg.pending_seconds:g} s"
            backends[cls].reasons.append(
                f"{len(names)} claims Pending longer than {wait}: " f"{_names(names)}"
            )
        for cls, names in failed.items():
            backends[cls].reasons.append(f"{len(names)} volumes Failed: {_names(names)}")
        # the scan window: at least one scan interval, back to the scan before when that
        # was longer ago (a failed scan, a restart: nothing between falls out)
        since = now - timedelta(seconds=self.cfg.scan_seconds)
        if self.last is not None:
            since = min(since, self.last.at)
        for cls, text in self._warnings(by_claim, since, now):
            backends.setdefault(cls, Backend(cls)).reasons.append(text)
        incomplete = []
        try:
            self._usage(by_claim, now)
        except prom.PromError as exc:
            incomplete.append(str(exc))
        return Scan(now, backends, sorted(claims, key=lambda c: (c.namespace, c.name)), incomplete)

    def _warnings(
        self, claims: dict[tuple[str, str], Claim], since: datetime, now: datetime
    ) -> Iterator[tuple[str, str]]:
        """(class, reason) for each storage Warning since the last scan."""
        pods: dict[tuple[str, str], list[str]] = {}  # a pod's claims, read once a scan
        for ev in self._list(self.core.list_event_for_all_namespaces):
            if ev.get("type") != "Warning" or ev.get("reason") not in WARNINGS:
                continue
            at = parse_time(
                ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp")
            )
            if at is None or not since <= at <= now:
                continue
            obj = ev.get("involvedObject") or {}
            ns, name, kind = (
                str(obj.get("namespace", "")),
                str(obj.get("name", "")),
                obj.get("kind"),
            )
            if kind == "PersistentVolumeClaim":
                names = [name]
            elif kind == "Pod":
                if (ns, name) not in pods:
                    try:
                        spec = (
                            call_raw(
                                self.core.read_namespaced_pod, name, ns, timeout=self.timeout
                            ).get("spec")
                            or {}
                        )
                    except Exception:  # gone, or not ours to read: its claims unknown
                        spec = {}
                    pods[(ns, name)] = [
                        str((v.get("persistentVolumeClaim") or {}).get("claimName", ""))
                        for v in spec.get("volumes") or ()
                        if v.get("persistentVolumeClaim")
                    ]
                names = pods[(ns, name)]
            else:
                continue
            for claim in names:
                c = claims.get((ns, claim))
                if c is not None:
                    yield (
                        c.storage_class,
                        (
                            f"{ev['reason']} on {kind} {ns}/{name}: "
                            f"{str(ev.get('message', ''))[:200]}"
                        ),
                    )

    def _usage(self, claims: dict[tuple[str, str], Claim], now: datetime) -> None:
        """Each claim's used and available bytes (the most any pod's kubelet measured),
        and the pods and nodes mounting it, from the agents' lens_pod_volume_*."""
        if not self.metrics.url:
            raise prom.PromError("recorder.prometheus.url is not set: no usage figures")
        for expr, attr in ((prom.VOLUME_USED, "used"), (prom.VOLUME_AVAILABLE, "available")):
            for lbl, v in self.metrics.instant(expr, now):
                c = claims.get((lbl.get("namespace", ""), lbl.get("persistentvolumeclaim", "")))
                if c is not None:
                    setattr(c, attr, v)
        for lbl, _ in self.metrics.instant(prom.VOLUME_MOUNTS, now):
            c = claims.get((lbl.get("namespace", ""), lbl.get("persistentvolumeclaim", "")))
            if c is not None:
                c.pods = sorted({*c.pods, f"{lbl.get('namespace', '')}/{lbl.get('pod', '')}"})
                c.nodes = sorted({*c.nodes, lbl.get("node", "")} - {""})

    def newest(self) -> Scan:
        """The newest scan (one now, when there is none yet); 503 while the API cannot be
        listed."""
        with self._lock:
            last = self.last
        if last is None:
            last = self.run_once(self.clock())
        if last is None:
            raise Unavailable("storage: the Kubernetes API could not be listed")
        return last

    def run_once(self, now: datetime) -> Scan | None:
        try:
            got = self.scan(now)
        except Exception as exc:  # the API down or refusing (RBAC): said, counted, kept
            self.runs["error"] += 1
            log.warning("recorder: storage scan: %s", exc)
            return None
        with self._lock:
            self.last = got
        self.runs["ok"] += 1
        return got

    # -- routes ----------------------------------------------------------------------
    @staticmethod
    def _measured(s: Scan) -> bool:
        """Whether the scan has its claims' usage from Prometheus; where not, the figures
        from it are None and meta.message says why (missing_figures)."""
        for why in s.incomplete:
            prom.missed(
                f"storage usage (scan at {s.at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}): " f"{why}"
            )
        return not s.incomplete

    def overview(self) -> dict[str, Any]:
        """storage/overview: per backend its class, provisioner, volumes, capacity requested
        and provisioned, used, the pods using it, and whether it is healthy (and why not)."""
        s = self.newest()
        measured = self._measured(s) if s.claims else True
        out = []
        for cls, b in sorted(s.backends.items()):
            mine = [c for c in s.claims if c.storage_class == cls]
            used = [c.used for c in mine if c.used is not None]
            out.append(
                {
                    "storage_class": cls,
                    "provisioner": b.provisioner,
                    "csi_driver": b.csi_driver,
                    "default": b.default,
                    "healthy": not b.reasons,
                    "reasons": b.reasons,
                    "pvs": b.pvs,
                    "pvcs": len(mine),
                    "bound": sum(1 for c in mine if c.phase == "Bound"),
                    "pending": sum(1 for c in mine if c.phase == "Pending"),
                    "capacity_requested_bytes": sum(c.requested for c in mine),
                    "capacity_bytes": b.capacity,
                    "used_bytes": sum(used) if used and measured else None,
                    "pods": len({p for c in mine for p in c.pods})
                    if measured or not mine
                    else None,
                }
            )
        return {"scanned_at": int(s.at.timestamp()), "backends": out, "incomplete": s.incomplete}

    def volumes(self, num: int, size: int) -> dict[str, Any]:
        """storage/volumes: one page of the claims, each with its capacity, usage, and the
        pods and nodes mounting it."""
        s = self.newest()
        shown = s.claims[(num - 1) * size : num * size]
        measured = self._measured(s) if shown else True
        rows = [
            {
                "namespace": c.namespace,
                "name": c.name,
                "storage_class": c.storage_class,
                "phase": c.phase,
                "volume": c.volume,
                "access_modes": c.access_modes,
                "requested_bytes": c.requested,
                "capacity_bytes": c.capacity,
                "used_bytes": c.used if measured else None,
                "available_bytes": c.available if measured else None,
                "pods": c.pods if measured else None,
                "nodes": c.nodes if measured else None,
            }
            for c in shown
        ]
        return {"data": rows, "total": len(s.claims), "scanned_at": int(s.at.timestamp())}

    def totals(self) -> dict[str, Any]:
        """clusters/overview's storage fields from the newest scan (none yet, or the API
        not listable: 0): the volumes' capacity, what the claims use, percent (used and
        percent 0 where the scan could not measure its claims' usage, the original's
        float64; meta.message says why)."""
        with self._lock:
            last = self.last
        if last is None:
            return {}
        total = float(sum(b.capacity for b in last.backends.values()))
        if last.claims and not self._measured(last):
            return {"total_space": total, "used_space": 0.0, "usage_percentage": 0.0}
        used = float(sum(c.used for c in last.claims if c.used is not None))
        return {
            "total_space": total,
            "used_space": used,
            "usage_percentage": 100 * used / total if total else 0.0,
        }

    # -- metrics ---------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            last = self.last
        yield counter(
            "lens_recorder_storage_scans", "Storage scans, by result", self.runs, "result"
        )
        healthy = gauge(
            "lens_recorder_storage_backend_healthy",
            "1 while a storage backend " "(a StorageClass) has no reason to be unhealthy",
        )
        for cls, b in sorted((last.backends if last else {}).items()):
            healthy.add({"storage_class": cls}, 0 if b.reasons else 1)
        yield healthy
