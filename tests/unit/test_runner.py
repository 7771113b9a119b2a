"""core/runner: intervals and jitter, failures counted and contained, the leader gate,
stop, and the job metrics; a fake clock that the runner's wait advances (no sleeping)."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from lens_ebpf.core.collector import CollectorSet, PeriodicCollector
from lens_ebpf.core.runner import Job, JobMetrics, Runner


class FakeTime:
    """A clock that only waits move; the lanes end after `waits` waits."""

    def __init__(self, waits: int) -> None:
        self.now, self.left, self.waited = 1000.0, waits, []  # type: list[float]
        self.on_wait: list = []
        self.done = threading.Event()  # the waits are used up: the lane ends

    def clock(self) -> float:
        return self.now

    def wait(self, ended: threading.Event, seconds: float) -> bool:
        if self.left == 0:
            self.done.set()
        if ended.is_set() or self.left == 0:
            return True
        self.left -= 1
        self.waited.append(seconds)
        self.now += seconds
        for hook in self.on_wait:
            hook()
        return False


def ran(fake: FakeTime, jobs: list[Job], **kw) -> Runner:
    """Start a runner on fake time and return it once its lanes have ended."""
    runner = Runner(
        jobs,
        clock=fake.clock,
        wall=lambda: 1_700_000_000.0 + fake.now,
        wait=fake.wait,
        rand=kw.pop("rand", lambda: 0.0),
        **kw,
    )
    runner.start()
    assert fake.done.wait(5)
    runner.stop(timeout=5)
    return runner


def test_interval_first_run_and_the_order_within_a_lane() -> None:
    fake, seen = FakeTime(waits=3), []
    jobs = [
        Job(
            "a",
            10,
            lambda: seen.append(("a", fake.now)),
            leader_only=False,
            at_start=True,
            jitter=0,
            lane="one",
        ),
        Job(
            "b",
            10,
            lambda: seen.append(("b", fake.now)),
            leader_only=False,
            at_start=True,
            jitter=0,
            lane="one",
        ),
        Job("c", 20, lambda: seen.append(("c", fake.now)), leader_only=False, jitter=0, lane="one"),
    ]
    r = ran(fake, jobs)
    # a and b at once, in order; c first after its interval; then each every interval
    assert seen == [
        ("a", 1000),
        ("b", 1000),
        ("a", 1010),
        ("b", 1010),
        ("a", 1020),
        ("b", 1020),
        ("c", 1020),
    ]
    assert fake.waited == [0.0, 10.0, 10.0]
    assert (r.state["a"].runs, r.state["c"].runs) == (3, 1)


def test_jitter_bounds_each_wait() -> None:
    job = Job("a", 60, lambda: None, leader_only=False, jitter=0.1)
    low = Runner(rand=lambda: 0.0)
    high = Runner(rand=lambda: 0.999999)
    assert low.delay(job) == 60
    assert 65.99 < high.delay(job) < 66
    fake = FakeTime(waits=4)
    ran(fake, [Job("a", 60, lambda: None, leader_only=False, jitter=0.1)], rand=lambda: 0.5)
    assert fake.waited == [63.0, 63.0, 63.0, 63.0]
    assert Job("d", 1, lambda: None, leader_only=False).jitter == 0.05
    with pytest.raises(ValueError):
        Runner([Job("bad", 0, lambda: None, leader_only=False)])


def test_a_failing_job_is_counted_and_logged_and_the_others_run(caplog) -> None:
    def broken() -> None:
        raise RuntimeError("disk on fire")

    def down() -> None:
        raise ConnectionError("database down")

    fake, good = FakeTime(waits=3), []
    jobs = [
        Job("broken", 5, broken, leader_only=False, at_start=True, jitter=0, lane="l"),
        Job(
            "down",
            5,
            down,
            leader_only=False,
            at_start=True,
            jitter=0,
            lane="l",
            quiet=(ConnectionError,),
        ),
        Job(
            "good",
            5,
            lambda: good.append(fake.now),
            leader_only=False,
            at_start=True,
            jitter=0,
            lane="l",
        ),
    ]
    with caplog.at_level(logging.WARNING, logger="lens_ebpf.core.runner"):
        r = ran(fake, jobs)
    assert good == [1000, 1005, 1010]
    b = r.state["broken"]
    assert (b.runs, b.failures, b.last_success) == (3, 3, 0.0)
    assert b.last_error == "RuntimeError: disk on fire"
    assert (r.state["good"].runs, r.state["good"].failures) == (3, 0)
    loud = [x for x in caplog.records if "broken" in x.getMessage()]
    quiet = [x for x in caplog.records if "down" in x.getMessage()]
    assert len(loud) == 3 and all(x.exc_info for x in loud)  # with its traceback
    assert len(quiet) == 3 and not any(x.exc_info for x in quiet)
    assert quiet[0].getMessage() == "jobs job down: ConnectionError: database down"


def test_leader_only_jobs_wait_for_the_lead() -> None:
    """Passed over at its own times (counted), asking the gate every GATE_RECHECK seconds
    between them (not counted): the lead begins at 1023.5, the job runs at 1024, not at
    its next own time; then every interval from there."""
    fake, leading, seen = FakeTime(waits=40), [False], []
    fake.on_wait.append(lambda: leading.__setitem__(0, fake.now >= 1023.5))
    jobs = [
        Job(
            "write",
            10,
            lambda: seen.append(("write", fake.now)),
            leader_only=True,
            at_start=True,
            jitter=0,
            lane="l",
        ),
        Job(
            "read",
            10,
            lambda: seen.append(("read", fake.now)),
            leader_only=False,
            at_start=True,
            jitter=0,
            lane="l",
        ),
    ]
    r = ran(fake, jobs, is_leader=lambda: leading[0])
    assert [t for what, t in seen if what == "write"][:3] == [1024, 1034, 1044]
    assert [t for what, t in seen if what == "read"][:5] == [1000, 1010, 1020, 1030, 1040]
    w = r.state["write"]
    assert (w.skipped, w.failures) == (3, 0)  # at 1000, 1010, 1020; not a failure


def test_a_leader_gate_that_fails_skips_the_leader_only_job(caplog) -> None:
    def gate() -> bool:
        raise ConnectionError("API server unreachable")

    fake, seen = FakeTime(waits=20), []
    jobs = [
        Job(
            "write",
            10,
            lambda: seen.append("write"),
            leader_only=True,
            at_start=True,
            jitter=0,
            lane="l",
        ),
        Job(
            "read",
            10,
            lambda: seen.append("read"),
            leader_only=False,
            at_start=True,
            jitter=0,
            lane="l",
        ),
    ]
    with caplog.at_level(logging.WARNING):
        r = ran(fake, jobs, is_leader=gate)
    assert seen == ["read"] * 2  # the lane lives on; the leader-only job never ran
    assert (r.state["write"].runs, r.state["write"].skipped, r.state["write"].failures) == (0, 2, 0)
    assert "leader gate failed (ConnectionError: API server unreachable)" in caplog.text


def test_stop_joins_promptly_and_remove_ends_a_lane() -> None:
    runner = Runner(
        [
            Job("hourly", 3600, lambda: None, leader_only=False, at_start=True),
            Job("daily", 86400, lambda: None, leader_only=True),
        ]
    )
    runner.start()
    runner.add(Job("late", 3600, lambda: None, leader_only=False))  # starts at once
    threads = [t for t in threading.enumerate() if t.name.startswith("jobs-")]
    assert sorted(t.name for t in threads) == ["jobs-daily", "jobs-hourly", "jobs-late"]
    runner.remove("late")
    assert "late" not in runner.state
    assert not any(t.is_alive() for t in threads if t.name == "jobs-late")
    started = time.monotonic()
    runner.stop(timeout=5)
    assert time.monotonic() - started < 1
    assert not any(t.is_alive() for t in threads)
    assert runner.state["hourly"].runs == 1 and runner.state["daily"].runs == 0


def test_job_metrics_exact() -> None:
    fake = FakeTime(waits=0)
    calls = []

    def slow() -> None:
        calls.append(1)
        fake.now += 2.5
        if len(calls) == 2:
            raise ValueError("bad row")

    leading = [True]
    r = Runner(
        [
            Job("snapshot", 30, slow, leader_only=True),
            Job("index", 10, lambda: None, leader_only=False),
        ],
        is_leader=lambda: leading[0],
        clock=fake.clock,
        wall=lambda: 1_700_000_000.0 + fake.now,
    )
    assert r.run("snapshot")  # succeeds at 1002.5
    assert r.run("snapshot")  # fails
    leading[0] = False
    assert not r.run("snapshot")
    reg = CollectorRegistry()
    reg.register(JobMetrics(r, "lens_recorder_job"))
    snap, idx = {"job": "snapshot"}, {"job": "index"}

    def v(name: str, lbl: dict[str, str]) -> float | None:
        return reg.get_sample_value(f"lens_recorder_job_{name}", lbl)

    assert v("runs_total", snap) == 2 and v("errors_total", snap) == 1
    assert v("skipped_total", snap) == 1
    assert v("last_success_timestamp_seconds", snap) == 1_700_001_002.5
    assert v("duration_seconds", snap) == 2.5
    assert v("leader_only", snap) == 1 and v("leader_only", idx) == 0
    assert v("runs_total", idx) == 0 and v("last_success_timestamp_seconds", idx) == 0


class Counting(PeriodicCollector):
    name = "counting"

    def refresh(self) -> list:
        return []


def test_collector_set_runs_on_a_runner_and_keeps_its_metrics() -> None:
    fake = FakeTime(waits=3)
    runner = Runner(clock=fake.clock, wait=fake.wait, rand=lambda: 0.0)
    c = Counting(interval=15)
    cs = CollectorSet([c], runner=runner)
    cs.start()  # a refresh at once, then one per wait
    assert fake.done.wait(5)
    cs.stop()
    assert fake.waited == [15.0, 15.0, 15.0]
    reg = CollectorRegistry()
    reg.register(cs)
    lbl = {"collector": "counting"}
    assert reg.get_sample_value("lens_agent_collector_runs_total", lbl) == 4
    assert reg.get_sample_value("lens_agent_collector_success", lbl) == 1
    assert runner.state["collector-counting"].runs == 3


def test_the_contributing_pages_example_runs() -> None:
    """docs/contributing/job.md's example, as written."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "contributing" / "job.md").read_text()
    block = re.search(r"```python\n(.*?)```", page, re.S)
    assert block is not None
    example: dict = {}
    exec(compile(block.group(1), "docs/contributing/job.md", "exec"), example)
    runner, registry = example["runner"], example["registry"]
    try:
        deadline = time.monotonic() + 5
        while runner.state["quota"].runs == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        runner.stop()
    assert registry.get_sample_value("lens_recorder_job_runs_total", {"job": "quota"}) == 1
    assert registry.get_sample_value("lens_recorder_job_leader_only", {"job": "quota"}) == 1
