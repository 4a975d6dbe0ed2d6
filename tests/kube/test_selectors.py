"""Label selectors as `kubectl -l` reads them (k8s.io/apimachinery labels.Parse)."""

from __future__ import annotations

import pytest

from mig_exporter.kube.selectors import parse

LABELS = {"type": "kwok", "gpu": "a100", "nvidia.com/mig.config": "all-enabled", "empty": ""}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("type=kwok", True),
        ("type==kwok", True),
        ("type=real", False),
        ("type!=real", True),
        ("absent!=x", True),  # != selects objects without the key too
        ("type", True),
        ("absent", False),
        ("!absent", True),
        ("!type", False),
        ("empty=", True),
        ("nvidia.com/mig.config=all-enabled", True),
        ("type=kwok,gpu=a100", True),
        ("type=kwok, gpu=h100", False),
        ("gpu in (a100,h100)", True),
        ("gpu in (h100, h200)", False),
        ("gpu notin (h100)", True),
        ("absent notin (x)", True),
        ("type=kwok,gpu in (a100),!absent,nvidia.com/mig.config", True),
    ],
)
def test_a_selector_matches_as_the_api_server_would(selector: str, matches: bool) -> None:
    assert parse(selector)(LABELS) is matches


@pytest.mark.parametrize(
    "selector", ["=x", "type=kwok,", "type in a100", "type=a b", "gpu in (a,b", "a=b=c", "!"]
)
def test_what_is_no_selector_is_refused(selector: str) -> None:
    with pytest.raises(ValueError, match=r"selector|bad value"):
        parse(selector)
