"""Names and label selectors checked as the API server checks them (k8s.io/apimachinery
`validation.IsDNS1123Label`, `IsDNS1123Subdomain`, `labels.Parse` with its key and value
limits), so that a daemon given one the API would refuse says so at start-up, in one line,
instead of retrying a 422 forever. Written here because the official client checks nothing
before it sends, and kubernetes-validate checks whole objects against the schema, not names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from mig_exporter.kube import selectors

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")

Check = Callable[[str], str | None]  # why the value is refused, or None


def dns1123_label(value: str) -> str | None:
    """A namespace's name (and a Service's): at most 63 lowercase letters, digits and '-'."""
    if len(value) > 63:
        return f"is {len(value)} characters, at most 63"
    if not _DNS1123_LABEL.fullmatch(value):
        return "must be lowercase letters, digits and '-', starting and ending with one of the first two"
    return None


def dns1123_subdomain(value: str) -> str | None:
    """The name of most objects (ConfigMap, Lease, Pod, Node, StatefulSet): at most 253
    characters, DNS labels joined by '.'."""
    if len(value) > 253:
        return f"is {len(value)} characters, at most 253"
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        return "must be lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
    return None


def label_selector(value: str) -> str | None:
    """A label selector (`kubectl -l`): its syntax, and each key's and value's length."""
    try:
        selectors.parse(value)
    except ValueError as e:
        return str(e)
    for key, values in selectors.terms(value):
        prefix, _, name = key.rpartition("/")
        if len(name) > 63 or len(prefix) > 253:
            return f"label key {key!r} is too long (a name of at most 63, a prefix of at most 253)"
        if prefix and dns1123_subdomain(prefix) is not None:
            return f"label key {key!r}: its prefix must be a DNS subdomain"
        if values == []:
            return f"the set of values for {key!r} is empty: 'in' and 'notin' need one at least"
        for v in values or ():
            if len(v) > 63:
                return f"label value {v[:20]!r}... is {len(v)} characters, at most 63"
    return None


def problem(checks: Iterable[tuple[str, str | None, Check]]) -> str | None:
    """The first of (what, value, check) whose value is refused, in one line; a value of None
    is not given, and not checked."""
    for what, value, check in checks:
        if value is not None and (why := check(value)) is not None:
            return f"{what} {value[:80]!r}: {why}"
    return None
