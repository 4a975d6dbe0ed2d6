"""YAML and JSON read safely, in time and memory bounded by the text's length.

What users and other programs write (topology documents, annotations, mig-parted configs, web
configs, Kubernetes objects in files) is read here: nesting and alias expansion are bounded, dates
stay text, and every failure is a yaml.YAMLError (or ValueError for JSON) with a one-line reason.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from mig_exporter.common import blockyaml
from mig_exporter.common.text import one_line

# libyaml when PyYAML was built with it: the pure-Python loader is several times slower.
_FastLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SafeDumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_TIMESTAMP = "tag:yaml.org,2002:timestamp"


def _textual_times(loader: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    """The loader with YAML 1.1's dates left as text, as JSON and the Kubernetes API have them:
    an impossible one (`2024-02-30`) made the loader raise ValueError, and no field of ours
    wants a date object (mig_exporter/kube/times.py reads the text)."""
    resolvers = {
        first: [(tag, regexp) for tag, regexp in found if tag != _TIMESTAMP]
        for first, found in loader.yaml_implicit_resolvers.items()
    }
    return type(loader.__name__, (loader,), {"yaml_implicit_resolvers": resolvers})


SafeLoader = _textual_times(_FastLoader)
_DeepLoader = _textual_times(yaml.SafeLoader)  # recursion in Python, where too deep is an error


# libyaml's composer recurses in C: some tens of thousands of nested `[`/`{` overflow the stack
# and kill the process (block nesting is bounded by indentation). The schema is a dozen levels
# deep; a text that might nest far deeper never reaches libyaml.
MAX_FLOW_DEPTH = 1000
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


class TooDeepError(yaml.YAMLError):
    def __str__(self) -> str:
        return f"nests more than {MAX_FLOW_DEPTH} levels deep"


def flow_depth_exceeds(text: str, limit: int = MAX_FLOW_DEPTH) -> bool:
    """Whether `[`/`{` nest deeper than `limit`, counting brackets inside strings too (so an
    over-estimate: only a text with a thousand unclosed brackets is refused)."""
    depth = 0
    for c in _NOT_BRACKETS.sub("", text):
        if c in "[{":
            depth += 1
            if depth > limit:
                return True
        elif depth:
            depth -= 1
    return False


class TooBigError(yaml.YAMLError):
    def __str__(self) -> str:
        return "expands its aliases to far more values than its text holds"


def _expands_beyond(doc: object, budget: int) -> bool:
    """Whether the tree, walked with aliases expanded, has more than `budget` values. The loader
    shares an aliased value, so a few hundred bytes of `&a [*b, *b, …]` load small, and blow up
    in whatever walks them next: the walk stops as soon as the budget is spent."""
    stack = [doc]
    while stack:
        budget -= 1
        if budget < 0:
            return True
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return False


class UnreadableValueError(yaml.YAMLError):
    def __init__(self, e: ValueError) -> None:
        self.reason = one_line(e)

    def __str__(self) -> str:
        return f"holds a value that cannot be read: {self.reason}"


def load_document(text: str) -> Any:
    """YAML (or JSON) text, parsed safely, in time and memory bounded by its length: a
    yaml.YAMLError when it nests too deep (TooDeepError), its aliases expand it far beyond
    what its text could hold without them (TooBigError), or a value cannot be built
    (UnreadableValueError: an integer of more digits than Python converts)."""
    fast = blockyaml.load(text)  # what the updater writes, without PyYAML's Python half
    if fast is not None:
        return fast
    docs = load_documents(text)
    return docs[0] if docs else None


def load_documents(text: str) -> list[Any]:
    """Every document of a YAML stream (`---` between them), as load_document reads one."""
    try:
        if flow_depth_exceeds(text):
            # Maybe only brackets inside strings (a pod named `[[[…`, which the updater writes
            # quoted): the pure-Python loader recurses in Python, where too deep is an exception.
            try:
                docs = list(yaml.load_all(text, Loader=_DeepLoader))
            except RecursionError:
                raise TooDeepError() from None
        else:
            docs = list(yaml.load_all(text, Loader=SafeLoader))
    except ValueError as e:
        raise UnreadableValueError(e) from None
    # Without an alias (`*`), every value takes at least a character of the text.
    if "*" in text and _expands_beyond(docs, len(text) + 1000):
        raise TooBigError()
    return docs


def load_json(text: str | bytes) -> Any:
    """JSON text, parsed with the nesting bound of load_document (json recurses in Python: a few
    thousand `[` exhaust the stack). ValueError, with one line, on anything that is not JSON."""
    if flow_depth_exceeds(text.decode("utf-8", "replace") if isinstance(text, bytes) else text):
        raise ValueError(str(TooDeepError()))
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(str(TooDeepError())) from None
