"""Pod labels on series, as dcgm-exporter's `--kubernetes-enable-pod-labels` puts them (from 4.x).

The allowlist (`--kubernetes-pod-label-allowlist-regex`, comma-separated) is matched against a
label's key as the pod has it, anywhere in the key (Go's `MatchString`, unanchored): any pattern
that matches lets it through; a pattern that does not compile is skipped, and with none left
every label passes. Values are never filtered. The updater copies what it lets through into the
topology (its `--pod-labels`), and the exporter filters again with its own flag.

`sanitize` is dcgm-exporter's SanitizeLabelName (4.8.3), and `placed` its collision rule: a key
already in use on the series becomes `pod_label_<key>`, then `pod_label_<key>_conflict<N>`.
Written here because no library does exactly this (prometheus_client has no sanitiser).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

_INVALID = re.compile(r"[^a-zA-Z0-9_]")
PREFIX = "pod_label_"


@dataclass(frozen=True)
class Allowlist:
    patterns: tuple[re.Pattern[str], ...]  # empty: every label

    @classmethod
    def parse(cls, texts: Iterable[str]) -> Allowlist:
        compiled = []
        for text in (t.strip() for raw in texts for t in raw.split(",")):
            if not text:
                continue
            try:
                compiled.append(re.compile(text))
            except re.error:  # skipped, as dcgm-exporter skips one it cannot compile
                continue
        return cls(tuple(compiled))

    def allows(self, key: str) -> bool:
        return not self.patterns or any(p.search(key) for p in self.patterns)

    def keep(self, labels: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in labels.items() if self.allows(k)}


def sanitize(name: str) -> str:
    """A Prometheus-safe label name: each other character `_`, a leading digit prefixed with
    `_`, and a leading `__` (reserved) cut to one."""
    out = _INVALID.sub("_", name)
    if not out:
        return "_"
    if out[0].isdigit():
        out = "_" + out
    if out.startswith("__"):
        out = "_" + out.lstrip("_")
    return out


def placed(labels: Iterable[tuple[str, str]], in_use: Collection[str]) -> list[tuple[str, str]]:
    """The pod's labels as names on a series whose other labels are `in_use`: in key order,
    sanitised, a name in use renamed."""
    used = set(in_use)
    out = []
    for key, value in sorted(labels):
        name = sanitize(key)
        if name in used:
            base = name = PREFIX + name
            n = 1
            while name in used:
                name = f"{base}_conflict{n}"
                n += 1
        used.add(name)
        out.append((name, value))
    return out
