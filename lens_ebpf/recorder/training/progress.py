"""Training progress: the GPU pods' log lines through the format table into
training_points, each workload's rolling median of iteration times, and what departs
from it (training_slowdown, training_stalled in training_events), with the
lens_training_* metrics.

Per workload (the pods' top owner): an iteration is counted once however many ranks
print it (the first line wins; the same iteration again within DUPLICATE_SECONDS, or
two medians, is another rank's); an iteration longer than `slowdown_factor` x the
median of the last `window` iterations opens a slowdown, which ends at the first
iteration back under that bound (the median it opened with); no new iteration for
`stall_factor` x the median, while a pod of the workload runs, is a stall, which ends at
the next iteration. A line sent twice (a shipper's retry) is one point: by the pod, its
time and its text, in memory and in the table's unique key.
"""

from __future__ import annotations

import hashlib
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import Connection, and_, select, update

from lens_ebpf.core.exposition import Buckets, counter, gauge, histogram
from lens_ebpf.core.times import aware
from lens_ebpf.recorder.config import TrainingConfig
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.schema import scoped
from lens_ebpf.recorder.store.writer import Op, Writer, insert_rows
from lens_ebpf.recorder.tracker import TrackedPod
from lens_ebpf.recorder.training import formats
from lens_ebpf.recorder.training.logs import LogLine

MIN_WINDOW = 5  # iterations a median needs before anything is compared with it
DUPLICATE_SECONDS = 60.0
SEEN_MAX = 4096  # iterations remembered per workload (for duplicates)
RECENT_LINES = 512  # line keys remembered per pod (for a shipper's retries)
ITERATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
LAG_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
RESULTS = ("parsed", "not_progress", "not_gpu_pod", "no_workload", "duplicate")

PodLookup = Callable[[str, str, str], TrackedPod | None]


def line_key(pod_uid: str, at: datetime, text: str) -> str:
    return hashlib.sha1(f"{pod_uid}\0{at.isoformat()}\0{text}".encode()).hexdigest()


@dataclass
class Run:
    """One workload's progress."""

    uid: str
    namespace: str
    name: str
    window: deque[float]
    # recent iterations: when first seen, whether a line gave its time
    seen: OrderedDict[int, tuple[datetime, bool]] = field(default_factory=OrderedDict)
    last_iteration: int | None = None
    last_progress: datetime | None = None  # the newest iteration's time
    slow: tuple[datetime, float] | None = None  # an open slowdown: since, its median
    stalled: datetime | None = None  # an open stall: since
    seconds: Buckets = field(default_factory=lambda: Buckets(ITERATION_BUCKETS))
    gauges: dict[str, float] = field(default_factory=dict)  # tokens, tflops, loss: the last
    slowdowns: int = 0
    stalls: int = 0
    touched: datetime | None = None  # the service's clock at its last point

    def median(self) -> float | None:
        return statistics.median(self.window) if len(self.window) >= MIN_WINDOW else None


@dataclass
class PodLast:
    at: datetime | None = None
    iteration: int | None = None
    keys: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_LINES))
    key_set: set[str] = field(default_factory=set)

    def remember(self, key: str) -> bool:
        """False when the key was seen (the line again)."""
        if key in self.key_set:
            return False
        if len(self.keys) == self.keys.maxlen:
            self.key_set.discard(self.keys[0])
        self.keys.append(key)
        self.key_set.add(key)
        return True


@dataclass
class Batch:
    """What one request's lines bring: rows to write, event changes, counts."""

    points: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    ends: list[tuple[str, str, datetime, datetime]] = field(default_factory=list)  # uid,kind,at,end
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0))


