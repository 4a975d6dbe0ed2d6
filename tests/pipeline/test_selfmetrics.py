"""Never silent: every skipped object is logged once and counted in the daemon's own metrics."""

from __future__ import annotations

import os
import socket
import threading
import time
import urllib.request

import pytest

from exporter import dcgm
from exporter.many import NodesExporter
from exporter.service import Exporter
from mig_exporter.web.server import MetricsServer, Published
from status_updater import cli as updater_cli
from status_updater import daemon
from status_updater.controller import Controller
from status_updater.dra import DraOptions
from status_updater.leader import Timing
from status_updater.objects import slim_node, slim_pod
from tests.exporter.test_exporter import MIG
from tests.exporter.test_many import doc
from tests.exporter.test_many import exporter as nodes_exporter
from tests.pipeline.test_cli import get
from tests.status_updater.test_reconcile import REAL_NODE, gpu_pod, whole_gpu_node
from tests.support.base import run_cli
from tests.support.kubeapi import eventually
from tests.support.promtext import by_name, parse
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology

NODE = next(iter(MIG.nodes))
BAD_CM = TopologyError("ConfigMap gpu-operator/topology-x", "data[topology.yml]", "is missing")


def counts(own: bytes, metric: str) -> dict[str, float]:
    return {s.label("kind"): s.value for s in parse(own.decode()) if s.name == metric}


def exporter_counts(exporter: Exporter) -> dict[str, float]:
    return counts(exporter.snapshot().own, "mig_exporter_invalid_objects_total")


def test_the_exporter_counts_each_invalid_input_once() -> None:
    exporter = Exporter(NODE, dcgm.Options("h"), Published())
    assert exporter_counts(exporter) == {"configmap": 0, "file": 0, "node": 0, "pod": 0}
    exporter.sink.update(MIG, "cm")
    for _ in range(3):  # the same bad ConfigMap, delivered again (a resync, a relist)
        exporter.sink.rejected(BAD_CM.obj, BAD_CM)
    assert exporter_counts(exporter)["configmap"] == 1
    assert not exporter.snapshot().healthy
    exporter.sink.update(MIG, "cm")
    exporter.sink.rejected(BAD_CM.obj, BAD_CM)  # good in between: broken again is news
    assert exporter_counts(exporter)["configmap"] == 2
    node = MIG.nodes[NODE]
    broken = NodeTopology(node.gpu_count, node.gpu_memory, "NVIDIA-H200", True, node.gpus)
    exporter.sink.update(Topology("mixed", {NODE: broken}), "cm")
    assert exporter_counts(exporter) == {"configmap": 2, "file": 0, "node": 1, "pod": 0}


def test_the_count_is_scraped_after_the_dcgm_series() -> None:
    published = Published()
    exporter = Exporter(NODE, dcgm.Options("h"), published)
    exporter.sink.update(MIG, "cm")
    exporter.sink.rejected(BAD_CM.obj, BAD_CM)
    served = exporter.snapshot()  # compared as served: a later one may fall in the next step
    published.publish(served)
    server = MetricsServer(published, "127.0.0.1", 0)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as r:
            text = r.read().decode()
    finally:
        server.stop()
    series = parse(text)  # one valid exposition, whole
    assert series[0].name.startswith("DCGM_FI_")
    assert series[-4:] == parse(served.own.decode())
    assert served.body.decode() in text  # the DCGM part unchanged


def test_many_nodes_count_and_log_a_bad_node_once(caplog: pytest.LogCaptureFixture) -> None:
    many = nodes_exporter()
    many.update_source("topology-a", doc("a", MIG), "ConfigMap gpu-operator/topology-a")
    (node,) = MIG.nodes.values()
    broken = NodeTopology(node.gpu_count, node.gpu_memory, "NVIDIA-H200", True, node.gpus)
    for _ in range(3):
        many.update_source(
            "topology-a", Topology("mixed", {"a": broken}), "ConfigMap gpu-operator/topology-a"
        )
    assert counts(many.snapshot().own, "mig_exporter_invalid_objects_total")["node"] == 1
    assert sum("serving its last good series" in r.getMessage() for r in caplog.records) == 1


def test_the_updater_counts_bad_nodes_and_pods_once(caplog: pytest.LogCaptureFixture) -> None:
    controller = Controller(None, None)  # type: ignore[arg-type]  # settle() needs no API
    bad_node = whole_gpu_node("k80")
    bad_node["metadata"]["labels"]["nvidia.com/gpu.count"] = "many"
    pod = gpu_pod("p", "k80-ok", 1, "2026-01-01T00:00:00Z")
    pod["metadata"]["annotations"] = {"run.ai/simulated-fb-used": "lots"}
    for node in (bad_node, whole_gpu_node("k80-ok"), REAL_NODE):
        controller.state.set_node(slim_node(node))
    controller.state.set_pod(slim_pod(pod))
    controller.settle()
    own = controller.invalid.exposition()
    assert counts(own, "mig_status_updater_invalid_objects_total") == {
        "configmap": 0, "file": 0, "node": 1, "pod": 1
    }  # fmt: skip
    # An unrelated change re-settles the nodes: the same problems are neither logged nor counted.
    controller.state.set_node(slim_node({**bad_node, "spec": {"unschedulable": True}}))
    controller.state.set_pod(slim_pod({**pod, "status": {"phase": "Pending"}}))
    controller.settle()
    assert controller.invalid.exposition() == own
    assert sum("expected an integer, got 'many'" in r.getMessage() for r in caplog.records) == 1


