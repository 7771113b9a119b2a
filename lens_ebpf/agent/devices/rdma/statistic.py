"""`rdma statistic show` output (text or -j JSON) to per-port counters; pure parsing."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lens_ebpf.agent.devices.rdma.resources import ToolOutputError, json_objects

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
META_KEYS = {"ifindex", "ifname", "port"}


class StatParseError(ToolOutputError):
    """Output that is not what `rdma statistic show` prints."""


@dataclass(frozen=True)
class PortStats:
    device: str
    port: int
    counters: dict[str, int]
    ifindex: int | None = None


def parse_text(text: str) -> list[PortStats]:
    """'link mlx5_0/1 rx_write_requests 0 out_of_buffer 135 ...' per line."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if words[0] != "link" or len(words) < 2 or "/" not in words[1]:
            raise StatParseError(f"line {lineno}: expected 'link DEV/PORT ...': {line[:60]!r}")
        device, _, port = words[1].rpartition("/")
        pairs = words[2:]
        if len(pairs) % 2 or not port.isdigit():
            raise StatParseError(f"line {lineno}: counters do not pair up")
        counters = {}
        for name, value in zip(pairs[::2], pairs[1::2], strict=True):
            if not NAME.match(name) or not value.isdigit():
                raise StatParseError(f"line {lineno}: bad counter {name!r} {value!r}")
            counters[name] = int(value)
        out.append(PortStats(device, int(port), counters))
    return out


def parse_json(text: str) -> list[PortStats]:
    """`rdma -j statistic show`: a list of {ifindex, ifname, port, counter: value, ...}."""
    out = []
    for item in json_objects(text, "statistic show", StatParseError):
        if "ifname" not in item or "port" not in item:
            raise StatParseError(f"link without ifname/port: {str(item)[:60]}")
        counters = {
            k: int(v)
            for k, v in item.items()
            if k not in META_KEYS
            and isinstance(v, int)
            and not isinstance(v, bool)
            and NAME.match(k)
        }
        ifindex = item.get("ifindex")
        out.append(
            PortStats(
                str(item["ifname"]),
                int(item["port"]),
                counters,
                ifindex if isinstance(ifindex, int) else None,
            )
        )
    return out


def parse(text: str) -> list[PortStats]:
    """Either form: JSON (`rdma -j statistic show`) or text."""
    return parse_json(text) if text.lstrip().startswith("[") else parse_text(text)
