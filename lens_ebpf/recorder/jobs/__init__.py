"""The recorder's periodic jobs (accounting/jobs.py, alerts/jobs.py, ...), each run by
core/runner and listed in service/schedule.py: how one is made, and what it may meet.

A job is made one of two ways, and only here: `leader_job()`, work done once for the
cluster (a write, an action on the cluster), which the runner runs only while this replica
leads (its gate asks RecorderApp.leads() before each run); `replica_job()`, work every
replica does for itself (its settings, its maps). The Leadership callbacks
(ingest/leadership.py) start and stop what runs continuously on the leader (the watches),
never a periodic job."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

from lens_ebpf.core.runner import Job
from lens_ebpf.recorder.prom import PromError

# what a job may meet and the runner logs in one line: the database or Prometheus down
FAILURES: tuple[type[Exception], ...] = (SQLAlchemyError, PromError)


def leader_job(
    name: str,
    interval: float,
    fn: Callable[[], object],
    *,
    at_start: bool = False,
    lane: str = "",
    quiet: tuple[type[Exception], ...] = FAILURES,
) -> Job:
    """fn every interval seconds on the leader alone (and once at start where at_start);
    lane: the thread it shares; quiet: what a failure is logged in one line for."""
    return Job(name, interval, fn, leader_only=True, at_start=at_start, lane=lane, quiet=quiet)


def replica_job(
    name: str,
    interval: float,
    fn: Callable[[], object],
    *,
    at_start: bool = False,
    quiet: tuple[type[Exception], ...] = FAILURES,
) -> Job:
    """fn every interval seconds on every replica (and once at start where at_start)."""
    return Job(name, interval, fn, leader_only=False, at_start=at_start, quiet=quiet)
