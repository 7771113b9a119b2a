"""Remote write in (POST /prometheus, and /v1/prometheus, Primus-Lens's path), workload
copies (and in proxy mode every series) out to `recorder.remote_write.url`; and the maps
the copies are made by, as pods/cache and pods/workload/cache serve them.

A request with series that cannot be read is a partial write, as Prometheus takes one:
the rest written, then 400 naming those left out (a sender does not send a 400 again,
and what it would send again is written already); 2.0's headers say what was written."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from lens_ebpf.core.exposition import Buckets, counter, gauge, histogram
from lens_ebpf.recorder.config import RemoteWriteConfig
from lens_ebpf.recorder.errors import NotFound
from lens_ebpf.recorder.ingest.admission import Outcome
from lens_ebpf.recorder.remote_write import wire
from lens_ebpf.recorder.remote_write.forward import Forwarder
from lens_ebpf.recorder.remote_write.index import Indexer
from lens_ebpf.recorder.remote_write.relabel import Relabeler
from lens_ebpf.recorder.remote_write.series import MISSES, RESULTS

LAG_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
REFUSED = {400: "bad_body", 413: "too_large", 415: "unsupported", 503: "no_receiver"}


class RemoteWrite(Collector):
    def __init__(
        self,
        cfg: RemoteWriteConfig,
        engine: Engine,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        cluster: str = "local",
    ) -> None:
        self.cfg = cfg
        self.indexer = Indexer(engine, cfg.cache_seconds, clock, cluster)
        self.relabeler = Relabeler(cfg, self.indexer)
        self.forwarder = Forwarder(cfg) if cfg.url else None
        self.samples: dict[str, int] = dict.fromkeys(RESULTS, 0)
        self.misses: dict[str, int] = dict.fromkeys(MISSES, 0)
        self.written = 0  # series the receiver took (copies, and proxied series)
        self.invalid = 0  # series left out of a request (unreadable), the rest written
        self.refused: dict[str, int] = dict.fromkeys(REFUSED.values(), 0)
        self.lag = Buckets(LAG_BUCKETS)
        self.downstream = Buckets(SECONDS_BUCKETS)
        # what the service itself adds to a request (its time less the receiver's)
        self.added = Buckets(SECONDS_BUCKETS)
        self.recent_added: deque[float] = deque(maxlen=100_000)  # the last, exactly (bench)
        self._lock = threading.Lock()

    def _refuse(self, status: int, message: str) -> Outcome:
        with self._lock:
            key = REFUSED.get(status, "bad_body")
            self.refused[key] += 1
        return Outcome(status, message)

    def post(self, headers: dict[str, str], body: bytes) -> Outcome:
        """One sender's request (headers named in lower case): 204 once the receiver took
        what it became."""
        began = time.perf_counter()
        if self.forwarder is None:
            return self._refuse(
                503, "recorder.remote_write.url is not set: there is no " "receiver to write to"
            )
        try:
            version = wire.version(headers)
            data = wire.unsnappy(body, self.cfg.max_body_bytes)
            out = self.relabeler.v1(data) if version == wire.V1 else self.relabeler.v2(data)
        except wire.WireError as exc:
            return self._refuse(exc.status, str(exc))
        if any(out.misses.values()) or out.invalid:  # (whatever the receiver says)
            with self._lock:
                for k, n in out.misses.items():
                    self.misses[k] += n
                self.invalid += len(out.invalid)
        now_ms = time.time() * 1000
        took = 0.0
        if out.series:
            start = time.perf_counter()
            got = self.forwarder.send(version, out.body)
            took = time.perf_counter() - start
            if got.status == 400:
                with self._lock:
                    self.samples["rejected"] += out.written.samples + out.written.histograms
            if got.status != 204:
                extra = {"Retry-After": got.retry_after} if got.retry_after else {}
                return Outcome(got.status, got.message, headers=extra)
        with self._lock:
            for k, n in out.counts.items():
                self.samples[k] += n
            self.written += out.series
            if out.oldest_ms:
                self.lag.observe(max(0.0, (now_ms - out.oldest_ms) / 1000))
            if out.series:
                self.downstream.observe(took)
            added = time.perf_counter() - began - took
            self.added.observe(added)
            self.recent_added.append(added)
        said = {}
        if version == wire.V2:  # what 2.0 asks a receiver to say it wrote
            w = out.written
            said = {
                "X-Prometheus-Remote-Write-Samples-Written": str(w.samples),
                "X-Prometheus-Remote-Write-Histograms-Written": str(w.histograms),
                "X-Prometheus-Remote-Write-Exemplars-Written": str(w.exemplars),
            }
        if out.invalid:  # a partial write: the rest is written, these are named
            named = "; ".join(out.invalid)
            return Outcome(
                400,
                f"{len(out.invalid)} series left out, the rest written: " f"{named[:2000]}",
                {"invalid": out.invalid[:100]},
                headers=said,
            )
        return Outcome(204, "", headers=said)

    # -- the maps, as Primus-Lens serves them ------------------------------------------
    def _home(self, cluster: str) -> None:
        if cluster != self.indexer.cluster:
            raise NotFound(
                f"remote write serves cluster {self.indexer.cluster!r} only, not " f"{cluster!r}"
            )

    def pods_cache(self, cluster: str, only: str = "") -> dict[str, Any]:
        """node (only that one, when given) -> device label -> device -> [pod name, pod uid],
        the pods holding devices now (and since when, unix seconds, under `since`)."""
        self._home(cluster)
        idx = self.indexer.index
        by_slot: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for node, gpus in idx.gpus.items():
            for (match, value), slot in gpus.items():
                by_slot.setdefault((node, slot), []).append((match, value))
        for node, devices in idx.rdma.items():
            for dev in devices:
                by_slot.setdefault((node, dev), []).append(("rdma", dev))
        cache: dict[str, dict[str, dict[str, list[str]]]] = {}
        since: dict[str, dict[str, dict[str, int | None]]] = {}
        now = (idx.built or datetime.now(UTC)).timestamp() * 1000
        for (node, slot), names in sorted(by_slot.items()):
            if only and node != only:
                continue
            held = [
                (start, uid)
                for start, end, uid in idx.holders.get((node, slot), ())
                if start <= now < end
            ]
            if len(held) != 1 or held[0][1] not in idx.pods:
                continue
            start, uid = held[0]
            pod = idx.pods[uid]
            for label, match in self.relabeler.rules:
                for m, value in names:
                    if m == match:
                        cache.setdefault(node, {}).setdefault(label, {})[value] = [pod.name, uid]
                        since.setdefault(node, {}).setdefault(label, {})[value] = (
                            int(start / 1000) if math.isfinite(start) else None
                        )
        return {
            "updated_at": int(idx.built.timestamp()) if idx.built else None,
            "cache": cache,
            "since": since,
        }

    def workload_cache(self, cluster: str) -> dict[str, Any]:
        """pod name -> [[workload name, workload uid], ...] (every level above it), and the
        same by pod uid."""
        self._home(cluster)
        idx = self.indexer.index
        by_name: dict[str, list[list[str]]] = {}
        by_uid: dict[str, list[list[str]]] = {}
        for uid, pod in sorted(idx.pods.items()):
            pairs = [[wname, wuid] for _, wname, wuid in pod.workloads]
            by_name.setdefault(pod.name, []).extend(p for p in pairs if p not in by_name[pod.name])
            by_uid[uid] = pairs
        return {
            "updated_at": int(idx.built.timestamp()) if idx.built else None,
            "cache": by_name,
            "by_uid": by_uid,
        }

    # -- metrics ---------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            samples, refused, misses = dict(self.samples), dict(self.refused), dict(self.misses)
            written, invalid = self.written, self.invalid
            lag, down, added = (h.copy() for h in (self.lag, self.downstream, self.added))
        errors = dict(self.forwarder.errors) if self.forwarder else {}
        refreshes = dict(self.indexer.node_refreshes)
        yield counter(
            "lens_recorder_remote_write_samples",
            "Samples of remote write requests "
            "the receiver took, by result: copied (to workload_ series), no_pod, "
            "no_workload; rejected (the receiver refused them)",
            samples,
            "result",
        )
        yield counter(
            "lens_recorder_remote_write_series_written",
            "Series the receiver took " "(workload copies, and every series in proxy mode)",
            {"": written},
        )
        yield counter(
            "lens_recorder_remote_write_series_invalid",
            "Series left out of a "
            "request because they could not be read (labels or samples malformed, "
            "a 2.0 reference past its symbols), the rest of it written and the "
            "request answered 400 naming them",
            {"": invalid},
        )
        yield counter(
            "lens_recorder_remote_write_misses",
            "Series that found no pod but "
            "named, on a node, what the maps did not know (a device, a pod, the "
            "node, a device nobody held then), by what came of it: found once the "
            "node's entries were read again; not_found by that read; throttled "
            "(not read: the node's were within the last second, or a read failed "
            "just before)",
            misses,
            "result",
        )
        yield counter(
            "lens_recorder_remote_write_node_refreshes",
            "A node's entries read "
            "again on a miss (at most once a second per node), by result: changed "
            "(the maps took what was new), unchanged, failed (the database did not "
            "answer: none read again for remote_write.cache_seconds)",
            refreshes,
            "result",
        )
        yield counter(
            "lens_recorder_remote_write_refused",
            "Remote write requests refused: "
            "bad_body (400), too_large (413), unsupported (415), no_receiver (503)",
            refused,
            "reason",
        )
        yield counter(
            "lens_recorder_remote_write_downstream_errors",
            "The receiver's " "failures: unreachable, 5xx, 429, 4xx",
            dict(sorted(errors.items())),
            "reason",
        )
        for name, help_text, b in (
            (
                "lens_recorder_remote_write_lag_seconds",
                "From a request's first sample to " "its arrival",
                lag,
            ),
            (
                "lens_recorder_remote_write_downstream_seconds",
                "The receiver's time to answer",
                down,
            ),
            (
                "lens_recorder_remote_write_added_seconds",
                "What the service adds to a " "request it takes: its time less the receiver's",
                added,
            ),
        ):
            h = histogram(name, help_text)
            h.add_buckets({}, b.cumulative(), b.total)
            yield h
        idx = self.indexer.index
        g = gauge(
            "lens_recorder_remote_write_cache",
            "The copies' maps: series remembered, "
            "their generation (it moves when the maps change)",
        )
        g.add({"what": "series"}, len(self.relabeler.cache))
        g.add({"what": "generation"}, idx.generation)
        yield g
