"""Pure decoders shared by the metric path and the event path, so labels and fields agree."""

from __future__ import annotations

import dataclasses
import functools
import socket
import time
from types import ModuleType
from typing import Any

from lens_ebpf.agent import native
from lens_ebpf.agent.bpf.layouts import FlowEvent, comm_text, record_struct
from lens_ebpf.agent.events import FlowClosed, maker
from lens_ebpf.agent.net.policy import CLASS_NAMES

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


# the first 12 bytes of an IPv4-mapped IPv6 address (::ffff:a.b.c.d)
V4_MAPPED = bytes(10) + b"\xff\xff"


@functools.lru_cache(maxsize=8192)
def format_addr(family: int, addr16: bytes) -> str:
    """An address as stored by the programs (IPv4 as ::ffff:a.b.c.d) in its usual text.

    An IPv4 peer of a dual-stack IPv6 socket (::ffff:a.b.c.d) is spelled a.b.c.d, as on an
    IPv4 socket: one spelling per address in labels, events and index lookups
    (native/_native.c's addr_text spells it the same way). inet_ntop rather than
    ipaddress, and remembered: this runs twice per ring-buffer record, mostly for
    addresses it has seen.
    """
    if family == AF_INET or addr16[:12] == V4_MAPPED:
        return socket.inet_ntop(socket.AF_INET, bytes(addr16[12:16]))
    return socket.inet_ntop(socket.AF_INET6, bytes(addr16))


def family_name(addr: str) -> str:
    """A flow's family as its addresses are spelled (format_addr): an IPv4 peer of a
    dual-stack socket is ipv4."""
    return "ipv6" if ":" in addr else "ipv4"


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
    (
        ts,
        duration,
        sent,
        recv,
        cgroup_id,
        laddr,
        raddr,
        pid,
        retrans,
        lport,
        rport,
        family,
        direction,
        cls,
        reason,
        comm,
    ) = _FLOW_EVENT.unpack_from(buf)
    # by position: the arguments bind in half the time keywords take, once per record
    return _event(
        ts,
        duration,
        pid,
        comm,
        cgroup_id,
        family,
        laddr,
        raddr,
        lport,
        rport,
        direction,
        cls,
        sent,
        recv,
        retrans,
        reason_name(reason),
    )


def sock_info_event(si: Any, keyed: bool) -> FlowClosed:
    """A socket the agent finished itself (its CLOSE went unseen) as an event."""
    now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    reason = "close_not_seen" if keyed else "failed_connect"
    return _event(
        ts=now,
        duration=now - si.start_ns,
        pid=si.pid,
        comm=si.comm,
        cgroup_id=si.cgroup_id,
        family=si.family,
        laddr=bytes(si.laddr),
        raddr=bytes(si.key.raddr),
        lport=si.lport,
        rport=si.rport,
        direction=si.direction,
        cls=si.key.cls,
        sent=si.sent,
        recv=si.recv,
        retrans=si.retrans,
        reason=reason,
    )


# the fields _event passes, in its order (positional arguments bind in half the time)
_make_flow = maker(
    FlowClosed,
    tuple(
        "ts_ns pid comm cgroup_id family laddr lport raddr rport direction cls sent_bytes"
        " received_bytes retransmits duration_ns reason".split()
    ),
)


def _event(
    ts: int,
    duration: int,
    pid: int,
    comm: bytes,
    cgroup_id: int,
    family: int,
    laddr: bytes,
    raddr: bytes,
    lport: int,
    rport: int,
    direction: int,
    cls: int,
    sent: int,
    recv: int,
    retrans: int,
    reason: str,
) -> FlowClosed:
    """A closed flow from the programs' raw values (a ring record's, or a sock_info's),
    made through its slots (events.maker): this runs once per ring record. The values are
    every field's, as the constructor would have them (tests compare both)."""
    remote = format_addr(family, raddr)  # always set (a failed connect's local may not be)
    return _make_flow(
        ts,
        pid,
        comm_text(comm),
        cgroup_id,
        family_name(remote),
        format_addr(family, laddr),
        lport,
        remote,
        rport,
        direction_name(direction),
        class_name(cls),
        sent,
        recv,
        retrans,
        duration,
        reason,
    )


def materialize(p: Any) -> FlowClosed:
    """A compiled closed flow (native.Packed) as the Python path publishes it: decoded
    from its record, enrichment's fields, its kind, numbered, its wire kept."""
    ev = flow_record(p.record)
    if p.extra:
        ev = dataclasses.replace(ev, **p.extra)
    if p.kind != ev.kind:
        ev = dataclasses.replace(ev, kind=p.kind)
    return native.stamped(ev, p)


def compiled_flows() -> tuple[ModuleType | None, str]:
    """The compiled path for closed-flow records, its names set and its layout checked
    against FlowEvent; or None and why not."""
    mod, why = native.load()
    if mod is None:
        return None, why
    why = native.layout_differs(mod.flow_event_layout(), FlowEvent)
    if why:
        return None, why
    mod.configure_flows([class_name(i) for i in range(256)], DIRECTIONS, CLOSE_REASONS)
    for kind in FlowClosed.KINDS:
        mod.set_materializer(kind, materialize)
    return mod, ""
