"""One error type that says where the problem is: the object, the field, what is wrong."""

from __future__ import annotations

from mig_exporter.common.text import printable


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
