"""Reads Kubernetes objects from files the way `kubectl get -o yaml` writes them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from topology.errors import one_line
from topology.model import SafeLoader

SUFFIXES = (".yaml", ".yml", ".json")


class InputError(Exception):
    """A path that cannot be read at all: `<path>: <what is wrong>`."""


def _files(path: Path) -> Iterator[Path]:
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
        if not found:
            raise InputError(f"{path}: no .yaml, .yml or .json files in this directory")
        yield from found
    elif path.is_file():
        yield path
    else:
        raise InputError(f"{path}: no such file or directory")


def _documents(path: Path) -> Iterator[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
    try:
        if path.suffix == ".json":
            yield json.loads(text)
        else:
            yield from list(yaml.load_all(text, Loader=SafeLoader))
    except (yaml.YAMLError, ValueError) as e:
        raise InputError(f"{path}: not valid {path.suffix[1:].upper()}: {one_line(e)}") from None


def load_objects(paths: list[str], default_kind: str) -> Iterator[dict[str, Any]]:
    """Every object in the paths; a `kind: List` is flattened, objects without kind get `default_kind`."""
    for raw in paths:
        for file in _files(Path(raw)):
            for doc in _documents(file):
                items = (
                    doc.get("items")
                    if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List")
                    else [doc]
                )
                for item in items or []:
                    if isinstance(item, dict):
                        yield item if "kind" in item else {**item, "kind": default_kind}
