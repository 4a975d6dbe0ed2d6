"""Reads Kubernetes objects from files the way `kubectl get -o yaml` writes them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from mig_exporter.common.files import UnreadableFile, read_text
from mig_exporter.common.text import kind_of, one_line
from mig_exporter.common.yamlload import load_documents, load_json

SUFFIXES = (".yaml", ".yml", ".json")
# A cluster's whole `kubectl get pods -A -o yaml` fits many times over; /dev/zero or a FIFO given
# by mistake is refused instead of read forever or waited on.
MAX_INPUT_BYTES = 1 << 30


class InputError(Exception):
    """A path that cannot be read at all: `<path>: <what is wrong>`."""


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not found:
            raise InputError(f"{path}: no .yaml, .yml or .json files in this directory")
        yield from found
    elif path.exists():
        yield path  # read_text refuses a FIFO or a device: one line, never a wait
    else:
        raise InputError(f"{path}: no such file or directory")


def _documents(path: Path) -> Iterator[Any]:
    try:
        text = read_text(path, MAX_INPUT_BYTES)
    except UnreadableFile as e:
        raise InputError(f"{path}: {e}") from None
    try:
        if path.suffix == ".json":
            yield load_json(text)
        else:
            yield from load_documents(text)
    except (yaml.YAMLError, ValueError) as e:
        raise InputError(f"{path}: not valid {path.suffix[1:].upper()}: {one_line(e)}") from None


def load_objects(
    paths: list[str], default_kind: str, skipped: list[str], kinds: Mapping[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """Every Node and Pod in the paths: each document an object, a `kind: List` of them, or a
    bare sequence (a YAML list, a JSON array) of them; an object without kind is `default_kind`.
    What is not one is said, one line each into `skipped`, and the rest is read."""
    for raw in paths:
        for file in _files(Path(raw)):
            docs = list(_documents(file))
            for n, doc in enumerate(docs):
                where = f"{file}: document {n + 1}" if len(docs) > 1 else str(file)
                yield from _objects(doc, where, default_kind, skipped, kinds or KINDS)


def _kinds(kinds: Mapping[str, str]) -> str:
    names = list(kinds.values())
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _objects(
    doc: object, where: str, default_kind: str, skipped: list[str], kinds: Mapping[str, str]
) -> Iterator[dict[str, Any]]:
    if doc is None:
        return  # an empty document: a trailing `---`, or a comment only
    items: list[tuple[str, object]]
    if isinstance(doc, list):
        items = [(f"{where}: [{i}]", item) for i, item in enumerate(doc)]
    elif isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
        found = doc.get("items")
        if found is not None and not isinstance(found, list):
            skipped.append(f"{where}: items: expected a list of objects, got {kind_of(found)}")
            return
        items = [(f"{where}: items[{i}]", item) for i, item in enumerate(found or ())]
    else:
        items = [(where, doc)]
    for at, item in items:
        if not isinstance(item, dict):
            skipped.append(f"{at}: expected a {_kinds(kinds)}, got {kind_of(item)}: skipped")
            continue
        kind = item.get("kind", default_kind)
        # Kinds are case-sensitive in the API, but what a hand-written `kind: node` means is clear.
        known = kinds.get(kind.lower()) if isinstance(kind, str) else None
        if known is None:
            skipped.append(f"{at}: a {kind!r} is no {_kinds(kinds)}: skipped")
            continue
        # The API names every object; one from a file without a name would be rendered as a
        # node (or a pod) named '' or after its YAML.
        meta = item.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            skipped.append(f"{at}: a {known} without metadata.name: skipped")
            continue
        yield item if item.get("kind") == known else {**item, "kind": known}


KINDS = {"node": "Node", "pod": "Pod", "resourceclaim": "ResourceClaim"}
POLICY_KINDS = {"configmap": "ConfigMap"}  # --fault-policies