def test_a_pod_that_cannot_be_placed_is_reported_when_it_comes_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Its node's result does not change (it gets nothing), yet it is news: one warning, counted.
    controller = Controller(None, None)  # type: ignore[arg-type]
    controller.state.set_node(slim_node(whole_gpu_node("k80", count=1)))
    controller.state.set_pod(slim_pod(gpu_pod("first", "k80", 1, "2026-01-01T00:00:00Z")))
    assert controller.settle() == {"k80"}
    controller.state.set_pod(slim_pod(gpu_pod("late", "k80", 1, "2026-01-02T00:00:00Z")))
    assert controller.settle() == set()  # nothing to write
    said = [r.getMessage() for r in caplog.records if "pod ns/late" in r.getMessage()]
    assert said == [
        "pod ns/late: spec.containers[0].resources.limits[nvidia.com/gpu]: "
        "asks for 1 GPUs, node k80 has 0 free"
    ]
    own = controller.invalid.exposition()
    assert counts(own, "mig_status_updater_invalid_objects_total")["pod"] == 1


def test_updater_health_says_what_it_waits_for_or_which_loop_died() -> None:
    controller = Controller(None, None)  # type: ignore[arg-type]
    waiting = daemon._health(controller, leader=False, dead=[])
    assert (waiting.healthy, waiting.reason) == (
        False, "waiting for the first list of layouts, nodes, pods, policies"
    )  # fmt: skip
    controller.synced |= {"nodes", "pods", "layouts", "policies"}
    ok = daemon._health(controller, leader=True, dead=[])
    assert (ok.healthy, ok.reason) == (True, "ok")
    assert "mig_status_updater_leader 1.0\n" in ok.own.decode()
    dead = daemon._health(controller, leader=True, dead=["writer"])
    assert (dead.healthy, dead.reason) == (False, "the writer thread stopped")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RESYNC_SECONDS": "soon"}, "argument --resync: expected seconds between 0 and 86400, got 'soon'"),
        ({"METRICS_PORT": "99999"}, "argument --metrics-port: expected a port 0-65535, got '99999'"),
    ],
)  # fmt: skip
def test_bad_updater_settings_from_the_environment_exit_2(
    env: dict[str, str], message: str
) -> None:
    result = run_cli("status_updater", "run", env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(message)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("many", [False, True], ids=["one-node", "all-nodes"])
def test_the_exporter_turns_unhealthy_when_its_source_stops(many: bool) -> None:
    published = Published()
    sink: Exporter | NodesExporter = (
        NodesExporter(dcgm.Options("h"), published) if many else Exporter(NODE, dcgm.Options("h"), published)
    )  # fmt: skip
    sink.sink.update(MIG, "cm")
    release = threading.Event()
    source = threading.Thread(target=release.wait, name="watch-topology", daemon=True)
    source.start()
    stop = threading.Event()
    loop = threading.Thread(target=sink.run, args=(stop, [source]), daemon=True)
    loop.start()
    try:
        eventually(lambda: published.snapshot.healthy, timeout=3)
        release.set()  # the watch ends, as a bug would end it
        snap = eventually(lambda: not published.snapshot.healthy and published.snapshot, timeout=3)
        assert snap.reason.startswith("the topology source watch-topology stopped")
        assert by_name(parse(snap.body.decode()), "DCGM_FI_DEV_FB_USED")  # still served
    finally:
        stop.set()
        sink.wake.set()
        loop.join(3)


def test_metrics_fail_until_the_first_topology_then_serve_it() -> None:
    published = Published()
    exporter = Exporter(NODE, dcgm.Options("h"), published)
    server = MetricsServer(published, "127.0.0.1", 0)
    server.start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{url}/metrics") == (503, "no topology yet\n")  # not an empty exporter
        exporter.sink.rejected(BAD_CM.obj, BAD_CM)  # still nothing true to serve
        published.publish(exporter.snapshot())
        assert get(f"{url}/metrics")[0] == 503
        exporter.sink.update(MIG, "cm")
        published.publish(exporter.snapshot())
        status, text = get(f"{url}/metrics")
        assert status == 200 and by_name(parse(text), "DCGM_FI_DEV_FB_USED")
    finally:
        server.stop()


def test_a_quiet_exporter_renders_once_per_change_not_per_watchdog_look() -> None:
    published = Published()
    publishes: list[bool] = []
    publish = published.publish
    published.publish = lambda s: (publishes.append(s.healthy), publish(s))  # type: ignore[method-assign,func-returns-value]
    exporter = Exporter(NODE, dcgm.Options("h"), published, clock=lambda: 1.0)  # mid-step
    exporter.sink.update(MIG, "cm")
    alive = threading.Event()
    source = threading.Thread(target=alive.wait, daemon=True)
    source.start()
    stop = threading.Event()
    loop = threading.Thread(target=exporter.run, args=(stop, [source]), daemon=True)
    loop.start()
    try:
        time.sleep(2.5)  # two looks at the source, no change, same step
        assert publishes == [True]
        exporter.sink.update(MIG, "cm")  # a change: rendered again at once
        eventually(lambda: len(publishes) == 2, timeout=1)
    finally:
        alive.set()
        stop.set()
        exporter.wake.set()
        loop.join(3)


def test_the_writer_waits_while_an_informer_fails_until_it_lists_again() -> None:
    controller = Controller(None, None)  # type: ignore[arg-type]
    for what in ("nodes", "pods"):
        controller._reset(what, [])
    controller.events.put(("layouts", "RESET", None))
    controller.events.put(("policies", "RESET", []))
    controller.drain()
    assert controller.following()
    controller._informer_error("pods", "pods: HTTP 500 Internal Server Error")
    controller.drain()
    assert not controller.following()  # its cache may miss pods created meanwhile
    controller._reset("pods", [])
    controller.drain()
    assert controller.following()


def test_the_updater_s_documented_defaults_reach_the_daemon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The defaults docs/commands.md gives, from the environment or not, are what `run` hands
    the daemon."""
    for name in ("KUBECONFIG", "TOPOLOGY_LAYOUT", "LEASE_NAME", "POD_NAME", "MIG_PARTED_CONFIG",
                 "RESYNC_SECONDS", "METRICS_PORT", "METRICS_ADDRESS", "DRA_NODE_SELECTOR",
                 "DRA_DYNAMIC_MIG", "KUBE_API_QPS", "KUBE_API_BURST", "LEASE_DURATION_SECONDS",
                 "RENEW_DEADLINE_SECONDS", "RETRY_PERIOD_SECONDS", "POD_LABELS",
                 "POD_LABEL_ALLOWLIST_REGEX", "FAULT_NODE_LABELS", "KAI_NODE_SELECTOR"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    given: list[tuple[object, ...]] = []
    monkeypatch.setattr(daemon, "run", lambda *args: given.append(args) or 0)
    assert updater_cli.main(["run"]) == 0
    (args,) = given
    pace, timing, pod_labels, node_labels, kai_selector = args[-5:]
    assert (pace.qps, pace.burst) == (100, 200) and timing == Timing(15, 10, 2)  # client-go's
    assert pod_labels is None  # no pod labels copied unless asked
    assert node_labels is False and kai_selector is None  # no Node written unless asked
    assert args[1:-5] == ("per-node", "topology-status-updater", f"{socket.gethostname()}-{os.getpid()}",
                        30.0, "gpu-operator/default-mig-parted-config", ("", 9401),
                        None)  # fmt: skip
    monkeypatch.setenv("POD_NAME", "updater-1")
    monkeypatch.setenv("MIG_PARTED_CONFIG", "ops/layouts")
    monkeypatch.setenv("METRICS_PORT", "0")  # none served
    monkeypatch.setenv("LEASE_NAME", "mine")
    monkeypatch.setenv("DRA_NODE_SELECTOR", "type=kwok")  # DRA on, static MIG
    monkeypatch.setenv("KUBE_API_QPS", "500")
    monkeypatch.setenv("RENEW_DEADLINE_SECONDS", "12")
    monkeypatch.setenv("FAULT_NODE_LABELS", "true")
    monkeypatch.setenv("KAI_NODE_SELECTOR", "type=kwok")
    assert updater_cli.main(["run", "--layout", "single", "--resync", "5"]) == 0
    assert given[1][-5].qps == 500 and given[1][-4] == Timing(15, 12, 2) and given[1][-2] is True
    assert given[1][-1] == "type=kwok"
    assert given[1][1:-5] == ("single", "mine", "updater-1", 5.0, "ops/layouts", None,
                            DraOptions("type=kwok", dynamic_mig=False))  # fmt: skip
    monkeypatch.setenv("DRA_DYNAMIC_MIG", "true")
    assert updater_cli.main(["run", "--dra-node-selector", ""]) == 0  # every GPU node
    assert given[2][-6] == DraOptions("", dynamic_mig=True)
    monkeypatch.setenv("DRA_NODE_SELECTOR", "")  # empty is unset, as every variable: DRA off
    assert updater_cli.main(["run"]) == 0
    assert given[3][-6] is None


def test_the_updater_without_a_command_is_a_usage_error() -> None:
    result = run_cli("status_updater")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("error: the following arguments are required: command")
    )
