"""The Detection Status page's routes (detection-status): each workload's training or
inference framework, its evidence, coverage and detection task, in the original's shapes."""

from __future__ import annotations

from typing import Any

from lens_ebpf.core.routes import Param, RouteTable
from lens_ebpf.recorder import inputs
from lens_ebpf.recorder.api.envelope import Ask, bad, integer, param
from lens_ebpf.recorder.detection import frameworks
from lens_ebpf.recorder.detection import status as detection_status

routes = RouteTable()
PAGE_MAX = 100


def who(ask: Ask) -> str:
    return ask.req.user or "api"


@routes.get("detection-status/summary")
def summary(ask: Ask) -> Any:
    """Workloads counted by status and by detection state, the ten latest."""
    return detection_status.summary(ask.conn, ask.c.name)


@routes.get(
    "detection-status",
    Param("status", choices=detection_status.STATUSES),
    Param("state", choices=detection_status.STATES, doc="the detection's state"),
    Param(
        "page",
        "integer",
        "the page, from 1",
        default=1,
        minimum=1,
        maximum=inputs.INT_MAX // PAGE_MAX,
    ),
    Param("page_size", "integer", "workloads a page", default=20, minimum=1, maximum=PAGE_MAX),
)
def statuses(ask: Ask) -> Any:
    """?status, state, page, page_size (20, at most 100): {data, total, page, page_size}."""
    q = ask.query
    num, size = integer(q, "page", 1), integer(q, "page_size", 20)
    if not 1 <= num <= inputs.INT_MAX // PAGE_MAX or not 1 <= size <= PAGE_MAX:
        raise bad(
            f"page={num}, page_size={size}: page 1 or more, page_size from 1 to " f"{PAGE_MAX}"
        )
    return detection_status.listing(
        ask.conn, ask.c.name, param(q, "status") or "", param(q, "state") or "", num, size
    )


@routes.get("detection-status/{workload_uid}")
def status(ask: Ask) -> Any:
    """One workload's framework detection: its status, framework stack, confidence,
    evidence sources, coverage per source and detection task."""
    return detection_status.one(ask.conn, ask.c.name, ask.arg("workload_uid"))


@routes.get("detection-status/{workload_uid}/coverage")
def coverage(ask: Ask) -> Any:
    """Per evidence source (process, log, image, label): collected or pending, attempts,
    evidence found."""
    return detection_status.coverage_of(ask.conn, ask.c.name, ask.arg("workload_uid"))


@routes.get("detection-status/{workload_uid}/coverage/log-gap")
def log_gap(ask: Ask) -> Any:
    """The log window received but not read for detection (none: lines are read as they
    come)."""
    return detection_status.log_gap(ask.conn, ask.c.name, ask.arg("workload_uid"))


@routes.get("detection-status/{workload_uid}/tasks")
def tasks(ask: Ask) -> Any:
    """The workload's detection task: its state, attempts, next attempt, who asked."""
    return detection_status.tasks_of(ask.conn, ask.c.name, ask.arg("workload_uid"))


@routes.get("detection-status/{workload_uid}/evidence", Param("source", choices=frameworks.SOURCES))
def evidence(ask: Ask) -> Any:
    """?source (process, log, image, label): its evidence, newest first."""
    return detection_status.evidence_of(
        ask.conn, ask.c.name, ask.arg("workload_uid"), param(ask.query, "source") or ""
    )


@routes.post("detection-status/{workload_uid}/coverage/initialize")
def coverage_initialize(ask: Ask) -> Any:
    """Coverage for a workload not looked at yet; a write (the API's credentials)."""
    return detection_status.initialize(
        ask.conn, ask.c.name, ask.arg("workload_uid"), ask.now(), who(ask)
    )


@routes.post("detection-status/{workload_uid}/trigger")
def trigger(ask: Ask) -> Any:
    """Detect the workload again at the leader's next look; a write."""
    return detection_status.trigger(
        ask.conn, ask.c.name, ask.arg("workload_uid"), ask.now(), who(ask)
    )
