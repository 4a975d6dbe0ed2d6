"""Kubernetes timestamps compared as times, whatever their format."""

from __future__ import annotations

import datetime as dt

import pytest

from mig_exporter.kube.times import parse_time, timestamp

UTC = dt.UTC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T00:00:00Z", dt.datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01t00:00:00z", dt.datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01T05:00:00+05:00", dt.datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01T00:00:00.500000Z", dt.datetime(2026, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)),
        ("2026-01-01T00:00:00", dt.datetime(2026, 1, 1, tzinfo=UTC)),  # naive: UTC
    ],
)
def test_forms_writers_use(text: str, expected: dt.datetime) -> None:
    parsed = parse_time(text)
    assert parsed == expected and parsed is not None and parsed.tzinfo is not None
    assert timestamp(text) == expected.timestamp()


@pytest.mark.parametrize("value", ["", "yesterday", "2026-13-01T00:00:00Z", None, 5, ["x"],
                                   "2026-01-01T00:00:00Z" + " " * 60])  # fmt: skip
def test_what_is_no_time(value: object) -> None:
    assert parse_time(value) is None
    assert timestamp(value) is None


def test_datetimes_pass_through_aware() -> None:
    naive = dt.datetime(2026, 1, 1)
    assert parse_time(naive) == dt.datetime(2026, 1, 1, tzinfo=UTC)
    aware = dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert parse_time(aware) is aware