class Training(Collector):
    def __init__(
        self,
        cfg: TrainingConfig,
        writer: Writer,
        pods: PodLookup,
        running: Callable[[], set[str]],
        clock: Callable[[], datetime],
        cluster: str = "local",
    ) -> None:
        self.cfg, self.writer, self.pods, self.running = cfg, writer, pods, running
        self.cluster = cluster  # its pods' (POST /logs reads the home cluster's pods)
        self.clock = clock
        self._lock = threading.Lock()
        self.runs: dict[str, Run] = {}
        self.last: dict[str, PodLast] = {}  # pod uid -> its last point
        self.lines: dict[str, int] = dict.fromkeys(RESULTS, 0)
        self.lag = Buckets(LAG_BUCKETS)
        self.malformed = 0  # shippers' records skipped (no line, no pod, a bad time)
        # a stall opened: (workload uid, the stall's time, why); the deep dive's stacks
        self.on_stall: Callable[[str, datetime, str], object] = lambda uid, at, why: None

    # -- ingest ----------------------------------------------------------------------
    def count_malformed(self, n: int) -> None:
        with self._lock:
            self.malformed += n

    def ingest(
        self, lines: list[LogLine], received: datetime, stored: Callable[[], None] | None = None
    ) -> tuple[dict[str, int], bool]:
        """Each line of a GPU pod that a format parses becomes a point; the points and
        what they open or close are queued for the database (stored() runs once they are
        committed). Counts by result, and whether anything was queued."""
        b = Batch()
        with self._lock:
            for line in lines:
                self._line(line, received, b)
            for k, n in b.counts.items():
                self.lines[k] += n
        if b.points or b.events or b.ends:
            return b.counts, self.writer.submit(
                Op("training_points", lambda conn: self.write(conn, b), done=stored)
            )
        return b.counts, False

    def _line(self, line: LogLine, received: datetime, b: Batch) -> None:
        at = line.at or received
        if line.at is not None:
            self.lag.observe(max(0.0, (received - line.at).total_seconds()))
        pod = self.pods(line.namespace, line.pod, line.pod_uid)
        if pod is None:  # most lines of a cluster: not parsed at all
            b.counts["not_gpu_pod"] += 1
            return
        prog = formats.parse(line.text)
        if prog is None:
            b.counts["not_progress"] += 1
            return
        if not pod.workload_uid:
            b.counts["no_workload"] += 1
            return
        last = self.last.setdefault(pod.uid, PodLast())
        key = line_key(pod.uid, at, line.text)
        if not last.remember(key):
            b.counts["duplicate"] += 1
            return
        b.counts["parsed"] += 1
        seconds = prog.iteration_seconds
        if (
            seconds is None
            and prog.derive_seconds
            and prog.iteration is not None
            and last.iteration is not None
            and last.at is not None
            and prog.iteration > last.iteration
            and at > last.at
        ):
            seconds = (at - last.at).total_seconds() / (prog.iteration - last.iteration)
        if prog.iteration is not None:
            last.at, last.iteration = at, prog.iteration
        b.points.append(
            {
                "cluster": self.cluster,
                "workload_uid": pod.workload_uid,
                "pod_uid": pod.uid,
                "namespace": pod.namespace,
                "pod": pod.name,
                "node": pod.node,
                "at": at,
                "received_at": received,
                "format": prog.format,
                "iteration": prog.iteration,
                "target_iterations": prog.target_iterations,
                "iteration_seconds": seconds,
                "tokens_per_second": prog.tokens_per_second,
                "tflops_per_gpu": prog.tflops_per_gpu,
                "loss": prog.loss,
                "skipped_iterations": prog.skipped_iterations,
                "nan_iterations": prog.nan_iterations,
                "samples_per_second": prog.samples_per_second,
                "line_key": key,
            }
        )
        run = self.runs.get(pod.workload_uid)
        if run is None:
            run = self.runs[pod.workload_uid] = Run(
                pod.workload_uid,
                pod.namespace,
                pod.workload_name or pod.workload_uid,
                deque(maxlen=self.cfg.window),
            )
        run.touched = self.clock()
        for name, value in (
            ("tokens_per_second", prog.tokens_per_second),
            ("tflops_per_gpu", prog.tflops_per_gpu),
            ("loss", prog.loss),
        ):
            if value is not None:
                run.gauges[name] = value
        if prog.iteration is not None:
            self._iteration(run, pod, prog.iteration, at, seconds, b)

    def _iteration(
        self, run: Run, pod: TrackedPod, it: int, at: datetime, seconds: float | None, b: Batch
    ) -> None:
        median = run.median()
        first = run.seen.get(it)
        near = timedelta(seconds=max(DUPLICATE_SECONDS, 2 * (median or 0)))
        if first is not None and abs(at - first[0]) <= near:
            # another rank's line of an iteration counted (or one more line of it, with the
            # time the first lacked: DeepSpeed prints step= before steps:)
            if seconds is None or first[1]:
                return
            run.seen[it] = (first[0], True)
        else:
            if run.last_iteration is not None and it < run.last_iteration:
                run.seen.clear()  # the run started over (from a checkpoint, or from 0)
            run.seen[it] = (at, seconds is not None)
            while len(run.seen) > SEEN_MAX:
                run.seen.popitem(last=False)
            run.last_iteration = it
            if run.last_progress is None or at > run.last_progress:
                run.last_progress = at
            if run.stalled is not None:
                b.ends.append((run.uid, "training_stalled", run.stalled, at))
                run.stalled = None
        if seconds is None:
            return
        run.seconds.observe(seconds)
        if run.slow is not None:
            since, base = run.slow
            if seconds <= self.cfg.slowdown_factor * base:
                b.ends.append((run.uid, "training_slowdown", since, at))
                run.slow = None
        elif median is not None and seconds > self.cfg.slowdown_factor * median:
            run.slow = (at, median)
            run.slowdowns += 1
            b.events.append(
                self._event(
                    run,
                    "training_slowdown",
                    at,
                    pod,
                    it,
                    seconds,
                    median,
                    {
                        "ratio": round(seconds / median, 6),
                        "factor": self.cfg.slowdown_factor,
                        "window": len(run.window),
                    },
                )
            )
        run.window.append(seconds)

    def _event(
        self,
        run: Run,
        kind: str,
        at: datetime,
        pod: TrackedPod | None,
        it: int | None,
        value: float | None,
        baseline: float | None,
        detail: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "workload_uid": run.uid,
            "namespace": run.namespace,
            "workload": run.name,
            "pod_uid": pod.uid if pod else "",
            "pod": pod.name if pod else "",
            "node": pod.node if pod else "",
            "kind": kind,
            "signal": "",
            "at": at,
            "ended_at": None,
            "iteration": it,
            "value": value,
            "baseline": baseline,
            "detail": detail,
        }

    # -- stalls ----------------------------------------------------------------------
    def check(self, now: datetime) -> int:
        """Open a stall for each running workload without a new iteration for
        stall_factor medians; forget the series of workloads quiet for series_ttl.
        The stalls opened."""
        running = self.running()
        b = Batch()
        ttl = timedelta(seconds=self.cfg.series_ttl_seconds)
        with self._lock:
            for uid, run in list(self.runs.items()):
                median = run.median()
                if (
                    run.stalled is None
                    and median is not None
                    and uid in running
                    and run.last_progress is not None
                    and now - run.last_progress > timedelta(seconds=self.cfg.stall_factor * median)
                ):
                    run.stalled = run.last_progress
                    run.stalls += 1
                    quiet = (now - run.last_progress).total_seconds()
                    b.events.append(
                        self._event(
                            run,
                            "training_stalled",
                            run.last_progress,
                            None,
                            run.last_iteration,
                            quiet,
                            median,
                            {"detected_at": int(now.timestamp()), "factor": self.cfg.stall_factor},
                        )
                    )
                if (
                    run.touched is not None
                    and now - run.touched > ttl
                    and run.slow is None
                    and run.stalled is None
                ):
                    del self.runs[uid]
        if b.events:
            self.writer.submit(Op("training_events", lambda conn: self.write(conn, b)))
        for ev in b.events:
            self.on_stall(ev["workload_uid"], ev["at"], "training_stalled")
        return len(b.events)

    # -- the database ----------------------------------------------------------------
    def write(self, conn: Connection, b: Batch) -> None:
        insert_rows(conn, t.training_points, b.points, keys=["cluster", "line_key"])
        if b.events:
            conn.execute(t.training_events.insert(), b.events)
        ev = t.training_events
        for uid, kind, at, end in b.ends:
            conn.execute(
                update(ev)
                .where(
                    and_(
                        ev.c.cluster == self.cluster,
                        ev.c.workload_uid == uid,
                        ev.c.kind == kind,
                        ev.c.at == at,
                        ev.c.ended_at.is_(None),
                    )
                )
                .values(ended_at=end)
            )

    def recover(self, conn: Connection, now: datetime) -> None:
        """Each workload with points in the last day: its last `window` iterations, so a
        restart of the service neither forgets a median nor counts an iteration twice;
        its open slowdown or stall."""
        mine = scoped(self.cluster)
        tp, ev = mine.training_points, mine.training_events
        since = now - timedelta(days=1)
        uids = [
            r[0]
            for r in conn.execute(
                select(tp.c.workload_uid).where(tp.c.at >= since).group_by(tp.c.workload_uid)
            )
        ]
        for uid in uids:
            rows = list(
                conn.execute(
                    select(tp)
                    .where(tp.c.workload_uid == uid, tp.c.iteration.is_not(None))
                    .order_by(tp.c.at.desc(), tp.c.id.desc())
                    .limit(4 * self.cfg.window)
                )
            )
            if not rows:
                continue
            name = conn.execute(
                select(mine.gpu_workloads.c.name).where(mine.gpu_workloads.c.uid == uid)
            ).scalar_one_or_none()
            run = Run(uid, rows[0].namespace, str(name or uid), deque(maxlen=self.cfg.window))
            scratch = Batch()  # what was found then is stored already
            for r in reversed(rows):
                at = aware(r.at) or now
                pod = TrackedPod(
                    str(r.pod_uid), r.namespace, r.pod, r.node, True, uid, "", run.name
                )
                last = self.last.setdefault(pod.uid, PodLast())
                last.at, last.iteration = at, int(r.iteration)
                last.remember(str(r.line_key))
                self._iteration(run, pod, int(r.iteration), at, r.iteration_seconds, scratch)
            # the metrics start again; what is open is what the table says
            run.seconds, run.slowdowns = Buckets(ITERATION_BUCKETS), 0
            run.slow = run.stalled = None
            for e in conn.execute(
                select(ev.c.kind, ev.c.at, ev.c.baseline).where(
                    ev.c.workload_uid == uid,
                    ev.c.ended_at.is_(None),
                    ev.c.kind.in_(("training_slowdown", "training_stalled")),
                )
            ):
                if e.kind == "training_slowdown":
                    run.slow = (aware(e.at) or now, float(e.baseline or 0))
                else:
                    run.stalled = aware(e.at)
            run.touched = now
            self.runs[uid] = run

    # -- metrics ---------------------------------------------------------------------
    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            runs = sorted(self.runs.values(), key=lambda r: (r.namespace, r.name))
            lines = dict(self.lines)
            malformed = self.malformed
            lag = self.lag.copy()
            snapshot = [
                (
                    r.namespace,
                    r.name,
                    r.seconds.copy(),
                    dict(r.gauges),
                    r.slowdowns,
                    r.stalls,
                    r.slow is not None,
                    r.stalled is not None,
                )
                for r in runs
            ]
        yield counter(
            "lens_recorder_log_lines",
            "Log lines taken by POST /logs, by result: "
            "parsed (a progress point), not_progress (a GPU pod's other lines), "
            "not_gpu_pod, no_workload, duplicate (sent again)",
            lines,
            "result",
        )
        yield counter(
            "lens_recorder_log_records_malformed",
            "Shippers' records POST /logs " "skipped: no line, no pod, a time that does not parse",
            {"": malformed},
        )
        lag_fam = histogram(
            "lens_recorder_log_lag_seconds", "From a log line's time to its arrival"
        )
        lag_fam.add_buckets({}, lag.cumulative(), lag.total)
        yield lag_fam
        hist = histogram(
            "lens_training_iteration_seconds",
            "Time per training " "iteration, each iteration once (the logs' own figure)",
        )
        gauges = {
            name: gauge(f"lens_training_{name}", help_text)
            for name, help_text in (
                ("tokens_per_second", "Tokens per second per GPU, the last line's"),
                ("tflops_per_gpu", "TFLOP/s per GPU, the last line's"),
                ("loss", "Training loss, the last line's"),
            )
        }
        counters = {
            name: counter(f"lens_training_{name}", help_text)
            for name, help_text in (
                (
                    "slowdowns",
                    "Slowdowns opened (an iteration over slowdown_factor " "x the rolling median)",
                ),
                ("stalls", "Stalls opened (no progress for stall_factor x the " "median)"),
            )
        }
        active = {
            name: gauge(f"lens_training_{name}", help_text)
            for name, help_text in (
                ("slowdown_active", "1 while a slowdown is open"),
                ("stalled", "1 while a stall is open"),
            )
        }
        for ns, name, seconds, g, slowdowns, stalls, slow, stalled in snapshot:
            lbl = {"namespace": ns, "workload": name}
            hist.add_buckets(lbl, seconds.cumulative(), seconds.total)
            for key, value in g.items():
                gauges[key].add(lbl, value)
            counters["slowdowns"].add(lbl, slowdowns)
            counters["stalls"].add(lbl, stalls)
            active["slowdown_active"].add(lbl, slow)
            active["stalled"].add(lbl, stalled)
        yield hist
        yield from gauges.values()
        yield from counters.values()
        yield from active.values()
