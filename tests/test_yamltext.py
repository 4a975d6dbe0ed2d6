"""The block-YAML writer: PyYAML loads back exactly the tree that went in."""

from __future__ import annotations

import yaml
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from topology import yamltext

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
    assert yaml.safe_load(yamltext.dump(tree)) == tree


def test_layout_is_pyyamls_block_style() -> None:
    tree = {"nodes": {"n1": {"gpus": [{"id": "GPU-1", "mig-devices": [{"name": "1g.5gb"}]}],
                             "on": True, "empty": {}, "none": []}}, "list": [[1, 2], "yes"]}  # fmt: skip
    expected = yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)
    assert yamltext.dump(tree) == expected
