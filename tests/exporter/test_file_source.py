"""A topology file is followed whatever way it is replaced, and what a bad read of it reports is
cleared by its next good read, whatever part of it was bad."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter import dcgm, sources
from exporter.many import NodesExporter
from exporter.service import Exporter
from mig_exporter.web.server import Published
from tests.exporter.test_exporter import MIG
from tests.exporter.test_exporter_health import Reads
from tests.exporter.test_many import doc
from tests.support.kubeapi import eventually
from topology.configmap import node_configmap
from topology.model import dump_yaml

OPTIONS = dcgm.Options("h", "535.104.05")


def _in_place(path: Path, text: str) -> None:
    with path.open("r+") as f:  # the same inode, written over
        f.write(text)


def _renamed(path: Path, text: str) -> None:
    new = path.with_name("new.yml")
    new.write_text(text)
    os.replace(new, path)


def _copied(path: Path, text: str) -> None:
    new = path.with_name("new.yml")
    new.write_text(text)
    shutil.copy2(new, path)  # `cp -p`: the content and the source's times


def _volume(path: Path, text: str) -> None:
    """A ConfigMap volume's update: a new timestamped directory, `..data` swapped to it."""
    root = path.parent
    new = root / "..2026_11_28_new"
    new.mkdir()
    (new / path.name).write_text(text)
    (root / "..data_tmp").symlink_to(new.name)
    os.replace(root / "..data_tmp", root / "..data")


REPLACE: dict[str, Callable[[Path, str], None]] = {
    "in place": _in_place, "renamed over": _renamed, "copied over": _copied, "volume": _volume,
}  # fmt: skip


def _file(tmp_path: Path, how: str, text: str) -> Path:
    if how != "volume":
        path = tmp_path / "topology.yml"
        path.write_text(text)
        return path
    first = tmp_path / "..2026_11_28_old"
    first.mkdir()
    (first / "topology.yml").write_text(text)
    (tmp_path / "..data").symlink_to(first.name)
    (tmp_path / "topology.yml").symlink_to("..data/topology.yml")
    return tmp_path / "topology.yml"


@pytest.mark.parametrize("how", sorted(REPLACE))
def test_a_file_replaced_by_one_of_the_same_size_and_time_is_read_again(
    tmp_path: Path, how: str
) -> None:
    one, two = doc("n1", MIG), doc("n2", MIG)
    text_one, text_two = dump_yaml(one), dump_yaml(two)
    assert len(text_one) == len(text_two)
    path = _file(tmp_path, how, text_one)
    times = path.stat().st_atime_ns, path.stat().st_mtime_ns
    reads, stop = Reads(), threading.Event()
    thread = threading.Thread(target=sources.follow_file, args=(path, reads, stop, 0.02))
    thread.start()
    try:
        eventually(lambda: reads.updates == [one])
        REPLACE[how](path, text_two)
        os.utime(path, ns=times)  # the same modification time as before
        assert path.stat().st_size == len(text_one) and path.stat().st_mtime_ns == times[1]
        eventually(lambda: reads.updates[-1:] == [two])
    finally:
        stop.set()
        thread.join(5)


def _list(items: list[dict[str, Any]]) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})


def _cm(name: str) -> dict[str, Any]:
    return node_configmap(name, dump_yaml(doc(name, MIG)), "gpu-operator", None)


def _bad_yaml(name: str) -> dict[str, Any]:
    cm = _cm(name)
    cm["data"]["topology.yml"] = "nodes: [\n"
    return cm


def _bad_node(name: str) -> dict[str, Any]:
    cm = _cm(name)
    cm["data"]["topology.yml"] = cm["data"]["topology.yml"].replace(
        "name: 2g.10gb", "name: 9g.99gb"
    )
    return cm


# Each way one item of a List can be bad: its topology no YAML, no ConfigMap at all, a node
# named twice, a node no GPU could be.
BAD_ITEMS: dict[str, Callable[[str], list[dict[str, Any]]]] = {
    "not YAML": lambda name: [_cm("n0"), _bad_yaml(name)],
    "not a ConfigMap": lambda name: [_cm("n0"), {"kind": "Secret"}],
    "a node twice": lambda name: [_cm("n0"), _cm(name), _cm(name)],
    "a bad node": lambda name: [_cm("n0"), _bad_node(name)],
}


@pytest.mark.parametrize("bad", sorted(BAD_ITEMS))
@pytest.mark.parametrize("served", ["--all-nodes", "--node-name"])
def test_a_list_s_bad_item_fixed_makes_health_good_again(
    tmp_path: Path, bad: str, served: str
) -> None:
    path = tmp_path / "topology.yml"
    good = _list([_cm("n0"), _cm("n1")])
    path.write_text(good)
    exporter: NodesExporter | Exporter = (
        NodesExporter(OPTIONS, Published()) if served == "--all-nodes"
        else Exporter("n1", OPTIONS, Published())
    )  # fmt: skip
    stop = threading.Event()
    thread = sources.file_source(path, exporter.sink, stop)
    thread.start()
    try:
        assert exporter.snapshot().healthy
        _renamed(path, _list(BAD_ITEMS[bad]("n1")))
        eventually(lambda: not exporter.snapshot().healthy, timeout=10)
        assert "n1" in exporter.snapshot().pages  # the bad node's last good series kept
        _renamed(path, good)
        eventually(lambda: exporter.snapshot().healthy, timeout=10)
        assert exporter.snapshot().reason == "ok"
    finally:
        stop.set()
        thread.join(5)
