"""RBAC as the API server judges it: PolicyRules, and the request each API call is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.support.kubeapi import JournalEntry


def _matches(values: list[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def allowed(
    rules: list[dict[str, Any]], verb: str, resource: str, group: str = "", name: str | None = None
) -> bool:
    """RBAC semantics of a set of PolicyRules for one request (name=None: unnamed)."""
    for rule in rules:
        if not (
            _matches(rule.get("apiGroups", []), group)
            and _matches(rule.get("resources", []), resource)
            and _matches(rule.get("verbs", []), verb)
        ):
            continue
        names = rule.get("resourceNames")
        if not names or (name is not None and name in names):
            return True
    return False


@dataclass(frozen=True)
class Request:
    """What RBAC sees of a request: verb, API group, resource, namespace, name."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def request_of(entry: JournalEntry) -> Request | None:
    """The resource request a journal entry is; None for discovery (`/api`, `/version`)."""
    parts = entry.path.strip("/").split("/")
    if parts[0] == "api" and len(parts) > 2:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], (rest[1] if len(rest) > 1 else None)
    if entry.method == "GET":
        watching = entry.params.get("watch") in ("true", "1", "True")
        verb = "watch" if watching else "get" if name else "list"
        selector = entry.params.get("fieldSelector", "")
        if name is None and selector.startswith("metadata.name=") and "," not in selector:
            name = selector.removeprefix("metadata.name=")  # as RBAC's resourceNames sees it
    else:
        verb = _VERBS[entry.method]
    return Request(verb, group, resource, namespace, name)
