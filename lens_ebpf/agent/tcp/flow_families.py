"""The metric families tcp_flows' counters feed: the seed network families (bytes of a
flow by where it went) and the lens_tcp_* ones (per flow key and remote identity), and
how one flow key's counter increases land in them."""

from __future__ import annotations

from lens_ebpf.agent.metrics.cache import COUNTER, MetricCache
from lens_ebpf.agent.net import identity
from lens_ebpf.agent.net.identity import NO_IDENTITY

SEED_EGRESS = "primus_lens_network_tcp_flow_egress"
SEED_INGRESS = "primus_lens_network_tcp_flow_ingress"
SEED_K8S = "primus_lens_network_k8s_tcp_flow"
SEED_DNS = "primus_lens_network_flow_dns"
FLOW_LABELS = ("direction", "type", "raddr", "port")
# lens_ family -> (help, the flows-map field it counts)
LENS_FAMILIES: dict[str, tuple[str, str]] = {
    "lens_tcp_connections_opened_total": ("TCP connections established", "opened"),
    "lens_tcp_connections_closed_total": ("TCP connections closed", "closed"),
    "lens_tcp_failed_connects_total": (
        "Connection attempts that never established (refused, timed out, aborted)",
        "failed",
    ),
    "lens_tcp_sent_bytes_total": ("Bytes applications sent on TCP flows", "sent"),
    "lens_tcp_received_bytes_total": ("Bytes applications received on TCP flows", "recv"),
    "lens_tcp_retransmits_total": ("Retransmitted TCP segments", "retrans"),
}
RESETS = "lens_tcp_resets_total"


def register_families(cache: MetricCache) -> None:
    """The seed network families (docs/reference/metric-conventions.md), lens_tcp_* ones."""
    cache.register(
        SEED_EGRESS,
        COUNTER,
        "Bytes (both ways) of flows this node opened, by remote address and port",
        ("raddr", "rport", "direction", "type"),
    )
    cache.register(
        SEED_INGRESS,
        COUNTER,
        "Bytes (both ways) of flows accepted by a local listener",
        ("lport", "raddr", "direction", "type"),
    )
    cache.register(SEED_K8S, COUNTER, "Bytes of flows whose remote is a pod or service", ("type",))
    cache.register(SEED_DNS, COUNTER, "Bytes of flows to DNS servers", ())
    for name, (help_text, _) in LENS_FAMILIES.items():
        cache.register(name, COUNTER, help_text, (*FLOW_LABELS, *identity.REMOTE_LABELS))
    cache.register(
        RESETS,
        COUNTER,
        "TCP resets sent or received",
        (*FLOW_LABELS, "side", *identity.REMOTE_LABELS),
    )


def seed_series(labels: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """The seed family, and its labels, that a flow key's bytes (both ways) go to: by
    where the flow went, pods, services and dns by class only."""
    direction, cls, raddr, port = labels
    if cls in ("k8sPod", "k8sSvc"):
        return SEED_K8S, (cls,)
    if cls == "dns":
        return SEED_DNS, ()
    if direction == "egress":
        return SEED_EGRESS, (raddr, port, direction, cls)
    return SEED_INGRESS, (port, raddr, direction, cls)


def apply_deltas(
    cache: MetricCache, labels: tuple[str, ...], who: tuple[str, ...], d: dict[str, int]
) -> None:
    """Feed one flow key's counter increases into every family they belong to.

    labels and who come from enrichment (Enrichment.flow_key): the class refined by the
    cluster index when there is one (a pod IP is k8sPod whatever the policy says), and
    who the remote is, which the lens_ families carry.
    """
    for name, (_, field) in LENS_FAMILIES.items():
        if d[field]:
            cache.inc(name, (*labels, *who), d[field])
    if d["resets_sent"]:
        cache.inc(RESETS, (*labels, "sent", *who), d["resets_sent"])
    if d["resets_recv"]:
        cache.inc(RESETS, (*labels, "received", *who), d["resets_recv"])
    nbytes = d["sent"] + d["recv"]
    if nbytes:
        cache.inc(*seed_series(labels), nbytes)


def attribute(
    cache: MetricCache, key_labels: tuple[str, ...], labels: tuple[str, ...], who: tuple[str, ...]
) -> None:
    """Move what a flow key counted without an identity (its series labelled as decoded)
    to the series of the identity the index now gives it (attribution.Unattributed). The
    seed bytes move when they change family or class, out of a series of this key's own;
    those of pods, services and dns are by class only, many keys' bytes in one series
    that cannot give up one key's: they stay under the class they were counted in."""
    for name in LENS_FAMILIES:
        cache.move(name, (*key_labels, *NO_IDENTITY), name, (*labels, *who))
    for side in ("sent", "received"):
        cache.move(RESETS, (*key_labels, side, *NO_IDENTITY), RESETS, (*labels, side, *who))
    old, new = seed_series(key_labels), seed_series(labels)
    if old != new and old[0] in (SEED_EGRESS, SEED_INGRESS):
        cache.move(*old, *new)
