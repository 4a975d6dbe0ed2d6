"""KAI-Scheduler GPU fractions at cluster size (issue 36): the updater and the exporter.

    python -m bench.kai [--nodes 5000] [--gpus 8] [--runs 3] [--events 50] [--hold 30]

The cluster: KWOK nodes of --gpus whole H100 80GB GPUs, labelled as samples/mig/kai/nodes.yaml.
On each node (8 GPUs) KAI's reservation pods hold half the GPUs, one GPU group each, and 2 or 3
fraction pods share each of them (`gpu-fraction` 0.25/0.5, `gpu-memory` MiB, one NvFractions
`nvidia.com/container.infer.gpu-memory.request: 16Gi`: 10 a node); a quarter of the GPUs are held
whole through the device plugin, the rest are free. Generated deterministically. Medians of
--runs runs each:

1. the updater, in a fresh interpreter per run as `ClusterState` runs in the daemon: the initial
   list (every Node and Pod slimmed into a fresh state) settled, every node's `topology.yml` made
   as `PerNodeWriter` makes it, the state's RSS (VmRSS after gc less before, and VmHWM) and, in
   one more interpreter, its tracemalloc size; then one event, a fraction pod added on one node
   (`set_pod`, `settle`, its document), on --events nodes in turn (p50, max). Side by side, the
   same cluster with the fraction pods left out (reservation pods only): what the fractions cost.
2. the many-nodes exporter as a process (`--all-nodes` on the cluster rendered by
   `status_updater render`, as bench/many.py and bench/faults.py run it), in three
   configurations side by side in one run: the default (2022 generation, no virtual GPUs),
   `--dcgm-exporter-version 4.8.4`, and `--dcgm-exporter-version 4.8.4
   --kubernetes-virtual-gpus` (each fraction pod its own copies with per-process values):
   start-up, RSS, CPU per 10-s step while nobody scrapes over --hold seconds, and one node's
   page (bytes, series, the fraction pods it names).

Benchmarks are not timed tests: tests/live/test_bench.py runs this at a tiny size and checks only
that every figure is printed.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from bench.faults import render
from bench.many import ROOT, baseline_tree, exporters, fetch, hold
from bench.scale import load, machine, node_document, pct
from status_updater import objects as rc
from status_updater.state import ClusterState
from topology import kai

CONFIGS = ("with fractions", "reservations only")
EXPORTERS: dict[str, list[str]] = {
    "default (2022)": [],
    "4.8.4": ["--dcgm-exporter-version", "4.8.4"],
    "4.8.4 virtual GPUs": ["--dcgm-exporter-version", "4.8.4", "--kubernetes-virtual-gpus"],
}
H100_MIB = "81559"
# What each GPU group's fraction pods ask (annotations), group by group: 2 or 3 pods a GPU, every
# kind KAI has, one NvFractions pod a node. None fills its GPU: an event's pod fits the first.
GROUPS: tuple[tuple[dict[str, str], ...], ...] = (
    ({kai.FRACTION: "0.5"}, {kai.FRACTION: "0.25"}),
    ({kai.MEMORY: "20000"}, {kai.MEMORY: "20000"}, {kai.FRACTION: "0.25"}),
    ({f"{kai.NV_PREFIX}infer{kai.NV_REQUEST}": "16Gi"}, {kai.FRACTION: "0.5"}),
    ({kai.MEMORY: "10000"}, {kai.FRACTION: "0.25"}, {kai.FRACTION: "0.25"}),
)


# --- the cluster ---------------------------------------------------------------------------------


def _uid(*parts: object) -> str:
    return str(uuid.UUID(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:32]))


def _stamp(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1795075200 + seconds))


def node_name(n: int) -> str:
    return f"h100-kai-{n:05d}"


def node_obj(n: int, gpus: int) -> dict[str, Any]:
    """Node n, as samples/mig/kai/nodes.yaml's: a KWOK node of whole H100s."""
    name = node_name(n)
    labels = {"kubernetes.io/hostname": name, "type": "kwok",
              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/gpu.memory": H100_MIB, "nvidia.com/mig.strategy": "none",
              "nvidia.com/gpu.deploy.dcgm-exporter": "true"}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": _uid("node", n), "creationTimestamp": _stamp(0),
                         "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {}, "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                                   "allocatable": {"nvidia.com/gpu": str(gpus)}}}  # fmt: skip


