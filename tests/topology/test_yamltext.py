"""The block-YAML writer: PyYAML loads back exactly the tree that went in."""

from __future__ import annotations

from collections import OrderedDict
from enum import IntEnum, StrEnum
from types import MappingProxyType

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import tree as oracle
from tests.support.base import examples

# Strings a topology can carry, and the ones YAML would misread if left unquoted.
TRICKY = ["", "true", "No", "~", "null", "1g.5gb", "0x1F", "1e3", "12:30", "- a", "a: b", "#x",
          "'q'", '"d"', "a\nb", "tab\there", "é", "\u2028", "\x85", "😀", "2001-01-01", "=", "<<",
          ".inf", "-1", "+1", "0o17", "a b", " lead", "trail ", "@at", "`tick", "!tag", "%p", "*a",
          "False", "off", "ON", "Null", "n", "Y", "yes", "TRUE", "fine", "note", "_x", "Zeta"]  # fmt: skip
strings = st.one_of(st.sampled_from(TRICKY), st.text(max_size=12))
scalars = st.one_of(st.none(), st.booleans(), st.integers(), strings)
keys = st.one_of(strings, st.integers())
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=25,
)


@settings(max_examples=examples(400))
@given(trees)
def test_pyyaml_reads_back_what_was_written(tree: object) -> None:
    assert yaml.safe_load(oracle.dump(tree)) == tree


def test_layout_is_pyyamls_block_style() -> None:
    tree = {"nodes": {"n1": {"gpus": [{"id": "GPU-1", "mig-devices": [{"name": "1g.5gb"}]}],
                             "on": True, "empty": {}, "none": []}}, "list": [[1, 2], "yes"]}  # fmt: skip
    expected = yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)
    assert oracle.dump(tree) == expected


def test_values_and_subclasses_lay_out_as_their_plain_types() -> None:
    class Name(StrEnum):
        A = "1g.5gb"

    class Count(IntEnum):
        TWO = 2

    plain = {"a": ["x", "y"], "m": {"k": 1}, "one": {"k": None}, "empty": {}, "none": [], "nil": None,
             "s": "1g.5gb", "n": 2}  # fmt: skip
    dressed = {"a": ("x", "y"), "m": MappingProxyType({"k": 1}), "one": OrderedDict(k=None),
               "empty": OrderedDict(), "none": (), "nil": None, "s": Name.A, "n": Count.TWO}  # fmt: skip
    expected = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)
    assert oracle.dump(dressed) == oracle.dump(plain) == expected
    assert oracle.dump([OrderedDict(k=[("x",)])]) == oracle.dump([{"k": [["x"]]}])


# Characters at each edge of the escapes: printable ASCII, \xXX, \uXXXX and \UXXXXXXXX. PyYAML
# writes a few more as named escapes (\a, \e, \N, \_ …); none of them is here.
EDGES = [
    " ",
    "!",
    "~",
    "\x7f",
    "\x1f",
    "\x80",
    "\xfe",
    "\xff",
    "\u0100",
    "\ufffd",
    "\uffff",
    "\U00010000",
]


def test_escapes_are_pyyamls() -> None:
    for c in EDGES:
        tree = {"k": "\x01" + c}  # the control character makes both write it double-quoted
        assert oracle.dump(tree) == yaml.safe_dump(tree, width=10**9), repr(c)


def test_a_key_is_implicit_up_to_yamls_limit_of_1024_characters_as_written() -> None:
    for text, written in (("a" * 1024, "a" * 1024), ("1" * 1022, "'" + "1" * 1022 + "'")):
        assert oracle.dump({text: 1}) == f"{written}: 1\n"
        assert yaml.safe_load(oracle.dump({text: 1})) == {text: 1}
    for text in ("a" * 1025, "1" * 1023):
        assert oracle.dump({text: 1}).startswith("? ")
        assert yaml.safe_load(oracle.dump({text: 1})) == {text: 1}
