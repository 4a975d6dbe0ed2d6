"""What dcgm-exporter writes in `err_msg` for an Xid: its collector's table (`xid_errors.go`,
updated from the Xid errors of driver R580 in its PR #588), kept as data in xid_messages.tsv.
A code past the table is "Unknown Error", as there."""

from __future__ import annotations

from pathlib import Path

UNKNOWN = "Unknown Error"


def _read(path: Path) -> dict[int, str]:
    rows = (line.rstrip("\n").split("\t", 1) for line in path.read_text().splitlines(True))
    return {int(code): text for code, text in (r for r in rows if r[0] and r[0][0] != "#")}


TEXTS = _read(Path(__file__).with_name("xid_messages.tsv"))


def xid_text(code: int) -> str:
    return TEXTS.get(code, UNKNOWN)
