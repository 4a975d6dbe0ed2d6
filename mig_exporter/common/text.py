"""Messages of one line: whatever a name or a library's error holds, a log line or a /health
body stays one line of bounded length."""

from __future__ import annotations

import re

# Names and values in messages come from objects anyone may write: a message stays one line of
# bounded length, whatever they hold, so a log line or a /health body cannot be forged or flooded.
MAX_PART = 400
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or f"\\x{ord(c):02x}"


def printable(text: str, limit: int = MAX_PART) -> str:
    """`text` on one line: control characters escaped, cut to `limit` characters."""
    text = _CONTROL.sub(_escape, text)
    return text if len(text) <= limit else f"{text[: limit - 1]}…"


def one_line(e: BaseException) -> str:
    """A library's message (YAML errors span lines) folded onto one line."""
    return " ".join(str(e).split())


def kind_of(value: object) -> str:
    """What a value is, for a message: `nothing` for null, else its type (`int`, `list`)."""
    return "nothing" if value is None else type(value).__name__


def some_of(names: list[str], shown: int = 5) -> str:
    """`a, b, c, d, e and 7 more`: a list named in a log line without flooding it."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
