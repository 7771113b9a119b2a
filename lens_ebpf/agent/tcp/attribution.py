"""Flow keys counted before the cluster index knew their remote, moved to it once it does.

A flow key's growth is labelled when the agent reads it, with the index as it is then. A
pod that connects in its first instant, before the index has its address (the watch
event comes a moment after the pod's network), is counted without its identity: the
class the kernel's policy gave and nothing more. Such a key is remembered here; once the
index has moved on, each is asked again, and one whose address is now known has its
series moved whole (MetricCache.move) to those of its identity: nothing counted twice, no
unlabelled series left counting the same connections. An unlabelled series holds one
key's counts only (without an identity the class is the policy's, so its labels are the
key's), which is what lets it move whole. Only from unknown to known: what an address
counted while a pod held it stays with that pod when the address passes to another.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.net.identity import NO_IDENTITY
from lens_ebpf.agent.tcp.decode import OTHER

Labels = tuple[str, ...]
# (key labels as decoded, their labels refined by the index, who the remote is): moves
# the key's unlabelled series to the labelled ones
Relabel = Callable[[Labels, Labels, Labels], None]
RADDR = 2  # the remote address's place in a flows- or rtt-map key's labels (decode.py)


class Unattributed:
    """Keys whose counts went to series without an identity, the least recently counted
    first; as many as the families' series cap, for as long as their series live (TTL)."""

    def __init__(
        self, relabel: Relabel, ttl: float, bound: int, clock: Callable[[], float]
    ) -> None:
        self._relabel = relabel
        self._ttl, self._bound, self._clock = ttl, bound, clock
        self._keys: OrderedDict[Labels, float] = OrderedDict()  # key labels -> last counted
        self._asked: tuple[int, int] | None = None  # the index (its id, changes) last asked
        self._noted = False  # keys noted since
        self.moved = 0  # keys moved to their identity

    def __len__(self) -> int:
        return len(self._keys)

    def note(self, key_labels: Labels, who: Labels) -> None:
        """A key's growth was just counted with these identity labels: remembered when
        they are none (an overflow slot is nobody's)."""
        if who != NO_IDENTITY or key_labels[RADDR] == OTHER:
            return
        keys = self._keys
        keys[key_labels] = self._clock()
        keys.move_to_end(key_labels)
        if len(keys) > self._bound:
            keys.popitem(last=False)
        self._noted = True

    def settle(self, enrich: Enrichment) -> int:
        """Move each remembered key the index now knows to its identity; how many. Asks
        only when the index changed or keys were noted since it last asked."""
        index = enrich.index
        if index is None or not self._keys:
            return 0
        asked = (id(index), index.changes)  # before the lookups: a change after is seen next
        if asked == self._asked and not self._noted:
            return 0
        self._asked, self._noted = asked, False
        keys, now = self._keys, self._clock()
        while keys and now - next(iter(keys.values())) >= self._ttl:
            keys.popitem(last=False)  # its series has expired too
        moved, lookup, known = 0, index.lookup, {}  # keys share addresses: each asked once
        for key in list(keys):
            addr = key[RADDR]
            if addr not in known:
                known[addr] = lookup(addr) is not None
            if not known[addr]:
                continue
            labels, who = enrich.flow_key(key)
            if who != NO_IDENTITY:
                self._relabel(key, labels, who)
                del keys[key]
                moved += 1
        self.moved += moved
        return moved
