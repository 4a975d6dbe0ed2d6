"""Kubernetes label selectors, matched here: for what is read from files (`render`), and for the
nodes a daemon picks out of a watch of every node.

The syntax of `kubectl -l` (k8s.io/apimachinery `labels.Parse`): requirements separated by
commas, each `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (a,b)` or
`key notin (a,b)`. An empty selector matches everything.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

Selector = Callable[[Mapping[str, str]], bool]

_KEY = r"(?:[a-z0-9A-Z](?:[-a-zA-Z0-9_.]*[a-zA-Z0-9])?/)?[a-zA-Z0-9](?:[-a-zA-Z0-9_.]*[a-zA-Z0-9])?"
_VALUE = r"(?:[a-zA-Z0-9](?:[-a-zA-Z0-9_.]*[a-zA-Z0-9])?)?"
_REQUIREMENT = re.compile(
    rf"\s*(?:(?P<not>!)\s*(?P<absent>{_KEY})"
    rf"|(?P<key>{_KEY})\s*(?:(?P<op>==|=|!=)\s*(?P<value>{_VALUE})"
    rf"|\s(?P<set>in|notin)\s*\((?P<values>[^()]*)\))?)\s*(?:,|$)"
)


def parse(text: str) -> Selector:
    """A selector's test of a label set. ValueError, saying where, for what is no selector."""
    text = text.strip()
    tests: list[Selector] = []
    at = 0
    while at < len(text):
        m = _REQUIREMENT.match(text, at)
        if m is None or m.end() == at:
            raise ValueError(f"not a label selector at {text[at : at + 20]!r}")
        tests.append(_requirement(m))
        at = m.end()
        if at == len(text) and text.rstrip().endswith(","):
            raise ValueError("a label selector does not end with ','")
    return lambda labels: all(test(labels) for test in tests)


def _requirement(m: re.Match[str]) -> Selector:
    if m["absent"]:
        key = m["absent"]
        return lambda labels: key not in labels
    key, op, value = m["key"], m["op"], m["value"]
    if op in ("=", "=="):
        return lambda labels: labels.get(key) == value
    if op == "!=":
        return lambda labels: labels.get(key) != value
    if m["set"]:
        values = {v.strip() for v in m["values"].split(",")}
        if not all(re.fullmatch(_VALUE, v) for v in values):
            raise ValueError(f"bad value in {m[0].strip()!r}")
        if m["set"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    return lambda labels: key in labels


def terms(text: str) -> list[tuple[str, list[str] | None]]:
    """Each requirement's key and the values it names, of a selector `parse` takes (None: the
    requirement names none, `key` or `!key`)."""
    found: list[tuple[str, list[str] | None]] = []
    at, text = 0, text.strip()
    while at < len(text):
        m = _REQUIREMENT.match(text, at)
        if m is None or m.end() == at:
            break
        key = m["absent"] or m["key"]
        if m["absent"] or not (m["op"] or m["set"]):
            found.append((key, None))
            at = m.end()
            continue
        if m["set"]:  # `()` names no value at all; `(,)` names the empty one
            inner = m["values"].strip()
            values = [v.strip() for v in inner.split(",")] if inner else []
        else:
            values = [m["value"] or ""]
        found.append((key, values))
        at = m.end()
    return found