def _pod(n: int, name: str, namespace: str, t: int, labels: dict[str, str],
         annotations: dict[str, str], container: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": _uid("pod", n, name),
                         "creationTimestamp": _stamp(60 + t), "labels": labels,
                         "annotations": annotations},
            "spec": {"nodeName": node_name(n), "containers": [container]},
            "status": {"phase": "Running"}}  # fmt: skip


def group(n: int, g: int) -> str:
    return _uid("group", n, g)


def reservation(n: int, g: int) -> dict[str, Any]:
    """GPU group g's reservation pod on node n, as KAI's binder makes it."""
    labels = {"app": "kai-resource-reservation", kai.GROUP: group(n, g)}
    gpu = {"nvidia.com/gpu": "1"}
    container = {"name": kai.RESERVATION_CONTAINER, "image": "ubuntu", "args": ["sleep", "infinity"],
                 "resources": {"limits": gpu, "requests": gpu}}  # fmt: skip
    name = f"gpu-reservation-{group(n, g).replace('-', '')[:16]}"
    return _pod(n, name, "kai-resource-reservation", g, labels,
                {"karpenter.sh/do-not-disrupt": "true"}, container)  # fmt: skip


def fraction(n: int, g: int, i: int, asks: dict[str, str]) -> dict[str, Any]:
    """Fraction pod i of GPU group g on node n, asking `asks` (its annotations)."""
    nv = any(k.startswith(kai.NV_PREFIX) for k in asks)
    labels = {"kai.scheduler/queue": "team", kai.GROUP: group(n, g)}
    annotations = {"received-resource-type": "Fraction", **asks}
    return _pod(n, f"frac-{n}-{g}-{i}", "team", 20 + 4 * g + i, labels, annotations,
                {"name": "infer" if nv else "main", "image": "pytorch"})  # fmt: skip


def whole(n: int, w: int) -> dict[str, Any]:
    container = {"name": "main", "image": "pytorch",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}  # fmt: skip
    return _pod(n, f"train-{n}-{w}", "team", 10 + w, {"kai.scheduler/queue": "team"}, {}, container)


