"""Per-node ConfigMaps at a size one ConfigMap cannot hold: 300 fully described 8-GPU nodes.

The daemons run as real processes against the strict emulator (it keeps resourceVersions, so
"only its node's ConfigMap was rewritten" can be seen). A handful of pods is enough: the emulator
creates pods slowly, and the size that matters here is the nodes'.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from status_updater.devices import gpu_uuid
from status_updater.reconcile import document
from status_updater.state import ClusterState
from tests.live.test_live import NS, Daemons, running
from tests.pipeline.test_cli import get
from tests.support import tree
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import by_name, parse
from topology.model import NodeTopology

NODES, GPUS = 300, 8
LAYOUT = {0: "2g.10gb", 4: "1g.5gb", 5: "1g.5gb", 6: "1g.5gb"}  # 4 instances per GPU
CONFIG = yaml.safe_dump({"version": "v1", "mig-configs": {"selected": [
    {"devices": "all", "mig-enabled": True, "mig-devices": {p: n for p, n in LAYOUT.items()}}]}})  # fmt: skip
KWOK = 10  # nodes labelled type=kwok, for --node-selector


def name(n: int) -> str:
    return f"gpu-node-{n:03d}"


def node(n: int) -> dict[str, Any]:
    mapping = {str(g): [{"position": p, "device_uuid": f"MIG-{n:03d}-{g}-{p}",
                         "gpu_instance_id": gi} for p, gi in zip(LAYOUT, (5, 7, 8, 9), strict=True)]
               for g in range(GPUS)}  # fmt: skip
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": str(GPUS),
              "nvidia.com/mig.strategy": "mixed", "node-role.kubernetes.io/runai-dynamic-mig": "true",
              "node-role.kubernetes.io/runai-mig-enabled": "true"}  # fmt: skip
    if n < KWOK:
        labels["type"] = "kwok"
    annotations = {
        "run.ai/mig.config": CONFIG,
        "run.ai/mig-mapping": base64.b64encode(json.dumps(mapping).encode()).decode(),
    }
    meta = {"name": name(n), "labels": labels, "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def pod(n: int, gpu: int, position: int, fb: int) -> dict[str, Any]:
    device = {"name": f"nvidia.com/mig-{LAYOUT[position]}", "position": position, "gpuindex": gpu}
    annotations = {"runai-mig-device": json.dumps(device), "run.ai/simulated-fb-used": str(fb)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"job-{n}-{gpu}-{position}", "namespace": "team", "annotations": annotations},
            "spec": {"nodeName": name(n), "containers": [{"name": "main", "image": "burn"}]},
            "status": {"phase": "Running"}}  # fmt: skip


def ours(kube: KubeAPI) -> dict[str, dict[str, Any]]:
    return {
        cm["metadata"]["name"]: cm
        for cm in kube.list_objects("configmaps", NS)
        if (cm["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by")
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Daemons]:
    with running(tmp_path) as d:
        yield d


def test_three_hundred_nodes_each_get_their_own_configmap(cluster: Daemons) -> None:
    kube = cluster.kube
    for n in range(NODES):
        kube.create("nodes", node(n))
    pods = [pod(3, 0, 4, 1000), pod(3, 1, 0, 2000), pod(7, 5, 6, 3000), pod(42, 7, 5, 4000)]
    for p in pods:
        kube.create("pods", p, namespace="team")
    # Left by an earlier run for a node that is gone: deleted on start. Someone else's ConfigMap
    # with the node-topology label: never touched.
    ghost = {"metadata": {"name": "topology-ghost", "labels": {
        "node-topology": "true", "node-name": "ghost", "app.kubernetes.io/managed-by": "topology-status-updater"}},
        "data": {"topology.yml": "nodes: {}\n"}}  # fmt: skip
    foreign = {"metadata": {"name": "topology-legacy", "labels": {"node-topology": "true"}},
               "data": {"topology.yml": "nodes: {}\n"}}  # fmt: skip
    kube.create("configmaps", ghost, namespace=NS)
    legacy = kube.create("configmaps", foreign, namespace=NS)

    cluster.updater("updater-0", "--resync", "1")  # full comparisons every second, below
    eventually(lambda: len(ours(kube)) == NODES and "topology-ghost" not in ours(kube), timeout=60)
    written = ours(kube)
    assert kube.get("configmaps", "topology-legacy", NS) == legacy

    # Every node's ConfigMap holds exactly what reconcile says of that node, in the cluster schema.
    uids = {o["metadata"]["name"]: o["metadata"]["uid"] for o in kube.list_objects("nodes")}
    expected = ClusterState.of(kube.list_objects("nodes"), kube.list_objects("pods"))
    total = 0
    for n in range(NODES):
        cm = written[f"topology-{name(n)}"]
        text = cm["data"]["topology.yml"]
        total += len(text.encode())
        result = expected.results[name(n)]
        assert isinstance(result, NodeTopology)
        assert yaml.safe_load(text) == tree.to_dict(document(name(n), result, "mixed"))
        assert cm["metadata"]["labels"]["node-name"] == name(n)
        assert cm["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": name(n), "uid": uids[name(n)]}
        ]
    assert total > 1024 * 1024, "the cluster must not fit one ConfigMap"

    # Exporters: one node's own, and one for every node, and one for the selected nodes.
    own = cluster.exporter("--node-name", name(3), "--hostname", name(3), name="exporter-3")
    every = cluster.exporter("--all-nodes", name="exporter-all")
    kwok = cluster.exporter("--all-nodes", "--node-selector", "type=kwok", name="exporter-kwok")

    def fb_used(url: str) -> list[Any]:
        # One family's lines: the parser takes seconds over the whole text of 300 nodes (36 MB).
        family = "DCGM_FI_DEV_FB_USED"
        text = get(f"{url}/metrics")[1]
        lines = [line for line in text.splitlines() if line.startswith((f"{family}{{", "#"))]
        return by_name(parse("\n".join(x for x in lines if family in x) + "\n"), family)

    mine = eventually(lambda: fb_used(own), timeout=30)
    assert {s.label("UUID") for s in mine} == {gpu_uuid(name(3), g) for g in range(GPUS)}
    assert len(mine) == GPUS * len(LAYOUT)
    assert sorted(s.value for s in mine if s.value > 6) == [1000, 2000]
    # It watches its own ConfigMap only, by name.
    own_cm = f"metadata.name=topology-{name(3)}"
    eventually(lambda: any(e.params.get("watch") == "true" and e.params.get("fieldSelector") == own_cm
                           for e in kube.journal()), timeout=10)  # fmt: skip
    everything = eventually(lambda: len(s := fb_used(every)) == NODES * GPUS * 4 and s, timeout=60)
    assert {s.label("Hostname") for s in everything} == {name(n) for n in range(NODES)}
    assert [s for s in everything if s.label("Hostname") == name(3)] == mine
    selected = eventually(lambda: len(s := fb_used(kwok)) == KWOK * GPUS * 4 and s, timeout=60)
    assert {s.label("Hostname") for s in selected} == {name(n) for n in range(KWOK)}

    # One pod changes: only its node's ConfigMap is written again.
    versions = {k: cm["metadata"]["resourceVersion"] for k, cm in ours(kube).items()}
    kube.delete("pods", "job-42-7-5", namespace="team")
    changed = f"topology-{name(42)}"
    eventually(lambda: ours(kube)[changed]["metadata"]["resourceVersion"] != versions[changed])
    time.sleep(2.5)  # two full resyncs: they compare every node and must rewrite none
    after = {k: cm["metadata"]["resourceVersion"] for k, cm in ours(kube).items()}
    assert {k for k in versions if after[k] != versions[k]} == {changed}
    eventually(
        lambda: all(s.value == 6 for s in fb_used(every) if s.label("Hostname") == name(42)),
        timeout=10,
    )

    # A node is deleted: its ConfigMap goes, and the many-nodes exporter drops its series.
    kube.delete("nodes", name(7))
    eventually(lambda: f"topology-{name(7)}" not in ours(kube), timeout=10)
    eventually(lambda: name(7) not in {s.label("Hostname") for s in fb_used(every)}, timeout=10)
    for log in ("updater-0", "exporter-3", "exporter-all", "exporter-kwok"):
        assert "Traceback" not in cluster.log(log)
