"""Times as both services keep them: timezone-aware UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(value: datetime) -> datetime:
    """A stored time in UTC: SQLite hands datetimes back without their zone (every stored
    one is UTC), PostgreSQL in its session's TimeZone (which need not be UTC)."""
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def aware(value: datetime | None) -> datetime | None:
    """utc() of a time that may be absent (a nullable column); None stays None."""
    return None if value is None else utc(value)
