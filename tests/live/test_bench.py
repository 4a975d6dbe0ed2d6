"""The benchmark still runs and prints every figure (at a tiny size; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.base import ROOT

FIGURES = (
    "initial sync: per-node ",
    "node topology.yml: ",
    "pod event -> node document: p50 ",
    "pod event GC and kinds ",
    "pod event, whole-cluster path ",
    "exporter initial render: ",
    "exporter one node changes ",
    "scrape /metrics ours ",
    "scrape /metrics prometheus_client ",
    "updater memory, slimmed cache: VmRSS ",
    "initial sync from realistic objects: ",
    "updater memory during the initial sync: ",
    "updater memory, raw objects kept: VmRSS ",
)


def test_the_benchmark_prints_every_figure() -> None:
    args = ["--nodes", "20", "--exporter-nodes", "20", "--runs", "1", "--events", "20"]
    args += ["--rate", "1000", "--changes", "20", "--scrapes", "5"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.scale", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for figure in FIGURES:
        assert any(line.startswith(figure) for line in lines), (figure, done.stdout)


def test_the_focused_event_benchmark_runs() -> None:
    args = ["--nodes", "10", "--events", "12"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.events", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    labels = [line.split(":")[0] for line in done.stdout.splitlines()]
    assert labels == ["paced 200/s", "paced 200/s again", "unpaced"], done.stdout
