"""POST /logs's work: a log shipper's body into training points, counted by result."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from lens_ebpf.recorder.ingest.admission import Outcome
from lens_ebpf.recorder.store.writer import Writer
from lens_ebpf.recorder.training.logs import BodyError, LogLine, gunzip, parse_body
from lens_ebpf.recorder.training.progress import Training

STORED_SECONDS = 10.0  # the most a POST waits for its points' commit


def take_logs(
    training: Training,
    writer: Writer,
    body: bytes,
    encoding: str,
    query: dict[str, str],
    max_body: int,
    now: datetime,
    also: Callable[[list[LogLine], datetime], None] | None = None,
) -> Outcome:
    """The lines of a shipper's body (logs.py; query: its source's fields) stored: the
    answer waits for their commit, so a 200 means stored, and the sender retries anything
    else (the replicas' failover loses nothing: a line sent again is one point).
    also(lines, now): the lines to what else reads them (the log rules)."""
    if writer.depth() >= writer.queue_max:
        return Outcome(503, "the write queue is full (the database is slow or down): retry")
    if not writer.up:
        return Outcome(503, "the database is down: retry", headers={"Retry-After": "5"})
    try:
        got = parse_body(gunzip(body, encoding, max_body), query)
    except BodyError as exc:
        return Outcome(exc.status, str(exc))
    training.count_malformed(got.malformed)
    if also is not None and got.lines:
        also(got.lines, now)
    stored = threading.Event()
    counts, queued = training.ingest(got.lines, now, stored.set)
    if queued and not stored.wait(STORED_SECONDS):
        return Outcome(
            503,
            f"not stored within {STORED_SECONDS:.0f} s (the database is slow " "or down): retry",
            headers={"Retry-After": "5"},
        )
    data = {"shipper": got.shipper, "lines": len(got.lines), "malformed": got.malformed, **counts}
    if got.malformed and not got.lines:
        return Outcome(400, f"no record taken: {got.why}", data)
    return Outcome(200, f"skipped {got.malformed}: {got.why}" if got.malformed else "OK", data)
