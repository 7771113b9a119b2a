"""Workload series, as Primus-Lens's telemetry processor writes them: each incoming series
finds its pod (first by the device it names on its node, at the sample's time, else by
its pod labels), and for each workload above that pod a copy named `workload_<name>` is
written, `job` set to the service's, `pod_name`, `pod_uid`, `workload_name`,
`workload_uid` added, samples unchanged. In proxy mode every series goes on too, with
`namespace`, `pod`, `workload_kind`, `workload` added where it has none.

Per series the work that depends only on its labels (which node and device, which pod by
its labels, the copies' label bytes for the pod that holds the device) is kept, keyed by
the series' serialized labels, until the device and pod maps change; a request's own work
is its samples' bytes and the join.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from lens_ebpf.cluster.config import RemoteWriteConfig
from lens_ebpf.cluster.gen import remote_write_v1_pb2 as pb1
from lens_ebpf.cluster.gen import remote_write_v2_pb2 as pb2
from lens_ebpf.cluster.remote_write import wire
from lens_ebpf.cluster.remote_write.index import Index, Indexer, Pod, bdf

RESULTS = ("copied", "no_pod", "no_workload", "rejected")
CACHE_MAX = 1_000_000  # series remembered; beyond, the cache starts again


@dataclass
class Out:
    """What a request becomes: the body to forward (uncompressed), what it held, and
    samples by result."""

    body: bytes
    series: int = 0  # series forwarded (copies, and originals in proxy mode)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))
    written: wire.Counts = field(default_factory=wire.Counts)
    oldest_ms: float = 0.0  # the oldest sample's time (ingest lag)


class Resolved:
    """A series' labels, read against one generation of the maps."""

    __slots__ = ("generation", "device", "pod", "labels", "held", "copies", "proxy")

    def __init__(self, generation: int, device: tuple[str, str] | None, pod: str,
                 labels: dict[str, str]) -> None:  # fmt: skip
        self.generation = generation
        self.device = device  # (node, slot or RDMA device): its holder is looked up by time
        self.pod = pod  # the pod its labels name ("" for none)
        self.labels = labels
        self.held: str | None = None  # the pod whose copies below are built
        self.copies: tuple[bytes, ...] = ()
        self.proxy: bytes = b""


