"""The ConfigMap contract both daemons share: names, labels, and what a document file may be."""

from __future__ import annotations

import hashlib
import re

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mig_exporter.common import blockyaml
from tests.support.base import SAMPLES
from tests.topology.test_topology_model import edited, topologies
from topology import configmap as contract
from topology import yamltext
from topology.errors import TopologyError
from topology.model import Topology, dump_yaml, load_yaml

SAMPLE_TOPOLOGY = yaml.safe_load((SAMPLES / "topology" / "a100-40gb-active.yaml").read_text())[
    "data"
]["topology.yml"]

SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
names = st.one_of(
    st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,300}[a-z0-9])?", fullmatch=True),  # node-like, any length
    st.text(min_size=1, max_size=300),  # anything at all (a hand-written topology)
    st.text(alphabet="._-!Ä ", min_size=1, max_size=20),  # nothing a DNS name may keep
)


def test_names_that_fit_are_used_as_they_are() -> None:
    assert contract.node_configmap_name("gpu-node-1.zone-a") == "topology-gpu-node-1.zone-a"
    assert contract.node_label_value("gpu-node-1.zone-a") == "gpu-node-1.zone-a"


def test_names_that_do_not_fit_get_a_stable_hashed_form() -> None:
    long = "kwok-" + "x" * 250
    name = contract.node_configmap_name(long)
    assert len(name) == 253 and name.startswith("topology-kwok-xxx")
    assert re.fullmatch(r"topology-kwok-x+-[0-9a-f]{10}", name)
    assert contract.node_configmap_name(long) == name  # stable
    assert contract.node_configmap_name(long + "y") != name
    label = contract.node_label_value("n" * 64)
    assert len(label) == 63 and re.fullmatch(r"n{52}-[0-9a-f]{10}", label)
    # Not a DNS name: lower-cased, '_' becomes '-', and the hash of the real name keeps it apart
    # from a node that is really called gpu-node.a.
    digest = hashlib.sha256(b"GPU_Node.A").hexdigest()[:10]
    assert contract.node_configmap_name("GPU_Node.A") == f"topology-gpu-node.a-{digest}"
    # Nothing kept at all: the hash alone.
    digest = hashlib.sha256(b"_._").hexdigest()[:10]
    assert contract.node_configmap_name("_._") == f"topology-{digest}"
    # A label value keeps the case and '_', and drops what it may not start or end with.
    for node, kept in (("X_Node.A!", "X_Node.A"), ("._X!", "X")):
        digest = hashlib.sha256(node.encode()).hexdigest()[:10]
        assert contract.node_label_value(node) == f"{kept}-{digest}"


@given(st.lists(names, min_size=1, max_size=20, unique=True))
def test_every_name_is_a_valid_configmap_name_and_label_value_and_distinct(
    nodes: list[str],
) -> None:
    cms = [contract.node_configmap_name(n) for n in nodes]
    labels = [contract.node_label_value(n) for n in nodes]
    for cm, label in zip(cms, labels, strict=True):
        assert len(cm) <= 253 and SUBDOMAIN.fullmatch(cm), cm
        assert len(label) <= 63 and LABEL_VALUE.fullmatch(label), label
    assert len(set(cms)) == len(cms)
    assert len(set(labels)) == len(labels)


def test_a_per_node_configmap() -> None:
    topology = load_yaml("mig-strategy: mixed\nnodes: {}\n")
    cm = contract.node_configmap("n1", dump_yaml(topology), "sim", "uid-1")
    assert cm == {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "topology-n1", "namespace": "sim",
                     "labels": {"node-topology": "true", "node-name": "n1",
                                "app.kubernetes.io/managed-by": "topology-status-updater"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1"}]},
        "data": {"topology.yml": "mig-strategy: mixed\nnodes: {}\n"},
    }  # fmt: skip
    assert "ownerReferences" not in contract.node_configmap("n1", "", "sim", None)["metadata"]
    assert contract.is_managed(cm["metadata"]["labels"])
    assert not contract.is_managed({"node-topology": "true"})  # someone else's


def test_a_list_of_configmaps_is_one_topology_and_a_node_twice_is_an_error() -> None:
    def listed(*nodes: str) -> str:
        items = [contract.node_configmap(n, yaml.safe_dump({"nodes": {n: {
            "gpu-count": 0, "gpu-memory": 1, "gpu-product": "X"}}}), "ns", None) for n in nodes]  # fmt: skip
        return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})

    topology = contract.parse_document(listed("a", "b"), "f")
    assert sorted(topology.nodes) == ["a", "b"]
    empty = contract.parse_document(listed(), "f")  # `kubectl get` of a cluster with no GPU node
    assert (empty.mig_strategy, empty.nodes) == ("none", {})
    with pytest.raises(TopologyError, match=r"f: items\[1\]: node a is in two ConfigMaps"):
        contract.parse_document(listed("a", "a"), "f")


@given(topologies)
def test_the_node_peeked_from_a_document_is_the_one_it_holds(topology: Topology) -> None:
    """A shard leaves other nodes' ConfigMaps unread, judged by their first lines: whenever the
    peek names a node, reading the document whole gives that node alone; and the peek names it
    for every one-node document the updater writes (in the fast reader's subset)."""
    text = dump_yaml(topology)
    peeked = contract.peek_node(text)
    if peeked is not None:
        whole = load_yaml(text)
        assert set(whole.nodes) | set(whole.invalid) == {peeked}
    elif len(topology.nodes) == 1 and not blockyaml._OUTSIDE.search(text):
        (name,) = topology.nodes
        key = yamltext.scalar(name)  # a key it cannot read, or one written `? key`
        assert len(key) > yamltext.MAX_IMPLICIT_KEY or blockyaml.scalar(key) != name, text


_PEEK_EDITS = st.sampled_from(["\n", "  ", "  b:\n", "\n  c:", ":", "'", "#", " ", "x"])


@given(topologies, st.lists(st.tuples(st.integers(0, 400), st.integers(0, 2), _PEEK_EDITS),
                            max_size=3))  # fmt: skip
def test_a_peek_at_any_edited_document_never_misses_a_node(
    topology: Topology, edits: list[tuple[int, int, str]]
) -> None:
    text = edited(topology, edits)
    peeked = contract.peek_node(text)
    if peeked is None:
        return
    try:
        whole = load_yaml(text)
    except TopologyError:
        return  # unreadable whole: the shard that serves the node says so
    assert set(whole.nodes) | set(whole.invalid) == {peeked}, text


def test_a_shard_leaves_other_nodes_configmaps_in_a_list_unread() -> None:
    """Their documents are not even read: broken ones are the other shard's to report. A node
    twice is still an error, wanted or not."""
    good = load_yaml(SAMPLE_TOPOLOGY)
    (node,) = good.nodes.values()
    items = [contract.node_configmap(name, dump_yaml(Topology("mixed", {name: node})), "ns", None)
             for name in ("a", "b")]  # fmt: skip
    items.append(contract.node_configmap(
        "c", "mig-strategy: mixed\nnodes:\n  c:\n    gpu-count: [unclosed\n", "ns", None))  # fmt: skip
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
    read = contract.parse_document(text, "f", wanted=lambda name: name != "c")
    assert set(read.nodes) == {"a", "b"} and not read.invalid
    with pytest.raises(TopologyError, match="not valid YAML"):
        contract.parse_document(text, "f")
    twice = yaml.safe_dump({"kind": "List", "items": [*items, items[2]]})
    with pytest.raises(TopologyError, match="node c is in two ConfigMaps"):
        contract.parse_document(twice, "f", wanted=lambda name: name != "c")
