"""Kubernetes quantities as the API writes them: what a pod's NvFractions annotations and a claim's
consumed capacity hold."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mig_exporter.common.quantity import mib, parse


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7680Mi", 7680), ("8Gi", 8192), ("1500M", 1430), ("1Ki", 0), ("40960Mi", 40960),
     ("0", 0), ("1e9", 953), ("2.5Gi", 2560), (" 100Mi ", 100)],
)  # fmt: skip
def test_memory_quantities_read_as_whole_mib_rounded_down(text: str, expected: int) -> None:
    assert mib(text) == expected


def test_a_plain_portion_reads_as_its_decimal() -> None:
    assert parse("0.5") == Decimal("0.5")
    assert parse("500m") == Decimal("0.5")


@pytest.mark.parametrize(
    "bad", ["nan", "inf", "", "Mi", "1e400", "1.2.3Mi", "5 Mi", "0x10", None, 5]
)
def test_what_is_no_quantity_is_refused_in_one_line(bad: object) -> None:
    with pytest.raises(ValueError, match="expected a Kubernetes quantity") as e:
        mib(bad)
    assert "\n" not in str(e.value)


def test_negative_memory_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 0"):
        mib("-1Mi")


@given(st.integers(0, 2**40))
def test_mib_of_a_mib_quantity_is_that_number(n: int) -> None:
    assert mib(f"{n}Mi") == n
    assert mib(f"{n * 2**20}") == n
