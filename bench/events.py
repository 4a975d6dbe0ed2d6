"""Pod events alone: the latency distribution in a process that holds only the updater's state.

    .venv/bin/python -m bench.events [--nodes 5000]

bench/scale.py measures the same events after three runs of both sync paths; this is the focused
view, paced twice at 200/s and once unpaced, with p90/p95 and how many events passed 5 ms.
"""

from __future__ import annotations

import argparse
import gc

from bench import scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--events", type=int, default=2000)
    args = ap.parse_args()
    nodes, pods = scale.cluster(args.nodes, args.gpus)
    state, docs, *_ = scale.per_node_sync(nodes, pods)
    gc.freeze()  # as the controller does once a full list has settled
    seeded = scale.random.Random
    for seed, (label, rate) in enumerate(
        (("paced 200/s", 200.0), ("paced 200/s again", 200.0), ("unpaced", 1e9))
    ):
        # Another seed each time: the same events again would change nothing.
        scale.random.Random = lambda _s, seed=seed: seeded(seed)  # type: ignore[misc]
        latencies, _, achieved = scale.pod_events(state, docs, pods, args.events, rate)
        q = {p: scale.pct(latencies, p) * 1e3 for p in (50, 90, 95, 99)}
        over = sum(t > 0.005 for t in latencies)
        print(f"{label}: p50 {q[50]:.2f} p90 {q[90]:.2f} p95 {q[95]:.2f} p99 {q[99]:.2f} "
              f"max {max(latencies) * 1e3:.1f} ms; {over} of {len(latencies)} over 5 ms; "
              f"at {achieved:.0f}/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
