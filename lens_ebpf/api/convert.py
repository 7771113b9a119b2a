"""Agent events (dicts) to lens.v1 protobuf messages, and the Subscribe filters."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lens_ebpf.api.gen import lens_pb2 as pb

Event = dict[str, Any]
# event kind -> Event oneof field
KINDS = {
    "flow_closed": "flow_closed",
    "abnormal_flow": "abnormal_flow",
    "process_exec": "process_exec",
    "process_exit": "process_exit",
    "oom_kill": "oom_kill",
    "container_start": "container_start",
    "container_exit": "container_exit",
    "device_change": "device_change",
    "gap": "gap",
}
FLOW_FIELDS = (
    "pid",
    "comm",
    "cgroup_id",
    "laddr",
    "lport",
    "raddr",
    "rport",
    "direction",
    "class",
    "sent_bytes",
    "received_bytes",
    "retransmits",
    "duration_ns",
    "reason",
    "remote_namespace",
    "remote_pod",
    "remote_workload_kind",
    "remote_workload",
    "remote_service",
    "namespace",
    "pod",
    "workload_kind",
    "workload",
)


def _identity(ev: Event) -> pb.Identity:
    return pb.Identity(container_id=ev.get("container_id", ""), container=ev.get("container", ""),
                       pod=ev.get("pod", ""), namespace=ev.get("namespace", ""),
                       pod_uid=ev.get("pod_uid", ""), workload_kind=ev.get("workload_kind", ""),
                       workload=ev.get("workload", ""))  # fmt: skip


def to_pb(ev: Event, node_name: str, node_ip: str) -> pb.Event:
    out = pb.Event(seq=ev.get("seq", 0), ts_unix_nano=ev.get("ts_unix_nano", 0),
                   node_name=node_name, node_ip=node_ip)  # fmt: skip
    kind = ev["kind"]
    if kind in ("flow_closed", "abnormal_flow"):
        getattr(out, kind).CopyFrom(pb.FlowClosed(**{f: ev[f] for f in FLOW_FIELDS if f in ev}))
    elif kind == "process_exec":
        out.process_exec.CopyFrom(pb.ProcessExec(
            pid=ev["pid"], ppid=ev["ppid"], comm=ev["comm"], filename=ev.get("filename", ""),
            cgroup_id=ev.get("cgroup_id", 0), identity=_identity(ev)))  # fmt: skip
    elif kind == "process_exit":
        out.process_exit.CopyFrom(pb.ProcessExit(
            pid=ev["pid"], ppid=ev["ppid"], comm=ev["comm"], exit_code=ev["exit_code"],
            signal=ev["signal"], oom_killed=ev["oom_killed"], identity=_identity(ev)))  # fmt: skip
    elif kind == "oom_kill":
        out.oom_kill.CopyFrom(pb.OomKill(pid=ev["pid"], comm=ev["comm"], identity=_identity(ev)))
    elif kind in ("container_start", "container_exit"):
        getattr(out, kind).CopyFrom(
            pb.ContainerChange(identity=_identity(ev), devices=ev.get("devices", []))
        )
    elif kind == "device_change":
        out.device_change.CopyFrom(pb.DeviceChange(vendor=ev["vendor"], bdf=ev["bdf"],
                                                   change=ev["change"]))  # fmt: skip
    elif kind == "gap":
        out.gap.CopyFrom(pb.Gap(lost=ev["lost"], reason=ev["reason"]))
    return out


def validate(req: pb.SubscribeRequest) -> str | None:
    """Why a SubscribeRequest is malformed, or None."""
    unknown = [k for k in req.kinds if k not in KINDS]
    if unknown:
        return f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}"
    if req.from_seq < 0:
        return f"from_seq must be 0 (live) or a sequence number, got {req.from_seq}"
    return None


def matcher(req: pb.SubscribeRequest) -> Callable[[Event], bool]:
    kinds = set(req.kinds)

    def accept(ev: Event) -> bool:
        if kinds and ev["kind"] not in kinds:
            return False
        if req.namespace and ev.get("namespace") != req.namespace:
            return False
        if req.pod and ev.get("pod") != req.pod:
            return False
        return not (
            req.container
            and not (
                ev.get("container") == req.container
                or str(ev.get("container_id", "")).startswith(req.container)
            )
        )

    return accept
