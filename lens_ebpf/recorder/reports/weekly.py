"""Weekly reports: made for a cluster and a week (content, HTML, JSON, PDF), kept in
gpu_usage_weekly_reports, read by the API; and the leader's job that makes the last completed
week's report once it falls due."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, func, select

from lens_ebpf.core.times import aware, utc
from lens_ebpf.recorder.errors import BadRequest, NotFound, Unavailable
from lens_ebpf.recorder.reports import content, render
from lens_ebpf.recorder.reports.week import Week, containing, due
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store import schema
from lens_ebpf.recorder.store.writer import Op, Writer

log = logging.getLogger(__name__)
reports = schema.gpu_usage_weekly_reports
FORMATS = ("html", "pdf", "json")


@dataclass
class Made:
    """A report as made: its row's fields."""

    id: str
    cluster: str
    week: Week
    start: datetime
    end: datetime
    content: dict[str, Any]
    html: str
    pdf: bytes | None = None
    error: str = ""

    @property
    def status(self) -> str:
        return "failed" if self.error else "generated"

    def row(self, now: datetime) -> dict[str, Any]:
        return {
            "id": self.id,
            "cluster_name": self.cluster,
            "period_start": self.start,
            "period_end": self.end,
            "generated_at": now,
            "status": self.status,
            "html_content": self.html.encode(),
            "pdf_content": self.pdf,
            "json_content": self.content,
            "metadata": content.metadata(self.content),
            "error_message": self.error or None,
            "created_at": now,
            "updated_at": now,
        }

    def json(self) -> bytes:
        return (json.dumps(self.content, indent=2, sort_keys=True) + "\n").encode()


def report_id(cluster: str, week: Week) -> str:
    return f"rpt_{week.start:%Y%m%d}_{cluster}"


def make(
    conn: Connection,
    c: Scope,
    week: Week,
    now: datetime,
    opts: content.Options,
    chromium: str | None = "chromium",
) -> Made:
    """The report of a cluster's week (the current one: up to now); chromium None makes no
    PDF; a PDF that cannot be made is the report's error, its HTML and JSON made."""
    if week.start >= now:
        raise BadRequest(f"week {week.name} has not begun")
    end = min(week.end, now)
    got = content.weekly(conn, c, week.start, end, week.before().start, opts, week.name)
    made = Made(report_id(c.name, week), c.name, week, week.start, end, got, render.html(got))
    if chromium is not None:
        try:
            made.pdf = render.pdf(made.html, chromium)
        except Unavailable as exc:
            made.error = f"PDF: {exc}"
    return made


def _when(v: Any, fmt: str) -> str:
    return utc(v).strftime(fmt)


def _last(end: Any) -> datetime:
    """The last moment a period ending at end (exclusive) covers: its last day's."""
    got = aware(end)
    assert got is not None
    return got - timedelta(seconds=1)


def _item(row: Any, with_content: bool) -> dict[str, Any]:
    """A report as the original lists it (WeeklyReportItem, WeeklyReportDetailResponse);
    period_end is the last day the period covers."""
    out = {
        "id": row.id,
        "cluster_name": row.cluster_name,
        "period_start": _when(row.period_start, "%Y-%m-%d"),
        "period_end": _when(_last(row.period_end), "%Y-%m-%d"),
        "generated_at": _when(row.generated_at, "%Y-%m-%d %H:%M:%S"),
        "status": row.status,
        "has_html": bool(row.html_len),
        "has_pdf": bool(row.pdf_len),
        "has_json": row.has_json,
        "metadata": row.metadata,
        "error_message": row.error_message or "",
    }
    if with_content:
        out["json_content"] = row.json_content
    return out


def _columns(with_content: bool) -> list[Any]:
    c = reports.c
    cols = [
        c.id,
        c.cluster_name,
        c.period_start,
        c.period_end,
        c.generated_at,
        c.status,
        c["metadata"],
        c.error_message,
        func.coalesce(func.length(c.html_content), 0).label("html_len"),
        func.coalesce(func.length(c.pdf_content), 0).label("pdf_len"),
        c.json_content.is_not(None).label("has_json"),
    ]
    return [*cols, c.json_content] if with_content else cols


def listing(conn: Connection, cluster: str, status: str, page: int, size: int) -> dict[str, Any]:
    """The reports, newest period first (WeeklyReportsListResponse)."""
    cond = [reports.c.cluster_name == cluster] if cluster else []
    if status:
        cond.append(reports.c.status == status)
    total = int(conn.execute(select(func.count()).select_from(reports).where(*cond)).scalar_one())
    rows = conn.execute(
        select(*_columns(False))
        .where(*cond)
        .order_by(reports.c.period_start.desc(), reports.c.cluster_name)
        .offset((page - 1) * size)
        .limit(size)
    )
    return {"total": total, "page": page, "size": size, "reports": [_item(r, False) for r in rows]}


