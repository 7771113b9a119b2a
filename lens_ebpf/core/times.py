"""Times as both services keep them: timezone-aware UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def aware(value: datetime | None) -> datetime | None:
    """A stored time in UTC: SQLite hands datetimes back without their zone (every stored
    one is UTC), PostgreSQL in its session's TimeZone (which need not be UTC)."""
    if value is None:
        return None
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
