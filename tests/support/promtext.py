"""Reads Prometheus text exposition keeping what golden comparisons need: label order.

prometheus_client's parser validates the text; label order is taken from the raw line because
"exactly like dcgm-exporter" includes the order of labels.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Series:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str:
        return dict(self.labels)[key]

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.labels)


def parse(text: str) -> list[Series]:
    """The samples of an exposition Prometheus would take whole: it parses (prometheus_client),
    and no two samples have one name and label set (Prometheus rejects the scrape's duplicates).
    Every test that reads an exposition through here checks both."""
    list(text_string_to_metric_families(text))  # raises on anything Prometheus would reject
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        assert m, f"not a sample line: {line!r}"
        out.append(Series(m["name"], tuple(_LABEL.findall(m["labels"])), float(m["value"])))
    twice = duplicates(out)
    assert not twice, f"{len(twice)} duplicate sample(s), the first: {twice[0]}"
    return out


def by_name(series: list[Series], name: str) -> list[Series]:
    return [s for s in series if s.name == name]


def duplicates(series: list[Series]) -> list[Series]:
    """Every sample whose metric name and label set, in any label order, an earlier sample of
    the same text already has. Prometheus keeps one such sample per scrape and rejects the
    rest as duplicates, so one of the series is lost."""
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    out = []
    for s in series:
        key = (s.name, frozenset(s.labels))
        if key in seen:
            out.append(s)
        seen.add(key)
    return out


# What promtool's linter says of dcgm-exporter's own names: label names such as `modelName`,
# `UUID` and `GPU_I_ID`, counters without `_total`, and `DCGM_FI_DEV_PCIE_REPLAY_COUNTER`.
# The real dumps say the same. Any other finding, or a parse error, is a problem.
DCGM_NAMING_LINT = (
    "label names should be written in 'snake_case' not 'camelCase'",
    'counter metrics should have "_total" suffix',
    "metric name should not include type 'counter'",
)


def promtool_findings(text: str, allowed: tuple[str, ...] = ()) -> list[str]:
    """What `promtool check metrics` finds in the exposition beyond DCGM's own naming (and the
    `allowed` findings)."""
    binary = shutil.which("promtool")
    assert binary, (
        "promtool is required: run ./scripts/install-test-tools (Debian package prometheus)"
    )
    result = subprocess.run(
        [binary, "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    lines = (result.stdout + result.stderr).decode(errors="replace").splitlines()
    # 0: clean; 3: lint findings only; anything else (1: the text does not parse) fails.
    if result.returncode not in (0, 3):
        return lines or [f"exit {result.returncode}"]
    return [line for line in lines if not line.endswith((*DCGM_NAMING_LINT, *allowed))]