def detail(conn: Connection, report: str) -> dict[str, Any]:
    row = conn.execute(select(*_columns(True)).where(reports.c.id == report)).first()
    if row is None:
        raise NotFound(f"report {report!r}: not found")
    return _item(row, True)


def latest(conn: Connection, cluster: str) -> dict[str, Any]:
    row = conn.execute(
        select(*_columns(True))
        .where(reports.c.cluster_name == cluster)
        .order_by(reports.c.period_start.desc())
        .limit(1)
    ).first()
    if row is None:
        raise NotFound(f"cluster {cluster!r}: no report yet")
    return _item(row, True)


def download(conn: Connection, report: str, fmt: str) -> tuple[str, bytes]:
    """A report's file in a format: (file name, bytes); NotFound when it has none."""
    c = reports.c
    col = {"html": c.html_content, "pdf": c.pdf_content, "json": c.json_content}[fmt]
    row = conn.execute(
        select(c.cluster_name, c.period_end, c.error_message, col.label("body")).where(
            c.id == report
        )
    ).first()
    if row is None:
        raise NotFound(f"report {report!r}: not found")
    if row.body is None or row.body == b"":
        why = f" ({row.error_message})" if row.error_message else ""
        raise NotFound(f"report {report!r}: no {fmt.upper()} content{why}")
    week = containing(_last(row.period_end))
    name = f"gpu_usage_report_{row.cluster_name}_{week.name}.{fmt}"
    if fmt == "json":
        return name, (json.dumps(row.body, indent=2, sort_keys=True) + "\n").encode()
    return name, bytes(row.body)


@dataclass
class WeeklyReports:
    """The leader's job: per cluster, the last completed week's report once it is due (the
    configured weekday and hour after the week); a week with a row is not made again, so a
    restart makes nothing twice, and a service down at the hour makes it at its next run."""

    engine: Engine
    writer: Writer
    scopes: Callable[[], list[Scope]]
    weekday: str
    hour: int
    timezone: str
    opts: content.Options
    chromium: str | None
    made: list[str] = field(default_factory=list)  # the ids made by this process

    def run(self, now: datetime) -> list[str]:
        """One check: the reports made (their ids)."""
        week = due(now, self.weekday, self.hour, self.timezone)
        out = []
        for c in self.scopes():
            rid = report_id(c.name, week)
            if rid in self.made:
                continue
            with self.engine.connect() as conn:
                have = conn.execute(
                    select(reports.c.id).where(
                        reports.c.cluster_name == c.name, reports.c.period_start == week.start
                    )
                ).first()
                if have is not None:
                    self.made.append(rid)
                    continue
                got = make(conn, c, week, now, self.opts, self.chromium)
            if got.error:
                log.warning("weekly report %s: %s", rid, got.error)
            self.writer.submit(Op("gpu_usage_weekly_reports", _insert(got.row(now))))
            self.made.append(rid)
            out.append(rid)
        return out


def _insert(row: dict[str, Any]) -> Callable[[Connection], None]:
    def write(conn: Connection) -> None:  # a second maker of the week writes nothing
        # (the writer applies one write at a time; insert_new's bulk form takes no bytes)
        if (
            conn.execute(
                select(reports.c.id).where(
                    reports.c.cluster_name == row["cluster_name"],
                    reports.c.period_start == row["period_start"],
                )
            ).first()
            is None
        ):
            conn.execute(reports.insert(), row)

    return write


def job_for(
    r: Any, engine: Engine, writer: Writer, scopes: Callable[[], list[Scope]]
) -> WeeklyReports:
    """The job as the recorder's settings (recorder.reports, recorder.aggregation) make it."""
    rep = r.reports
    opts = options(r)
    return WeeklyReports(
        engine,
        writer,
        scopes,
        rep.weekday,
        rep.hour,
        rep.timezone,
        opts,
        rep.chromium if rep.pdf else None,
    )


def options(r: Any) -> content.Options:
    """What the content takes from recorder.reports and recorder.aggregation's label keys."""
    rep = r.reports
    return content.Options(
        tuple(r.aggregation.label_keys),
        rep.top_workloads,
        rep.low_utilization_percent,
        rep.timezone,
    )
