"""Who is at the other end of a flow: the policy class refined by the live cluster index.

A remote address that the index knows as a pod is k8sPod, with its namespace, pod and
owner workload; one that is a service cluster IP is k8sSvc, with the service. Others
keep the class the kernel's policy trie gave them. Pure: the lookup is passed in. Addresses
come as tcp/decode.py spells them (an IPv4 peer of a dual-stack socket as a.b.c.d), which
is how the index keys them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Appended to every lens_tcp_* family's labels (not to the seed families).
REMOTE_LABELS = (
    "remote_namespace",
    "remote_pod",
    "remote_workload_kind",
    "remote_workload",
    "remote_service",
)
NO_IDENTITY = ("",) * len(REMOTE_LABELS)
# ip text -> an identity with kind, namespace, name, workload_kind, workload (pods/index.py)
Lookup = Callable[[str], Any]


def remote(lookup: Lookup | None, cls: str, address: str) -> tuple[str, tuple[str, ...]]:
    """(class, identity labels) of a remote address."""
    if lookup is None:
        return cls, NO_IDENTITY
    ident = lookup(address)
    if ident is None:
        return cls, NO_IDENTITY
    if ident.kind == "pod":
        return "k8sPod", (ident.namespace, ident.name, ident.workload_kind, ident.workload, "")
    return "k8sSvc", (ident.namespace, "", "", "", ident.name)


def refine(
    lookup: Lookup | None, key_labels: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A map key's (direction, class, raddr, ...) with the class refined, and the remote's
    identity labels: what every lens_tcp_* family and the RTT histogram are labelled by."""
    direction, cls, raddr, *rest = key_labels
    cls, who = remote(lookup, cls, raddr)
    return (direction, cls, raddr, *rest), who


def flow_fields(lookup: Lookup | None, cls: str, raddr: str, laddr: str) -> dict[str, Any]:
    """A closed flow's fields (events.FlowClosed's names) that the index fills: the class
    refined and who holds the remote end; namespace, pod and workload of the local end
    when a pod holds it, so Subscribe's namespace/pod filters select a pod's flows."""
    refined, r = remote(lookup, cls, raddr)
    out: dict[str, Any] = {"cls": refined, **dict(zip(REMOTE_LABELS, r, strict=True))}
    local = lookup(laddr) if lookup is not None else None
    if local is not None and local.kind == "pod":
        out.update(
            namespace=local.namespace,
            pod=local.name,
            workload_kind=local.workload_kind,
            workload=local.workload,
        )
    return out
