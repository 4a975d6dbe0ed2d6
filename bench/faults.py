"""GPU faults at cluster size (issue 35): one fleet fault policy over every node.

    python -m bench.faults [--nodes 5000] [--gpus 8] [--runs 3] [--fraction 0.02] [--lead 60]

The cluster is bench/scale.py's (A100-40GB dynamic-MIG nodes, every instance held). The policy:
`--fraction` of every GPU raises Xid 48 (NoSchedule), seeded. Median of --runs runs each:

1. the updater, in this process as `ClusterState` runs in it: the cluster settled, then the policy
   applied (`set_policy`, `settle`): the seconds it takes, how many GPUs it hits, and how many
   nodes' results change (only the nodes hit: only their documents and pools are written); then
   at the faults' start (`due`), how many nodes' taints change (the nodes hit, no other).
2. the many-nodes exporter as a process, on the cluster rendered without and with the policy's
   faults (`status_updater render --fault-policies --now`), side by side in one run: start-up,
   RSS and CPU per 10-s step while nobody scrapes, over --hold seconds of which the faults begin
   in the middle; and from the faults' start, the seconds until a hit node's page shows its Xid
   (within one collection step: at most 10 s, plus the poll's 0.1 s). The faults begin --lead
   seconds after the render and the exporter's start-up (the last render's time stands for this
   one's).

Benchmarks are not timed tests: tests/live/test_bench.py runs this at a tiny size and checks only
that every figure is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.many import ROOT, exporters, fetch, hold
from bench.scale import cluster, load, machine
from status_updater.faults import read_policy
from status_updater.state import ClusterState
from topology.configmap import LABEL_NODE_NAME
from topology.model import time_text

POLICY = "xid48-fleet"


def policy(fraction: float, at: float) -> dict[str, Any]:
    text = (f"gpus: {{fraction: {fraction}}}\nfault: {{fault: xid, xid: 48}}\n"
            f"start: {{at: '{time_text(int(at))}'}}\nseed: 35\n")  # fmt: skip
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": POLICY, "labels": {"mig-exporter/fault-policy": "true"}},
            "data": {"policy.yaml": text}}  # fmt: skip


def updater(nodes: list[dict[str, Any]], fraction: float, runs: int) -> None:
    """The policy in the updater's state: its cost, and what it changes."""
    at = time.time() + 3600
    cm = policy(fraction, at)
    times, hit, changed, tainted = [], 0, 0, 0
    for _ in range(runs):
        state = ClusterState.of(nodes, [], now=at - 60)
        started = time.perf_counter()
        state.set_policy(read_policy(cm, at - 60))
        found = state.settle()
        times.append(time.perf_counter() - started)
        hit = sum(len(e) for e in state.hits.get(POLICY, {}).values())
        changed = len(found)
        before = {n: state.taints(n) for n in state.results}
        due = state.due(at)
        tainted = sum(1 for n in due if state.taints(n) != before[n])
    gpus = sum(int(n["metadata"]["labels"]["nvidia.com/gpu.count"]) for n in nodes)
    print(f"updater: policy over {len(nodes)} nodes x {gpus // len(nodes)} GPUs applied in "
          f"{statistics.median(times):.2f} s (runs: {', '.join(f'{t:.2f}' for t in times)}); "
          f"hits {hit} of {gpus} GPUs; {changed} nodes' documents change, "
          f"{tainted} nodes' taints change at its start")  # fmt: skip


def render(work: Path, name: str, nodes: Path, pods: Path, extra: list[str]) -> Path:
    out = work / f"{name}.yaml"
    with out.open("w") as f:
        subprocess.run([sys.executable, "-m", "status_updater", "render", "--nodes", str(nodes),
                        "--pods", str(pods), *extra], cwd=ROOT, stdout=f, check=True)  # fmt: skip
    return out


def hit_node(topology: Path) -> str:
    """A node with a fault in the rendered List (its ConfigMap's document names the policy)."""
    import yaml

    for item in yaml.safe_load(topology.read_text())["items"]:
        if f"policy/{POLICY}" in item["data"]["topology.yml"]:
            return str(item["metadata"]["labels"][LABEL_NODE_NAME])
    raise SystemExit("the policy hit no node: raise --fraction")


def exporter(work: Path, args: argparse.Namespace, nodes: Path, pods: Path) -> None:
    """Ours on the healthy cluster and on the one with faults, side by side."""
    figures: dict[str, dict[str, list[float]]] = {"healthy": {}, "faults": {}}
    took = 0.0  # the last render's seconds: the faults begin after the next render and start-up
    for _ in range(args.runs):
        for name in ("healthy", "faults"):
            at = time.time() + took + args.lead
            extra: list[str] = []
            if name == "faults":
                (work / "policy.json").write_text(json.dumps(policy(args.fraction, at)))
                extra = ["--fault-policies", str(work / "policy.json")]
            started = time.monotonic()
            topology = render(work, name, nodes, pods, extra)
            took = time.monotonic() - started
            put = figures[name].setdefault
            with exporters(ROOT, topology, work, name, [[]]) as (proc,):
                put("start", []).append(proc.wait_ready(600))
                put("rss", []).append(proc.rss())
                if name == "faults":
                    if time.time() >= at:
                        raise SystemExit("the faults began before the exporter served: --lead")
                    target = hit_node(topology)
                    while time.time() < at:
                        time.sleep(0.05)
                    seen = _until_xid(f"{proc.url}/metrics/nodes/{target}", at)
                    put("applied", []).append(seen)
                (step,), (most,) = hold([proc], args.hold)
                put("step", []).append(step)
                put("rss most", []).append(most)
    for name, f in figures.items():
        m = {k: statistics.median(v) for k, v in f.items()}
        line = (f"exporter {name}: start-up {m['start']:.1f} s, RSS {m['rss']:.0f} MiB ready, "
                f"{m['rss most']:.0f} MiB at most; CPU per 10-s step {m['step']:.2f} s "
                f"(runs: {', '.join(f'{v:.2f}' for v in f['step'])})")  # fmt: skip
        if "applied" in m:
            line += (f"; faults' start to a hit node's Xid on its page: {m['applied']:.1f} s "
                     f"(runs: {', '.join(f'{v:.1f}' for v in f['applied'])})")  # fmt: skip
        print(line)


def _until_xid(url: str, at: float) -> float:
    while True:
        status, body = fetch(url)
        if status == 200 and b"DCGM_FI_DEV_XID_ERRORS{" in body and b"} 48" in body:
            return time.time() - at
        if time.time() - at > 60:
            raise SystemExit(f"{url}: no Xid 48 a minute after the faults' start")
        time.sleep(0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--fraction", type=float, default=0.02)
    # Whole steps: a window of whole steps holds as many renders whatever its phase (the faults'
    # run starts it just after a step's render began, the healthy one anywhere in a step).
    p.add_argument("--hold", type=float, default=40.0, help="seconds of steps measured")
    p.add_argument("--lead", type=float, default=30.0,
                   help="seconds from the exporter's start to the faults' (past its start-up)")  # fmt: skip
    args = p.parse_args()
    print(f"machine: {machine()}, load {load()}")
    node_objs, pod_objs = cluster(args.nodes, args.gpus)
    updater(node_objs, args.fraction, args.runs)
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        work = Path(tmp)
        nodes, pods = work / "nodes.json", work / "pods.json"
        nodes.write_text(json.dumps({"kind": "List", "items": node_objs}))
        pods.write_text(json.dumps({"kind": "List", "items": pod_objs}))
        exporter(work, args, nodes, pods)


if __name__ == "__main__":
    main()
