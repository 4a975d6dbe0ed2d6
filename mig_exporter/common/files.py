"""Local files the daemons and CLIs read (topology files, counters CSVs), read with bounds.

A path given by mistake or by an attacker must not hang or exhaust the process: a FIFO or device
is refused instead of waited on (the open does not block), a file is read only up to its limit,
and text must be UTF-8. Every refusal is one line.
"""

from __future__ import annotations

import os
import stat


class UnreadableFile(Exception):
    """Why a file cannot be used, in one line."""


def read_text(path: str | os.PathLike[str], limit: int) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise UnreadableFile(f"cannot be read: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnreadableFile("not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UnreadableFile(f"cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UnreadableFile(f"larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableFile("not UTF-8 text") from None
