"""The exporter's watches in this process, over HTTP with the official client, on the emulated API:
its node's ConfigMap, every per-node ConfigMap (--all-nodes), and the Nodes of --node-selector.

The daemons are tested as processes in test_live.py; here the same loops run in a thread, so a
change, a deletion, a bad document and an API error can each be followed to what is served.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import kubernetes
import pytest

from exporter import dcgm
from exporter.many import NodesExporter
from exporter.service import Exporter
from exporter.sources import watch_configmap, watch_node_configmaps, watch_selected_nodes
from mig_exporter.web.server import Published
from tests.exporter.test_exporter import MIG
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import parse
from topology.configmap import configmap, node_configmap
from topology.model import Topology, dump_yaml

NS = "gpu-operator"
(NODE,) = MIG.nodes


def text(name: str = NODE) -> str:
    """MIG's node under `name`, as a per-node ConfigMap holds it."""
    return dump_yaml(Topology(MIG.mig_strategy, {name: MIG.nodes[NODE]}))


@contextmanager
def watching(
    target: Callable[..., None], *args: Any, strict: bool = True
) -> Iterator[tuple[KubeAPI, kubernetes.client.CoreV1Api]]:
    """The emulated API and `target(*args, stop, client, ...)` running in a thread against it
    (`strict=False`: plain kmock, which ignores label and field selectors)."""
    with KubeAPI.start(strict=strict) as kube, kube.api_client() as client:
        stop = threading.Event()
        sink, rest = args[0], args[1:]
        thread = threading.Thread(target=target, args=(sink, stop, client, *rest), daemon=True)
        thread.start()
        try:
            yield kube, kubernetes.client.CoreV1Api(client)
        finally:
            stop.set()
            if strict:
                kube.cut_watches()
            thread.join(10)


def hosts(many: NodesExporter) -> set[str]:
    return {s.label("Hostname") for s in parse(many.snapshot().body.decode())}


@pytest.mark.parametrize("strict", [True, False], ids=["strict-emulator", "plain-kmock"])
def test_the_nodes_configmap_is_followed_and_its_problems_said(strict: bool) -> None:
    exporter = Exporter(NODE, dcgm.Options("h"), Published())
    name = f"topology-{NODE}"
    with watching(watch_configmap, exporter.sink, name, NS, strict=strict) as (_, core):
        eventually(lambda: "not found" in exporter.snapshot().reason, timeout=10)
        assert exporter.snapshot().reason == (
            f"ConfigMap {NS}/{name}: not found; serving the last good topology"
        )
        core.create_namespaced_config_map(NS, configmap(text(), name, NS))
        eventually(lambda: exporter.snapshot().healthy, timeout=10)
        assert exporter.snapshot().ready
        # Another ConfigMap in the namespace changes nothing.
        core.create_namespaced_config_map(NS, configmap("nodes: [", "other", NS))
        core.patch_namespaced_config_map(name, NS, {"data": {"topology.yml": "nodes: ["}})
        eventually(lambda: "not valid YAML" in exporter.snapshot().reason, timeout=10)
        assert exporter.invalid.value("configmap") == 1
        assert b"DCGM_FI_DEV_FB_USED" in exporter.snapshot().body  # the last good, kept
        core.patch_namespaced_config_map(name, NS, {"data": {"topology.yml": text()}})
        eventually(lambda: exporter.snapshot().healthy, timeout=10)
        # A document without the node: said, naming the ConfigMap, and the node kept.
        core.patch_namespaced_config_map(name, NS, {"data": {"topology.yml": text("other")}})
        eventually(lambda: not exporter.snapshot().healthy, timeout=10)
        assert exporter.snapshot().reason == (
            f"ConfigMap {NS}/{name}: nodes.{NODE}: is not in the topology (nodes: other); "
            "serving the last good topology"
        )
        assert b"DCGM_FI_DEV_FB_USED" in exporter.snapshot().body
        core.delete_namespaced_config_map(name, NS)
        eventually(lambda: "not found" in exporter.snapshot().reason, timeout=10)


@pytest.mark.parametrize("strict", [True, False], ids=["strict-emulator", "plain-kmock"])
def test_every_per_node_configmap_is_served_and_one_that_goes_takes_its_node(strict: bool) -> None:
    many = NodesExporter(dcgm.Options("h"), Published())
    with watching(watch_node_configmaps, many, NS, strict=strict) as (_, core):
        eventually(lambda: many.snapshot().ready, timeout=10)
        for node in ("a", "b"):
            core.create_namespaced_config_map(NS, node_configmap(node, text(node), NS, None))
        # Not ours: no node-topology label.
        core.create_namespaced_config_map(NS, configmap(text("c"), "topology-c", NS))
        eventually(lambda: hosts(many) == {"a", "b"}, timeout=10)
        core.patch_namespaced_config_map("topology-b", NS, {"data": {"topology.yml": "nodes: ["}})
        eventually(lambda: not many.snapshot().healthy, timeout=10)
        assert "ConfigMap gpu-operator/topology-b" in many.snapshot().reason
        assert hosts(many) == {"a", "b"}  # b's last good series stay
        core.delete_namespaced_config_map("topology-b", NS)
        eventually(lambda: hosts(many) == {"a"} and many.snapshot().healthy, timeout=10)
        # Its label taken off: no longer a node's topology.
        core.patch_namespaced_config_map(
            "topology-a", NS, {"metadata": {"labels": {"node-topology": None}}}
        )
        eventually(lambda: hosts(many) == set(), timeout=10)


def test_only_the_selected_nodes_are_served() -> None:
    many = NodesExporter(dcgm.Options("h"), Published())
    for node in ("kwok-1", "real-1"):
        many.update_source(f"topology-{node}", Topology(nodes={node: MIG.nodes[NODE]}), node)
    with watching(watch_selected_nodes, many, "type=kwok") as (kube, _):
        eventually(lambda: hosts(many) == set(), timeout=10)
        kube.create(
            "nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "kwok-1", "labels": {"type": "kwok"}},
            },
        )
        eventually(lambda: hosts(many) == {"kwok-1"}, timeout=10)
        kube.delete("nodes", "kwok-1")
        eventually(lambda: hosts(many) == set(), timeout=10)


def test_an_unreachable_api_is_said_and_the_last_good_kept() -> None:
    exporter = Exporter(NODE, dcgm.Options("h"), Published())
    name = f"topology-{NODE}"
    with watching(watch_configmap, exporter.sink, name, NS) as (kube, _):
        kube.create("configmaps", configmap(text(), name, NS), namespace=NS)
        eventually(lambda: exporter.snapshot().healthy, timeout=10)
        kube.fail_next(3, status=503, plural="configmaps")
        kube.cut_watches()
        eventually(lambda: not exporter.snapshot().healthy, timeout=15)
        assert b"DCGM_FI_DEV_FB_USED" in exporter.snapshot().body
        eventually(lambda: exporter.snapshot().healthy, timeout=60)
