"""`python -m topology show`: what a person reads off the picture, checked by its structure.

The picture is parsed back (bars, cells, the slot ruler, the notes under a bar) rather than
compared to a stored blob, so the tests state what matters: which instance sits over which slots,
what it is labelled with, who holds it, and that every row stays aligned.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from status_updater.dra import DraOptions, node_slimmer
from status_updater.state import ClusterState, reconcile
from tests.status_updater.test_claims import CLAIMS, PODS, by_name
from tests.status_updater.test_reconcile import whole_gpu_node
from tests.status_updater.test_resourceslices import devices, gpu_node, slices
from tests.support.base import ROOT, SAMPLES, examples, run_cli
from topology import __main__ as topology_main
from topology.__main__ import MAX_FILE_BYTES
from topology.catalog import MODELS, GpuModel
from topology.configmap import parse_document
from topology.errors import TopologyError
from topology.model import Topology, dump_yaml
from topology.show import picture

NODE = "qa-mig-worker-gpu-a100"
SAMPLE = SAMPLES / "topology" / "a100-40gb-active.yaml"
SAMPLE_FILES = sorted((SAMPLES / "topology").glob("*.yaml"))
PROG = "python -m topology"


# --- reading the picture back ----------------------------------------------------------------


@dataclass
class Cell:
    start: int  # column of the first character inside the cell
    end: int  # column of the `|` closing it
    top: str
    middle: str
    bottom: str


@dataclass
class GpuBar:
    cells: list[Cell]
    notes: list[str] = field(default_factory=list)  # the lines under the bar


@dataclass
class NodeDrawing:
    header: str
    slot_columns: list[int]  # where the ruler puts each slot's number
    gpus: list[GpuBar]

    def cell_at(self, gpu: int, slot: int) -> Cell:
        column = self.slot_columns[slot]
        found = [c for c in self.gpus[gpu].cells if c.start == column]
        assert found, f"no cell starts at slot {slot} (column {column}): {self.gpus[gpu].cells}"
        return found[0]

    def end_of(self, slot: int, span: int) -> int:
        width = self.slot_columns[1] - self.slot_columns[0]
        return self.slot_columns[slot] + span * width - 1


_GPU_LINE = re.compile(r"  gpu (\d+) +\|")


def read_picture(out: str) -> dict[str, NodeDrawing]:
    """Each node's drawing; asserts the three rows of every bar have their `|` in one column."""
    assert out.isascii(), out
    nodes: dict[str, NodeDrawing] = {}
    for section in out.rstrip("\n").split("\n\n"):
        lines = section.split("\n")
        header = lines[0]
        assert header.startswith("node "), section
        ruler = next((line for line in lines if line.startswith("  slot")), "")
        columns = [m.start() for m in re.finditer(r"\d+", ruler)]
        gpus: list[GpuBar] = []
        i = 1
        while i < len(lines):
            m = _GPU_LINE.match(lines[i])
            if not m:
                if gpus:
                    gpus[-1].notes.append(lines[i])
                i += 1
                continue
            assert int(m.group(1)) == len(gpus), lines[i]
            rows = lines[i : i + 3]
            bars = [[j for j, c in enumerate(row) if c == "|"] for row in rows]
            assert bars[0] == bars[1] == bars[2], "\n".join(rows)
            assert len({len(row) for row in rows}) == 1, "\n".join(rows)
            seps = bars[0]
            cells = [Cell(a + 1, b, *(row[a + 1 : b] for row in rows)) for a, b in pairwise(seps)]
            gpus.append(GpuBar(cells))
            i += 3
        nodes[header.split()[1]] = NodeDrawing(header, columns, gpus)
    return nodes


_NOTE = re.compile(r"^ +(GI \d+|GPU) +(\S+)$")


def holder(bar: GpuBar, cell: Cell, key: str) -> str:
    """Who the picture says holds a cell: the name in it, or the full name listed under the bar."""
    shown = cell.bottom.strip()
    listed = [m.group(2) for n in bar.notes if (m := _NOTE.match(n)) and m.group(1) == key]
    if not listed:
        return shown
    assert len(listed) == 1, bar.notes
    pod = listed[0].split("/", 1)[1]
    assert pod.startswith(shown.rstrip("~")), (shown, listed[0])  # a cut name is its start
    return listed[0]


