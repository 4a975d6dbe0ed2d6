"""docs/help.md shows what each command's `--help` prints (`make docs-help` writes it again)."""

from __future__ import annotations

import re

import pytest

from tests.support.base import ROOT
from tests.support.helptext import COMMANDS, Parser, help_text


def _blocks() -> dict[str, str]:
    page = (ROOT / "docs" / "help.md").read_text(encoding="utf-8")
    return dict(re.findall(r"^## `([^`]+)`\n\n```\n(.*?)\n```$", page, flags=re.M | re.S))


def _words(text: str) -> str:
    # Wrapping and padding differ between Python versions; the words and their order do not.
    return " ".join(text.split())


@pytest.mark.parametrize(("line", "parser", "argv"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_docs_show_what_help_prints(line: str, parser: Parser, argv: list[str]) -> None:
    shown = _blocks().get(line)
    assert shown is not None, f"docs/help.md has no section for `{line}`: run make docs-help"
    assert _words(shown) == _words(help_text(parser, argv)), (
        f"docs/help.md is stale for `{line}`: run make docs-help"
    )


def test_the_upgrade_page_is_the_generation_tables() -> None:
    from exporter import upgrade

    page = (ROOT / "docs" / "upgrade.md").read_text()
    assert page == upgrade.page(), "docs/upgrade.md is stale: run make docs-upgrade"
