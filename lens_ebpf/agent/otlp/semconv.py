"""Who telemetry belongs to, as OpenTelemetry's semantic conventions name resources.

The node is one resource (`host.name`, `k8s.node.name`, `service.name` ...). A series or
an event that belongs to a pod is the pod's resource: the node's attributes and
`k8s.namespace.name`, `k8s.pod.name`, `k8s.pod.uid`, `k8s.container.name`, `container.id`,
and its owner as `k8s.<kind>.name` (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
CronJob); an owner of another kind (a training operator's) as `workload_kind` and
`workload`, our names. Pure: names in, attribute pairs out.
"""

from __future__ import annotations

from collections.abc import Mapping

SERVICE_NAME = "lens-ebpf-agent"

# our label or event field -> its resource attribute
OWNER_ATTRIBUTES = {
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "pod_uid": "k8s.pod.uid",
    "container": "k8s.container.name",
    "container_id": "container.id",
}
WORKLOAD_KINDS = {
    "Deployment": "k8s.deployment.name",
    "StatefulSet": "k8s.statefulset.name",
    "DaemonSet": "k8s.daemonset.name",
    "ReplicaSet": "k8s.replicaset.name",
    "Job": "k8s.job.name",
    "CronJob": "k8s.cronjob.name",
}
# what names a pod's resource, in the order its attributes are written
OWNER_FIELDS = (
    "namespace",
    "pod",
    "pod_uid",
    "container",
    "container_id",
    "workload_kind",
    "workload",
)

Owner = tuple[str, ...]  # values of OWNER_FIELDS; all empty: the node itself
NODE: Owner = ("",) * len(OWNER_FIELDS)


def node_attributes(
    node: str, version: str, cluster: str = "", extra: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """The node's resource: the service, the host and the Kubernetes node; extra
    (collectors.otlp.resource) adds to them or replaces them by key."""
    attrs = {
        "service.name": SERVICE_NAME,
        "service.version": version,
        "host.name": node,
        "k8s.node.name": node,
    }
    if cluster:
        attrs["k8s.cluster.name"] = cluster
    attrs.update(extra or {})
    return [(k, v) for k, v in attrs.items() if v]


def owner_attributes(owner: Owner) -> list[tuple[str, str]]:
    """A pod's (or container's) attributes beyond the node's, from OWNER_FIELDS' values."""
    got = dict(zip(OWNER_FIELDS, owner, strict=True))
    out = [(OWNER_ATTRIBUTES[f], got[f]) for f in OWNER_FIELDS[:5] if got[f]]
    kind, name = got["workload_kind"], got["workload"]
    if kind and name:
        if kind in WORKLOAD_KINDS:
            out.append((WORKLOAD_KINDS[kind], name))
        else:
            out += [("workload_kind", kind), ("workload", name)]
    return out


def is_owner(owner: Owner) -> bool:
    """Whether these values name a pod (a namespace and a pod) rather than the node."""
    return bool(owner[0] and owner[1])
