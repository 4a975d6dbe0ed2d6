"""How the pure core scales toward the planned 5,000 GPU nodes.

    .venv/bin/python bench/scale.py [--nodes 5000] [--runs 5]

Measures, each as the median of --runs runs in this one process:
- reconcile: Node and Pod JSON -> topology for the whole cluster (what the updater runs per
  coalesced batch of events), and the size of the resulting `topology.yml` against the 1 MiB a
  ConfigMap can hold;
- render: one node's topology -> its `/metrics` bytes (what the exporter runs per change),
  beside prometheus_client's generate_latest over the same series (the library way);
- scrape: the server handing out the rendered bytes over HTTP.
"""

from __future__ import annotations

import argparse
import base64
import json
import platform
import statistics
import sys
import time
import tracemalloc
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from exporter import dcgm
from exporter.server import MetricsServer, Published, Snapshot
from status_updater.state import reconcile
from topology.model import dump_yaml

CONFIGMAP_LIMIT = 1024 * 1024
LAYOUT = {0: "2g.10gb", 4: "1g.5gb", 5: "1g.5gb", 6: "1g.5gb"}  # 4 instances per GPU


def cluster(nodes: int, gpus: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A100-40GB dynamic-MIG nodes, every instance held by a pod."""
    config = "version: v1\nmig-configs:\n  selected:\n  - devices: all\n    mig-enabled: true\n    mig-devices:\n"
    config += "".join(f"      {p}: {n}\n" for p, n in LAYOUT.items())
    node_objs, pods = [], []
    for n in range(nodes):
        name = f"gpu-node-{n:05d}"
        mapping = {str(g): {str(p): f"MIG-{n:05d}-{g}-{p}" for p in LAYOUT} for g in range(gpus)}
        labels = {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": "40960", "nvidia.com/mig.strategy": "mixed",
            "node-role.kubernetes.io/runai-dynamic-mig": "true", "node-role.kubernetes.io/runai-mig-enabled": "true",
        }  # fmt: skip
        annotations = {
            "run.ai/mig.config": config,
            "run.ai/mig-mapping": base64.b64encode(json.dumps(mapping).encode()).decode(),
        }
        node_objs.append(
            {
                "kind": "Node",
                "metadata": {"name": name, "labels": labels, "annotations": annotations},
            }
        )
        for g in range(gpus):
            for p, profile in LAYOUT.items():
                device = {"name": f"nvidia.com/mig-{profile}", "position": p, "gpuindex": g}
                pods.append({
                    "kind": "Pod",
                    "metadata": {"name": f"job-{n}-{g}-{p}", "namespace": "team", "uid": f"uid-{n}-{g}-{p}",
                                 "annotations": {"runai-mig-device": json.dumps(device)}},
                    "spec": {"nodeName": name, "containers": [{"name": "main"}]},
                    "status": {"phase": "Running"},
                })  # fmt: skip
    return node_objs, pods


def median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def library_render(families: list[dcgm.Family]) -> bytes:
    """The same series the prometheus_client way: fresh families in a collector, generate_latest."""

    class Snapshot:
        def collect(self) -> list[GaugeMetricFamily]:
            out = []
            for f in families:
                names = [k for k, _ in f.samples[0][0]]
                g = GaugeMetricFamily(f.name, f.help, labels=names)
                for labels, value in f.samples:
                    g.add_metric([v for _, v in labels], value)
                out.append(g)
            return out

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot())  # type: ignore[arg-type]
    return generate_latest(registry)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}, median of {args.runs} runs")  # fmt: skip

    nodes, pods = cluster(args.nodes, args.gpus)
    tracemalloc.start()
    topology, warnings = reconcile(nodes, pods)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert not warnings, warnings[:3]
    text = dump_yaml(topology)
    per_node = len(text) / args.nodes
    print(f"reconcile {args.nodes} nodes x {args.gpus} GPUs, {len(pods)} pods: "
          f"{median_s(lambda: reconcile(nodes, pods), args.runs):.2f} s, peak {peak / 2**20:.0f} MiB")  # fmt: skip
    print(f"topology.yml: {len(text) / 2**20:.1f} MiB ({per_node:.0f} B per node); one ConfigMap holds "
          f"{CONFIGMAP_LIMIT // int(per_node)} such nodes")  # fmt: skip
    print(f"dump_yaml: {median_s(lambda: dump_yaml(topology), args.runs):.2f} s")

    node = next(iter(topology.nodes.values()))
    options = dcgm.Options("nvidia-dcgm-exporter-bench")
    fams = dcgm.families(node, options, time.time())
    ours = dcgm.render(node, options, time.time())
    theirs = library_render(fams)
    series = sum(len(f.samples) for f in fams)
    runs = args.runs * 200
    print(f"render one node ({series} series): ours {median_s(lambda: dcgm.render(node, options, 0), runs) * 1e6:.0f} us, "
          f"prometheus_client {median_s(lambda: library_render(dcgm.families(node, options, 0)), runs) * 1e6:.0f} us; "
          f"{len(ours)} vs {len(theirs)} bytes")  # fmt: skip

    published = Published()
    published.publish(Snapshot(ours, True, "ok"))
    server = MetricsServer(published, "127.0.0.1", 0)
    server.start()
    url = f"http://127.0.0.1:{server.port}/metrics"

    def scrape() -> None:
        with urllib.request.urlopen(url) as r:
            r.read()

    print(f"scrape /metrics over HTTP: {median_s(scrape, args.runs * 100) * 1e3:.2f} ms")
    server.stop()


if __name__ == "__main__":
    main()