class Relabeler:
    def __init__(self, cfg: RemoteWriteConfig, indexer: Indexer) -> None:
        self.cfg, self.indexer = cfg, indexer
        self.rules = [(r.label, r.match) for r in cfg.device_labels]
        self.cache: dict[bytes, Resolved] = {}
        self._lock = threading.Lock()

    # -- what a series' labels lead to ------------------------------------------------
    def resolve(self, labels: dict[str, str], idx: Index) -> Resolved:
        node = ""
        for name in self.cfg.node_labels:
            if labels.get(name):
                node = idx.node(labels[name])
                if node:
                    break
        device = None
        if node:
            gpus = idx.gpus.get(node, {})
            for name, match in self.rules:
                v = labels.get(name)
                if not v:
                    continue
                if match == "rdma":
                    if v in idx.rdma.get(node, ()):
                        device = (node, v)
                        break
                    continue
                key = bdf(v) if match == "bdf" else str(int(v)) if match == "index" and \
                    v.isdigit() else v  # fmt: skip
                slot = gpus.get((match, key))
                if slot:
                    device = (node, slot)
                    break
        pod = ""
        name = next((labels[k] for k in self.cfg.pod_labels if labels.get(k)), "")
        if name:
            uid = labels.get("uid") or labels.get("pod_uid") or ""
            ns = labels.get("namespace") or labels.get("exported_namespace") or ""
            if uid in idx.pods:
                pod = uid
            elif ns:
                pod = idx.by_name.get((ns, name), "")
            elif len(idx.names.get(name, ())) == 1:
                pod = idx.names[name][0]
        return Resolved(idx.generation, device, pod, labels)

    def pod_at(self, r: Resolved, idx: Index, at_ms: float) -> str:
        """The pod a series belongs to at that time: its device's holder then, else the
        pod its labels name; "" for none (or several sharing an RDMA device)."""
        if r.device is not None:
            held = idx.held(*r.device, at_ms)
            if len(held) == 1:
                return held[0]
        return r.pod

    def copies(self, labels: dict[str, str], pod: Pod | None) -> list[dict[str, str]]:
        """The labels of a series' workload copies: one per workload above its pod."""
        if pod is None:
            return []
        return [{**labels, "__name__": "workload_" + labels.get("__name__", ""),
                 "job": self.cfg.job, "pod_name": pod.name, "pod_uid": pod.uid,
                 "workload_name": wname, "workload_uid": wuid}
                for _, wname, wuid in pod.workloads]  # fmt: skip

    def build(self, r: Resolved, pod_uid: str, idx: Index, original: bytes) -> None:
        """The copies' label bytes (and the proxied series') for this pod."""
        pod = idx.pods.get(pod_uid)
        r.held = pod_uid
        r.copies = tuple(wire.labels(lbl) for lbl in self.copies(r.labels, pod))
        proxy = proxied(r.labels, pod)
        r.proxy = wire.labels(proxy) if proxy != r.labels else original

    @staticmethod
    def reason(pod_uid: str, idx: Index) -> str:
        pod = idx.pods.get(pod_uid) if pod_uid else None
        if pod is None:
            return "no_pod"
        return "copied" if pod.workloads else "no_workload"

    # -- remote write 1.0 --------------------------------------------------------------
    def v1(self, data: bytes) -> Out:
        try:
            req = pb1.WriteRequest.FromString(data)
        except DecodeError as exc:
            raise wire.WireError(400, f"not a prometheus.WriteRequest: {exc}") from None
        idx = self.indexer.index
        proxy = self.cfg.mode == "proxy"
        out: list[bytes] = []
        res = Out(b"")
        counts, cache = res.counts, self.cache
        oldest = float("inf")
        for ts in req.timeseries:
            keyed = pb1.TimeSeries()
            keyed.labels.MergeFrom(ts.labels)
            key = keyed.SerializeToString()
            r = cache.get(key)
            if r is None or r.generation != idx.generation:
                r = self.resolve({lb.name: lb.value for lb in ts.labels}, idx)
                if len(cache) >= CACHE_MAX:
                    cache.clear()
                cache[key] = r
            n = len(ts.samples)
            res.written.samples += n
            res.written.histograms += len(ts.histograms)
            res.written.exemplars += len(ts.exemplars)
            times = [s.timestamp for s in ts.samples] or [h.timestamp for h in ts.histograms]
            if not times:
                continue
            oldest = min(oldest, times[0])
            first = self.pod_at(r, idx, times[0])
            groups = [(first, ts)]
            if r.device is not None and len(times) > 1 and \
                    self.pod_at(r, idx, times[-1]) != first:  # fmt: skip
                groups = self._split(r, idx, ts)  # the device changed holders meanwhile
            else:
                ts.ClearField("labels")
            for pod_uid, part in groups:
                if r.held != pod_uid:
                    self.build(r, pod_uid, idx, key)
                part.ClearField("labels")
                rest = part.SerializeToString()
                m = len(part.samples) + len(part.histograms)
                counts[self.reason(pod_uid, idx)] += m
                for lb in r.copies:
                    out.append(wire.timeseries(lb, rest))
                if proxy:
                    out.append(wire.timeseries(r.proxy, rest))
        if proxy:
            out += [wire.field(0x1A, m.SerializeToString()) for m in req.metadata]
        res.series = len(out) - (len(req.metadata) if proxy else 0)
        res.body = b"".join(out)
        res.oldest_ms = oldest if oldest != float("inf") else 0.0
        return res

    def _split(self, r: Resolved, idx: Index,
               ts: pb1.TimeSeries) -> list[tuple[str, pb1.TimeSeries]]:  # fmt: skip
        """A series' samples, histograms and exemplars by the pod holding its device at
        each one's time, in time order."""
        parts: dict[str, pb1.TimeSeries] = {}
        for s in ts.samples:
            parts.setdefault(self.pod_at(r, idx, s.timestamp), pb1.TimeSeries()).samples.append(s)
        for h in ts.histograms:
            parts.setdefault(self.pod_at(r, idx, h.timestamp),
                             pb1.TimeSeries()).histograms.append(h)  # fmt: skip
        for e in ts.exemplars:
            parts.setdefault(self.pod_at(r, idx, e.timestamp),
                             pb1.TimeSeries()).exemplars.append(e)  # fmt: skip
        return list(parts.items())

    # -- remote write 2.0 --------------------------------------------------------------
    def v2(self, data: bytes) -> Out:
        """The same for a 2.0 request: labels through its symbols table; the copies'
        symbols in a table of their own, every reference (exemplars', metadata's) mapped."""
        try:
            req = pb2.Request.FromString(data)
        except DecodeError as exc:
            raise wire.WireError(400, f"not an io.prometheus.write.v2.Request: {exc}") from None
        sym = list(req.symbols)
        idx = self.indexer.index
        new = pb2.Request()
        table: dict[str, int] = {"": 0}
        new.symbols.append("")
        res = Out(b"")

        def ref(s: str) -> int:
            i = table.get(s)
            if i is None:
                i = table[s] = len(new.symbols)
                new.symbols.append(s)
            return i

        def copy(src: pb2.TimeSeries, labels: dict[str, str]) -> None:
            ts = new.timeseries.add()
            ts.CopyFrom(src)
            del ts.labels_refs[:]
            for k in sorted(labels):
                ts.labels_refs.extend((ref(k), ref(labels[k])))
            for e in ts.exemplars:
                e.labels_refs[:] = [ref(sym[i]) for i in e.labels_refs]
            if src.HasField("metadata"):
                ts.metadata.help_ref = ref(sym[src.metadata.help_ref])
                ts.metadata.unit_ref = ref(sym[src.metadata.unit_ref])

        oldest = float("inf")
        try:
            for src in req.timeseries:
                refs = src.labels_refs
                labels = {sym[refs[i]]: sym[refs[i + 1]] for i in range(0, len(refs) - 1, 2)}
                res.written.samples += len(src.samples)
                res.written.histograms += len(src.histograms)
                res.written.exemplars += len(src.exemplars)
                times = [s.timestamp for s in src.samples] or \
                    [h.timestamp for h in src.histograms]  # fmt: skip
                if not times:
                    continue
                oldest = min(oldest, times[0])
                r = self.resolve(labels, idx)
                pod_uid = self.pod_at(r, idx, times[0])
                res.counts[self.reason(pod_uid, idx)] += len(times)
                pod = idx.pods.get(pod_uid)
                for lbl in self.copies(labels, pod):
                    copy(src, lbl)
                if self.cfg.mode == "proxy":
                    copy(src, proxied(labels, pod))
        except IndexError:
            raise wire.WireError(400, "a label or metadata reference past the symbols "
                                      "table") from None  # fmt: skip
        res.series = len(new.timeseries)
        res.body = new.SerializeToString() if res.series else b""
        res.oldest_ms = oldest if oldest != float("inf") else 0.0
        return res


def proxied(labels: dict[str, str], pod: Pod | None) -> dict[str, str]:
    """A proxied series' labels: namespace, pod, workload_kind, workload where it has none
    (never overwritten)."""
    out = dict(labels)
    if pod is None:
        return out
    top = pod.workloads[-1] if pod.workloads else ("", "", "")
    for k, v in (("namespace", pod.namespace), ("pod", pod.name), ("workload_kind", top[0]),
                 ("workload", top[1])):  # fmt: skip
        if v and not out.get(k):
            out[k] = v
    return out
