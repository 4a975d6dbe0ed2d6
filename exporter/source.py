"""Where the exporter's topology comes from: the ConfigMap object or the bare `topology.yml`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from topology.errors import TopologyError, one_line
from topology.model import NodeTopology, Topology, from_dict, load_document
from topology.validate import duplicate_id_errors, node_errors

DATA_KEY = "topology.yml"


def parse_topology_document(text: str, obj: str) -> Topology:
    """A ConfigMap (`data: {topology.yml: ...}`) or the topology itself, as YAML or JSON."""
    try:
        doc: Any = load_document(text)
    except yaml.YAMLError as e:
        raise TopologyError(obj, "topology", f"is not valid YAML: {one_line(e)}") from None
    if isinstance(doc, Mapping) and doc.get("kind") == "ConfigMap":
        return configmap_topology(doc, obj)
    return from_dict(doc, obj)


def configmap_topology(cm: Mapping[str, Any], obj: str) -> Topology:
    data = cm.get("data")
    text = data.get(DATA_KEY) if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        raise TopologyError(obj, f"data[{DATA_KEY}]", "is missing")
    try:
        doc = load_document(text)
    except yaml.YAMLError as e:
        raise TopologyError(obj, f"data[{DATA_KEY}]", f"is not valid YAML: {one_line(e)}") from None
    return from_dict(doc, obj)


def missing_node(topology: Topology, node: str, obj: str) -> TopologyError:
    known = ", ".join(sorted(topology.nodes)) or "none"
    return TopologyError(obj, f"nodes.{node}", f"is not in the topology (nodes: {known})")


def node_of(topology: Topology, node: str, obj: str) -> NodeTopology | None:
    """This exporter's node (None if absent), checked against the MIG catalog.

    Raises TopologyError when the node's entry is not something a real GPU could be.
    """
    found = topology.nodes.get(node)
    if found is None:
        return None
    errors = node_errors(node, found)
    errors += [e for e in duplicate_id_errors(topology) if e.obj == f"node {node}"]
    if errors:
        raise TopologyError(obj, errors[0].field, f"{errors[0].obj}: {errors[0].message}")
    return found
