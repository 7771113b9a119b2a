"""One runner for a service's periodic jobs: intervals, jitter, stop, the leader gate, and
what each run did (runs, failures, last success, last duration).

A job says whether it needs the leader (controller-runtime's NeedLeaderElection): the
runner runs a leader-only job only while is_leader() answers True, asked each time the job
is due; a job passed over because this replica does not lead is counted as skipped, not as
a failure, and asks again every GATE_RECHECK seconds (uncounted) until it runs: a replica
that comes to lead runs its jobs at once, not an interval later. An exception in a job is
logged and counted and never stops the runner or the other jobs. Jobs in one lane share a
thread and run in the order given (their first runs too); each job has a lane of its own
unless it names one. Observers (observe()) are told of each run, in the job's thread, once
it ended: the recorder keeps every run of its jobs that way (job history).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from lens_ebpf.core.exposition import counter, gauge

log = logging.getLogger(__name__)

JITTER = 0.05  # the default: each wait is up to 5% longer than the interval
GATE_RECHECK = 1.0  # seconds: a leader-only job passed over asks the gate again this soon


@dataclass(frozen=True)
class Job:
    """fn() every interval seconds (plus up to jitter x interval), and once at start
    when at_start. Failures of the quiet types are logged in one line (a database or an
    API that is down: expected, said at each run); any other with its traceback."""

    name: str
    interval: float
    fn: Callable[[], object]
    leader_only: bool
    at_start: bool = False
    jitter: float = JITTER
    lane: str = ""  # the thread it shares; "" is a thread of its own
    quiet: tuple[type[Exception], ...] = ()


@dataclass
class JobState:
    """What a job's runs did; timestamps are the wall clock's (unix seconds)."""

    runs: int = 0  # run, failed or not
    failures: int = 0
    skipped: int = 0  # due while this replica did not lead
    last_success: float = 0.0
    last_duration: float = 0.0
    last_error: str = ""


@dataclass(frozen=True)
class Run:
    """One run of a job as observers are told of it: wall-clock times (unix seconds), its
    error ("" when it did not fail) with its traceback, and what its function returned."""

    job: Job
    started: float
    ended: float
    duration: float  # the monotonic clock's
    error: str = ""
    stack: str = ""
    result: object = None


@dataclass
class _Lane:
    jobs: list[Job]
    ended: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


def _wait(event: threading.Event, seconds: float) -> bool:
    return event.wait(seconds)


class Runner:
    """Runs jobs in threads of its own until stop(); add() and remove() work while it runs.

    clock (monotonic seconds), wall (unix seconds), wait(event, seconds) -> whether the
    event is set, and rand() in [0, 1) are the runner's only ways to time, so a test passes
    a clock that its wait advances and runs without sleeping."""

    def __init__(
        self,
        jobs: Iterable[Job] = (),
        is_leader: Callable[[], bool] = lambda: True,
        name: str = "jobs",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        wait: Callable[[threading.Event, float], bool] = _wait,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.is_leader, self.name = is_leader, name
        self.clock, self.wall, self.wait, self.rand = clock, wall, wait, rand
        self.jobs: dict[str, Job] = {}
        self.state: dict[str, JobState] = {}
        self._lanes: dict[str, _Lane] = {}
        self._lock = threading.Lock()
        self._running = False
        self._stopped = False
        self.observers: list[Callable[[Run], None]] = []
        for job in jobs:
            self.add(job)

    def observe(self, observer: Callable[[Run], None]) -> None:
        """observer(run) after each run of each job, in that job's thread (a run passed
        over, not run, is not one); its failure is logged, the job's run stands."""
        self.observers.append(observer)

    def add(self, job: Job) -> None:
        """Register a job; while running, its lane starts now (a lane that runs already
        takes no more jobs: give the job a lane of its own)."""
        if job.interval <= 0 or job.jitter < 0:
            raise ValueError(f"job {job.name}: interval {job.interval}, jitter {job.jitter}")
        with self._lock:
            if job.name in self.jobs:
                raise ValueError(f"job {job.name} is there already")
            lane = self._lanes.setdefault(job.lane or job.name, _Lane([]))
            if lane.thread is not None:
                raise ValueError(f"job {job.name}: lane {job.lane or job.name} runs already")
            lane.jobs.append(job)
            self.jobs[job.name] = job
            self.state[job.name] = JobState()
            if self._running:
                self._start(job.lane or job.name, lane)

    def remove(self, name: str, timeout: float = 3.0) -> None:
        """Run the job no more (its state goes too); its lane's thread ends with its last
        job."""
        with self._lock:
            job = self.jobs.pop(name, None)
            self.state.pop(name, None)
            if job is None:
                return
            lane = self._lanes[job.lane or job.name]
            lane.jobs.remove(job)
            if lane.jobs:
                return
            del self._lanes[job.lane or job.name]
            lane.ended.set()
        if lane.thread is not None and lane.thread is not threading.current_thread():
            lane.thread.join(timeout)

    def start(self) -> None:
        with self._lock:
            if self._running or self._stopped:
                return
            self._running = True
            for key, lane in self._lanes.items():
                self._start(key, lane)

    def _start(self, key: str, lane: _Lane) -> None:
        lane.thread = threading.Thread(
            target=self._serve, args=(lane,), daemon=True, name=f"{self.name}-{key}"
        )
        lane.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every lane and join its thread (a run under way is finished, not cut)."""
        with self._lock:
            self._running, self._stopped = False, True
            lanes = list(self._lanes.values())
        for lane in lanes:
            lane.ended.set()
        deadline = time.monotonic() + timeout
        for lane in lanes:
            if lane.thread is not None:
                lane.thread.join(max(0.0, deadline - time.monotonic()))

    def delay(self, job: Job) -> float:
        """The wait before the job's next run: its interval, up to jitter x longer."""
        return job.interval * (1 + job.jitter * self.rand())

    def _serve(self, lane: _Lane) -> None:
        now = self.clock()
        due = {j.name: now if j.at_start else now + self.delay(j) for j in lane.jobs}
        regular = dict(due)  # each job's own times; due: when it is next looked at
        while lane.jobs:
            jobs = list(lane.jobs)
            if self.wait(lane.ended, max(0.0, min(due[j.name] for j in jobs) - self.clock())):
                return
            for j in jobs:
                if j not in lane.jobs or due[j.name] > self.clock():
                    continue
                at = self.clock()
                counted = at >= regular[j.name]  # one of its own times (not a recheck)
                if self._run(j, counted):
                    regular[j.name] = due[j.name] = self.clock() + self.delay(j)
                    continue
                if counted:
                    regular[j.name] = at + self.delay(j)
                # passed over: the gate is asked again soon (uncounted), so a replica
                # that comes to lead runs it within GATE_RECHECK, not an interval later
                due[j.name] = min(regular[j.name], at + GATE_RECHECK)

    def run(self, name: str) -> bool:
        """Run the job now, gated and counted as when it is due; whether it ran."""
        return self._run(self.jobs[name])

    def _leading(self, job: Job) -> bool:
        """Whether this replica leads now; a gate that cannot answer means no (the job
        waits for its next turn rather than run twice across replicas)."""
        try:
            return bool(self.is_leader())
        except Exception as exc:
            log.warning(
                "%s job %s: leader gate failed (%s: %s); not run",
                self.name,
                job.name,
                type(exc).__name__,
                exc,
            )
            return False

    def _run(self, job: Job, counted: bool = True) -> bool:
        name, st = job.name, self.state.get(job.name)
        if st is None:  # removed meanwhile
            return False
        if job.leader_only and not self._leading(job):
            st.skipped += counted  # once per time of its own passed over, not per look
            return False
        started, began, result, stack = self.clock(), self.wall(), None, ""
        try:
            result = job.fn()
        except Exception as exc:  # a failing job must not stop the runner or the others
            error = f"{type(exc).__name__}: {exc}"[:300]
            if isinstance(exc, job.quiet):
                log.warning("%s job %s: %s", self.name, name, error)
            else:
                log.exception("%s job %s failed", self.name, name)
            stack = "".join(traceback.format_exception(exc))[-4000:]
            st.failures += 1
        else:
            error = ""
            st.last_success = self.wall()
        st.last_duration = self.clock() - started
        st.last_error = error
        st.runs += 1
        if self.observers:
            run = Run(job, began, self.wall(), st.last_duration, error, stack, result)
            for observer in list(self.observers):
                try:
                    observer(run)
                except Exception:  # the observer's own failure; the run stands
                    log.exception("%s job %s: an observer of its run failed", self.name, name)
        return True


