"""The topology ConfigMap contract, shared by the updater (writer) and the exporter (reader).

Two layouts hold the same `topology.yml` schema:

- `per-node` (default): one ConfigMap per GPU node, `topology-<node>`, labelled
  `node-topology: "true"`, `node-name: <node>` and managed-by the updater, whose document has
  exactly that node under `nodes:`. A change to one node rewrites one small object, and each
  exporter reads only its own.
- `single`: one ConfigMap (`topology` unless TOPOLOGY_CM_NAME says otherwise) with every node,
  the original design, for small clusters.

Node names that do not fit a ConfigMap name (253 characters, DNS subdomain) or a label value
(63 characters) get a stable form: as much of the name as fits, `-`, and 10 hex digits of the
SHA-256 of the full name. The full name is always the key under `nodes:`.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from mig_exporter.common import blockyaml
from mig_exporter.common.text import one_line
from mig_exporter.common.yamlload import load_document
from topology.errors import TopologyError
from topology.model import Topology, from_dict

DATA_KEY = "topology.yml"
DEFAULT_NAME = "topology"  # the single layout's ConfigMap
DEFAULT_NAMESPACE = "gpu-operator"
LAYOUTS = ("per-node", "single")
DEFAULT_LAYOUT = "per-node"

NODE_PREFIX = "topology-"
LABEL_NODE_TOPOLOGY = "node-topology"
LABEL_NODE_NAME = "node-name"
# Marks the ConfigMaps the updater created: it never updates or deletes any other.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "topology-status-updater"
PER_NODE_SELECTOR = f"{LABEL_NODE_TOPOLOGY}=true"
MANAGED_SELECTOR = f"{PER_NODE_SELECTOR},{LABEL_MANAGED_BY}={MANAGER}"

_NAME_MAX = 253
_LABEL_MAX = 63
_HASH_LEN = 10
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _digest(node: str) -> str:
    return hashlib.sha256(node.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LEN]


def node_configmap_name(node: str) -> str:
    """`topology-<node>`, or `topology-<as much as fits>-<hash>` when that is not a valid name."""
    return node_object_name(NODE_PREFIX, node)


def node_object_name(prefix: str, node: str) -> str:
    """`<prefix><node>` (a prefix ending in `-`), or `<prefix><as much as fits>-<hash>` when that
    is not a valid object name: the name of an object a node has one of."""
    name = prefix + node
    if len(name) <= _NAME_MAX and _SUBDOMAIN.fullmatch(name):
        return name
    # Lower-case, anything else becomes '-', and every dot-separated part starts and ends
    # alphanumeric, so that prefix + part + '-' + hash is a DNS subdomain.
    parts = (re.sub(r"[^a-z0-9-]", "-", p.lower()).strip("-") for p in node.split("."))
    kept = ".".join(p for p in parts if p)[: _NAME_MAX - len(prefix) - _HASH_LEN - 1]
    kept = kept.rstrip("-.")
    return f"{prefix}{kept}{'-' if kept else ''}{_digest(node)}"


def node_label_value(node: str) -> str:
    """The node name as a label value, or `<as much as fits>-<hash>` when it is not one."""
    if len(node) <= _LABEL_MAX and _LABEL_VALUE.fullmatch(node):
        return node
    kept = re.sub(r"[^A-Za-z0-9_.-]", "-", node)[: _LABEL_MAX - _HASH_LEN - 1]
    kept = kept.lstrip("-_.").rstrip("-_.")
    return f"{kept}-{_digest(node)}" if kept else _digest(node)


def configmap(
    text: str,
    name: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
    owner: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ConfigMap holding `topology.yml`; `owner` is an ownerReference (to the node)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = dict(labels)
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {DATA_KEY: text}}


def node_labels(node: str) -> dict[str, str]:
    return {
        LABEL_NODE_TOPOLOGY: "true",
        LABEL_NODE_NAME: node_label_value(node),
        LABEL_MANAGED_BY: MANAGER,
    }


def node_owner(node: str, uid: str | None) -> dict[str, str] | None:
    """The ownerReference that lets the garbage collector delete a node's ConfigMap with it."""
    if not uid:
        return None  # an owner reference without the owner's uid is refused by the API
    return {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}


