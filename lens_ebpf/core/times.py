"""Times as both services keep them: timezone-aware UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def aware(value: datetime | None) -> datetime | None:
    """A stored time with its zone: SQLite hands datetimes back without it, and every
    stored one is UTC."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
