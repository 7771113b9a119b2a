"""How `lens-ebpf trace` (lens_ebpf/agent/trace.py) writes what it sees for people: each
event as one line under its table's header (80 columns, a GPU fault's 120; --wide
appends the pod and the container), and rtt's histograms, as text or JSON lines. Pure:
events in, text out.
"""

from __future__ import annotations

import json
import time
from typing import Any

from lens_ebpf.agent.events import Event
from lens_ebpf.agent.tcp import tcp_rtt

TCP_HEADER = (
    f"{'TIME':<8} {'PID':>6} {'COMM':<9} {'DIR':<3} {'CLASS':<8} {'REMOTE':<21} "
    f"{'TX':>6} {'RX':>6} {'MS':>5}"
)
GPU_HEADER = f"{'TIME':<8} {'GPU':>3} {'BDF':<12} {'FAULT':<18} {'CODE':<6} {'PID':>7} MESSAGE"
EXEC_HEADER = f"{'TIME':<8} {'EVENT':<5} {'PID':>7} {'PPID':>7} {'COMM':<12} {'RET':>5} FILENAME"
# trace all: one table, each line led by its event kind
ALL_HEADER = f"{'TIME':<8} {'EVENT':<5} {'PID':>7} {'COMM':<12} DETAIL"
DROP_HEADER = f"{'TIME':<8} {'DIR':<3} {'PROTO':<5} {'LOCAL':<21} {'REMOTE':<21} REASON"
SHORT_KIND = {
    "flow_closed": "flow",
    "process_exec": "exec",
    "process_exit": "exit",
    "oom_kill": "oom",
}
CLASS_SHORT = {"externalHosts": "external", "internalHosts": "internal", "localhost": "local"}


