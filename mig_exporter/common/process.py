"""How both daemons' (and the topology CLI's) processes start and end."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Sequence
from typing import NoReturn


def env_switch(name: str) -> bool:
    """A switch set in the environment: `1`, `true` or `yes`, in any case."""
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's shutdown: daemon threads blocked in a request (a watch, a
    relist during slow answers) can make it abort (exit -6) after the work is done. Flush first."""
    logging.shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # the reader has gone (`| head`): nothing left to say
        pass
    os._exit(code)


# What the Kubernetes client and the topology's settings (topology/settings.py) read, for every
# command that talks to a cluster.
CLUSTER_ENVIRONMENT = (
    "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "TOPOLOGY_LAYOUT",
    "TOPOLOGY_CM_NAMESPACE", "TOPOLOGY_CM_NAME",
)  # fmt: skip


def not_utf8(argv: Sequence[str], environment: Iterable[str]) -> str | None:
    """Why the command line or the environment cannot be used, in one line, or None.

    Python hands over bytes that are not UTF-8 as lone surrogates (surrogateescape), and they
    fail only later, where they are written out: a label, a log line, an API request; an
    internal error then, or a daemon that dies. Said here instead, before anything runs, naming
    the flag or variable: `environment` are the variables the command reads.
    """
    for name in environment:
        value = os.environ.get(name)
        if value is not None and not _utf8(value):
            return f"environment variable {name}: {_not_utf8(value)}"
    for i, arg in enumerate(argv):
        if not _utf8(arg):
            flag, value = _flag_of(argv[:i].count("--") == 0, argv, i)
            return f"argument {flag or i + 1}: {_not_utf8(value)}"
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _not_utf8(value: str) -> str:
    try:
        raw = os.fsencode(value)  # the bytes as given
    except UnicodeEncodeError:  # a surrogate no undecodable byte made (a caller's own str)
        raw = value.encode("utf-8", "backslashreplace")
    shown = repr(raw[:60]) + ("..." if len(raw) > 60 else "")
    return f"not UTF-8 text: {shown}"


def _flag_of(options: bool, argv: Sequence[str], i: int) -> tuple[str | None, str]:
    """The flag argv[i] gives a value to (`--flag VALUE`, `--flag=VALUE`, `-fVALUE`), when
    `options` are still read (no `--` before it) and its name can be written; and the value."""
    arg, before = argv[i], argv[i - 1] if i > 0 else ""
    name: str | None = None
    value = arg
    if not options:
        pass
    elif arg.startswith("--") and "=" in arg:
        name, value = arg.split("=", 1)
    elif arg.startswith("-") and arg != "-" and not arg.startswith("--"):
        name, value = arg[:2], arg[2:]
    elif not arg.startswith("-") and before.startswith("-") and before not in ("-", "--"):
        name = before if "=" not in before else None
    if name is None or not _utf8(name):
        return None, arg
    return name, value
