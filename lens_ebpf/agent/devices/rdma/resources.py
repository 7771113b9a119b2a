"""RDMA resource tracking and links through the `rdma` tool's JSON (iproute2): every queue
pair with the process that created it, and each device's netdev and index.

`rdma -j resource show qp` lists user QPs with `pid` and `comm`, and the kernel's own
(GSI, SMI, ...) with `comm` only (the text output writes those `[ib_core]`). Kernels
before 5.x's port tracking (5.10 here) leave `port` out of some entries. `rdma -j link
show` names the netdev of devices whose sysfs has none (rxe, siw).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any


class ToolOutputError(ValueError):
    """Output that is not what the rdma tool prints (each command's parser has its own
    subclass; the collector counts any of them as a parse error)."""


class ResourceParseError(ToolOutputError):
    """Output that is not what `rdma resource show` or `rdma link show` prints."""


@dataclass(frozen=True)
class QueuePair:
    device: str
    port: int | None  # None where the kernel did not say
    lqpn: int
    type: str  # RC, UC, UD, GSI, SMI, XRC_INI, ...
    state: str
    pid: int | None  # None for the kernel's own QPs
    comm: str


@dataclass(frozen=True)
class Link:
    device: str
    index: int
    port: int
    netdev: str


def json_objects(
    text: str, what: str, error: type[ToolOutputError] = ResourceParseError
) -> list[dict[str, Any]]:
    """The list of objects the rdma tool's -j prints (for every command), or error."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{what}: not JSON: {exc.msg} at {exc.pos}") from None
    if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
        raise error(f"{what}: expected a JSON list of objects")
    return doc


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def parse_qps(text: str) -> list[QueuePair]:
    """`rdma -j resource show qp`; an entry without ifname, lqpn or type is an error."""
    out = []
    for r in json_objects(text, "resource show qp"):
        lqpn = _int(r.get("lqpn"))
        if not isinstance(r.get("ifname"), str) or lqpn is None or not r.get("type"):
            raise ResourceParseError(
                f"resource show qp: entry without ifname/lqpn/type: " f"{str(r)[:80]}"
            )
        out.append(
            QueuePair(
                r["ifname"],
                _int(r.get("port")),
                lqpn,
                str(r["type"]),
                str(r.get("state", "")),
                _int(r.get("pid")),
                str(r.get("comm", "")).strip("[]"),
            )
        )
    return out


def parse_links(text: str) -> list[Link]:
    """`rdma -j link show`: one entry per port, with the netdev where there is one."""
    out = []
    for r in json_objects(text, "link show"):
        index, port = _int(r.get("ifindex")), _int(r.get("port"))
        if not isinstance(r.get("ifname"), str) or index is None or port is None:
            raise ResourceParseError(
                f"link show: entry without ifname/ifindex/port: " f"{str(r)[:80]}"
            )
        out.append(Link(r["ifname"], index, port, str(r.get("netdev", ""))))
    return out


def run_rdma(tool: str, timeout: float, *args: str) -> str:
    """`rdma -j ARGS` with a timeout; raises OSError or TimeoutExpired."""
    res = subprocess.run(
        [tool, "-j", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if res.returncode != 0:
        raise OSError(
            f"{tool} {' '.join(args)} exited {res.returncode}: " f"{res.stderr.strip()[:200]}"
        )
    return res.stdout
