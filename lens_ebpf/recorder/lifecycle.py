"""Pure readers of the objects the recorder follows: a pod's GPUs, what of it is worth a
snapshot, what changed between two snapshots, a workload's GPU request and status.

API objects (JSON dicts) in, plain values out; no I/O.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from lens_ebpf.k8s.objects import ObjectError, controller_ref
from lens_ebpf.k8s.resources import effective_request

FINALIZER = "lens-ebpf.io/recorder"
TERMINAL_PHASES = ("Succeeded", "Failed")
# condition types that end a workload when True (Job, and the training operators' jobs)
ENDING_CONDITIONS = ("Complete", "Succeeded", "Failed")
REDACTED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
# metadata fields that change without the pod changing
NOISE_METADATA = ("resourceVersion", "managedFields", "generation")


def parse_time(value: Any) -> datetime | None:
    """An API timestamp (RFC 3339, "2026-11-23T07:00:00Z") as an aware datetime."""
    if not isinstance(value, str) or not value:
        return None
    try:
        out = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return out if out.tzinfo else out.replace(tzinfo=UTC)


def meta(obj: Any) -> dict[str, Any]:
    """metadata with the name and uid the recorder keys everything by."""
    m = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(m, dict) or not m.get("name") or not m.get("uid"):
        raise ObjectError("object without metadata.name and metadata.uid")
    return m


def gpu_requests(pod: dict[str, Any], resources: list[str]) -> dict[str, int]:
    """GPUs the pod requests per configured resource (only those it requests)."""
    meta(pod)
    if not isinstance(pod.get("spec"), dict):
        raise ObjectError(f"pod {pod['metadata']['name']}: no spec")
    out = {r: effective_request(pod, r) for r in resources}
    return {r: n for r, n in out.items() if n}


def _redact_containers(spec: dict[str, Any]) -> None:
    for key in ("containers", "initContainers", "ephemeralContainers"):
        for c in spec.get(key) or ():
            if not isinstance(c, dict):
                continue
            if "env" in c:  # names stay (what was set), values and references go
                c["env"] = [
                    {"name": e.get("name", "")} for e in c["env"] or () if isinstance(e, dict)
                ]
            c.pop("envFrom", None)


def snapshot(pod: dict[str, Any]) -> dict[str, Any]:
    """metadata, spec and status as worth keeping: env values and secrets removed."""
    m = copy.deepcopy(meta(pod))
    for key in NOISE_METADATA:
        m.pop(key, None)
    annotations = m.get("annotations")
    if isinstance(annotations, dict):
        for key in REDACTED_ANNOTATIONS:
            annotations.pop(key, None)
    spec = copy.deepcopy(pod.get("spec") or {})
    _redact_containers(spec)
    for vol in spec.get("volumes") or ():
        if isinstance(vol, dict) and isinstance(vol.get("secret"), dict):
            vol["secret"] = {"secretName": vol["secret"].get("secretName", "")}
    status = copy.deepcopy(pod.get("status") or {})
    for cond in status.get("conditions") or ():
        if isinstance(cond, dict):
            cond.pop("lastProbeTime", None)
    return {"metadata": m, "spec": spec, "status": status}


@dataclass(frozen=True)
class Change:
    type: str  # created, phase, condition, restart, deleted
    subject: str = ""  # the condition type or container name
    old: str = ""
    new: str = ""


def _conditions(status: dict[str, Any]) -> dict[str, str]:
    return {
        str(c.get("type")): str(c.get("status", ""))
        for c in status.get("conditions") or ()
        if isinstance(c, dict) and c.get("type")
    }


def _restarts(status: dict[str, Any]) -> dict[str, int]:
    out = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for c in status.get(key) or ():
            if isinstance(c, dict) and c.get("name"):
                out[str(c["name"])] = int(c.get("restartCount") or 0)
    return out


def pod_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> list[Change]:
    """What changed from one snapshot to the next: phase transitions, condition changes,
    restart counts. old None: the pod is new to the recorder."""
    before = (old or {}).get("status") or {}
    after = new.get("status") or {}
    out = [] if old is not None else [Change("created", "", "", str(after.get("phase", "")))]
    if old is not None and before.get("phase", "") != after.get("phase", ""):
        out.append(Change("phase", "", str(before.get("phase", "")), str(after.get("phase", ""))))
    was, now = _conditions(before), _conditions(after)
    for kind in sorted(set(was) | set(now)):
        if was.get(kind, "") != now.get(kind, ""):
            out.append(Change("condition", kind, was.get(kind, ""), now.get(kind, "")))
    r_was, r_now = _restarts(before), _restarts(after)
    for name in sorted(r_now):
        if r_now[name] > r_was.get(name, 0):
            out.append(Change("restart", name, str(r_was.get(name, 0)), str(r_now[name])))
    return out


def _templates(node: Any, multiplier: int, out: list[tuple[dict[str, Any], int]]) -> None:
    """Pod templates anywhere under a workload's spec, with how many pods each makes."""
    if isinstance(node, list):
        for item in node:
            _templates(item, multiplier, out)
        return
    if not isinstance(node, dict):
        return
    count = node.get("parallelism", node.get("replicas", 1))
    count = count if isinstance(count, int) and count >= 0 else 1
    tmpl = node.get("template")
    if (
        isinstance(tmpl, dict)
        and isinstance(tmpl.get("spec"), dict)
        and "containers" in tmpl["spec"]
    ):
        out.append((tmpl, multiplier * count))
    for key, value in node.items():
        if key != "template":
            _templates(value, multiplier * count if key == "jobTemplate" else multiplier, out)


