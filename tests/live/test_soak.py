"""The soak still runs and prints every figure: 18 s of churn on 3 nodes instead of 10 minutes on
20 (`make soak` is the real one; see BENCHMARKS.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.base import ROOT

FIGURES = (
    "rss updater: start ",
    "rss exporter-all: start ",
    "rss exporter-node: start ",
    "ops: ",
    "scrapes: ",
    "converged: ",
    "verdict: PASS",
)


def test_the_soak_runs_and_prints_every_figure(tmp_path: Path) -> None:
    args = ["--minutes", "0.3", "--nodes", "3", "--warmup", "3"]
    args += ["--sample-every", "1", "--scrape-every", "1", "--logs", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for figure in FIGURES:
        assert any(line.startswith(figure) for line in lines), (figure, done.stdout)
    ops = next(line for line in lines if line.startswith("ops: "))
    # The churn did churn, and the soak's model of the cluster never disagreed with the API.
    assert re.search(r": [1-9]\d* pods created", ops) and "; 0 errors;" in ops, ops
