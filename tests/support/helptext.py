"""What each command's `--help` prints, as `docs/help.md` shows it.

`python -m tests.support.helptext > docs/help.md` (`make docs-help`) writes the page again after a
flag or its help changes; `tests/pipeline/test_help.py` fails while the page is stale.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Callable, Iterator

import topology.__main__ as topology_cli
from exporter import cli as exporter_cli
from status_updater import cli as updater_cli

Parser = Callable[[], argparse.ArgumentParser]

# (the command line a user types, the parser that answers it, the arguments before --help)
COMMANDS: list[tuple[str, Parser, list[str]]] = [
    ("python -m exporter --help", exporter_cli.parser, []),
    ("python -m status_updater --help", updater_cli.parser, []),
    ("python -m status_updater render --help", updater_cli.parser, ["render"]),
    ("python -m status_updater run --help", updater_cli.parser, ["run"]),
    ("python -m topology --help", topology_cli.parser, []),
    ("python -m topology show --help", topology_cli.parser, ["show"]),
]


@contextlib.contextmanager
def _plain_environment() -> Iterator[None]:
    """Defaults that come from the environment show as they are without it; lines wrap at 100."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ["COLUMNS"] = "100"
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def help_text(parser: Parser, argv: list[str]) -> str:
    out = io.StringIO()
    with _plain_environment(), contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        parser().parse_args([*argv, "--help"])
    return out.getvalue()


def page() -> str:
    parts = [
        "# `--help`\n\n"
        "What each command prints for `--help`, without any of its environment variables set.\n"
        "[commands.md](commands.md) explains the flags; `make docs-help` writes this page again.\n"
    ]
    for line, parser, argv in COMMANDS:
        parts.append(f"\n## `{line}`\n\n```\n{help_text(parser, argv).rstrip()}\n```\n")
    return "".join(parts)


if __name__ == "__main__":
    print(page(), end="")