def human_bytes(n: float) -> str:
    for unit in ("", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit == "" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def clock_text(ts_ns: int, boot_offset: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(boot_offset + ts_ns / 1e9))


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


def _remote(ev: Event) -> str:
    """The remote address with the service port (the remote's for egress, ours else)."""
    port = ev["rport"] if ev["direction"] == "egress" else ev["lport"]
    return f"[{ev['raddr']}]:{port}" if ":" in ev["raddr"] else f"{ev['raddr']}:{port}"


def format_flow(ev: Event, boot_offset: float, wide: bool = False) -> str:
    """One closed flow as an 80-column line (--wide appends pod and container)."""
    remote = _remote(ev)
    line = (
        f"{clock_text(ev['ts_ns'], boot_offset):<8} {ev['pid']:>6} {ev['comm'][:9]:<9} "
        f"{'out' if ev['direction'] == 'egress' else 'in':<3} "
        f"{CLASS_SHORT.get(ev['class'], ev['class'])[:8]:<8} {_fit(remote, 21):<21} "
        f"{human_bytes(ev['sent_bytes']):>6} {human_bytes(ev['received_bytes']):>6} "
        f"{min(ev['duration_ns'] / 1e6, 99999):>5.0f}"
    )
    return line + _wide(ev) if wide else line


def format_proc(ev: Event, boot_offset: float, wide: bool = False) -> str:
    kind = SHORT_KIND[ev["kind"]]
    ret = _exit_text(ev) if kind == "exit" else ""
    line = (
        f"{clock_text(ev['ts_ns'], boot_offset):<8} {kind:<5} {ev['pid']:>7} {ev['ppid']:>7} "
        f"{ev['comm'][:12]:<12} {ret:>5} {ev.get('filename', '')}"
    )[:80]
    return line + _wide(ev) if wide else line


def _exit_text(ev: Event) -> str:
    if ev["signal"]:
        return f"sig{ev['signal']}"
    return "?" if ev["exit_code"] < 0 else str(ev["exit_code"])


def format_any(ev: Event, boot_offset: float, wide: bool = False) -> str:
    """One line of `trace all`'s table: time, kind, pid, comm, then what that kind says."""
    kind = SHORT_KIND[ev["kind"]]
    if kind == "flow":
        detail = (
            f"{'out' if ev['direction'] == 'egress' else 'in'} "
            f"{CLASS_SHORT.get(ev['class'], ev['class'])} {_fit(_remote(ev), 21)} "
            f"{human_bytes(ev['sent_bytes'])}/{human_bytes(ev['received_bytes'])} "
            f"{min(ev['duration_ns'] / 1e6, 99999):.0f}ms"
        )
    elif kind == "exec":
        detail = f"ppid {ev['ppid']} {ev.get('filename', '')}"
    elif kind == "exit":
        detail = f"ppid {ev['ppid']} ret {_exit_text(ev)}"
    else:
        detail = f"ppid {ev['ppid']} chosen by the OOM killer"
    line = (
        f"{clock_text(ev['ts_ns'], boot_offset):<8} {kind:<5} {ev['pid']:>7} "
        f"{ev['comm'][:12]:<12} {detail}"
    )[:80]
    return line + _wide(ev) if wide else line


def _wide(ev: Event) -> str:
    if not ev.get("container_id"):
        return ""
    pod = f"{ev['namespace']}/{ev['pod']}" if ev.get("pod") else "-"
    return f"  pod={pod} container={ev.get('container') or ev['container_id'][:12]}"


def rtt_lines(
    prev: dict[tuple[str, str], list[int]],
    now: dict[tuple[str, str], tuple[list[int], float]],
    stamp: str,
    as_json: bool,
) -> list[str]:
    """Histograms of the samples since the last interval, per (direction, class)."""
    out = []
    for key, (bins, _total) in sorted(now.items()):
        old = prev.get(key, [0] * len(bins))
        delta = [a - b for a, b in zip(bins, old, strict=True)]
        count = sum(delta)
        if not count:
            continue
        bounds = [*tcp_rtt.RTT_BOUNDS_US, None]
        if as_json:
            out.append(
                json.dumps(
                    {
                        "kind": "rtt_histogram",
                        "time": stamp,
                        "direction": key[0],
                        "class": key[1],
                        "count": count,
                        "buckets": [
                            {"le_us": b, "count": n}
                            for b, n in zip(bounds, delta, strict=True)
                            if n
                        ],
                    }
                )
            )
            continue
        out.append(f"{stamp} direction={key[0]} class={key[1]} samples={count}")
        out.append(f"{'usecs':>21} : {'count':<8} distribution")
        peak = max(delta)
        low = 0
        for b, n in zip(bounds, delta, strict=True):
            if n:
                label = f"{low} -> {b}" if b is not None else f"{low} -> inf"
                bar = "*" * max(1, round(40 * n / peak))
                out.append(f"{label:>21} : {n:<8} |{bar:<40}|")
            low = b if b is not None else low
    return out


def format_gpu(ev: Event, wide: bool = False) -> str:
    line = (
        f"{time.strftime('%H:%M:%S'):<8} {ev['gpu_index']:>3} {ev['bdf']:<12} "
        f"{ev['fault']:<18} {ev['code']:<6} {ev['pid'] or '-':>7} {ev['message']}"
    )[:120]
    return line + _wide(ev) if wide else line


def format_drop(ev: dict[str, Any], boot_offset: float) -> str:
    """One drop as an 80-column line: the local end (the destination of a packet that
    came in, the source of one sent), the other, and the kernel's reason."""
    ingress = ev["direction"] == "ingress"

    def end(addr: str, port: int) -> str:
        if not addr:
            return "-"
        host = f"[{addr}]" if ":" in addr else addr
        return _fit(f"{host}:{port}" if port else host, 21)

    local = end(ev["daddr"], ev["dport"]) if ingress else end(ev["saddr"], ev["sport"])
    remote = end(ev["saddr"], ev["sport"]) if ingress else end(ev["daddr"], ev["dport"])
    return (
        f"{clock_text(ev['ts_ns'], boot_offset):<8} {'in' if ingress else 'out':<3} "
        f"{ev['protocol'] or '-':<5} {local:<21} {remote:<21} {ev['reason']}"
    )[:80]
