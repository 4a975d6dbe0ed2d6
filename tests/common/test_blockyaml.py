"""The fast block reader builds exactly what PyYAML builds, or declines (None) and PyYAML reads."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mig_exporter.common import blockyaml
from mig_exporter.common.yamlload import SafeLoader, load_document
from tests.support.base import SAMPLES
from tests.topology.test_topology_model import edited, topologies
from topology.model import Topology, dump_yaml


def typed(value: Any) -> Any:
    """A tree with each scalar's type beside it: `True == 1` and `1 == 1.0` in Python, not in
    YAML."""
    if isinstance(value, dict):
        return {typed(k): typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


def pyyaml(text: str) -> Any:
    """What PyYAML builds, or the exception it raises."""
    try:
        return typed(yaml.load(text, Loader=SafeLoader))
    except yaml.YAMLError as e:
        return e


def agrees(text: str) -> Any:
    """The fast reader's tree, checked against PyYAML's: None, or the very same tree."""
    fast = blockyaml.load(text)
    if fast is not None:
        assert typed(fast) == pyyaml(text), text
    return fast


@given(topologies)
def test_whatever_the_updater_writes_is_read_fast_as_pyyaml_reads_it(topology: Topology) -> None:
    text = dump_yaml(topology)
    fast = agrees(text)
    # Declined only for a character it leaves to PyYAML (a quoted name with `"`, `#`, ...).
    assert fast is not None or blockyaml._OUTSIDE.search(text), text


# Edits of a document the updater writes: any of them may leave the subset, or change what it is.
_EDITS = st.sampled_from(
    [" ", "  ", "- ", ":", ": ", "\n", "'", "''", "-", "0", "01", "1.5", "yes", "null", "~",
     "{}", "[]", "{", "? ", "x", "true", "True", "0x1", "1_0", "1:2", "\\", "é", ".", "<<"]
)  # fmt: skip


@given(
    topologies, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3), _EDITS), max_size=4)
)
def test_any_edit_of_a_document_is_read_as_pyyaml_reads_it_or_declined(
    topology: Topology, edits: list[tuple[int, int, str]]
) -> None:
    text = edited(topology, edits)
    agrees(text)


SCALARS = ["0", "7", "07", "010", "0o7", "0x1f", "1_000", "+1", "-1", "1.5", "1e3", ".5", "1:30",
           "123456789012345678901234", "true", "false", "True", "FALSE", "yes", "no", "on", "off",
           "y", "n", "null", "Null", "~", "2024-01-01", "2024-02-30", ".inf", ".nan", "<<", "=",
           "a", "A100", "1g.5gb", "MIG-1/2", "'quoted'", "'it''s'", "'a: b'", "''", "'é'",
           "'\x01'", '"double"', "a b", "a #c", "a: b", "&x a", "*x", "!!str 1", "|", ">",
           "{}", "[]", "{a: 1}", "[1]", "-", "- a", "? a", "%x", "@x", "`x"]  # fmt: skip


@pytest.mark.parametrize("scalar", SCALARS)
def test_each_kind_of_value_is_read_as_pyyaml_reads_it_or_declined(scalar: str) -> None:
    agrees(f"a: {scalar}\n")
    agrees(f"{scalar}: 1\n")
    agrees(f"a:\n- b: {scalar}\n  c: 1\n")


SHAPES = [
    "a: 1\nb:\n  c: 2\n",  # nested
    "a:\n- b: 1\n  c: 2\n- b: 3\n",  # an indentless sequence of mappings
    "a:\n  - b: 1\n  - b: 2\nc: 3\n",  # an indented one
    "a:\n  b:\n  - c: 1\n    d:\n      e: 2\n  f: 3\ng: 4\n",  # a sequence inside a mapping
    "a:\n- b:\n  - c: 1\n",  # a sequence in an item
    "a: 1\na: 2\n",  # a duplicate key: PyYAML keeps the last
    "a:\n",  # null
    "b: 1\na:\n",  # null at the end
    "a:\n  b:\n- c: 1\n",  # an item left of the key it would belong to: an error
    "a:\n  - b: 1\n- c: 2\n",  # an item left of its sequence: an error
    "a:\nb: 1\n",  # null, then a key
    "a: 1\n  b: 2\n",  # a deeper key: an error
    "a:\n  b: 1\n c: 2\n",  # a key between two indents: an error
    "a:\n- b: 1\n -c: 2\n",
    "a:\n-   b: 1\n    c: 2\n",  # an item whose keys sit further in
    "- a: 1\n",  # a sequence at the root
    "a: 1\n\nb: 2\n",  # a blank line
    "a: 1 \n",  # a trailing space
    "a: 1\r\nb: 2\r\n",
    "\ta: 1\n",
    "# c\na: 1\n",
    "---\na: 1\n",
    "a: 1\n---\nb: 2\n",
    "",
    "{}\n",
    "a: {}\nb: []\n",
    "'" + "k" * 1030 + "': 1\n",  # a key past YAML's implicit-key limit: an error
    "k" * 1030 + ": 1\n",
    "a:\n" + "".join(" " * (2 * d) + f"k{d}:\n" for d in range(1, 300)) + " " * 600 + "z: 1\n",
]


@pytest.mark.parametrize("text", SHAPES)
def test_each_shape_is_read_as_pyyaml_reads_it_or_declined(text: str) -> None:
    agrees(text)


def test_the_shapes_the_updater_writes_are_not_declined() -> None:
    """The fast path is taken where it matters: the sample topology, and the shapes above that
    a writer of ours uses."""
    sample = yaml.safe_load((SAMPLES / "topology" / "a100-40gb-active.yaml").read_text())
    assert agrees(sample["data"]["topology.yml"]) is not None
    for text in SHAPES[:5]:
        assert agrees(text) is not None, text


def test_load_document_reads_through_it() -> None:
    """The same tree either way, and a value PyYAML makes something else of is still that."""
    assert load_document("a:\n- b: x\n  c: 1\n") == {"a": [{"b": "x", "c": 1}]}
    assert load_document("a: yes\nb: 1.5\n") == {"a": True, "b": 1.5}
