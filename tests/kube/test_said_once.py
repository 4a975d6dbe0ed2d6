"""A list and watch that keeps failing says each failure once, when it is news (a new kind, or
the first after a list), never at every retry: what a failure is comes from its HTTP status or
its type, never from its message (which may differ at every try)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from mig_exporter.kube import api

# What a try can meet: the API's refusals by status, and an API not there (its message naming a
# new connection object each time).
FAILURES = ("403", "404", "500", "down", "ok")


def _raise(kind: str, i: int) -> None:
    if kind == "down":
        raise ConnectionError(f"<urllib3.connection.HTTPConnection object at 0x{i:x}>: refused")
    if kind != "ok":
        raise ApiException(status=int(kind), reason="Forbidden")


def _expected(script: list[str]) -> int:
    """Lines said: each failure that differs from the last said since the last good list."""
    said, last = 0, None
    for kind in script:
        if kind == "ok":
            last = None
        elif kind != last:
            said, last = said + 1, kind
    return said


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(FAILURES), min_size=1, max_size=30))
def test_each_failure_is_said_once_until_it_changes_or_a_list_succeeds(script: list[str]) -> None:
    stop = threading.Event()
    heard: list[str] = []
    tries = iter(enumerate(script))

    def list_call(**kw: Any) -> Any:
        if kw.get("watch"):
            raise ApiException(status=410)  # list again: the next try of the script
        try:
            i, kind = next(tries)
        except StopIteration:
            stop.set()  # the end: one last failure, of a kind never met before
            raise ApiException(status=599) from None
        _raise(kind, i)
        return type("Page", (), {"data": b'{"items": [], "metadata": {"resourceVersion": "1"}}'})

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    api.log.addHandler(handler)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(api.Backoff, "wait", lambda self, stop: None)
        try:
            api.list_watch("claims", list_call, lambda items: None, lambda k, o: None, stop,
                           on_error=heard.append)  # fmt: skip
        finally:
            api.log.removeHandler(handler)
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == _expected(script) + 1
    assert len(heard) == sum(k != "ok" for k in script) + 1  # on_error hears every one
