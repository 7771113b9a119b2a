"""Pure decoders shared by the metric path and the event path, so labels and fields agree."""

from __future__ import annotations

import functools
import socket
import time
from typing import Any

from lens_ebpf.bpf.layouts import FlowEvent, record_struct
from lens_ebpf.events import FlowClosed
from lens_ebpf.net.policy import CLASS_NAMES

AF_INET, AF_INET6 = 2, 10
DIRECTIONS = ("egress", "ingress")
# Why a flow ended; close_not_seen: finished late, the kernel skipped this program's
# run for the CLOSE transition (see lens_agent_bpf_program_missed_total).
CLOSE_REASONS = (
    "normal",
    "reset_received",
    "reset_sent",
    "failed_connect",
    "aborted",
    "close_not_seen",
)
OTHER = "other"


@functools.lru_cache(maxsize=8192)
def format_addr(family: int, addr16: bytes) -> str:
    """An address as stored by the programs (IPv4 as ::ffff:a.b.c.d) in its usual text.

    inet_ntop rather than ipaddress, and remembered: this runs twice per ring-buffer
    record, mostly for addresses it has seen.
    """
    if family == AF_INET:
        return socket.inet_ntop(socket.AF_INET, bytes(addr16[12:16]))
    return socket.inet_ntop(socket.AF_INET6, bytes(addr16))


def direction_name(direction: int) -> str:
    return DIRECTIONS[direction] if direction < len(DIRECTIONS) else str(direction)


def class_name(cls: int) -> str:
    return CLASS_NAMES.get(cls, "externalHosts")


def reason_name(reason: int) -> str:
    return CLOSE_REASONS[reason] if reason < len(CLOSE_REASONS) else str(reason)


def remote_labels(key: Any) -> tuple[str, str, str]:
    """(direction, class, remote address) of a flows- or rtt-map key."""
    direction, cls = direction_name(key.direction), class_name(key.cls)
    if key.overflow:
        return direction, cls, OTHER
    return direction, cls, format_addr(key.family, bytes(key.raddr))


def flow_key_labels(key: Any) -> tuple[str, str, str, str]:
    """(direction, class, remote address, service port) of a flows-map key."""
    return (*remote_labels(key), OTHER if key.overflow else str(key.port))


_FLOW_EVENT = record_struct(FlowEvent)


def flow_record(buf: bytes) -> FlowClosed:
    """A closed-flow ring-buffer record (struct flow_event's bytes) as an event."""
    (ts, duration, sent, recv, cgroup_id, laddr, raddr, pid, retrans, lport, rport, family,
     direction, cls, reason, comm) = _FLOW_EVENT.unpack_from(buf)  # fmt: skip
    return FlowClosed(
        ts_ns=ts,
        pid=pid,
        comm=comm.split(b"\0", 1)[0].decode(errors="replace"),
        cgroup_id=cgroup_id,
        family="ipv4" if family == AF_INET else "ipv6",
        laddr=format_addr(family, laddr),
        lport=lport,
        raddr=format_addr(family, raddr),
        rport=rport,
        direction=direction_name(direction),
        cls=class_name(cls),
        sent_bytes=sent,
        received_bytes=recv,
        retransmits=retrans,
        duration_ns=duration,
        reason=reason_name(reason),
    )


def sock_info_event(si: Any, keyed: bool) -> FlowClosed:
    """A socket the agent finished itself (its CLOSE went unseen) as an event."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    reason = "close_not_seen" if keyed else "failed_connect"
    return _event(si, si.key.raddr, si.key.cls, reason, now, now - si.start_ns)


def _event(rec: Any, raddr: Any, cls: int, reason: str, ts: int, duration: int) -> FlowClosed:
    return FlowClosed(
        ts_ns=ts,
        pid=rec.pid,
        comm=rec.comm.decode(errors="replace"),
        cgroup_id=rec.cgroup_id,
        family="ipv4" if rec.family == AF_INET else "ipv6",
        laddr=format_addr(rec.family, bytes(rec.laddr)),
        lport=rec.lport,
        raddr=format_addr(rec.family, bytes(raddr)),
        rport=rec.rport,
        direction=direction_name(rec.direction),
        cls=class_name(cls),
        sent_bytes=rec.sent,
        received_bytes=rec.recv,
        retransmits=rec.retrans,
        duration_ns=duration,
        reason=reason,
    )