def workload_request(obj: dict[str, Any], resources: list[str]) -> dict[str, int]:
    """GPUs a workload asks for: each pod template's effective request times the pods it
    makes (replicas, parallelism), summed over templates (a PyTorchJob's Master and Worker).
    A CronJob counts one run."""
    found: list[tuple[dict[str, Any], int]] = []
    _templates(obj.get("spec") or {}, 1, found)
    out: dict[str, int] = {}
    for tmpl, pods in found:
        for r in resources:
            n = effective_request(tmpl, r) * pods
            if n:
                out[r] = out.get(r, 0) + n
    return out


def workload_status(obj: dict[str, Any]) -> tuple[str, datetime | None]:
    """(status, when it ended or None while it runs)."""
    raw = obj.get("status")
    st: dict[str, Any] = raw if isinstance(raw, dict) else {}
    conds = [c for c in st.get("conditions") or () if isinstance(c, dict)]
    for c in conds:
        if c.get("status") == "True" and c.get("type") in ENDING_CONDITIONS:
            when = parse_time(c.get("lastTransitionTime")) or parse_time(st.get("completionTime"))
            return str(c["type"]), when or datetime.now(UTC)
    if "replicas" in st or "readyReplicas" in st or "currentNumberScheduled" in st:
        ready = st.get("readyReplicas", st.get("numberReady", 0)) or 0
        return ("Running" if ready else "Pending"), None
    if "active" in st and obj.get("kind") == "CronJob":
        return ("Active" if st.get("active") else "Scheduled"), None
    true = [str(c.get("type")) for c in conds if c.get("status") == "True" and c.get("type")]
    if true:
        return true[-1], None
    if st.get("active"):
        return "Running", None
    return "Pending", None


def owner_ref(obj: dict[str, Any]) -> dict[str, str] | None:
    """The controlling owner reference (apiVersion, kind, name, uid), if it names its
    apiVersion (without one it cannot be followed)."""
    ref = controller_ref({"metadata": meta(obj)})
    if ref is None or not ref.get("apiVersion"):
        return None
    return {k: str(ref.get(k, "")) for k in ("apiVersion", "kind", "name", "uid")}
