"""Report weeks: ISO weeks (Monday to Monday) in the configured timezone, and which one is
due at a time."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from lens_ebpf.recorder.errors import BadRequest

WEEK = timedelta(days=7)
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise BadRequest(f"timezone {name!r}: not an IANA zone (UTC, Europe/Berlin, ...)") from None


@dataclass(frozen=True)
class Week:
    """An ISO week in a timezone: start and end (exclusive) as UTC times."""

    year: int
    number: int
    tz: str = "UTC"

    @property
    def name(self) -> str:
        return f"{self.year}-W{self.number:02d}"

    @property
    def start(self) -> datetime:
        day = date.fromisocalendar(self.year, self.number, 1)
        return datetime.combine(day, time(), zone(self.tz)).astimezone(UTC)

    @property
    def end(self) -> datetime:
        day = date.fromisocalendar(self.year, self.number, 1) + WEEK
        return datetime.combine(day, time(), zone(self.tz)).astimezone(UTC)

    def before(self) -> Week:
        return containing(self.start - timedelta(days=3), self.tz)


def parse(text: str, tz: str = "UTC") -> Week:
    """`2026-W47` (ISO 8601's week date)."""
    m = re.fullmatch(r"(\d{4})-?W(\d{1,2})", text.strip())
    if not m:
        raise BadRequest(f"week {text!r}: expected an ISO week such as 2026-W47")
    year, number = int(m.group(1)), int(m.group(2))
    try:
        date.fromisocalendar(year, number, 1)
    except ValueError:
        raise BadRequest(f"week {text!r}: {year} has no week {number}") from None
    return Week(year, number, tz)


def containing(at: datetime, tz: str = "UTC") -> Week:
    """The week at falls in, as the timezone's calendar has it."""
    year, number, _ = at.astimezone(zone(tz)).isocalendar()
    return Week(year, number, tz)


def due(now: datetime, weekday: str, hour: int, tz: str = "UTC") -> Week:
    """The last completed week whose report is due by now: a week's report falls due on
    the weekday and hour after it ends (the week before that while the hour has not come)."""
    this = containing(now, tz)
    fire = datetime.combine(
        date.fromisocalendar(this.year, this.number, 1) + timedelta(days=WEEKDAYS.index(weekday)),
        time(hour),
        zone(tz),
    ).astimezone(UTC)
    last = this.before()
    return last if now >= fire else last.before()
