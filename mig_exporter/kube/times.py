"""Kubernetes timestamps (RFC 3339, `Z` or an offset, with or without fractions) as times.

Compared as text they sort wrongly as soon as two writers format them differently
(`…:00Z` vs `…:00.5Z` vs `…+01:00`); compared as naive and aware datetimes they raise.
"""

from __future__ import annotations

import datetime as dt


def parse_time(value: object) -> dt.datetime | None:
    """An aware datetime (UTC when none is given), or None when `value` is not a time."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.upper())  # RFC 3339 allows a lowercase t and z
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def timestamp(value: object) -> float | None:
    """Seconds since the epoch of a Kubernetes timestamp, or None when it is not one."""
    parsed = parse_time(value)
    return None if parsed is None else parsed.timestamp()
