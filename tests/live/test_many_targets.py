"""One target per node, across shards, scraped by a real Prometheus (Debian's package).

Two `exporter --all-nodes --total-shards 2` replicas serve a cluster's nodes; Prometheus sends each
node's target to the replica of its shard with relabelling alone (`hashmod` of the node name, as
deploy/all-nodes/'s scrape config does), scrapes `/metrics/nodes/<node>` with gzip (it always asks
for it), and each node is its own target with its own `up` and `instance`. Then the shard count
changes to three: every node's page and `up` follow it to its new replica.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.live.test_prometheus import query, start
from tests.pipeline.test_cli import free_port, get
from tests.support.base import SAMPLES
from tests.support.kubeapi import eventually
from tests.support.scrape import shipped_config
from topology.model import Topology, dump_yaml, load_yaml

NODES = [f"kwok-gpu-{i:02d}" for i in range(12)]
# KWOK nodes without GPUs, discovered too: no exporter serves them, and none is a target.
CPU_NODES = ("kwok-cpu-00", "kwok-cpu-01", "kwok-cpu-02")


def cluster(tmp_path: Path) -> Path:
    """The sample MIG node as twelve KWOK nodes, one document."""
    cm = yaml.safe_load((SAMPLES / "topology" / "a100-40gb-active.yaml").read_text())
    sample = load_yaml(cm["data"]["topology.yml"])
    (node,) = sample.nodes.values()
    path = tmp_path / "cluster.yaml"
    path.write_text(dump_yaml(Topology(sample.mig_strategy, dict.fromkeys(NODES, node))))
    return path


def replicas(
    tmp_path: Path, topology: Path, total: int
) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    procs, ports = [], []
    for shard in range(total):
        port = free_port()
        procs.append(start([sys.executable, "-m", "exporter", "--topology-file", str(topology),
                            "--all-nodes", "--total-shards", str(total), "--shard", str(shard),
                            "--address", "127.0.0.1", "--port", str(port)],
                           tmp_path / f"exporter-{total}-{shard}.log"))  # fmt: skip
        ports.append(port)
    for port in ports:
        eventually(lambda p=port: get(f"http://127.0.0.1:{p}/health")[0] == 200, timeout=15)
    return procs, ports


def scrape_config(ports: list[int]) -> dict[str, Any]:
    """deploy/prometheus/kwok-nodes-sharded.yml as shipped, its modulus the replicas here. Two
    changes only: the Nodes come from a static list carrying the label Kubernetes discovery gives
    (`__meta_kubernetes_node_name`), and each replica's DNS name is its port on this machine."""
    config = shipped_config("kwok-nodes-sharded.yml", tuple(NODES), CPU_NODES)
    (job,) = config["scrape_configs"]
    for rule in job["relabel_configs"]:
        if rule.get("action") == "hashmod":
            rule["modulus"] = len(ports)
    job["relabel_configs"] += [
        {"source_labels": ["__address__"], "regex": f"nvidia-dcgm-exporter-all-nodes-{shard}\\..*",
         "target_label": "__address__", "replacement": f"127.0.0.1:{port}"}
        for shard, port in enumerate(ports)
    ]  # fmt: skip
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    job["scrape_interval"] = "1s"
    return config


def targets(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=5) as r:
        return json.load(r)["data"]["activeTargets"]  # type: ignore[no-any-return]


def serving(url: str, ports: list[int]) -> dict[str, int] | None:
    """node -> the shard whose replica Prometheus scrapes it on, once every target is up and has
    scraped since the config it has now."""
    found = targets(url)
    by_port = {f"127.0.0.1:{p}": shard for shard, p in enumerate(ports)}
    if len(found) != len(NODES) or any(t["health"] != "up" for t in found):
        return None
    if any(t["scrapeUrl"].split("/")[2] not in by_port for t in found):
        return None  # still the last config's targets
    return {t["labels"]["node"]: by_port[t["scrapeUrl"].split("/")[2]] for t in found}


def owners(ports: list[int]) -> dict[str, list[int]]:
    """node -> the shards whose replica says it serves it (`/health/nodes/<node>` 200; the
    others must say 404, not served here), asking every replica for every node."""
    found: dict[str, list[int]] = {node: [] for node in NODES}
    for shard, port in enumerate(ports):
        for node in NODES:
            status = get(f"http://127.0.0.1:{port}/health/nodes/{node}")[0]
            assert status in (200, 404), (node, shard, status)
            if status == 200:
                found[node].append(shard)
    return found


def test_each_node_is_its_own_target_on_its_shard_and_follows_a_new_shard_count(
    tmp_path: Path,
) -> None:
    binary = shutil.which("prometheus")
    assert binary, "prometheus is required: run ./scripts/install-test-tools"
    topology = cluster(tmp_path)
    procs, ports = replicas(tmp_path, topology, 2)
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(ports)))
    web = free_port()
    prometheus = start([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{web}"], tmp_path / "prometheus.log")  # fmt: skip
    url = f"http://127.0.0.1:{web}"
    try:
        # Every node up: Prometheus's hashmod sent each to the replica that serves it (a wrong
        # one answers 404, and the target is down), through gzip, which Prometheus asks for.
        first = eventually(lambda: serving(url, ports), timeout=30)
        assert sorted(first) == NODES and set(first.values()) == {0, 1}
        eventually(lambda: len(query(url, "up == 1")) == len(NODES), timeout=10)
        # The CPU-only nodes are discovered and dropped: no target, no `up == 0` for them.
        assert len(query(url, "up")) == len(NODES)
        per_node = query(url, "count by (instance, Hostname) (DCGM_FI_DEV_FB_USED)")
        assert {(r["metric"]["instance"], r["metric"]["Hostname"]) for r in per_node} == {
            (n, n) for n in NODES}  # fmt: skip
        assert {r["value"][1] for r in per_node} == {"3"}  # the sample's three instances each
        # Disjoint, and every node: each is served by exactly the replica Prometheus asks.
        assert owners(ports) == {node: [shard] for node, shard in first.items()}

        # Three shards: the replicas start again with the new count, Prometheus is told (SIGHUP).
        for p in procs:
            p.terminate()
            p.wait(10)
        procs, ports = replicas(tmp_path, topology, 3)
        config.write_text(yaml.safe_dump(scrape_config(ports)))
        prometheus.send_signal(signal.SIGHUP)
        second = eventually(lambda: serving(url, ports), timeout=30)
        assert sorted(second) == NODES and set(second.values()) == {0, 1, 2}
        moved = [n for n in NODES if first[n] != second[n]]
        assert moved  # some nodes changed replica, and each is up where it is now
        eventually(lambda: len(query(url, "up == 1")) == len(NODES), timeout=10)
        assert owners(ports) == {node: [shard] for node, shard in second.items()}
    finally:
        for p in [*procs, prometheus]:
            p.terminate()
            p.wait(10)
