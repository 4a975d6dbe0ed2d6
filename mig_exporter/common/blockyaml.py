"""Block-style YAML of the plainest kind, read in one pass: what `topology.model.dump_yaml` writes.

libyaml parses fast, but PyYAML builds every value in Python: 5,000 nodes' `topology.yml` took
23 s to load, most of the many-nodes exporter's start-up. This reads the subset that the status
updater writes (and PyYAML's block dumper, and most people by hand), straight into the tree
PyYAML would build, and answers None for any other text, which is then left to PyYAML:

- a line is `key: value`, `key:` or `- key: value`, indented by spaces; a `key:` is followed by
  a deeper mapping, or by a sequence of mappings at its own indent or deeper;
- keys and values are plain scalars that can only be strings, decimal integers without a leading
  zero, `true`/`false`, single-quoted strings, or `{}`/`[]`;
- no comment, tab, flow collection, anchor, tag, document marker, multi-line scalar, explicit
  key, double-quoted scalar or anything else: None.

tests/common/test_blockyaml.py proves it builds what PyYAML builds for every document dump_yaml
writes, and answers None or the same tree for any text.
"""

from __future__ import annotations

import re
import string
from typing import Any

import yaml.resolver

_RESOLVER = yaml.resolver.Resolver()
_STR = "tag:yaml.org,2002:str"
_INT = re.compile(r"0|[1-9][0-9]{0,17}")  # YAML 1.1's decimal form, and no `_`, sign or base
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*")  # nothing a plain scalar must escape
_QUOTED = re.compile(r"'(?:[ -&(-~]|'')*'")  # printable ASCII: PyYAML refuses some others
# Only for speed: characters outside the subset anywhere in the text (a literal block's `|`, a
# double quote, a comment, an anchor, a tab): found in C before anything is split, so PyYAML gets
# such a text (a List of ConfigMaps) at once. A quoted name holding one goes to PyYAML too, as it may.
_OUTSIDE = re.compile(r'[|>"&*!#%@`\t\r]')
MAX_KEY = 1024  # PyYAML's limit on an implicit key's length
# PyYAML resolves a plain scalar to something other than a string only by its first character
# (digits, signs, '.', '~', the letters its booleans and null start with): a plain string
# starting with any other letter is a string without asking the resolver.
_RESOLVED_FIRST = {c for c in yaml.resolver.Resolver.yaml_implicit_resolvers if c}
_SAFE_FIRST = "".join(c for c in string.ascii_letters + "_" if c not in _RESOLVED_FIRST)
_NEVER_RESOLVED = re.compile(f"[{_SAFE_FIRST}][A-Za-z0-9_./-]*")
MAX_DEPTH = 64  # deeper than any document of the schema: left to PyYAML's own bounds
_EMPTY: dict[str, type[dict[Any, Any]] | type[list[Any]]] = {"{}": dict, "[]": list}


class _NotMine(Exception):
    """The text is outside the subset: PyYAML reads it."""


def scalar(text: str) -> Any:
    """One scalar as PyYAML reads it, or None when it is outside the subset (in it, no scalar
    is null)."""
    try:
        return _scalar(text)
    except _NotMine:
        return None


def _scalar(text: str) -> Any:
    value: Any
    if _NEVER_RESOLVED.fullmatch(text):
        value = text
    elif _INT.fullmatch(text):
        value = int(text)
    elif text in ("true", "false"):
        value = text == "true"
    elif _PLAIN.fullmatch(text):
        # PyYAML resolves a plain scalar by its text: `null`, `yes`, `1.5`, `12:30` are no
        # strings. Whatever it would make of it other than a string is not ours to read.
        tag = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
        if tag != _STR:
            raise _NotMine
        value = text
    elif _QUOTED.fullmatch(text):
        value = text[1:-1].replace("''", "'")
    else:
        raise _NotMine
    return value


# line -> its token: most lines of a node's document recur in every other's (`namespace: team`,
# `min: 80`), so they are split once; and their strings are one object in every tree.
_TOKENS: dict[str, tuple[int, bool, Any, Any]] = {}
MAX_TOKENS = 1 << 14  # then forgotten all at once: about 2 MiB at most
_NO_VALUE = object()  # `key:`, a collection follows


def load(text: str) -> Any:
    """The tree PyYAML builds from `text`, or None when the text is outside the subset (a
    document that is empty or only `{}` included: PyYAML says what those are)."""
    if _OUTSIDE.search(text):
        return None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(_TOKENS) > MAX_TOKENS:
        _TOKENS.clear()
    try:
        tokens = [_TOKENS.get(line) or _token(line) for line in lines]
        root, end = _mapping(tokens, 0, 0, False)
    except (_NotMine, IndexError, RecursionError):
        return None
    return root if end == len(tokens) and root else None


def _token(line: str) -> tuple[int, bool, Any, Any]:
    """(the indent of its key, whether it starts an item `- `, key, value or _NO_VALUE)."""
    body = line.lstrip(" ")
    width = len(line) - len(body)
    dash = body.startswith("- ")
    if dash:
        body, width = body[2:], width + 2
    if body.startswith("'"):  # a quoted key may hold `: `
        end = _QUOTED.match(body)
        if end is None:
            raise _NotMine
        key_text, rest = body[: end.end()], body[end.end() :]
    else:
        cut = body.find(":")
        if cut < 0:
            raise _NotMine
        key_text, rest = body[:cut], body[cut:]
    if len(key_text) > MAX_KEY:
        raise _NotMine
    key = _scalar(key_text)
    if rest == ":":
        value: Any = _NO_VALUE
    elif rest.startswith(": ") and len(rest) > 2:
        text = rest[2:]
        value = _EMPTY[text] if text in _EMPTY else _scalar(text)
    else:
        raise _NotMine
    token = (width, dash, key, value)
    _TOKENS[line] = token
    return token


def _mapping(
    tokens: list[tuple[int, bool, Any, Any]], i: int, indent: int, item: bool
) -> tuple[dict[Any, Any], int]:
    """The mapping whose keys are the tokens from `i` at `indent`; `item`: its first token is a
    sequence item's `- `."""
    if indent > MAX_DEPTH * 4:
        raise _NotMine
    out: dict[Any, Any] = {}
    n = len(tokens)
    while i < n:
        width, dash, key, value = tokens[i]
        if width < indent or (dash and not (item and not out)):
            break  # the mapping ends (an item's `- ` ends the one before; elsewhere, the text)
        if width > indent:
            raise _NotMine
        i += 1
        if value is not _NO_VALUE:
            out[key] = value() if value in (dict, list) else value
            continue
        if i == n:
            raise _NotMine  # `key:` with nothing after it is null
        deeper, seq = tokens[i][0], tokens[i][1]
        if seq and deeper - 2 >= indent:
            out[key], i = _sequence(tokens, i, deeper)
        elif not seq and deeper > indent:
            out[key], i = _mapping(tokens, i, deeper, False)
        else:
            raise _NotMine
    return out, i


def _sequence(
    tokens: list[tuple[int, bool, Any, Any]], i: int, indent: int
) -> tuple[list[Any], int]:
    """Mappings, each starting `- ` with its keys at `indent`."""
    out: list[Any] = []
    while i < len(tokens) and tokens[i][1] and tokens[i][0] == indent:
        item, i = _mapping(tokens, i, indent, True)
        out.append(item)
    return out, i
