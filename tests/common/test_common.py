"""The ground floor's promises, each on its own: bad bytes named by their flag, dates that stay
text, and JSON that is not UTF-8 refused as a value error."""

from __future__ import annotations

import os
import sys
import tracemalloc
from pathlib import Path

import pytest
import yaml

from mig_exporter.common.files import UnreadableFile, read_text
from mig_exporter.common.process import not_utf8
from mig_exporter.common.selfmetrics import InvalidObjects, kind_of
from mig_exporter.common.yamlload import _expands_beyond, load_document, load_documents, load_json

BAD = os.fsdecode(b"caf\xe9")  # as Python hands over an argument that is not UTF-8


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--node-name", BAD], "argument --node-name: not UTF-8 text: b'caf\\xe9'"),
        (["--node-name=" + BAD], "argument --node-name: not UTF-8 text: b'caf\\xe9'"),
        (["-n" + BAD], "argument -n: not UTF-8 text: b'caf\\xe9'"),
        (["-x", "--", BAD], "argument 3: not UTF-8 text: b'caf\\xe9'"),  # no flags after --
        (["-", BAD], "argument 2: not UTF-8 text: b'caf\\xe9'"),  # `-` is a value, not a flag
        ([BAD], "argument 1: not UTF-8 text: b'caf\\xe9'"),
        ([BAD, "--flag"], "argument 1: not UTF-8 text: b'caf\\xe9'"),  # nothing before the first
        (["--flag", "x=" + BAD], "argument --flag: not UTF-8 text: b'x=caf\\xe9'"),
        (["=" + BAD], "argument 1: not UTF-8 text: b'=caf\\xe9'"),
        (["--" + BAD], "argument 1: not UTF-8 text: b'--caf\\xe9'"),  # a flag's own name
        (["--flag", "--" + BAD], "argument 2: not UTF-8 text: b'--caf\\xe9'"),  # not its value
        (["--a=b", BAD], "argument 2: not UTF-8 text: b'caf\\xe9'"),  # --a=b took its value
        (["--", "--flag", BAD], "argument 3: not UTF-8 text: b'caf\\xe9'"),  # no flags after --
    ],
)
def test_a_value_that_is_not_utf8_is_named_by_its_flag(argv: list[str], said: str) -> None:
    assert not_utf8(argv, ()) == said


def test_a_long_value_is_cut_at_60_bytes() -> None:
    sixty, more = "a" * 59 + BAD[-1], "a" * 60 + BAD[-1]
    shown = repr(59 * b"a" + b"\xe9")
    assert not_utf8([sixty], ()) == f"argument 1: not UTF-8 text: {shown}"
    assert not_utf8([more], ()) == f"argument 1: not UTF-8 text: {60 * b'a'!r}..."


def test_a_surrogate_no_byte_made_is_shown_escaped() -> None:
    assert not_utf8(["\ud800"], ()) == "argument 1: not UTF-8 text: b'\\\\ud800'"


def test_dates_stay_text() -> None:
    """YAML 1.1 would make them datetimes (and an impossible one a crash): they are text here,
    as the API gives them."""
    text = "created: 2026-01-01T00:00:00Z\nday: 2026-02-30\n"
    assert load_document(text) == {"created": "2026-01-01T00:00:00Z", "day": "2026-02-30"}
    assert load_documents(text + "---\nx: 2026-01-01\n")[1] == {"x": "2026-01-01"}


def test_json_bytes_that_are_not_utf8_are_a_value_error() -> None:
    with pytest.raises(ValueError):
        load_json(b'{"a": "\xff"}')


def test_a_value_that_cannot_be_built_is_named_in_the_error() -> None:
    with pytest.raises(yaml.YAMLError) as e:
        load_document("n: " + "9" * 5000)  # more digits than Python converts
    assert str(e.value).startswith("holds a value that cannot be read: ")
    assert "integer" in str(e.value)


def test_aliases_are_walked_only_up_to_the_budget() -> None:
    """More than `budget` values (the list and its items, every alias expanded) is too many."""
    doc = [[1, 2], [1, 2]]  # 7 values
    assert not _expands_beyond(doc, 7)
    assert _expands_beyond(doc, 6)


def test_a_large_file_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(64 << 20)  # sparse: nothing written, 64 MiB to read
    tracemalloc.start()
    try:
        with pytest.raises(UnreadableFile, match=r"^larger than 100 bytes$"):
            read_text(big, 100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux ptys and sessions")
def test_a_terminal_is_refused_without_becoming_the_controlling_terminal() -> None:
    """A daemon (a session leader without a terminal) given a tty's path must not take it as
    its controlling terminal: a hangup on it would kill the daemon. Checked in a child, which
    can leave the test's session."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 3
        try:
            os.setsid()
            _, slave = os.openpty()
            name = os.ttyname(slave)
            os.close(slave)
            try:
                read_text(name, 100)
                code = 4
            except UnreadableFile as e:
                if str(e) == "not a regular file":
                    try:
                        os.close(os.open("/dev/tty", os.O_RDONLY))
                        code = 1  # it became the controlling terminal
                    except OSError:
                        code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize(
    ("obj", "kind"),
    [
        ("node n1", "node"),
        ("pod ns/p", "pod"),
        ("ConfigMap ns/cm", "configmap"),
        ("topology file /etc/my topology.yml", "file"),
        ("ConfigMaps ns -l a/b=c", "configmap"),  # a list of them
    ],
)
def test_a_problem_is_counted_by_the_kind_of_its_object(obj: str, kind: str) -> None:
    invalid = InvalidObjects("x_invalid_objects_total")
    invalid.count(kind_of(obj))
    lines = invalid.exposition().decode().splitlines()
    assert f'x_invalid_objects_total{{kind="{kind}"}} 1.0' in lines
