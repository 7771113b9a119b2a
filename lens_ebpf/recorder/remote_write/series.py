"""A remote-write series as the relabeler reads it: what a request becomes (`Out`: the body
to forward, samples by result, the series left out), a series' labels read against one
generation of the device and pod maps (`Resolved`), the labels a proxied series gains,
and how a series is named in a message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lens_ebpf.recorder.gen import remote_write_v1_pb2 as pb1
from lens_ebpf.recorder.remote_write import wire
from lens_ebpf.recorder.remote_write.index import Pod

RESULTS = ("copied", "no_pod", "no_workload", "rejected")
# a miss (a series naming what the maps did not know): found once its node's entries were
# read again; not_found by that read; throttled: not read (its node was within the last
# second, or a read failed just before)
MISSES = ("found", "not_found", "throttled")


@dataclass
class Out:
    """What a request becomes: the body to forward (uncompressed), what it held, and
    samples by result."""

    body: bytes
    series: int = 0  # series forwarded (copies, and originals in proxy mode)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))
    written: wire.Counts = field(default_factory=wire.Counts)
    oldest_ms: float = 0.0  # the request's first sample's time (ingest lag)
    misses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MISSES, 0))
    invalid: list[str] = field(default_factory=list)  # series left out, each named and why

    def mark(self, out: Any) -> tuple[Any, ...]:
        """Where a series begins: what leaving it out puts back."""
        w = self.written
        return len(out), w.samples, w.histograms, w.exemplars, dict(self.counts), self.oldest_ms

    def left_out(self, out: Any, mark: tuple[Any, ...], name: str, why: Exception) -> None:
        """The series begun at mark left out (what it added taken back), named."""
        del out[mark[0] :]
        w = self.written
        w.samples, w.histograms, w.exemplars, self.counts, self.oldest_ms = mark[1:]
        self.invalid.append(f"{name}: {why or type(why).__name__}")


class Resolved:
    """A series' labels, read against one generation of the maps."""

    __slots__ = (
        "generation",
        "device",
        "pod",
        "static",
        "labels",
        "key",
        "held",
        "held_pod",
        "copies",
        "proxy",
        "node",
        "stamp",
        "missing",
        "settled",
    )

    def __init__(
        self,
        generation: int,
        device: tuple[str, str] | None,
        pod: str,
        labels: dict[str, str],
        static: str | None,
        node: str = "",
        stamp: int = 0,
        missing: str = "",
    ) -> None:
        self.generation = generation
        # its node ("" for none; a node the maps do not know: the name or address it gave)
        # and that node's count of reads that changed it (Index.stamps) it was read against
        self.node, self.stamp = node, stamp
        # what it names that the maps do not know: "device", "pod", "node" ("": nothing)
        self.missing = missing
        self.device = device  # (node, slot or RDMA device): its holder is looked up by time
        self.pod = pod  # the pod its labels name ("" for none)
        self.static = static  # the pod whatever the time (None: it depends on the time)
        self.settled = False  # static names a pod the maps know (no miss to look at)
        # its labels: kept only while its copies are built (memory: a cached series is its
        # key, its copies' bytes and a few names), read again from key when asked
        self.labels: dict[str, str] | None = labels
        self.key = b""  # its serialized labels (1.0's cache key)
        self.held: str | None = None  # the pod whose copies below are built
        self.held_pod: Pod | None = None  # as the maps had it then
        self.copies: tuple[bytes, ...] = ()
        self.proxy: bytes = b""


def proxied(labels: dict[str, str], pod: Pod | None) -> dict[str, str]:
    """A proxied series' labels: namespace, pod, workload_kind, workload where it has none
    (never overwritten)."""
    out = dict(labels)
    if pod is None:
        return out
    top = pod.workloads[-1] if pod.workloads else ("", "", "")
    for k, v in (
        ("namespace", pod.namespace),
        ("pod", pod.name),
        ("workload_kind", top[0]),
        ("workload", top[1]),
    ):
        if v and not out.get(k):
            out[k] = v
    return out


def index_key(value: str) -> str:
    """A device index label as the maps key it: its ASCII digits without leading zeros
    ("03" is GPU 3); anything else as it is (`gpu="²"`, 5,000 digits: a value no GPU has,
    not an error that would refuse the request)."""
    if value.isascii() and value.isdigit():
        return value.lstrip("0") or "0"
    return value


def shown(labels: dict[str, str], most: int = 8) -> str:
    """A series' labels as a message names it: ` {__name__="up", ...}`, values cut short
    ("" for none)."""
    if not labels:
        return ""
    cut = [(k, v if len(v) <= 40 else v[:37] + "...") for k, v in list(labels.items())[:most]]
    more = ", ..." if len(labels) > most else ""
    return " {" + ", ".join(f'{k[:40]}="{v}"' for k, v in cut) + more + "}"


def described(ts: bytes) -> str:
    """A 1.0 series' labels as a message names it, read leniently (its bytes may be what
    is wrong with it): shown(), "" where none can be read."""
    labels: dict[str, str] = {}
    p = 0
    try:
        while p < len(ts) and ts[p] == 0x0A:
            length, q = wire.read_uvarint(ts, p + 1)
            lab, p = ts[q : q + length], q + length
            name = value = ""
            i = 0
            while i < len(lab):
                size, j = wire.read_uvarint(lab, i + 1)
                text = lab[j : j + size].decode(errors="replace")
                name, value = (text, value) if lab[i] == 0x0A else (name, text)
                i = j + size
            labels[name] = value
    except (ValueError, IndexError):
        pass
    return shown(labels)


def labels_of(r: Resolved) -> dict[str, str]:
    if r.labels is not None:
        return r.labels
    return {lb.name: lb.value for lb in pb1.TimeSeries.FromString(r.key).labels}
