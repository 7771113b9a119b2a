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

A series that finds no pod but names what the maps do not know on its node (a device, a
pod, a device nobody held then, or a node they do not know) has that node's entries read
again (at most once a second per node) and is looked up again, with the rest of its
request: a pod that just started has its first samples copied.

A series that cannot be read (its labels or samples malformed, a 2.0 reference past the
symbols) is left out and named (Out.invalid), and the rest of its request goes on, as
Prometheus takes a partial write; only a request whose framing is broken is refused
whole.
"""

from __future__ import annotations

import math
import threading

from google.protobuf.message import DecodeError

from lens_ebpf.recorder.config import RemoteWriteConfig
from lens_ebpf.recorder.gen import remote_write_v1_pb2 as pb1
from lens_ebpf.recorder.gen import remote_write_v2_pb2 as pb2
from lens_ebpf.recorder.remote_write import wire
from lens_ebpf.recorder.remote_write.index import Index, Indexer, Pod, bdf, host
from lens_ebpf.recorder.remote_write.series import (
    Out,
    Resolved,
    described,
    index_key,
    labels_of,
    proxied,
    shown,
)

CACHE_MAX = 1_000_000  # series remembered; beyond, the cache starts again


class Relabeler:
    def __init__(self, cfg: RemoteWriteConfig, indexer: Indexer) -> None:
        self.cfg, self.indexer = cfg, indexer
        self.rules = [(r.label, r.match) for r in cfg.device_labels]
        self.cache: dict[bytes, Resolved] = {}
        self._lock = threading.Lock()

    # -- what a series' labels lead to ------------------------------------------------
    def resolve(self, labels: dict[str, str], idx: Index) -> Resolved:
        node, asked = "", ""
        for name in self.cfg.node_labels:
            if labels.get(name):
                node = idx.node(labels[name])
                if node:
                    break
                asked = asked or host(labels[name])
        device = None
        named = False  # a device label with a value
        if not node:
            named = any(labels.get(name) for name, _ in self.rules)
        else:
            gpus = idx.gpus.get(node, {})
            for name, match in self.rules:
                v = labels.get(name)
                if not v:
                    continue
                named = True
                if match == "rdma":
                    if v in idx.rdma.get(node, ()):
                        device = (node, v)
                        break
                    continue
                key = bdf(v) if match == "bdf" else index_key(v) if match == "index" else v
                slot = gpus.get((match, key))
                if slot:
                    device = (node, slot)
                    break
        pod, missing = "", ""
        ns, name = self.named(labels)
        if name:
            uid = labels.get("uid") or labels.get("pod_uid") or ""
            if uid in idx.pods:
                pod = uid
            elif ns:
                pod = idx.by_name.get((ns, name), "")
            elif len(idx.names.get(name, ())) == 1:
                pod = idx.names[name][0]
            if not pod and (uid or ns or name not in idx.names):  # (not: a name several have)
                missing = "pod"
        if named and device is None:
            missing = "device"
        if not node:
            missing = "node" if asked and (named or name) else ""
        static: str | None = pod
        if device is not None:
            spans = idx.holders.get(device, [])
            if len(spans) == 1 and spans[0][0] == -math.inf and spans[0][1] == math.inf:
                static = spans[0][2]
            elif spans:
                static = None
        node = node or asked
        r = Resolved(
            idx.generation, device, pod, labels, static, node, idx.stamps.get(node, 0), missing
        )
        r.settled = static is not None and static in idx.pods
        return r

    def named(self, labels: dict[str, str]) -> tuple[str, str]:
        """The namespace ("" for none) and name of the pod a series' labels name ("" for
        none)."""
        name = next((labels[k] for k in self.cfg.pod_labels if labels.get(k)), "")
        ns = labels.get("namespace") or labels.get("exported_namespace") or ""
        return (ns, name) if name else ("", "")

    def again(self, old: Resolved, idx: Index) -> Resolved:
        """A series' labels read against new maps; the copies already built are kept when
        its device, its pod and that pod's workloads are what they were (the maps change
        each time a pod somewhere starts or ends: a rebuild of every series' copies then
        would be a cold start)."""
        new = self.resolve(labels_of(old), idx)
        new.key = old.key
        if (
            (new.device, new.pod, new.static) == (old.device, old.pod, old.static)
            and old.held is not None
            and idx.pods.get(old.held) == old.held_pod
        ):
            new.held, new.held_pod, new.copies, new.proxy = (
                old.held,
                old.held_pod,
                old.copies,
                old.proxy,
            )
        return new

    @staticmethod
    def missing(r: Resolved, idx: Index, at_ms: float) -> bool:
        """Whether a series that found no pod at that time names, on a node, what its
        node's entries may hold by now: a device, a pod or the node the maps do not know, a
        device nobody held then (or a pod they do not know, an RDMA device's)."""
        if not r.node:
            return False
        if r.missing:
            return True
        if r.device is None:
            return False
        held = idx.held(*r.device, at_ms)
        return not held or any(uid not in idx.pods for uid in held)

    def look_again(
        self, r: Resolved, idx: Index, at_ms: float, res: Out
    ) -> tuple[Resolved, Index] | None:
        """A miss: the series' node's entries read again (at most once a second per node)
        and the series resolved against the newest maps (None: they are idx); counted by
        what came of it."""
        labels = labels_of(r)
        ns, name = self.named(labels)
        read, fresh = self.indexer.look_again(
            r.node, labels.get("uid") or labels.get("pod_uid") or "", (ns, name) if ns else None
        )
        new = None
        if fresh is not idx:
            new = self.again(r, fresh)
            if new.key:
                self.cache[new.key] = new
        found = new is not None and self.pod_at(new, fresh, at_ms) in fresh.pods
        res.misses["found" if found else "not_found" if read else "throttled"] += 1
        return None if new is None else (new, fresh)

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
        return [
            {
                **labels,
                "__name__": "workload_" + labels.get("__name__", ""),
                "job": self.cfg.job,
                "pod_name": pod.name,
                "pod_uid": pod.uid,
                "workload_name": wname,
                "workload_uid": wuid,
            }
            for _, wname, wuid in pod.workloads
        ]

    def build(self, r: Resolved, pod_uid: str, idx: Index, original: bytes) -> None:
        """The copies' label bytes (and the proxied series') for this pod."""
        pod = idx.pods.get(pod_uid)
        labels = labels_of(r)
        r.held, r.held_pod = pod_uid, pod
        r.copies = tuple(wire.labels(lbl) for lbl in self.copies(labels, pod))
        if self.cfg.mode == "proxy":
            proxy = proxied(labels, pod)
            r.proxy = wire.labels(proxy) if proxy != labels else original
        if r.key:
            r.labels = None

    @staticmethod
    def reason(pod_uid: str, idx: Index) -> str:
        pod = idx.pods.get(pod_uid) if pod_uid else None
        if pod is None:
            return "no_pod"
        return "copied" if pod.workloads else "no_workload"

    # -- remote write 1.0 --------------------------------------------------------------
    def v1(self, data: bytes) -> Out:
        """A 1.0 request, read at the wire level where it can be: a WriteRequest is its
        series one after another, a series its labels then its samples (as Prometheus,
        vmagent and the OpenTelemetry Collector write them), so a series' label bytes are
        its cache key and its sample bytes go into its copies as they came. A series that
        is laid out otherwise (fields interleaved, exemplars, histograms) is read through
        protobuf."""
        idx = self.indexer.index
        proxy = self.cfg.mode == "proxy"
        out: list[bytes] = []
        res = Out(b"")
        pos, n = 0, len(data)
        count = 0  # series read (their place in the request names one left out)
        try:
            while pos < n:
                tag = data[pos]
                if tag & 7 != 2:  # only length-delimited fields in a WriteRequest
                    raise ValueError(f"a field of wire type {tag & 7} in a WriteRequest")
                length, start = _len(data, pos + 1)
                end = start + length
                if end > n:
                    raise ValueError("a field longer than the request")
                if tag == 0x0A:  # (a miss may bring newer maps: the rest reads them)
                    mark = res.mark(out)
                    try:
                        idx = self._series(data[start:end], idx, proxy, out, res)
                    except (ValueError, IndexError, DecodeError) as exc:  # it alone
                        res.left_out(
                            out, mark, f"series {count}" f"{described(data[start:end])}", exc
                        )
                    count += 1
                elif tag == 0x1A and proxy:  # metadata: it goes on with the series
                    out.append(data[pos:end])
                pos = end
        except (ValueError, IndexError, DecodeError) as exc:
            raise wire.WireError(400, f"not a prometheus.WriteRequest: {exc}") from None
        res.series = len(out) - sum(1 for o in out if o[0] == 0x1A)
        res.body = b"".join(out)
        return res

    def _series(
        self, ts: bytes, idx: Index, proxy: bool, out: list[bytes], res: Out, looked: bool = False
    ) -> Index:
        """One series; the maps the request goes on with (newer after a miss)."""
        p, m = 0, len(ts)
        while p < m and ts[p] == 0x0A:  # the labels (a length under 128 read inline)
            b = ts[p + 1]
            if b < 0x80:
                p += 2 + b
            else:
                length, q = wire.read_uvarint(ts, p + 1)
                p = q + length
        if p > m:
            raise ValueError("a label longer than its series")
        key = ts[:p]
        r = self.cache.get(key)
        if r is None:
            r = self.resolve(
                {lb.name: lb.value for lb in pb1.TimeSeries.FromString(key).labels}, idx
            )
            r.key = key
            if len(self.cache) >= CACHE_MAX:
                self.cache.clear()
            self.cache[key] = r
        elif r.generation != idx.generation or r.stamp != idx.stamps.get(r.node, 0):
            r = self.cache[key] = self.again(r, idx)
        # the samples: only Sample fields, else the series is read through protobuf
        q, count = p, 0
        settled = r.settled
        need = (
            not res.oldest_ms or not settled and (r.static is None or (not looked and bool(r.node)))
        )
        times: list[int] = []
        while q < m:
            if ts[q] != 0x12:
                return self._series_pb(
                    pb1.TimeSeries.FromString(ts), key, r, idx, proxy, out, res, looked=looked
                )
            length, start = _len(ts, q + 1)
            q = start + length
            count += 1
            if need:
                times.append(_sample_time(ts, start, q))
        if q > m:
            raise ValueError("a sample longer than its series")
        if not count:
            return idx
        pod_uid = r.static if r.static is not None else self.pod_at(r, idx, times[0])
        at = times[0] if times else 0  # (none: the series names no node, or has a pod)
        if not settled and not looked and pod_uid not in idx.pods and self.missing(r, idx, at):
            got = self.look_again(r, idx, at, res)
            if got is not None:
                return self._series(ts, got[1], proxy, out, res, looked=True)
        res.written.samples += count
        if times and not res.oldest_ms:
            res.oldest_ms = float(times[0])
        if r.static is None and any(self.pod_at(r, idx, t) != pod_uid for t in times):
            return self._series_pb(
                pb1.TimeSeries.FromString(ts),
                key,
                r,
                idx,
                proxy,
                out,
                res,
                counted=True,
                looked=True,
            )
        if r.held != pod_uid:
            self.build(r, pod_uid, idx, key)
        res.counts[self.reason(pod_uid, idx)] += count
        rest = ts[p:]
        for lb in r.copies:
            out.append(wire.timeseries(lb, rest))
        if proxy:
            out.append(wire.timeseries(r.proxy, rest))
        return idx

    def _series_pb(
        self,
        ts: pb1.TimeSeries,
        key: bytes,
        r: Resolved,
        idx: Index,
        proxy: bool,
        out: list[bytes],
        res: Out,
        counted: bool = False,
        looked: bool = False,
    ) -> Index:
        """A series read through protobuf: its samples, histograms and exemplars split by
        the pod holding its device at each one's time. The maps the request goes on
        with."""
        if not counted:
            res.written.samples += len(ts.samples)
        res.written.histograms += len(ts.histograms)
        res.written.exemplars += len(ts.exemplars)
        times = [s.timestamp for s in ts.samples] or [h.timestamp for h in ts.histograms]
        if not times:
            return idx
        if not res.oldest_ms:
            res.oldest_ms = float(times[0])
        if not looked:  # a miss at the first sample without a pod
            at = next((t for t in times if self.pod_at(r, idx, t) not in idx.pods), None)
            if at is not None and self.missing(r, idx, at):
                got = self.look_again(r, idx, at, res)
                if got is not None:
                    r, idx = got
        for pod_uid, part in self._split(r, idx, ts):
            if r.held != pod_uid:
                self.build(r, pod_uid, idx, key)
            part.ClearField("labels")
            rest = part.SerializeToString()
            res.counts[self.reason(pod_uid, idx)] += len(part.samples) + len(part.histograms)
            for lb in r.copies:
                out.append(wire.timeseries(lb, rest))
            if proxy:
                out.append(wire.timeseries(r.proxy, rest))
        return idx

    def _split(
        self, r: Resolved, idx: Index, ts: pb1.TimeSeries
    ) -> list[tuple[str, pb1.TimeSeries]]:
        """A series' samples, histograms and exemplars by the pod holding its device at
        each one's time, in time order."""
        parts: dict[str, pb1.TimeSeries] = {}
        for s in ts.samples:
            parts.setdefault(self.pod_at(r, idx, s.timestamp), pb1.TimeSeries()).samples.append(s)
        for h in ts.histograms:
            parts.setdefault(self.pod_at(r, idx, h.timestamp), pb1.TimeSeries()).histograms.append(
                h
            )
        for e in ts.exemplars:
            parts.setdefault(self.pod_at(r, idx, e.timestamp), pb1.TimeSeries()).exemplars.append(e)
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
        for k, src in enumerate(req.timeseries):
            mark = res.mark(new.timeseries)
            try:
                refs = src.labels_refs
                labels = {sym[refs[i]]: sym[refs[i + 1]] for i in range(0, len(refs) - 1, 2)}
                res.written.samples += len(src.samples)
                res.written.histograms += len(src.histograms)
                res.written.exemplars += len(src.exemplars)
                times = [s.timestamp for s in src.samples] or [h.timestamp for h in src.histograms]
                if not times:
                    continue
                r = self.resolve(labels, idx)
                pod_uid = self.pod_at(r, idx, times[0])
                if pod_uid not in idx.pods and self.missing(r, idx, times[0]):
                    got = self.look_again(r, idx, times[0], res)
                    if got is not None:
                        r, idx = got
                        pod_uid = self.pod_at(r, idx, times[0])
                res.counts[self.reason(pod_uid, idx)] += len(times)
                pod = idx.pods.get(pod_uid)
                for lbl in self.copies(labels, pod):
                    copy(src, lbl)
                if self.cfg.mode == "proxy":
                    copy(src, proxied(labels, pod))
                oldest = min(oldest, times[0])
            except IndexError:  # it alone: the rest of the request goes on
                named = {
                    sym[a]: sym[b]
                    for a, b in zip(src.labels_refs[::2], src.labels_refs[1::2], strict=False)
                    if a < len(sym) and b < len(sym)
                }
                res.left_out(
                    new.timeseries,
                    mark,
                    f"series {k}{shown(named)}",
                    ValueError("a label, exemplar or metadata reference past the " "symbols table"),
                )
        res.series = len(new.timeseries)
        res.body = new.SerializeToString() if res.series else b""
        res.oldest_ms = oldest if oldest != float("inf") else 0.0
        return res


def _len(data: bytes, pos: int) -> tuple[int, int]:
    """A field's length (a varint at pos) and where its bytes start."""
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    return wire.read_uvarint(data, pos)


def _sample_time(ts: bytes, start: int, end: int) -> int:
    """A Sample's timestamp (field 2, a varint; absent: 0) from its bytes."""
    p = start
    while p < end:
        tag = ts[p]
        if tag == 0x09:  # value, a double
            p += 9
        elif tag == 0x10:
            value, _ = wire.read_uvarint(ts, p + 1)
            return value - (1 << 64) if value >= 1 << 63 else value
        else:
            raise ValueError(f"field tag {tag:#x} in a Sample")
    return 0
