"""`python -m topology show FILE [--node N]`: draw a topology's GPUs, slot by slot.

FILE is what the updater's `render` prints (a ConfigMap, or a `kind: List` of per-node ones) or a
bare `topology.yml`. The CLI edge of the package, its only I/O: bad input of any kind is one line
on stderr, `python -m topology: <file>: <reason>`, and exit status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from mig_exporter.common.files import UnreadableFile, read_text
from mig_exporter.common.process import not_utf8
from mig_exporter.common.text import one_line
from topology.configmap import parse_document
from topology.errors import TopologyError
from topology.show import picture

PROG = "python -m topology"
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# A rendered List of per-node ConfigMaps is a few KiB per node; 16 MiB is thousands of nodes.
MAX_FILE_BYTES = 16 << 20
ENVIRONMENT: tuple[str, ...] = ()  # the variables it reads: none, only its arguments


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Look at a MIG topology.")
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    show = commands.add_parser(
        "show",
        help="draw each GPU as a bar of its memory slots, with its MIG instances and their pods",
        description="Draw each GPU as a bar of its memory slots: every MIG instance over the "
        "slots it occupies, with its profile, GI id and the pod holding it (or free).",
    )
    show.add_argument("file", metavar="FILE", help="a topology ConfigMap, List, or topology.yml")
    show.add_argument("--node", metavar="N", help="only this node")
    return p


def _fail(reason: str) -> int:
    print(f"{PROG}: {_one_line(reason)}", file=sys.stderr)
    return EXIT_USAGE


def _one_line(text: str) -> str:
    return " ".join(text.split())


def show(path: str, node: str | None) -> int:
    name = _one_line(path)
    try:
        text = read_text(path, MAX_FILE_BYTES)
    except UnreadableFile as e:
        return _fail(f"{name}: {e}")
    try:
        topology = parse_document(text, name)
        # The node asked for, or every node, must be readable: a picture is not drawn in part.
        bad = [e for n, e in sorted(topology.invalid.items()) if node in (None, n)]
        if bad:
            raise bad[0]
        out = picture(topology, node, obj=name)
    except TopologyError as e:
        return _fail(str(e))
    except RecursionError:
        return _fail(f"{name}: topology: is nested too deeply")
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader has gone, nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    # Not UTF-8, an argument would fail where it is written out (a message, the picture).
    if (bad := not_utf8(sys.argv[1:] if argv is None else argv, ENVIRONMENT)) is not None:
        return _fail(bad)
    args = parser().parse_args(argv)
    try:
        return show(args.file, args.node)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last guard: one line, never a traceback
        print(f"{PROG}: internal error: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
