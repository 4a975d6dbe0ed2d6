"""Shared fixtures: the repository's samples, the hypothesis profile (tests/support/base.py), and
test ids mutmut can hand back to pytest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.base import SAMPLES


@pytest.fixture
def samples() -> Path:
    return SAMPLES


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A string with a blank at either end, or with a character outside ASCII, is named by its
    ascii(): mutmut hands test ids back to pytest as arguments, and pytest then finds no test
    whose id ends in a blank or holds the escape it made of such a character."""
    if isinstance(val, str) and (val != val.strip() or not val.isascii()):
        return ascii(val)
    return None
