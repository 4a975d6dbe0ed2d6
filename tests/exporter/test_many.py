"""`--all-nodes`: many nodes in one body, each re-rendered only when it changes."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from freezegun import freeze_time

from exporter import cli, dcgm
from exporter import loop as loop_module
from exporter import many as many_module
from exporter.fields import Counters, parse_counters
from exporter.many import NodesExporter
from mig_exporter.web.server import Published
from tests.exporter.test_exporter import MIG, whole_gpu
from tests.support.kubeapi import eventually
from tests.support.promtext import parse
from topology.errors import TopologyError
from topology.model import MigDevice, Topology

MIG_NODE = next(iter(MIG.nodes))


def doc(name: str, topology: Topology) -> Topology:
    """`topology`'s only node, under another name: what a per-node ConfigMap holds."""
    (node,) = topology.nodes.values()
    return Topology(topology.mig_strategy, {name: node})


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The hostnames whose GPUs are read, in order: what was rendered again."""
    calls: list[str] = []
    real = dcgm._read

    def spy(plans, options, now):  # type: ignore[no-untyped-def]
        calls.append(options.hostname)
        return real(plans, options, now)

    monkeypatch.setattr(dcgm, "_read", spy)
    yield calls


def exporter(counters: Counters | None = None) -> NodesExporter:
    options = dcgm.Options("ignored", "535.104.05")
    if counters is not None:
        options = replace(options, counters=counters)
    return NodesExporter(options, Published())


@freeze_time("2026-11-22 10:00:00")
def test_one_body_with_each_node_as_its_own_exporter_would_serve_it() -> None:
    many = exporter()
    for name in ("b", "a"):
        many.update_source(f"topology-{name}", doc(name, MIG), f"ConfigMap {name}")
    many.update_source("topology-k80", doc("k80", whole_gpu(50, 50)), "ConfigMap k80")
    snap = many.snapshot()
    assert snap.healthy and snap.reason == "ok"
    text = snap.body.decode()
    series = parse(text)  # Prometheus' parser accepts it: each family once
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    # Each family once, in the counters' order, whole-GPU-only and MIG-only families included.
    order = [c.name for c in dcgm.default_counters().metrics]
    assert families == sorted(set(families), key=order.index)
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED"} <= set(
        families
    )
    for name in ("a", "b", "k80"):
        topology = doc(name, MIG if name != "k80" else whole_gpu(50, 50))
        alone = dcgm.render(topology.nodes[name], dcgm.Options(name, "535.104.05"), time.time())
        assert [s for s in series if s.label("Hostname") == name] == parse(alone.decode())
    # Within a family, nodes in name order.
    used = [s.label("Hostname") for s in series if s.name == "DCGM_FI_DEV_FB_USED"]
    assert used == sorted(used)


def test_a_change_renders_only_its_node(rendered: list[str]) -> None:
    many = exporter()
    for name in ("a", "b", "c"):
        many.update_source(f"topology-{name}", doc(name, MIG), name)
    many.snapshot()
    assert sorted(rendered) == ["a", "b", "c"]
    rendered.clear()
    (node,) = MIG.nodes.values()
    gpu = node.gpus[0]
    repartitioned = replace(node, gpus=(replace(gpu, status=None,
                                                mig_devices=(MigDevice("7g.40gb", 0, 0),)),))  # fmt: skip
    many.update_source("topology-b", Topology("mixed", {"b": repartitioned}), "b")
    many.update_source("topology-c", doc("c", MIG), "c")  # the same again: no change
    body = many.snapshot().body.decode()
    assert rendered == ["b"]
    assert {s.label("GPU_I_PROFILE") for s in parse(body) if s.label("Hostname") == "b"} == {
        "7g.40gb"
    }


def test_every_gpu_node_renders_again_on_a_new_step_and_not_within_one(
    rendered: list[str],
) -> None:
    """Power, energy and temperatures move with the clock on every GPU, busy or idle."""
    with freeze_time("2026-11-22 10:00:00") as clock:
        many = exporter()
        many.update_source("topology-mig", doc("mig", MIG), "mig")
        many.update_source("topology-idle", doc("idle", whole_gpu(0, 0)), "idle")
        many.snapshot()
        rendered.clear()
        clock.tick(dcgm.UTILIZATION_STEP_S / 2)
        many.snapshot()
        assert rendered == []
        clock.tick(dcgm.UTILIZATION_STEP_S)
        many.snapshot()
        assert sorted(rendered) == ["idle", "mig"]


def test_only_nodes_that_move_in_time_render_on_a_new_step(rendered: list[str]) -> None:
    """With a counters file of frame-buffer and utilization only, an idle node stays still."""
    counters, warnings = parse_counters(
        "DCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DEV_FB_FREE, gauge, f\n"
        "DCGM_FI_DEV_FB_USED, gauge, u\n",
        "test",
    )
    assert warnings == []
    with freeze_time("2026-11-22 10:00:00") as clock:
        many = exporter(counters)
        many.update_source("topology-mig", doc("mig", MIG), "mig")
        many.update_source("topology-busy", doc("busy", whole_gpu(0, 100)), "busy")
        many.snapshot()
        rendered.clear()
        clock.tick(dcgm.UTILIZATION_STEP_S / 2)
        many.snapshot()
        assert rendered == []  # same step: nothing moves
        clock.tick(dcgm.UTILIZATION_STEP_S)
        many.snapshot()
        assert rendered == ["busy"]


def test_a_counters_files_order_and_help_are_the_bodys() -> None:
    """-f: the fields in the file's order, with its help, as each node's own exporter serves."""
    counters, warnings = parse_counters(
        "DCGM_FI_DEV_FB_USED, gauge, used MiB\nDCGM_FI_DEV_GPU_UTIL, gauge, busy %\n", "test"
    )
    assert warnings == []
    many = exporter(counters)
    many.update_source("topology-k80", doc("k80", whole_gpu(50, 50)), "ConfigMap k80")
    text = many.snapshot().body.decode()
    assert [line for line in text.splitlines() if line.startswith("# HELP")] == [
        "# HELP DCGM_FI_DEV_FB_USED used MiB",
        "# HELP DCGM_FI_DEV_GPU_UTIL busy %",
    ]


def test_a_bad_node_keeps_its_last_good_series_and_the_others_go_on() -> None:
    many = exporter()
    many.update_source("topology-a", doc("a", MIG), "ConfigMap gpu-operator/topology-a")
    many.update_source("topology-b", doc("b", MIG), "ConfigMap gpu-operator/topology-b")
    good = many.snapshot().body
    (node,) = MIG.nodes.values()
    broken = replace(node, gpu_product="NVIDIA-H200")  # no such profiles
    many.update_source(
        "topology-a", Topology("mixed", {"a": broken}), "ConfigMap gpu-operator/topology-a"
    )
    snap = many.snapshot()
    assert snap.body == good
    assert not snap.healthy
    assert snap.reason.startswith(
        "ConfigMap gpu-operator/topology-a: nodes.a.gpus[0].mig-devices[0].name: unknown profile"
    )
    assert len(snap.reason.splitlines()) == 1
    many.update_source("topology-a", doc("a", MIG), "ConfigMap gpu-operator/topology-a")
    assert many.snapshot().healthy


def test_sources_and_the_node_selector_decide_which_nodes_are_served() -> None:
    many = exporter()
    for name in ("a", "b", "c"):
        many.update_source(f"topology-{name}", doc(name, MIG), name)

    def hosts() -> set[str]:
        return {s.label("Hostname") for s in parse(many.snapshot().body.decode())}

    assert hosts() == {"a", "b", "c"}
    many.remove_source("topology-a")  # its ConfigMap was deleted
    assert hosts() == {"b", "c"}
    many.keep_sources({"topology-b"})  # a fresh list without topology-c
    assert hosts() == {"b"}
    many.update_source("topology-c", doc("c", MIG), "c")
    many.select({"c", "not-a-gpu-node"})
    assert hosts() == {"c"}
    many.select({"b", "c"})
    assert hosts() == {"b", "c"}
    many.problem("ConfigMaps gpu-operator: HTTP 500 Internal Server Error")
    snap = many.snapshot()
    assert (
        not snap.healthy
        and snap.reason == "ConfigMaps gpu-operator: HTTP 500 Internal Server Error"
    )
    assert {s.label("Hostname") for s in parse(snap.body.decode())} == {"b", "c"}


def test_a_node_that_goes_leaves_no_energy_counter_behind() -> None:
    """KWOK clusters create and delete nodes all day: the meter counts only served GPUs, each
    node's apart (the fixture's nodes even share GPU ids); of those gone it keeps only a bounded
    number of last counts (tests/exporter/test_exporter_energy.py)."""
    with freeze_time("2026-11-22 10:00:00") as clock:
        many = exporter()
        for name, percent in (("a", 0), ("b", 100)):
            many.update_source(f"topology-{name}", doc(name, whole_gpu(percent, percent)), name)
        many.snapshot()
        clock.tick(dcgm.UTILIZATION_STEP_S)
        body = parse(many.snapshot().body.decode())
        energy = {s.label("Hostname"): s.value for s in body
                  if s.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" and s.label("gpu") == "0"}  # fmt: skip
        assert energy["b"] > energy["a"]  # the busy node's GPU 0 drew more in the step
        assert len(many.options.energy) == 4
        many.remove_source("topology-a")
        many.snapshot()
        assert len(many.options.energy) == 2
        many.select(set())  # nothing selected: nothing served, nothing counted
        many.snapshot()
        assert len(many.options.energy) == 0


def test_health_says_the_first_problem_and_how_many_more(caplog: pytest.LogCaptureFixture) -> None:
    many = exporter()
    snap = many.snapshot()
    assert not snap.ready and not snap.healthy and snap.reason == "no topology yet"
    many.problem(None)  # listed, and the namespace has no ConfigMap: a true, empty state
    snap = many.snapshot()
    assert snap.ready and snap.healthy and snap.body == b""
    many.update_source("topology-a", doc("a", MIG), "ConfigMap a")
    many.problem("the API cannot be reached")
    many.problem("the API cannot be reached")  # said once
    many.problem("node watch: 500", key="nodes")
    many.source_problem("topology-b", "ConfigMap b: not valid YAML")
    snap = many.snapshot()
    assert not snap.healthy and snap.ready
    assert snap.reason == "ConfigMap b: not valid YAML (and 2 more problems)"
    assert [r.getMessage() for r in caplog.records] == [
        "the API cannot be reached", "node watch: 500", "ConfigMap b: not valid YAML"]  # fmt: skip
    many.problem(None)  # configmaps good again
    many.select(None)  # the node list came: its problem goes
    many.remove_source("topology-b")
    snap = many.snapshot()
    assert snap.healthy and snap.reason == "ok"
    assert {s.label("Hostname") for s in parse(snap.body.decode())} == {"a"}
    many.source_problem("topology-a", "ConfigMap a: gone bad")
    many.remove_source("topology-a")  # its node goes, and so does its problem
    snap = many.snapshot()
    assert snap.healthy and snap.body == b""


def test_a_node_listed_by_two_sources_stays_until_both_drop_it() -> None:
    many = exporter()
    many.update_source("topology-a", doc("a", MIG), "ConfigMap a")
    many.update_source("topology", doc("a", MIG), "ConfigMap topology")
    many.remove_source("topology-a")
    assert {s.label("Hostname") for s in parse(many.snapshot().body.decode())} == {"a"}
    many.update_source("topology", Topology(), "ConfigMap topology")
    assert many.snapshot().body == b""


def test_a_bad_entry_is_logged_once_and_counted_once(caplog: pytest.LogCaptureFixture) -> None:
    many = exporter()
    many.update_source("topology-a", doc("a", MIG), "ConfigMap a")
    (node,) = MIG.nodes.values()
    gpu = node.gpus[0]
    devices = gpu.mig_devices or ()
    bad = replace(node, gpus=(replace(gpu, mig_devices=(replace(devices[0], name="9g.99gb"),)),))
    for _ in range(2):
        many.update_source("topology-a", Topology(nodes={"a": bad}), "ConfigMap a")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].endswith("; serving its last good series")
    assert warnings[0].startswith(
        "ConfigMap a: nodes.a.gpus[0].mig-devices[0].name: unknown profile"
    )
    assert many.invalid.value("node") == 1
    snap = many.snapshot()
    assert snap.reason == f"{warnings[0]}"
    assert {s.label("Hostname") for s in parse(snap.body.decode())} == {"a"}  # last good kept


def test_a_rejected_document_keeps_the_series_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    many = exporter()
    many.update_source("topology-a", doc("a", MIG), "ConfigMap a")
    good = many.snapshot().body
    bad = TopologyError("ConfigMap gpu-operator/topology", "topology.yml", "is not valid YAML")
    many.rejected(bad.obj, bad)
    snap = many.snapshot()
    said = "ConfigMap gpu-operator/topology: topology.yml: is not valid YAML; serving the last good series"
    assert (snap.body, snap.healthy, snap.reason) == (good, False, said)
    assert [r.getMessage() for r in caplog.records] == [said]


def test_once_ready_the_collector_stops_walking_what_the_first_read_built() -> None:
    """At 5,000 nodes the cyclic collector walked every node's entry and labels, a second every
    few steps: once the first true snapshot is out, they are frozen (and not before: an empty
    start would freeze nothing worth it)."""
    gc.unfreeze()
    with collector_paused() as many:
        assert not many.published.snapshot.ready and gc.get_freeze_count() == 0
        assert not gc.isenabled()
        many.update_source("topology-a", doc("a", MIG), "a")
        eventually(lambda: many.published.snapshot.ready, timeout=10)
        eventually(lambda: gc.get_freeze_count() > 0 and gc.isenabled(), timeout=10)


@contextmanager
def collector_paused() -> Iterator[NodesExporter]:
    """An exporter's render loop running 0.3 s with the collector paused, as the command starts
    it; afterwards the collector is as it was."""
    gc.disable()
    many, stop = exporter(), threading.Event()
    loop = threading.Thread(target=many.run, args=(stop,), daemon=True)
    loop.start()
    try:
        time.sleep(0.3)
        yield many
    finally:
        stop.set()
        many.wake.set()
        loop.join(10)
        gc.unfreeze()
        gc.enable()


def test_the_collector_runs_again_in_time_even_with_nothing_to_serve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loop_module, "SETTLE_S", 0.2)
    with collector_paused() as many:
        many.problem("ConfigMaps gpu-operator: HTTP 500")  # wakes the loop, past SETTLE_S
        eventually(gc.isenabled, timeout=5)
        assert not many.published.snapshot.ready


def test_while_the_first_list_is_read_each_node_is_served_once_read_and_health_says_how_many() -> (
    None
):
    many = exporter()
    many.reading(3)
    assert not many.snapshot().ready  # nothing read yet: nothing true to serve
    many.update_source("topology-a", doc("a", MIG), "a")
    snap = many.snapshot()
    assert (snap.ready, snap.healthy, snap.complete) == (True, False, False)
    assert snap.reason == "read 1 of 3 topology ConfigMaps; serving the nodes read so far"
    assert set(snap.pages) == {"a"}
    many.source_problem("topology-b", "ConfigMap b: not valid YAML")  # read, and bad: counts
    many.health.clear("topology-b")
    assert many.snapshot().reason.startswith("read 2 of 3 ")
    many.update_source("topology-c", doc("c", MIG), "c")
    assert many.snapshot().reason.startswith("read 3 of 3 ")
    many.problem(None)  # the list is read
    many.source_problem("topology-b", "ConfigMap b: not valid YAML")
    snap = many.snapshot()
    assert (snap.complete, snap.reason, set(snap.pages)) == (
        True, "ConfigMap b: not valid YAML", {"a", "c"})  # fmt: skip
    # A relist (a watch that expired): everything stays served, and nothing is said of it.
    many.reading(3)
    many.update_source("topology-b", doc("b", MIG), "b")
    snap = many.snapshot()
    assert (snap.healthy, snap.complete, set(snap.pages)) == (True, True, {"a", "b", "c"})


def test_a_command_that_ends_before_serving_leaves_the_collector_running(tmp_path: Path) -> None:
    """The command pauses the collector for its first read: whatever ends it, it runs again
    (the command may be called in a process that goes on: a test, an embedding program)."""
    assert cli.main(["--all-nodes", "--topology-file", str(tmp_path / "none.yaml")]) == 2
    assert gc.isenabled()


def test_a_step_is_made_a_slice_at_a_time_and_a_new_node_at_once(rendered: list[str]) -> None:
    """Between slices the loop pauses and scrapes run (a whole step of 5,000 nodes kept them
    waiting for a second); a node not served yet is never left for a later slice (it would
    answer 404 meanwhile)."""
    total = many_module.SLICE * 2 + 7
    with freeze_time("2026-11-22 10:00:00") as clock:
        many = exporter()
        for i in range(total):
            many.update_source(f"topology-{i}", doc(f"n{i}", MIG), f"n{i}")
        assert len(many.snapshot().pages) == total and len(rendered) == total  # all at once
        assert many.due_in() > many_module.SLICE_PAUSE_S
        rendered.clear()
        clock.tick(dcgm.UTILIZATION_STEP_S)
        many.snapshot()
        assert len(rendered) == many_module.SLICE
        assert many.due_in() == many_module.SLICE_PAUSE_S
        many.update_source("topology-new", doc("new", MIG), "new")
        assert "new" in many.snapshot().pages  # with the second slice, not after the third
        assert len(rendered) == 2 * many_module.SLICE + 1
        many.snapshot()
        assert sorted(rendered) == sorted([f"n{i}" for i in range(total)] + ["new"])
        assert many.due_in() > many_module.SLICE_PAUSE_S
