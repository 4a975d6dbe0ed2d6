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


def bench_lines(module: str, args: list[str], figures: tuple[str, ...]) -> list[str]:
    """Run a benchmark at a tiny size; its lines, once each figure is seen among them."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for figure in figures:
        assert any(line.startswith(figure) for line in lines), (figure, done.stdout)
    return lines


def test_the_benchmark_prints_every_figure() -> None:
    args = ["--nodes", "20", "--exporter-nodes", "20", "--runs", "1", "--events", "20"]
    args += ["--rate", "1000", "--changes", "20", "--scrapes", "5"]
    bench_lines("bench.scale", args, FIGURES)


def test_the_focused_event_benchmark_runs() -> None:
    lines = bench_lines("bench.events", ["--nodes", "10", "--events", "12"], ())
    labels = [line.split(":")[0] for line in lines]
    assert labels == ["paced 200/s", "paced 200/s again", "unpaced"], lines


MANY = (
    "cluster: ",
    "baseline HEAD start-up, exec to serving every node: ",
    "baseline HEAD RSS: ",
    "baseline HEAD CPU per 10-s step, nobody scraping: ",
    "baseline HEAD whole /metrics, one scrape: ",
    "ours start-up, exec to serving every node: ",
    "ours RSS: ",
    "ours CPU per 10-s step, nobody scraping: ",
    "ours whole /metrics, one scrape: ",
    "ours node page, 10 fetched in turn: p50 ",
    "ours node page gzip, first scrape since its change: ",
    "ours node page identity, first scrape since its change: ",
    "2 shards start-up, all at once: ",
    "2 shards RSS: ",
    "2 shards CPU per 10-s step: ",
    "prometheus scrape_duration_seconds: p50 ",
    "prometheus RSS at most: ",
)


def test_the_many_nodes_benchmark_prints_every_figure() -> None:
    """At a tiny size, its baseline being this tree (the clone may have no older commit)."""
    args = ["--nodes", "12", "--gpus", "2", "--runs", "1", "--hold", "3", "--pages", "10"]
    args += ["--shards", "2", "--baseline", "HEAD", "--prometheus-targets", "6"]
    args += ["--prometheus-seconds", "6", "--scrape-interval", "2s"]
    lines = bench_lines("bench.many", args, MANY)
    # Not timings: what the shards and Prometheus saw.
    assert "2 shards serve every node exactly once: yes" in lines, lines
    assert any(line.startswith("prometheus 6 node targets every 2s") and "6 of 6 up" in line
               and ", 0 missed or failed" in line for line in lines), lines  # fmt: skip


FAULTS = (
    "updater: policy over 12 nodes x 2 GPUs applied in ",
    "exporter healthy: start-up ",
    "exporter faults: start-up ",
)


def test_the_fault_benchmark_prints_every_figure() -> None:
    args = ["--nodes", "12", "--gpus", "2", "--runs", "1", "--hold", "2", "--fraction", "0.5"]
    lines = bench_lines("bench.faults", [*args, "--lead", "4"], FAULTS)
    # Not timings: the policy changes only the nodes it hits, and the exporter shows it.
    (updater,) = [line for line in lines if line.startswith("updater: ")]
    changed = updater.split("GPUs; ")[1]
    assert changed.split(" nodes' documents change, ")[0] == changed.split(", ")[1].split(" ")[0]
    assert any("faults' start to a hit node's Xid on its page: " in line for line in lines)


KAI = (
    "updater with fractions: 6 nodes x 8 GPUs, ",
    "updater with fractions memory: ",
    "updater with fractions event, a fraction pod added on one node to its document: p50 ",
    "updater reservations only: 6 nodes x 8 GPUs, ",
    "updater reservations only memory: ",
    "updater reservations only event, a fraction pod added on one node to its document: p50 ",
    "updater fractions' cost: ",
    "exporter default (2022): start-up ",
    "exporter 4.8.4: start-up ",
    "exporter 4.8.4 virtual GPUs: start-up ",
    "exporter per-pod copies (4.8.4 virtual GPUs over 4.8.4): ",
)


def test_the_kai_benchmark_prints_every_figure() -> None:
    args = ["--nodes", "6", "--runs", "1", "--hold", "2", "--events", "3"]
    lines = bench_lines("bench.kai", args, KAI)
    # Not timings: the fraction pods are named on a page only with per-pod values.
    named = {line.split(": ")[0]: line.split(" series, ")[1] for line in lines
             if line.startswith("exporter ") and " series, " in line}  # fmt: skip
    assert named == {"exporter default (2022)": "0 fraction pods named",
                     "exporter 4.8.4": "0 fraction pods named",
                     "exporter 4.8.4 virtual GPUs": "10 fraction pods named"}, lines  # fmt: skip