def node_configmap(node: str, text: str, namespace: str, uid: str | None) -> dict[str, Any]:
    """The per-node ConfigMap of `node`, `text` being its one-node `topology.yml`."""
    return configmap(
        text, node_configmap_name(node), namespace, node_labels(node), node_owner(node, uid)
    )


def is_managed(labels: Mapping[str, Any] | None) -> bool:
    """Whether a ConfigMap's labels mark it as one the updater created."""
    labels = labels or {}
    return labels.get(LABEL_NODE_TOPOLOGY) == "true" and labels.get(LABEL_MANAGED_BY) == MANAGER


# --- reading -------------------------------------------------------------------------------------


def configmap_topology(cm: Mapping[str, Any], obj: str) -> Topology:
    """The topology a ConfigMap object (parsed JSON or YAML) holds."""
    data = cm.get("data")
    text = data.get(DATA_KEY) if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        raise TopologyError(obj, f"data[{DATA_KEY}]", "is missing")
    try:
        doc = load_document(text)
    except yaml.YAMLError as e:
        raise TopologyError(obj, f"data[{DATA_KEY}]", f"is not valid YAML: {one_line(e)}") from None
    return from_dict(doc, obj)


# The first lines of a one-node `topology.yml` as the updater writes it; another line indented
# as a node's name is another node (or something else at that level): then it is read whole.
_ONE_NODE = re.compile(r"mig-strategy: (?:none|single|mixed)\nnodes:\n  ([^ \n][^\n]*):\n")
_NODE_LEVEL = re.compile(r"\n  [^ \n]")


def peek_node(text: str) -> str | None:
    """The one node a per-node `topology.yml` describes, read from its first lines without
    reading the rest; None when the text is not in the form the updater writes (or names more
    than one node): only reading it whole says then."""
    m = _ONE_NODE.match(text)
    if m is None or _NODE_LEVEL.search(text, m.end() - 1):
        return None
    name = blockyaml.scalar(m[1])
    return name if isinstance(name, str) else None


def configmap_node(cm: Mapping[str, Any]) -> str | None:
    """`peek_node` of a ConfigMap's `topology.yml`."""
    data = cm.get("data")
    text = data.get(DATA_KEY) if isinstance(data, Mapping) else None
    return peek_node(text) if isinstance(text, str) else None


def parse_document(text: str, obj: str, wanted: Callable[[str], bool] | None = None) -> Topology:
    """What `render` prints (a ConfigMap, or a `kind: List` of per-node ones) or a bare
    `topology.yml`. A List gives one topology with the nodes of all its ConfigMaps; with
    `wanted`, a ConfigMap whose one node it does not want is left unread (a shard's)."""
    try:
        doc: Any = load_document(text)
    except yaml.YAMLError as e:
        raise TopologyError(obj, "topology", f"is not valid YAML: {one_line(e)}") from None
    if isinstance(doc, Mapping) and doc.get("kind") == "ConfigMap":
        return configmap_topology(doc, obj)
    if isinstance(doc, Mapping) and doc.get("kind") == "List":
        return _merged(doc.get("items"), obj, wanted)
    return from_dict(doc, obj)


def _merged(items: object, obj: str, wanted: Callable[[str], bool] | None) -> Topology:
    if not isinstance(items, list):
        raise TopologyError(obj, "items", "expected a list of ConfigMaps")
    nodes: dict[str, Any] = {}
    invalid: dict[str, TopologyError] = {}
    strategy = "none"
    seen: set[str] = set()  # every node named so far, its ConfigMap read or (not wanted) not

    def claim(name: str, i: int) -> None:
        if name in seen:
            raise TopologyError(obj, f"items[{i}]", f"node {name} is in two ConfigMaps")
        seen.add(name)

    first = True
    for i, cm in enumerate(items):
        if not isinstance(cm, Mapping) or cm.get("kind") != "ConfigMap":
            raise TopologyError(obj, f"items[{i}]", "expected a ConfigMap")
        if wanted is not None and (name := configmap_node(cm)) is not None and not wanted(name):
            claim(name, i)
            continue
        part = configmap_topology(cm, f"{obj} items[{i}]")
        for name in (*part.nodes, *part.invalid):
            claim(name, i)
        nodes.update(part.nodes)
        invalid.update(part.invalid)
        strategy, first = part.mig_strategy if first else strategy, False
    return Topology(mig_strategy=strategy, nodes=nodes, invalid=invalid)
