"""Why a packet was dropped, in the running kernel's own words.

The reason skb:kfree_skb reports (Linux 5.17+) is a value of enum skb_drop_reason, whose
members are added, moved and renumbered from one kernel to the next (6.1 has 68 of them,
6.18 130). So the names come from the running kernel's own description of the enum, its
BTF, read at load: never from a table of ours, which would name another kernel's numbers.
A value that kernel's BTF does not name, or any value on a kernel without BTF, is counted
under its number as "unknown on this kernel". Where the kernel gives no reason (5.10) or
gives NOT_SPECIFIED, the drop's location (a return address) is resolved to the kernel
function it lies in, through /proc/kallsyms.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from pathlib import Path

from lens_ebpf.agent.bpf.btf import Btf

ENUM = "skb_drop_reason"
UNKNOWN = "unknown on this kernel"
# the kernel's own spelling drops these prefixes (its drop_reasons[] strings, and the
# names skb:kfree_skb's print format shows): SKB_DROP_REASON_NO_SOCKET is NO_SOCKET
_PREFIXES = ("SKB_DROP_REASON_", "SKB_")
# members that are normal frees or markers, not drops: their values are passed over (the
# program is compiled with them) or never reported
NOT_DROPS = ("CONSUMED", "NOT_DROPPED_YET")
NOT_SPECIFIED = "NOT_SPECIFIED"


def short_name(member: str) -> str:
    """SKB_DROP_REASON_NO_SOCKET -> NO_SOCKET, SKB_CONSUMED -> CONSUMED."""
    for prefix in _PREFIXES:
        if member.startswith(prefix):
            return member[len(prefix) :]
    return member


def reason_names(btf: Btf | None) -> dict[int, str] | None:
    """value -> short name of each member of the running kernel's enum skb_drop_reason;
    None where BTF or the enum is missing (a kernel before 5.17 has no reasons)."""
    if btf is None:
        return None
    values = btf.enum_values(ENUM)
    if values is None:
        return None
    return {v: short_name(n) for v, n in values.items()}


def defines(names: dict[int, str] | None) -> dict[str, int | str]:
    """The values drops.c compares with: the normal frees it passes over and
    NOT_SPECIFIED, for which it keeps the location. None of them where BTF names none."""
    if not names:
        return {}
    by_name = {n: v for v, n in names.items()}
    out: dict[str, int | str] = {}
    if "CONSUMED" in by_name and "NOT_DROPPED_YET" in by_name:
        out["LENS_REASON_CONSUMED"] = by_name["CONSUMED"]
        out["LENS_REASON_NOT_DROPPED"] = by_name["NOT_DROPPED_YET"]
    if NOT_SPECIFIED in by_name:
        out["LENS_REASON_NOT_SPECIFIED"] = by_name[NOT_SPECIFIED]
    return out


def reason_label(value: int, names: dict[int, str] | None, has_reasons: bool) -> str:
    """The reason label of a drop: the kernel's name for value, UNKNOWN where it names
    none, "" where the kernel reports no reasons (its location says where)."""
    if not has_reasons:
        return ""
    if names is None or value not in names:
        return UNKNOWN
    return names[value]


def parse_kallsyms(text: str) -> tuple[list[int], list[str]]:
    """Sorted start addresses and names of the kernel's text symbols (t/T), modules
    included (their names without the [module] suffix)."""
    pairs = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("t", "T"):
            addr = int(parts[0], 16)
            if addr:
                pairs.append((addr, parts[2]))
    pairs.sort()
    return [a for a, _ in pairs], [n for _, n in pairs]


class Locations:
    """Return addresses to the kernel functions they lie in, from /proc/kallsyms (read
    again when an address lies past what was read: a module loaded since); names as the
    kernel's own %pS would print them, without the offset."""

    def __init__(
        self, read: Callable[[], str] | None = None, kallsyms: Path = Path("/proc/kallsyms")
    ) -> None:
        self._read = read or kallsyms.read_text
        self._addrs: list[int] = []
        self._names: list[str] = []
        self._cache: dict[int, str] = {}
        self._loaded = False

    def _load(self) -> None:
        try:
            self._addrs, self._names = parse_kallsyms(self._read())
        except OSError:
            self._addrs, self._names = [], []
        self._loaded = True

    def name(self, address: int) -> str:
        """The function holding address; its hex where no symbol is known (kallsyms
        unreadable, or addresses hidden by kptr_restrict)."""
        if not address:
            return ""
        got = self._cache.get(address)
        if got is not None:
            return got
        if not self._loaded:
            self._load()
        i = bisect.bisect_right(self._addrs, address) - 1
        if i < 0 or i == len(self._addrs) - 1:  # before the first, or past the last read
            self._load()
            i = bisect.bisect_right(self._addrs, address) - 1
        got = self._names[i] if 0 <= i < len(self._names) else f"{address:#x}"
        self._cache[address] = got
        return got
