"""`/health` is never stuck on a loop that is: every exporter's render loop says when it will
publish again, and past that (by far more than a busy step takes) `/health` answers 503 instead
of answering for the last state. A busy loop is never called stuck."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pynvml
import pytest

from exporter import dcgm, nvml
from exporter.collector import NvmlExporter
from exporter.many import NodesExporter
from exporter.service import Exporter
from mig_exporter.web.server import MetricsServer, Published
from tests.exporter.test_exporter import MIG
from tests.exporter.test_many import doc
from tests.exporter.test_nvml import fake  # noqa: F401 (the fixture)
from tests.pipeline.test_cli import get
from tests.support.fakenvml import FakeNvml
from tests.support.kubeapi import eventually


@contextmanager
def looping(exporter: Any, published: Published) -> Iterator[Callable[[str], tuple[int, str]]]:
    stop = threading.Event()
    server = MetricsServer(published, "127.0.0.1", 0)
    server.start()
    loop = threading.Thread(target=exporter.run, args=(stop,), daemon=True)
    loop.start()

    def ask(path: str) -> tuple[int, str]:
        return get(f"http://127.0.0.1:{server.port}{path}")

    try:
        yield ask
    finally:
        stop.set()
        exporter.wake.set()
        server.stop()


def _topology_exporters() -> list[Any]:
    def one(published: Published) -> Any:
        e = Exporter("n1", dcgm.Options("h"), published)
        e.sink.update(doc("n1", MIG), "file")
        return e

    def many(published: Published) -> Any:
        e = NodesExporter(dcgm.Options("h"), published)
        e.sink.update(doc("n1", MIG), "file")
        return e

    return [pytest.param(one, id="one node"), pytest.param(many, id="all nodes")]


@pytest.mark.parametrize("make", _topology_exporters())
def test_a_render_loop_that_hangs_turns_health_to_503_and_back(
    monkeypatch: pytest.MonkeyPatch, make: Callable[[Published], Any]
) -> None:
    published = Published()
    exporter = make(published)
    exporter.stuck_s = 0.5
    monkeypatch.setattr(type(exporter), "due_in", lambda self: 0.05)
    release, hung = threading.Event(), threading.Event()
    real = type(exporter).snapshot

    def snapshot(self: Any) -> Any:
        if hung.is_set():
            release.wait()  # a bug, a lock never let go
        return real(self)

    monkeypatch.setattr(type(exporter), "snapshot", snapshot)
    with looping(exporter, published) as ask:
        eventually(lambda: ask("/health") == (200, "ok\n"))
        hung.set()
        _, reason = eventually(lambda: (r := ask("/health"))[0] == 503 and r, timeout=5)
        assert "stuck" in reason
        assert ask("/health/nodes/n1")[0] == 503
        assert ask("/metrics")[0] == 200  # the last series are still served
        release.set()
        hung.clear()
        eventually(lambda: ask("/health") == (200, "ok\n"))


def test_an_nvml_call_that_never_returns_turns_health_to_503(
    monkeypatch: pytest.MonkeyPatch,
    fake: FakeNvml,  # noqa: F811
) -> None:
    published = Published()
    exporter = NvmlExporter(pynvml, dcgm.Options("h"), published, interval_s=0.1)
    exporter.stuck_s = 0.5
    release, hung = threading.Event(), threading.Event()
    real = nvml.collect

    def collect(nv: Any) -> Any:
        if hung.is_set():
            release.wait()
        return real(nv)

    monkeypatch.setattr(nvml, "collect", collect)
    with looping(exporter, published) as ask:
        eventually(lambda: ask("/health") == (200, "ok\n"))
        hung.set()
        _, reason = eventually(lambda: (r := ask("/health"))[0] == 503 and r, timeout=5)
        assert "stuck" in reason
        release.set()
        hung.clear()
        eventually(lambda: ask("/health") == (200, "ok\n"))


def test_a_busy_loop_is_not_stuck(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop that takes long for a step (but publishes within its time) stays healthy."""
    published = Published()
    exporter = Exporter("n1", dcgm.Options("h"), published)
    exporter.sink.update(doc("n1", MIG), "file")
    exporter.stuck_s = 0.5
    monkeypatch.setattr(Exporter, "due_in", lambda self: 0.05)
    real = Exporter.snapshot

    def slow(self: Any) -> Any:
        threading.Event().wait(0.3)  # busy, within the time it has
        return real(self)

    monkeypatch.setattr(Exporter, "snapshot", slow)
    with looping(exporter, published) as ask:
        eventually(lambda: ask("/health") == (200, "ok\n"))
        for _ in range(15):
            assert ask("/health") == (200, "ok\n")
            threading.Event().wait(0.1)
