"""The DRA benchmark (bench/dra.py) still runs and prints every figure, at a tiny size; no timing
is asserted, only what is no timing: a restart that found everything published wrote no slice."""

from __future__ import annotations

from tests.live.test_bench import bench_lines

FIGURES = (
    "machine: ",
    "commit: ",
    "ours publish 3 nodes: ",
    "ours publish CPU 3 nodes: ",
    "ours publish memory 3 nodes: ",
    "ours restart writes: ",
    "ours restart to serving events: ",
    "ours claim to ConfigMap, 2 claims one at a time: p50 ",
    "ours render 2 nodes YAML: ",
    "ours render 2 nodes JSON: ",
    "baseline HEAD publish 2 nodes: ",
    "baseline HEAD publish CPU 2 nodes: ",
    "baseline HEAD publish memory 2 nodes: ",
    "baseline HEAD render 2 nodes YAML: ",
    "baseline HEAD render 2 nodes JSON: ",
)


def test_the_dra_benchmark_prints_every_figure() -> None:
    """Its baseline is this tree's HEAD: the clone may have no older commit."""
    args = ["--nodes", "3", "--gpus", "2", "--runs", "1", "--claims", "2", "--baseline", "HEAD"]
    args += ["--baseline-nodes", "2", "--render-nodes", "2", "--timeout", "120"]
    lines = bench_lines("bench.dra", args, FIGURES)
    assert not any("did not finish" in line for line in lines), lines
    assert any(line.startswith("ours restart writes: 0 to ResourceSlices") for line in lines), lines
