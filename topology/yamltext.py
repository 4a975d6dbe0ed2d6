"""Block-style YAML: its scalars and keys, for `model.dump_yaml`, and a writer of plain trees
(`dump`, `list_item`), for what is too big for PyYAML (render's ResourceSlices: 300 MB for 1,000
nodes, 3 minutes through PyYAML).

PyYAML's representer is pure Python even with libyaml: one fully allocated 8-GPU node took 4.5 ms
to dump, more than the updater's whole per-event budget (bench/scale.py). So the topology is
written directly, in the layout PyYAML's block style uses, and PyYAML's own resolver decides which
strings may stay unquoted. `tests/topology/test_yamltext.py` proves, with the block writer of
tests/support/tree.py built on these, that PyYAML loads back exactly the tree that went in.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import yaml.resolver

_RESOLVER = yaml.resolver.Resolver()
_STR_TAG = "tag:yaml.org,2002:str"
# Characters a plain scalar may hold anywhere in it: no indicator, blank or comment character.
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")
_PRINTABLE_ASCII = re.compile(r"[ -~]*")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}


# PyYAML resolves a plain scalar to something other than a string only by its first character
# (digits, signs, '.', '~', and the letters its booleans and null start with): a plain-safe string
# starting with any other letter is a string, with no need to run the resolver's expressions.
_RESOLVED_FIRST = {k for k in yaml.resolver.Resolver.yaml_implicit_resolvers if k}
_SAFE_FIRST = "".join(c for c in string.ascii_letters + "_" if c not in _RESOLVED_FIRST)
_NEVER_RESOLVED = re.compile(f"[{_SAFE_FIRST}][A-Za-z0-9_./-]*")


@lru_cache(maxsize=8192)
def _string(value: str) -> str:
    if _NEVER_RESOLVED.fullmatch(value):
        return value
    implicit = _RESOLVER.resolve(yaml.ScalarNode, value, (True, False))  # type: ignore[no-untyped-call]
    if _PLAIN.fullmatch(value) and implicit == _STR_TAG:
        return value
    if _PRINTABLE_ASCII.fullmatch(value):
        return "'" + value.replace("'", "''") + "'"
    return '"' + "".join(_escape(c) for c in value) + '"'


def _escape(c: str) -> str:
    if c in _ESCAPES:
        return _ESCAPES[c]
    code = ord(c)
    if 0x20 <= code < 0x7F:
        return c
    if code <= 0xFF:
        return f"\\x{code:02X}"
    return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def scalar(value: object) -> str:
    """One scalar (a string, int, bool or None) as YAML writes it in block style."""
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):  # an int or bool subclass
        return scalar(bool(value) if isinstance(value, bool) else int(value))
    if isinstance(value, Mapping):  # only empty ones reach here
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    raise TypeError(f"cannot write {type(value).__name__} as YAML")


# YAML limits an implicit key (`key: value`) to 1024 characters as written, quotes included: a
# longer one (a name nobody validated) is written as an explicit key, `? key` then `: value`,
# which has no limit.
MAX_IMPLICIT_KEY = 1024


def key(value: object, indent: str) -> str:
    """`<indent>key:` (the value, if any, follows after a space), as one or two lines."""
    text = scalar(value)
    if len(text) <= MAX_IMPLICIT_KEY:
        return f"{indent}{text}:"
    return f"{indent}? {text}\n{indent}:"


_SCALARS = frozenset((str, int, bool, type(None)))


def _nested(value: object) -> bool:
    kind = type(value)
    if kind is dict or kind is list or kind is tuple:  # the common cases first: no ABC checks
        return len(value) > 0  # type: ignore[arg-type]
    if kind in _SCALARS:
        return False
    return isinstance(value, Mapping | list | tuple) and len(value) > 0


def _block(value: Any, indent: str, out: list[str]) -> None:
    if type(value) is dict or isinstance(value, Mapping):
        inner = indent + "  "
        for k, item in value.items():
            if not _nested(item):
                out.append(f"{key(k, indent)} {scalar(item)}")
                continue
            out.append(key(k, indent))
            # A list under a key starts at the key's column, as PyYAML writes it.
            _block(item, indent if type(item) is list or type(item) is tuple else inner, out)
        return
    for item in value:
        if not _nested(item):
            out.append(f"{indent}- {scalar(item)}")
            continue
        start = len(out)
        _block(item, indent + "  ", out)
        out[start] = f"{indent}- {out[start][len(indent) + 2 :]}"


def dump(data: object) -> str:
    """`data` (dicts, lists, scalars) as a block-style YAML document, laid out as PyYAML's
    `default_flow_style=False, sort_keys=False` lays it out."""
    if not _nested(data):
        return scalar(data) + "\n"
    out: list[str] = []
    _block(data, "", out)
    return "\n".join(out) + "\n"


def list_item(data: object) -> str:
    """`data` as one item of a block sequence at column 0 (`- ...`), to write a long list an item
    at a time."""
    if not _nested(data):
        return f"- {scalar(data)}\n"
    out: list[str] = []
    _block(data, "  ", out)
    out[0] = f"- {out[0][2:]}"
    return "\n".join(out) + "\n"
