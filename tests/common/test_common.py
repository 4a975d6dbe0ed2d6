"""The ground floor's promises, each on its own: bad bytes named by their flag, dates that stay
text, and JSON that is not UTF-8 refused as a value error."""

from __future__ import annotations

import os

import pytest

from common.process import not_utf8
from common.yamlload import load_document, load_documents, load_json

BAD = os.fsdecode(b"caf\xe9")  # as Python hands over an argument that is not UTF-8


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--node-name", BAD], "argument --node-name: not UTF-8 text: b'caf\\xe9'"),
        (["--node-name=" + BAD], "argument --node-name: not UTF-8 text: b'caf\\xe9'"),
        (["-n" + BAD], "argument -n: not UTF-8 text: b'caf\\xe9'"),
        (["-x", "--", BAD], "argument 3: not UTF-8 text: b'caf\\xe9'"),  # no flags after --
        (["-", BAD], "argument 2: not UTF-8 text: b'caf\\xe9'"),  # `-` is a value, not a flag
        ([BAD], "argument 1: not UTF-8 text: b'caf\\xe9'"),
        ([BAD, "--flag"], "argument 1: not UTF-8 text: b'caf\\xe9'"),  # nothing before the first
        (["--flag", "x=" + BAD], "argument --flag: not UTF-8 text: b'x=caf\\xe9'"),
        (["=" + BAD], "argument 1: not UTF-8 text: b'=caf\\xe9'"),
    ],
)
def test_a_value_that_is_not_utf8_is_named_by_its_flag(argv: list[str], said: str) -> None:
    assert not_utf8(argv, ()) == said


def test_a_long_value_is_cut_at_60_bytes() -> None:
    sixty, more = "a" * 59 + BAD[-1], "a" * 60 + BAD[-1]
    shown = repr(59 * b"a" + b"\xe9")
    assert not_utf8([sixty], ()) == f"argument 1: not UTF-8 text: {shown}"
    assert not_utf8([more], ()) == f"argument 1: not UTF-8 text: {60 * b'a'!r}..."


def test_a_surrogate_no_byte_made_is_shown_escaped() -> None:
    assert not_utf8(["\ud800"], ()) == "argument 1: not UTF-8 text: b'\\\\ud800'"


def test_dates_stay_text() -> None:
    """YAML 1.1 would make them datetimes (and an impossible one a crash): they are text here,
    as the API gives them."""
    text = "created: 2026-01-01T00:00:00Z\nday: 2026-02-30\n"
    assert load_document(text) == {"created": "2026-01-01T00:00:00Z", "day": "2026-02-30"}
    assert load_documents(text + "---\nx: 2026-01-01\n")[1] == {"x": "2026-01-01"}


def test_json_bytes_that_are_not_utf8_are_a_value_error() -> None:
    with pytest.raises(ValueError):
        load_json(b'{"a": "\xff"}')
