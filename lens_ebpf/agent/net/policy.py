"""policy.yaml: CIDR classes for remote addresses, parsed purely and compiled for an LPM trie."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lens_ebpf.core import networks
from lens_ebpf.core.networks import Network

# Class ids as in bpf/programs/lens_common.h; a lower id wins when several match.
EXTERNAL = "externalHosts"
CLASS_ORDER = ("k8sPod", "k8sSvc", "dns", "docker", "localhost", "internalHosts")
CLASS_IDS = {EXTERNAL: 0, **{name: i + 1 for i, name in enumerate(CLASS_ORDER)}}
CLASS_NAMES = {i: name for name, i in CLASS_IDS.items()}
ALIASES = {"internal_hosts": "internalHosts", "k8s_pod": "k8sPod", "k8s_svc": "k8sSvc"}
LIST_KEYS = ("abnormalBlackList", "abnormalWhiteList")
LIST_ALIASES = {
    "abnormal_black_list": "abnormalBlackList",
    "abnormal_white_list": "abnormalWhiteList",
}

V4_MAPPED = 0xFFFF << 32
# Class prefixes a policy file may hold, checked before anything is parsed. The kernel
# trie (tcp_flows.MAX_POLICY_PREFIXES) holds these plus room for the cluster's pod and
# service CIDRs.
MAX_PREFIXES = 4096
# libyaml's safe loader where PyYAML has it (Debian's does): a 100k-line file parses in a
# fraction of the pure-Python loader's time
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class PolicyError(Exception):
    """A policy that cannot be used, worded with the file, the key and the value."""


@dataclass(frozen=True)
class Policy:
    """Class name -> networks, plus the abnormal-flow lists."""

    classes: Mapping[str, tuple[Network, ...]] = field(default_factory=dict)
    black_list: tuple[Network, ...] = ()
    white_list: tuple[Network, ...] = ()
    source: str = ""


def parse_networks(values: Any, key: str, source: str) -> tuple[Network, ...]:
    """CIDRs or bare addresses (a list, or one string); PolicyError names source, key, value."""
    try:
        return networks.parse_networks(values, f"{source}: {key}")
    except networks.NetworkError as exc:
        raise PolicyError(str(exc)) from None


def parse_policy(text: str, source: str = "policy.yaml") -> Policy:
    """Parse policy text; raise PolicyError naming the file, key and value at fault."""
    try:
        doc = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PolicyError(f"{source}: not valid YAML{where}") from None
    if doc is None:  # an empty file (or comments only) is a mistake more often than not
        raise PolicyError(f"{source}: empty; write {{}} for a policy with no classes")
    if not isinstance(doc, dict):
        raise PolicyError(f"{source}: top level must be a mapping of class to CIDR list")
    size = sum(
        len(v) if isinstance(v, list) else 1
        for k, v in doc.items()
        if ALIASES.get(str(k), str(k)) in CLASS_IDS
    )
    if size > MAX_PREFIXES:
        raise PolicyError(
            f"{source}: {size} class prefixes; at most {MAX_PREFIXES} fit the " "kernel's trie"
        )
    classes: dict[str, list[Network]] = {}
    lists: dict[str, tuple[Network, ...]] = {}
    for raw_key, values in doc.items():
        key = str(raw_key)
        name = ALIASES.get(key, key)
        list_name = LIST_ALIASES.get(key, key)
        if name in CLASS_IDS and name != EXTERNAL:
            classes.setdefault(name, []).extend(parse_networks(values, key, source))
        elif list_name in LIST_KEYS:
            lists[list_name] = lists.get(list_name, ()) + parse_networks(values, key, source)
        else:
            known = ", ".join((*CLASS_ORDER, *LIST_KEYS))
            raise PolicyError(f"{source}: unknown key {key!r} (known: {known})")
    return Policy(
        classes={k: tuple(v) for k, v in classes.items()},
        black_list=lists.get("abnormalBlackList", ()),
        white_list=lists.get("abnormalWhiteList", ()),
        source=source,
    )


def load_policy(path: str | Path) -> Policy:
    """Read and parse a policy file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_policy(text, str(path))


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _parse(address: str) -> Address:
    """An address; IPv4-mapped IPv6 counts as the IPv4 address it maps."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _in_any(ip: Address, nets: Iterable[Network]) -> bool:
    return any(ip.version == n.version and ip in n for n in nets)


def classify(policy: Policy, address: str) -> str:
    """The class of one address: the first class in CLASS_ORDER with a matching network."""
    ip = _parse(address)
    for name in CLASS_ORDER:
        if _in_any(ip, policy.classes.get(name, ())):
            return name
    return EXTERNAL


def _mapped(net: Network) -> tuple[int, int]:
    """(prefix length, address int) in the 128-bit space; IPv4 as ::ffff:a.b.c.d."""
    if net.version == 4:
        return net.prefixlen + 96, V4_MAPPED | int(net.network_address)
    return net.prefixlen, int(net.network_address)


def _contains(outer: tuple[int, int], inner: tuple[int, int]) -> bool:
    olen, oaddr = outer
    ilen, iaddr = inner
    if olen > ilen:
        return False
    shift = 128 - olen
    return (oaddr >> shift) == (iaddr >> shift) if shift < 128 else True


def lpm_entries(policy: Policy) -> dict[tuple[int, bytes], int]:
    """Trie entries: each prefix carries the winning class of itself and its ancestors.

    The longest prefix that matches an address has every other matching prefix as an
    ancestor, so storing the best class over the ancestors makes one LPM lookup give
    the first-match class. Sorted by address then length, a prefix's ancestors come
    before it and are on the stack when it is reached: n log n, not n squared.
    """
    own: dict[tuple[int, int], int] = {}
    for name, nets in policy.classes.items():
        for n in nets:
            key = _mapped(n)
            own[key] = min(own.get(key, CLASS_IDS[name]), CLASS_IDS[name])
    out: dict[tuple[int, bytes], int] = {}
    stack: list[tuple[tuple[int, int], int]] = []  # (prefix, best class over it and above)
    for prefix in sorted(own, key=lambda p: (p[1], p[0])):
        while stack and not _contains(stack[-1][0], prefix):
            stack.pop()
        best = min(own[prefix], stack[-1][1]) if stack else own[prefix]
        stack.append((prefix, best))
        out[(prefix[0], prefix[1].to_bytes(16, "big"))] = best
    return out


def abnormal(policy: Policy, address: str) -> bool:
    """True when a flow to address should raise an abnormal-flow event.

    Called for every closed flow: with no black list (the default) it parses nothing.
    """
    if not policy.black_list:
        return False
    ip = _parse(address)
    return _in_any(ip, policy.black_list) and not _in_any(ip, policy.white_list)


def with_cluster_networks(
    policy: Policy, pods: Iterable[Network], services: Iterable[Network]
) -> tuple[Policy, list[str]]:
    """The policy with empty k8sPod / k8sSvc classes filled from the cluster's CIDRs.

    Classes the policy sets are kept as written: the file wins. Returns the policy in
    force and which classes were filled.
    """
    classes = dict(policy.classes)
    filled = []
    for name, nets in (("k8sPod", tuple(pods)), ("k8sSvc", tuple(services))):
        if nets and not classes.get(name):
            classes[name] = nets
            filled.append(name)
    if not filled:
        return policy, []
    return Policy(classes, policy.black_list, policy.white_list, policy.source), filled