class JobMetrics(Collector):
    """A runner's jobs, by job: `<prefix>_runs_total`, `<prefix>_errors_total`,
    `<prefix>_skipped_total`, `<prefix>_last_success_timestamp_seconds`,
    `<prefix>_duration_seconds` and `<prefix>_leader_only` (the recorder's prefix is
    lens_recorder_job)."""

    def __init__(self, runner: Runner, prefix: str) -> None:
        self.runner, self.prefix = runner, prefix

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        p = self.prefix
        families = [
            (counter(f"{p}_runs", "Periodic job runs, by job"), "runs"),
            (counter(f"{p}_errors", "Periodic job runs that failed, by job"), "failures"),
            (
                counter(
                    f"{p}_skipped",
                    "Periodic job runs passed over: this replica did not " "lead",
                ),
                "skipped",
            ),
            (
                gauge(
                    f"{p}_last_success_timestamp_seconds",
                    "When the job last ran without " "failing (0: never)",
                ),
                "last_success",
            ),
            (
                gauge(f"{p}_duration_seconds", "How long the job's last run took"),
                "last_duration",
            ),
        ]
        leader = gauge(f"{p}_leader_only", "1 when the job runs on the leader only")
        for name, st in sorted(self.runner.state.copy().items()):
            lbl = {"job": name}
            for fam, attr in families:
                fam.add(lbl, getattr(st, attr))
            job = self.runner.jobs.get(name)
            leader.add(lbl, 1.0 if job and job.leader_only else 0.0)
        yield from (fam for fam, _ in families)
        yield leader
