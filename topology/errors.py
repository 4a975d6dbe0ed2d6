"""One error type that says where the problem is: the object, the field, what is wrong."""

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


class TopologyError(ValueError):
    """Bad input, reported as one line: `<object>: <field>: <message>`."""

    def __init__(self, obj: str, field: str, message: str) -> None:
        obj, field, message = printable(obj), printable(field), printable(message)
        super().__init__(f"{obj}: {field}: {message}")
        self.obj = obj
        self.field = field
        self.message = message

    # A value, not an event: the same problem found twice is the same problem (so a node that
    # stays bad is not a change).
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopologyError):
            return NotImplemented
        return (self.obj, self.field, self.message) == (other.obj, other.field, other.message)

    def __hash__(self) -> int:
        return hash((self.obj, self.field, self.message))


def one_line(e: BaseException) -> str:
    """A library's message (YAML errors span lines) folded onto one line."""
    return " ".join(str(e).split())
