"""Extended resources a pod asks for (GPUs), by Kubernetes' effective-request rule: what
the scheduler reserves, read the same way by the agent's allocation view and the
recorder's records."""

from __future__ import annotations

from typing import Any

from lens_ebpf.k8s.objects import ObjectError


def _count(value: Any, where: str) -> int:
    """An extended-resource quantity: a whole number ("2"), never fractional."""
    text = str(value).strip()
    if not text.isdigit():
        raise ObjectError(f"{where}: {value!r} is not a whole number of devices")
    return int(text)


def container_request(c: dict[str, Any], resource: str, where: str) -> int:
    """One container's request for an extended resource (its limit when it gives no request)."""
    res = c.get("resources") or {}
    # extended resources may give only limits; requests then default to them
    value = (res.get("requests") or {}).get(resource)
    if value is None:
        value = (res.get("limits") or {}).get(resource)
    return 0 if value is None else _count(value, f"{where} container {c.get('name', '?')}")


def effective_request(pod: dict[str, Any], resource: str) -> int:
    """What the scheduler reserves for a pod, by Kubernetes' effective-request rule.

    max(sum of app containers + sum of sidecars, the largest init container step),
    where an init step is that init container plus the sidecars (restartPolicy Always)
    started before it, and a sidecar step is all sidecars so far.
    """
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    where = f"pod {meta.get('namespace', '')}/{meta.get('name', '?')}"
    sidecars = 0
    init_peak = 0
    for c in spec.get("initContainers") or ():
        req = container_request(c, resource, where)
        if c.get("restartPolicy") == "Always":
            sidecars += req
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + req)
    app = sum(container_request(c, resource, where) for c in spec.get("containers") or ())
    return max(app + sidecars, init_peak)
