"""The topology ConfigMap object, as written to the cluster and printed by `render`."""

from __future__ import annotations

import os
from typing import Any

import yaml

from topology.model import SafeDumper, Topology, dump_yaml

DATA_KEY = "topology.yml"
DEFAULT_NAME = "topology"
DEFAULT_NAMESPACE = "gpu-operator"


def configmap_name() -> str:
    return os.environ.get("TOPOLOGY_CM_NAME") or DEFAULT_NAME


def configmap_namespace() -> str:
    return os.environ.get("TOPOLOGY_CM_NAMESPACE") or DEFAULT_NAMESPACE


def topology_configmap(topology: Topology | str, name: str, namespace: str) -> dict[str, Any]:
    """The ConfigMap for a topology (or its `topology.yml` text, when already dumped)."""
    text = topology if isinstance(topology, str) else dump_yaml(topology)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {DATA_KEY: text},
    }


class _LiteralDumper(SafeDumper):  # type: ignore[valid-type,misc]
    """Prints multi-line strings as `|` blocks so the embedded topology stays readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str)


def dump_object(obj: dict[str, Any]) -> str:
    return yaml.dump(obj, Dumper=_LiteralDumper, sort_keys=False, default_flow_style=False)