def cluster(nodes: int, gpus: int, fractions: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:  # fmt: skip
    """Half of each node's GPUs reserved (shared by fraction pods unless `fractions` is false),
    a quarter held whole, the rest free."""
    node_objs = [node_obj(n, gpus) for n in range(nodes)]
    pods: list[dict[str, Any]] = []
    for n in range(nodes):
        for g in range(gpus // 2):
            pods.append(reservation(n, g))
            if fractions:
                pods += [fraction(n, g, i, a) for i, a in enumerate(GROUPS[g % len(GROUPS)])]
        pods += [whole(n, w) for w in range(gpus // 4)]
    return node_objs, pods


def event_pod(n: int) -> dict[str, Any]:
    """The event: a fraction pod added to node n's first group (0.75 of its GPU held, or none)."""
    return fraction(n, 0, 9, {kai.FRACTION: "0.25"})


# --- 1. the updater (a fresh interpreter per run) ------------------------------------------------


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key)) / 1024


def updater_child(nodes: int, gpus: int, fractions: bool, events: int, trace: bool) -> dict[str, Any]:  # fmt: skip
    """The initial list settled, every document, the state's memory, then the events."""
    node_objs, pods = cluster(nodes, gpus, fractions)
    gc.collect()
    if trace:  # slows everything: only the size is taken from this interpreter
        tracemalloc.start()
        state = ClusterState.of(node_objs, pods)
        gc.collect()
        return {"traced_mib": tracemalloc.get_traced_memory()[0] / 2**20}
    before = _status_mib("VmRSS:")
    started = time.perf_counter()
    state = ClusterState.of(node_objs, pods)
    settled = time.perf_counter()
    docs = {name: node_document(state, name) for name in state.results}
    made = time.perf_counter()
    assert len(docs) == nodes and not state.all_warnings(), state.all_warnings()[:3]
    del docs
    gc.collect()
    rss = _status_mib("VmRSS:") - before
    peak = _status_mib("VmHWM:")
    times = []
    for n in random.Random(36).sample(range(nodes), min(events, nodes)):
        pod = event_pod(n)
        old = node_document(state, node_name(n))[1]
        t0 = time.perf_counter()
        state.set_pod(rc.slim_pod(pod))
        changed = state.settle()
        text, sha = node_document(state, node_name(n))
        times.append(time.perf_counter() - t0)
        assert changed == {node_name(n)} and sha != old and pod["metadata"]["name"] in text
    return {"settle_s": settled - started, "docs_s": made - settled, "rss_mib": rss,
            "peak_mib": peak, "event_p50_s": pct(times, 50), "event_max_s": max(times),
            "pods": len(pods)}  # fmt: skip


def child(args: argparse.Namespace, config: str, trace: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.kai", "--updater-child", config, "--nodes",
               str(args.nodes), "--gpus", str(args.gpus), "--events", str(args.events)]  # fmt: skip
    out = subprocess.run([*command, *(["--trace"] if trace else [])], check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout  # fmt: skip
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def updater(args: argparse.Namespace) -> None:
    """Each configuration in its own interpreters, alternating run by run."""
    figures: dict[str, dict[str, list[float]]] = {c: {} for c in CONFIGS}
    for _ in range(args.runs):
        for config in CONFIGS:
            for k, v in child(args, config, trace=False).items():
                figures[config].setdefault(k, []).append(v)
    traced = {c: child(args, c, trace=True)["traced_mib"] for c in CONFIGS}
    m = {c: {k: statistics.median(v) for k, v in f.items()} for c, f in figures.items()}
    for config in CONFIGS:
        f, med = figures[config], m[config]
        print(f"updater {config}: {args.nodes} nodes x {args.gpus} GPUs, {med['pods']:.0f} pods; "
              f"initial list settled in {med['settle_s']:.2f} s "
              f"(runs: {', '.join(f'{v:.2f}' for v in f['settle_s'])}), every document made in "
              f"{med['docs_s']:.2f} s")  # fmt: skip
        print(f"updater {config} memory: the state's RSS {med['rss_mib']:.0f} MiB, VmHWM "
              f"{med['peak_mib']:.0f} MiB, tracemalloc {traced[config]:.1f} MiB")  # fmt: skip
        print(f"updater {config} event, a fraction pod added on one node to its document: p50 "
              f"{med['event_p50_s'] * 1e3:.2f} ms (runs: "
              f"{', '.join(f'{v * 1e3:.2f}' for v in f['event_p50_s'])}), max "
              f"{med['event_max_s'] * 1e3:.2f} ms over {min(args.events, args.nodes)} nodes")  # fmt: skip
    extra = m[CONFIGS[0]]["pods"] - m[CONFIGS[1]]["pods"]
    cost = traced[CONFIGS[0]] - traced[CONFIGS[1]]
    settle = m[CONFIGS[0]]["settle_s"] - m[CONFIGS[1]]["settle_s"]
    print(f"updater fractions' cost: {extra:.0f} fraction pods, +{settle:.2f} s settled "
          f"({settle / max(extra, 1) * 1e6:.1f} us a pod), +{cost:.1f} MiB tracemalloc "
          f"({cost * 2**20 / max(extra, 1):.0f} B a pod)")  # fmt: skip


# --- 2. the exporter -----------------------------------------------------------------------------


def page(body: bytes) -> tuple[int, int]:
    """(series, fraction pods named) on a node's page."""
    lines = [line for line in body.split(b"\n") if line and not line.startswith(b"#")]
    named = {
        line.split(b'pod="', 1)[1].split(b'"', 1)[0] for line in lines if b'pod="frac-' in line
    }
    return len(lines), len(named)


def exporter(args: argparse.Namespace, work: Path) -> None:
    node_objs, pods = cluster(args.nodes, args.gpus, fractions=True)
    nodes, pods_file = work / "nodes.json", work / "pods.json"
    nodes.write_text(json.dumps({"kind": "List", "items": node_objs}))
    pods_file.write_text(json.dumps({"kind": "List", "items": pods}))
    started = time.monotonic()
    topology = render(work, "kai", nodes, pods_file, [])
    print(f"cluster: {args.nodes} nodes, {len(pods)} pods, rendered by status_updater render in "
          f"{time.monotonic() - started:.1f} s to {topology.stat().st_size / 2**20:.1f} MiB "
          "(not a figure)")  # fmt: skip
    target = node_name(args.nodes // 2)
    # Each configuration's tree and flags; with --baseline, the virtual GPUs' at that ref beside.
    configs = {name: (ROOT, flags) for name, flags in EXPORTERS.items()}
    if args.baseline:
        tree = baseline_tree(args.baseline, work)
        configs[f"4.8.4 virtual GPUs at {args.baseline}"] = (tree, EXPORTERS["4.8.4 virtual GPUs"])
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in configs}
    for _ in range(args.runs):
        for name, (tree, flags) in configs.items():
            put = figures[name].setdefault
            label = name.replace(" ", "-")
            with exporters(tree, topology, work, label, [flags]) as (proc,):
                put("start", []).append(proc.wait_ready(600))
                put("rss", []).append(proc.rss())
                status, body = fetch(f"{proc.url}/metrics/nodes/{target}")
                if status != 200:
                    raise SystemExit(f"{name}: node {target}'s page answered {status}")
                series, named = page(body)
                put("bytes", []).append(len(body))
                put("series", []).append(series)
                put("named", []).append(named)
                (step,), (most,) = hold([proc], args.hold)
                put("step", []).append(step)
                put("rss most", []).append(most)
    m = {n: {k: statistics.median(v) for k, v in f.items()} for n, f in figures.items()}
    for name, f in figures.items():
        med = m[name]
        print(f"exporter {name}: start-up {med['start']:.1f} s, RSS {med['rss']:.0f} MiB ready, "
              f"{med['rss most']:.0f} MiB at most; CPU per 10-s step {med['step']:.2f} s "
              f"(runs: {', '.join(f'{v:.2f}' for v in f['step'])}); one node's page "
              f"{med['bytes'] / 1024:.1f} KiB, {med['series']:.0f} series, "
              f"{med['named']:.0f} fraction pods named")  # fmt: skip
    base, vgpu = m["4.8.4"], m["4.8.4 virtual GPUs"]
    copies = (vgpu["series"] - base["series"]) * args.nodes
    print(f"exporter per-pod copies (4.8.4 virtual GPUs over 4.8.4): +{copies:.0f} series over "
          f"the cluster, +{vgpu['rss'] - base['rss']:.0f} MiB RSS, "
          f"+{vgpu['step'] - base['step']:.2f} s a step "
          f"({(vgpu['step'] - base['step']) / max(copies, 1) * 1e6:.2f} us a series), "
          f"+{(vgpu['bytes'] - base['bytes']) / 1024:.1f} KiB a page")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--events", type=int, default=50, help="nodes a fraction pod is added on")
    p.add_argument("--hold", type=float, default=30.0, help="seconds of steps measured")
    p.add_argument("--baseline", help="git ref: its exporter with virtual GPUs measured beside")
    p.add_argument("--exporter-only", action="store_true", help="the exporter's figures alone")
    p.add_argument("--updater-child", choices=CONFIGS, help=argparse.SUPPRESS)
    p.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.gpus < 2:
        p.error("--gpus: at least 2 (half reserved)")
    if args.updater_child:
        fractions = args.updater_child == CONFIGS[0]
        print(json.dumps(updater_child(args.nodes, args.gpus, fractions, args.events, args.trace)))
        return
    print(f"machine: {machine()}, load {load()}")
    if not args.exporter_only:
        updater(args)
    with tempfile.TemporaryDirectory(prefix="bench-kai-") as tmp:
        exporter(args, Path(tmp))


if __name__ == "__main__":
    main()
