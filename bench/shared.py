"""A pod asking for more replicas than a time-sliced node has: how long placing it takes.

    .venv/bin/python -m bench.shared [--gpus 8] [--replicas 64 256 1024] [--runs 5]

One pod on one node of `--gpus` whole GPUs, each time-sliced `--replicas` ways (1024 is the most
a label may say), asking for one replica more than the node has: every replica is considered and
the pod is refused. Prints the median of `--runs` placements per size. Run it from two trees to
compare them side by side (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from status_updater.state import ClusterState


def node(gpus: int, replicas: int) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "Tesla-K80", "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/gpu.replicas": str(replicas),
              "nvidia.com/gpu.sharing-strategy": "time-slicing"}  # fmt: skip
    return {"kind": "Node", "metadata": {"name": "n", "labels": labels}}


def pod(count: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(count)}
    return {"kind": "Pod",
            "metadata": {"name": "p", "namespace": "a", "uid": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n", "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--replicas", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--budget", type=float, default=120.0, help="stop a size after this many s")
    args = ap.parse_args()
    for replicas in args.replicas:
        times: list[float] = []
        for _ in range(args.runs):
            started = time.perf_counter()
            state = ClusterState.of([node(args.gpus, replicas)], [pod(args.gpus * replicas + 1)])
            times.append(time.perf_counter() - started)
            assert len(state.all_warnings()) == 1  # refused: it does not fit
            if sum(times) > args.budget:
                break
        print(f"{args.gpus} GPUs x {replicas} replicas: median {statistics.median(times):.3f} s "
              f"over {len(times)} run(s)")  # fmt: skip


if __name__ == "__main__":
    main()
