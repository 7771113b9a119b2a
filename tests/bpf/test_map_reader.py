"""DeltaReader on a real BPF hash map of this kernel: every count taken once, whatever a
batch read leaves out and whatever a delete is refused.

What a read misses, and what refuses a delete, comes from kernels other than the one a
test runs on: a batch lookup that passes over a bucket another context holds (5.11 until
66a7a92e4d0d), BCC 0.26 resuming a partial batch from the wrong bucket, a delete answered
EBUSY. Those are injected by a view over the real map that drops one key from one batch,
or refuses one delete; every value read and every key deleted is the kernel's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lens_ebpf.agent.bpf.map_reader import DeltaReader

pytestmark = pytest.mark.bpf

# struct keys, as the flows and rtt maps have
PROGRAM = b"struct k { u64 id; }; struct v { u64 a; u64 b; }; BPF_HASH(m, struct k, struct v, 64);"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Missing:
    """The real map, but its next batch read leaves out the keys in `drop`, and its next
    delete of a key in `refuse` fails as the kernel's EBUSY does (BCC's KeyError)."""

    def __init__(self, table: Any) -> None:
        self.table, self.drop, self.refuse = table, set[int](), set[int]()
        self.Key = table.Key

    def items_lookup_batch(self) -> Iterator[tuple[Any, Any]]:
        drop, self.drop = self.drop, set()
        return ((k, v) for k, v in self.table.items_lookup_batch() if k.id not in drop)

    def get(self, key: Any) -> Any:
        return self.table.get(key)

    def __delitem__(self, key: Any) -> None:
        if key.id in self.refuse:
            self.refuse.discard(key.id)
            raise KeyError(key)
        del self.table[key]


@pytest.fixture(scope="module")
def table() -> Iterator[Any]:
    from bcc import BPF

    bpf = BPF(text=PROGRAM)
    yield bpf[b"m"]
    bpf.cleanup()


def put(table: Any, key: int, a: int, b: int) -> None:
    table[table.Key(key)] = table.Leaf(a, b)


def taken(reader: DeltaReader, view: Any) -> dict[int, tuple[int, ...]]:
    return {k.id: grew for k, grew in reader.read(view)}


def test_a_key_a_batch_read_missed_is_read_alone_and_counted_once(table: Any) -> None:
    table.clear()
    view, clock = Missing(table), Clock()
    reader = DeltaReader(lambda v: (v.a, v.b), 900, clock)
    put(table, 1, 100, 10)
    put(table, 2, 5, 5)
    assert taken(reader, view) == {1: (100, 10), 2: (5, 5)}
    put(table, 1, 150, 10)
    view.drop = {1}  # this batch leaves key 1 out: it is read alone, its growth taken
    assert taken(reader, view) == {1: (50, 0)} and reader.missed == 1
    put(table, 1, 170, 12)
    assert taken(reader, view) == {1: (20, 2)}  # not its whole value again
    assert taken(reader, view) == {}
    # missed while it did not grow: looked up, nothing taken, nothing forgotten
    view.drop = {2}
    assert taken(reader, view) == {} and reader.missed == 2
    put(table, 2, 6, 5)
    assert taken(reader, view) == {2: (1, 0)}
    assert len(reader) == 2


def test_idle_keys_leave_the_map_unless_they_grew_or_the_delete_is_refused(table: Any) -> None:
    table.clear()
    view, clock = Missing(table), Clock()
    reader = DeltaReader(lambda v: (v.a, v.b), 60, clock, pinned=lambda k: k.id == 9)
    for key in (1, 2, 3, 9):
        put(table, key, 1, 1)
    taken(reader, view)
    clock.now += 61
    put(table, 2, 2, 1)  # grew after the read below took it: the read after takes it
    view.refuse = {3}  # its delete is refused: kept, not forgotten
    assert taken(reader, view) == {2: (1, 0)}
    assert sorted(k.id for k in table) == [2, 3, 9]
    clock.now += 61
    put(table, 3, 4, 1)  # grew while kept: only that is taken
    assert taken(reader, view) == {3: (3, 0)}
    clock.now += 61
    assert taken(reader, view) == {}
    assert sorted(k.id for k in table) == [9]  # the pinned slot stays
    # a key deleted by someone else is forgotten, and starts from zero if it comes back
    put(table, 5, 7, 7)
    taken(reader, view)
    del table[table.Key(5)]
    assert taken(reader, view) == {} and len(reader) == 1
    put(table, 5, 2, 2)
    assert taken(reader, view) == {5: (2, 2)}