def show(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("topology", "show", *args)


def shown(*args: str) -> dict[str, NodeDrawing]:
    result = show(*args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return read_picture(result.stdout)


def assert_one_line_error(result: subprocess.CompletedProcess[str], path: Path, text: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{PROG}: {path}: "), lines[0]
    assert text in lines[0], lines[0]


# --- writing topologies ----------------------------------------------------------------------


def pod(namespace: str, name: str) -> dict[str, Any]:
    return {"allocated-by": {"namespace": namespace, "pod": name, "container": "main"}}


def mig(name: str, position: int, gi: int, status: dict[str, Any] | None = None) -> dict[str, Any]:
    dev: dict[str, Any] = {"name": name, "position": position, "gpu-instance-id": gi}
    if status is not None:
        dev["status"] = status
    return dev


def node(product: str, *gpus: dict[str, Any]) -> dict[str, Any]:
    return {"gpu-count": len(gpus), "gpu-memory": 40960, "gpu-product": product, "gpus": list(gpus)}


def gpu(index: int, migs: list[dict[str, Any]] | None, status: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    g: dict[str, Any] = {"id": f"GPU-{index:08d}"}
    if status is not None:
        g["status"] = status
    if migs is not None:
        g["mig-devices"] = migs
    return g


def write(tmp_path: Path, nodes: dict[str, Any], name: str = "topology.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"mig-strategy": "mixed", "nodes": nodes}), encoding="utf-8")
    return path


A100 = "NVIDIA-A100-SXM4-40GB"


# --- the bundled sample ----------------------------------------------------------------------

# (profile, GI id, first slot, slots, holder): the sample's three instances, in slot order.
SAMPLE_INSTANCES = [
    ("2g.10gb", 5, 0, 2, "runai-p1/job-2g-idle-0-0"),
    ("1g.5gb", 7, 4, 1, "runai-p1/job-1g-idle-0-0"),
    ("1g.5gb", 9, 6, 1, "runai-p1/job-gpu-burn-0-0"),
]


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: p.name)
def test_sample_instances_sit_over_their_slots(path: Path) -> None:
    drawing = shown(str(path))[NODE]
    assert drawing.header == f"node {NODE}  ({A100}, 1 GPU)"
    assert len(drawing.slot_columns) == 8
    assert len(drawing.gpus) == 1
    bar = drawing.gpus[0]
    for profile, gi, slot, span, pod_name in SAMPLE_INSTANCES:
        cell = drawing.cell_at(0, slot)
        assert cell.end == drawing.end_of(slot, span), (profile, cell)
        assert cell.top.strip() == profile
        assert cell.middle.strip() == f"GI {gi}"
        assert holder(bar, cell, f"GI {gi}") == pod_name
    # left to right in slot order, as the placements say
    instances = [c for c in bar.cells if c.middle.startswith("GI ")]
    assert [c.middle.strip() for c in instances] == [f"GI {i[1]}" for i in SAMPLE_INSTANCES]


def test_sample_geometry_agrees_with_the_file() -> None:
    topology = parse_document(SAMPLE.read_text(encoding="utf-8"), str(SAMPLE))
    devices = topology.nodes[NODE].gpus[0].mig_devices or ()
    assert sorted((d.name, d.gpu_instance_id, d.position) for d in devices) == sorted(
        (name, gi, slot) for name, gi, slot, _, _ in SAMPLE_INSTANCES
    )


def test_sample_unused_slots_are_drawn_unused() -> None:
    drawing = shown(str(SAMPLE))[NODE]
    for slot, span in [(2, 2), (5, 1), (7, 1)]:
        cell = drawing.cell_at(0, slot)
        assert cell.end == drawing.end_of(slot, span)
        assert cell.middle.strip() == "unused"
        assert set(cell.top) == {"."}
        assert cell.bottom.strip() == ""
    # the bar covers the eight slots exactly, with nothing in between
    cells = drawing.gpus[0].cells
    assert cells[0].start == drawing.slot_columns[0]
    assert all(a.end + 1 == b.start for a, b in pairwise(cells))
    assert cells[-1].end == drawing.end_of(0, 8)


def test_picture_is_pure_and_matches_the_command() -> None:
    topology = parse_document(SAMPLE.read_text(encoding="utf-8"), str(SAMPLE))
    assert picture(topology) == show(str(SAMPLE)).stdout
    assert picture(topology, NODE) == picture(topology)


# --- more topologies -------------------------------------------------------------------------


def test_node_filter_shows_only_that_node(tmp_path: Path) -> None:
    path = write(tmp_path, {
        "b-node": node(A100, gpu(0, [mig("7g.40gb", 0, 0, pod("ns", "big"))])),
        "a-node": node(A100, gpu(1, [mig("1g.5gb", 3, 10)])),
    })  # fmt: skip
    everything = shown(str(path))
    assert list(everything) == ["a-node", "b-node"]  # sorted by name
    only = shown(str(path), "--node", "b-node")
    assert list(only) == ["b-node"]
    cell = only["b-node"].cell_at(0, 0)
    labels = (cell.top.strip(), cell.middle.strip(), cell.bottom.strip())
    assert labels == ("7g.40gb", "GI 0", "ns/big")
    assert cell.end == only["b-node"].end_of(0, 8)
    free = everything["a-node"].cell_at(0, 3)
    assert (free.top.strip(), free.bottom.strip()) == ("1g.5gb", "free")


def test_unknown_node_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, {"a-node": node(A100, gpu(0, []))})
    result = show(str(path), "--node", "nope")
    assert_one_line_error(result, path, "nope")
    assert "a-node" in result.stderr  # says which nodes there are
    with pytest.raises(TopologyError):
        picture(parse_document(path.read_text(encoding="utf-8"), "t"), "nope")


def test_whole_gpus_are_one_bar_with_their_pod(tmp_path: Path) -> None:
    path = write(tmp_path, {
        "mixed-node": node(A100, gpu(0, None, pod("team-a", "trainer-0")), gpu(1, None),
                           gpu(2, [mig("3g.20gb", 4, 2, pod("team-b", "infer"))])),
    })  # fmt: skip
    drawing = shown(str(path))["mixed-node"]
    assert drawing.header == f"node mixed-node  ({A100}, 3 GPUs)"
    for index, who in [(0, "team-a/trainer-0"), (1, "free")]:
        [cell] = drawing.gpus[index].cells
        assert (cell.top.strip(), cell.middle.strip()) == ("whole GPU", "MIG disabled")
        assert cell.bottom.strip() == who
        assert (cell.start, cell.end) == (drawing.slot_columns[0], drawing.end_of(0, 8))
    cell = drawing.cell_at(2, 4)
    assert cell.top.strip() == "3g.20gb"
    assert holder(drawing.gpus[2], cell, "GI 2") == "team-b/infer"


def test_gpu_without_mig_support_is_whole(tmp_path: Path) -> None:
    path = write(tmp_path, {"t4": node("Tesla-T4", gpu(0, None, pod("ns", "p")))})
    drawing = shown(str(path))["t4"]
    assert drawing.slot_columns == []  # nothing to number
    [cell] = drawing.gpus[0].cells
    assert (cell.top.strip(), cell.middle.strip(), cell.bottom.strip()) == (
        "whole GPU",
        "no MIG",
        "ns/p",
    )


def test_a30_has_four_slots(tmp_path: Path) -> None:
    path = write(tmp_path, {"a30": node("NVIDIA-A30", gpu(0, [
        mig("1g.6gb+me", 0, 3), mig("2g.12gb", 2, 2, pod("n", "p")),
    ]))})  # fmt: skip
    drawing = shown(str(path))["a30"]
    assert len(drawing.slot_columns) == 4
    assert drawing.cell_at(0, 0).top.strip() == "1g.6gb+me"  # the slot widens to hold it
    cell = drawing.cell_at(0, 2)
    assert (cell.top.strip(), cell.end) == ("2g.12gb", drawing.end_of(2, 2))
    assert drawing.cell_at(0, 1).middle.strip() == "unused"
    assert drawing.gpus[0].cells[-1].end == drawing.end_of(0, 4)


def test_long_and_odd_labels_are_cut_never_misaligned(tmp_path: Path) -> None:
    long_pod = "a-very-long-pod-name-" * 5
    path = write(tmp_path, {"n\u00e9\nx": node("NVIDIA-H100-80GB-HBM3", gpu(0, [
        mig("1g.10gb", 0, 999999999, pod("ns", long_pod)),  # the most digits an id may have
        mig("1g.10gb", 1, 10, pod("ns", "tab\there\u00e9")),
        mig("4g.40gb", 4, 1, pod("ns", long_pod + "2")),
    ]))})  # fmt: skip
    result = show(str(path))
    assert result.returncode == 0, result.stderr
    [drawing] = read_picture(result.stdout).values()  # read_picture checks ASCII and alignment
    bar = drawing.gpus[0]
    first = drawing.cell_at(0, 0)
    assert first.end == drawing.end_of(0, 1)
    assert first.middle.endswith("~") and first.bottom.endswith("~")
    assert holder(bar, first, "GI 999999999") == f"ns/{long_pod}"
    assert holder(bar, drawing.cell_at(0, 4), "GI 1") == f"ns/{long_pod}2"
    assert "ns/tab?here?" in result.stdout


def test_instances_that_cannot_be_drawn_are_listed(tmp_path: Path) -> None:
    path = write(tmp_path, {"bad": node(A100, gpu(0, [
        mig("1g.5gb", 0, 13), mig("1g.5gb", 1, 14), mig("2g.10gb", 0, 5), mig("9g.1tb", 2, 1),
        mig("4g.20gb", 6, 2),
    ]))})  # fmt: skip
    drawing = shown(str(path))["bad"]
    bar = drawing.gpus[0]
    assert drawing.cell_at(0, 0).middle.strip() == "GI 13"
    assert drawing.cell_at(0, 1).middle.strip() == "GI 14"
    assert drawing.cell_at(0, 2).middle.strip() == "unused"
    problems = [n.strip() for n in bar.notes if n.strip().startswith("!")]
    assert len(problems) == 3, bar.notes
    assert "! 2g.10gb@0 GI 5 not drawn: overlaps 1g.5gb@0 GI 13, 1g.5gb@1 GI 14" in problems
    assert any("9g.1tb@2" in p and "profile" in p for p in problems)
    assert any("4g.20gb@6" in p and "outside" in p for p in problems)


def test_empty_topology() -> None:
    assert picture(parse_document("nodes: {}\n", "t")) == "no nodes\n"


# --- bad input -------------------------------------------------------------------------------


def _bad_files(tmp_path: Path) -> list[tuple[Path, str]]:
    big = tmp_path / "big.yaml"
    with big.open("wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    cases = {
        "missing.yaml": (None, "cannot be read"),
        "broken.yaml": ("nodes: [unclosed\n", "not valid YAML"),
        "schema.yaml": ("nodes:\n  n:\n    gpu-count: many\n", "gpu-count"),
        "latin1.yaml": (b"nodes: \xe9\n", "not UTF-8"),
        "deep.yaml": ("nodes: " + "[" * 100_000 + "\n", "levels deep"),
        "cm.yaml": ("kind: ConfigMap\ndata: {}\n", "missing"),
    }
    out = [(big, "larger than"), (fifo, "not a regular file"), (tmp_path, "not a regular file")]
    for name, (content, reason) in cases.items():
        path = tmp_path / name
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        elif isinstance(content, bytes):
            path.write_bytes(content)
        out.append((path, reason))
    return out


def test_bad_files_are_one_line_and_exit_2(tmp_path: Path) -> None:
    for path, reason in _bad_files(tmp_path):
        assert_one_line_error(show(str(path)), path, reason)


def test_usage_errors_exit_2() -> None:
    for args in [("topology",), ("topology", "show"), ("topology", "draw", str(SAMPLE))]:
        result = run_cli(*args)
        assert result.returncode == 2
        assert "Traceback" not in result.stderr


def test_an_interrupt_exits_130_and_an_internal_error_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(*_: object, **__: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(topology_main, "picture", interrupted)
    assert topology_main.main(["show", str(SAMPLE)]) == 130  # the shell's 128 + SIGINT

    def broken(*_: object, **__: object) -> str:
        raise LookupError("no such\nthing")

    monkeypatch.setattr(topology_main, "picture", broken)
    capsys.readouterr()
    assert topology_main.main(["show", str(SAMPLE)]) == 1
    assert capsys.readouterr().err == f"{PROG}: internal error: LookupError: no such thing\n"


def test_the_docs_show_what_the_command_prints() -> None:
    """The example of docs/commands.md."""
    doc = (ROOT / "docs" / "commands.md").read_text()
    command = "$ python -m topology show samples/mig/topology/a100-40gb-active.yaml\n"
    start = doc.index(command) + len(command)
    printed = doc[start : doc.index("```", start)]
    result = show(str(SAMPLES / "topology" / "a100-40gb-active.yaml"))
    assert result.returncode == 0, result.stderr
    assert printed == result.stdout


def test_a_reader_that_stops_early_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m topology show FILE | head`: the picture is far longer than the pipe holds."""
    path = tmp_path / "topology.yml"
    path.write_text(
        dump_yaml(reconcile([whole_gpu_node(f"n{i}", count=8) for i in range(300)], [])[0])
    )
    proc = subprocess.Popen([sys.executable, "-m", "topology", "show", str(path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(100).startswith(b"node ")
    proc.stdout.close()  # as `head` does once it has its lines
    assert proc.stderr.read() == b""  # no traceback, not even one Python ignores at exit
    assert proc.wait(timeout=30) == 0
    # The same in this process (where a mutation run can see it): the reader is gone at once.
    reader, writer = os.pipe()
    os.close(reader)
    with open(writer, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert topology_main.main(["show", str(path)]) == 0


# --- devices DRA claims hold -------------------------------------------------------------------


def _claimed_cluster(
    model: GpuModel, layout: str | None, dynamic: bool, picks: list[int], pods: list[str]
) -> Topology:
    """A two-GPU node of `model` with DRA on, each of `pods` given by a claim of its own the
    offered device `picks` names (taken in turn from the node's slices), as the scheduler
    allocates: the topology the updater makes of it."""
    node = gpu_node("n", model.product_labels[0], 2, layout, dynamic)
    offered = sorted(devices(slices(node, dynamic)))
    assume(offered)  # not a layout the model has
    objects, claims = [], []
    for i, (pick, name) in enumerate(zip(picks, pods, strict=False)):
        pod = by_name(PODS, "dynamic-infer")
        pod["metadata"].update(name=name, uid=f"uid-{i}")
        pod["spec"]["nodeName"] = "n"
        pod["spec"]["resourceClaims"][0]["resourceClaimName"] = f"claim-{i}"
        claim = by_name(CLAIMS, "half-h100")
        claim["metadata"]["name"] = f"claim-{i}"
        claim["status"]["allocation"]["devices"]["results"][0].update(
            pool="n", device=offered[pick % len(offered)]
        )
        claim["status"]["reservedFor"] = [{"resource": "pods", "name": name, "uid": f"uid-{i}"}]
        objects.append(pod)
        claims.append(claim)
    slim = node_slimmer(DraOptions("", dynamic_mig=dynamic))
    return ClusterState.of([node], objects, claims=claims, slim=slim).topology()


@settings(max_examples=examples(60), deadline=None)
@given(
    model=st.sampled_from(MODELS),
    layout=st.sampled_from([None, "all-balanced", "all-1g.5gb", "all-enabled"]),
    dynamic=st.booleans(),
    picks=st.lists(st.integers(0, 200), min_size=1, max_size=4),
    pods=st.lists(st.text(alphabet="abz09-", min_size=1, max_size=40), min_size=4, max_size=4,
                  unique=True),
)  # fmt: skip
def test_a_device_dra_claims_hold_is_drawn_held_by_the_claims_pod(
    model: GpuModel, layout: str | None, dynamic: bool, picks: list[int], pods: list[str]
) -> None:
    """Whatever the GPU, its MIG mode and the devices claims are given (whole GPUs, static
    instances, partitions made for them): each device the topology records DRA claims on is
    drawn held by the first claim's pod, never `free`, and its claims are listed under the bar;
    every other device is as before."""
    topology = _claimed_cluster(model, layout, dynamic, picks, pods)
    drawing = read_picture(picture(topology))["n"]
    result = topology.nodes["n"]
    held = 0
    for g, gpu in enumerate(result.gpus):
        bar = drawing.gpus[g]
        found = [("GPU", gpu.status, drawing.gpus[g].cells[0])] if gpu.mig_devices is None else [
            (f"GI {d.gpu_instance_id}", d.status, drawing.cell_at(g, d.position))
            for d in gpu.mig_devices]  # fmt: skip
        for key, status, cell in found:
            if status is None or not status.dra_claims:
                assert holder(bar, cell, key) == "free"
                continue
            held += 1
            first = status.dra_claims[0]
            assert holder(bar, cell, key) == f"gpu-test/{first.holder.pod}"
            what = "" if key == "GPU" else f"{key} "
            assert f"{what}DRA claim gpu-test/{first.claim}: gpu-test/{first.holder.pod}" in [
                n.strip() for n in bar.notes
            ]
    claimed = sum(
        1 for gpu in result.gpus
        for s in (gpu.status, *(d.status for d in gpu.mig_devices or ())) if s and s.dra_claims
    )  # fmt: skip
    assert held == claimed >= 1  # the first claim, alone on its device, always holds it
