"""CIDRs as people and clusters write them: what the agent's policy and the Kubernetes
objects' pod and service ranges are parsed with."""

from __future__ import annotations

import ipaddress
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class NetworkError(ValueError):
    """A value that is no CIDR, worded with where it stood."""


def parse_networks(values: Any, where: str) -> tuple[Network, ...]:
    """CIDRs or bare addresses (a list, or one string); NetworkError names where and the
    value at fault."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list):
        raise NetworkError(f"{where}: expected a list of CIDRs, got {values!r}")
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError:
            raise NetworkError(f"{where}: {value!r} is not a CIDR or an IP address") from None
    return tuple(out)
