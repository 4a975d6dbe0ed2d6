"""The updater's writers, where no API is needed to see what they do."""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from bench.scale import cluster
from mig_exporter.kube import api as kube_api
from mig_exporter.kube.api import list_watch
from status_updater import controller as controller_module
from status_updater import daemon
from status_updater.controller import LAYOUTS_ATTEMPTS, Controller
from status_updater.dra import DraOptions
from status_updater.objects import slim_node, slim_pod
from status_updater.single import SingleWriter, TooLarge
from status_updater.state import ClusterState, Unreadable, reconcile
from tests.status_updater.test_reconcile import after_one_ended, gpu_pod, whole_gpu_node
from tests.status_updater.test_static import pod as static_pod
from tests.support.base import SAMPLES
from tests.support.kubeapi import KubeAPI, eventually
from topology.model import NodeTopology, Topology


def test_a_topology_over_one_configmap_is_refused_with_the_reason() -> None:
    topology, _ = reconcile(*cluster(nodes=80, gpus=8))
    writer = SingleWriter(None, "topology", "gpu-operator")  # type: ignore[arg-type]
    with pytest.raises(TooLarge) as e:
        writer.write(topology)  # refused before any API call
    message = str(e.value)
    assert message.startswith("ConfigMap gpu-operator/topology: topology.yml for 80 nodes is 1.")
    assert message.endswith(
        "MiB, over the 1 MiB a ConfigMap holds; not written; use --layout per-node"
    )


def test_a_sync_over_one_configmap_says_so_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    writer = SingleWriter(None, "topology", "gpu-operator")  # type: ignore[arg-type]
    writer.written = Topology()  # as read from the ConfigMap: no API call here
    writer.sync(ClusterState.of(*cluster(nodes=80, gpus=8)), set(), False)  # no exception
    (record,) = caplog.records
    assert record.levelname == "ERROR" and record.getMessage().startswith(
        "ConfigMap gpu-operator/topology: topology.yml for 80 nodes is 1."
    )


# ------------------------------------------------- the GPU operator's layouts, in the writer loop


class Recorder:
    """A writer that keeps, per sync, the MIG profiles each changed static node got."""

    what = "recorder"

    def __init__(self, written: dict[str, NodeTopology] | None = None) -> None:
        self.writes: list[dict[str, list[list[str]] | str]] = []
        self.written = written or {}  # what the "ConfigMaps" hold
        self.reads = 0
        self.fulls: list[bool] = []  # each sync's `full`
        self.fail = 0  # the next N syncs fail, as an unreachable API makes them
        self.fail_reads = 0  # the next N reads of what is written fail

    def informers(self, stop: threading.Event, wake: Callable[[], None]) -> list[threading.Thread]:
        return []

    def ready(self) -> bool:
        return True

    def has_work(self) -> bool:
        return False

    def sync(self, state: ClusterState, changed: set[str], full: bool) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionRefusedError(111, "Connection refused")
        self.fulls.append(full)
        names = set(state.results) if full else changed
        self.writes.append({name: _profiles(state.results[name]) for name in names})

    def leading(self, leading: bool) -> None:
        pass

    def remembered(self) -> dict[str, NodeTopology]:
        if self.fail_reads:
            self.fail_reads -= 1
            raise ConnectionResetError(104, "Connection reset by peer")
        self.reads += 1
        return self.written


def _profiles(result: NodeTopology | Unreadable) -> list[list[str]] | str:
    if isinstance(result, Unreadable):
        return "unreadable"
    return [[d.name for d in g.mig_devices or ()] for g in result.gpus]


STATIC_NODE = {
    "kind": "Node",
    "metadata": {
        "name": "n1",
        "labels": {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu.count": "1",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": "one-small",
        },
    },
}
ONE_SMALL = {
    "metadata": {"name": "default-mig-parted-config"},
    "data": {
        "config.yaml": "version: v1\nmig-configs:\n  one-small:\n  - devices: all\n"
        "    mig-enabled: true\n    mig-devices: {1g.5gb: 1}\n"
    },
}


@pytest.fixture
def loop() -> Iterator[tuple[Controller, Recorder]]:
    writer = Recorder()
    controller = Controller(None, writer)  # type: ignore[arg-type]  # no API: events are fed
    stop = threading.Event()
    thread = threading.Thread(target=controller.run_writer, args=(stop,), daemon=True)
    thread.start()
    controller.events.put(("nodes", "RESET", [slim_node(STATIC_NODE)]))
    controller.events.put(("pods", "RESET", []))
    controller.events.put(("policies", "RESET", []))
    controller.dirty.set()
    yield controller, writer
    stop.set()
    controller.dirty.set()
    thread.join(5)


def feed(controller: Controller, kind: str, payload: object) -> None:
    controller.events.put(("layouts", kind, payload))
    controller.dirty.set()


def test_nothing_is_written_before_the_layouts_are_known(loop: tuple[Controller, Recorder]) -> None:
    controller, writer = loop
    time.sleep(0.6)  # nodes and pods listed, several writer turns: the layouts are not
    assert writer.writes == []
    feed(controller, "RESET", ONE_SMALL)
    first = eventually(lambda: writer.writes)[0]
    assert first == {"n1": [["1g.5gb"]]}  # the ConfigMap's layout, never the built-ins first


def test_an_unreadable_configmap_does_not_hold_the_writes(
    loop: tuple[Controller, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    controller, writer = loop
    feed(
        controller, "ERROR", "configmap gpu-operator/default-mig-parted-config: HTTP 403 Forbidden"
    )
    # NVIDIA's layouts have no `one-small`: MIG on, no instance, and it says so.
    assert eventually(lambda: writer.writes)[0] == {"n1": [[]]}
    assert "HTTP 403 Forbidden: NVIDIA's built-in MIG layouts until it can be read" in caplog.text
    assert "unknown layout 'one-small'" in caplog.text


def test_layouts_follow_the_configmap_and_a_bad_one_keeps_the_last(
    loop: tuple[Controller, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    controller, writer = loop
    feed(controller, "RESET", ONE_SMALL)
    eventually(lambda: writer.writes and writer.writes[-1] == {"n1": [["1g.5gb"]]})
    bad = {"metadata": ONE_SMALL["metadata"], "data": {"config.yaml": "version: v2\n"}}
    for _ in range(2):
        feed(controller, "MODIFIED", bad)
    time.sleep(0.6)
    assert writer.writes[-1] == {"n1": [["1g.5gb"]]}  # kept
    warned = [r for r in caplog.records if "expected v1, got 'v2'" in r.getMessage()]
    assert len(warned) == 1, "said once"
    feed(controller, "DELETED", None)  # gone: the built-ins, which lack `one-small`
    eventually(lambda: writer.writes[-1] == {"n1": [[]]})


def test_what_is_said_of_the_layouts_configmap_once_per_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    controller = Controller(None, Recorder())  # type: ignore[arg-type]
    meta = ONE_SMALL["metadata"]
    for cm in (None, ONE_SMALL, ONE_SMALL, {"metadata": meta, "data": {}},
               {"metadata": meta, "data": {"config.yaml": "version: v2\n"}}, None):  # fmt: skip
        controller._set_layouts(cm)
    ref = "configmap gpu-operator/default-mig-parted-config"
    assert caplog.messages == [
        f"{ref} not found: NVIDIA's built-in MIG layouts",
        f"{ref}: 1 MIG layouts",
        f"{ref}: data[config.yaml]: is required; keeping the layouts in use",
        f"{ref}: data[config.yaml].version: expected v1, got 'v2'; keeping the layouts in use",
        f"{ref} not found: NVIDIA's built-in MIG layouts",
    ]
    assert controller.invalid.value("configmap") == 2


def test_the_first_write_and_a_takeover_compare_everything_and_failures_are_retried(
    loop: tuple[Controller, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    controller, writer = loop
    writer.fail_reads = 1  # reading what is written fails once: retried before any write
    feed(controller, "RESET", ONE_SMALL)
    eventually(lambda: writer.fulls == [True])  # the first write compares everything
    assert writer.reads == 1
    controller.events.put(("nodes", "MODIFIED", slim_node(STATIC_NODE)))
    controller.dirty.set()
    time.sleep(0.6)
    assert writer.fulls == [True]  # nothing changed: nothing to write

    pod = slim_pod(
        static_pod("p", "n1", "2026-01-01T00:00:00Z", {"c": {"nvidia.com/mig-1g.5gb": "1"}})
    )
    writer.fail = 1
    controller.events.put(("pods", "ADDED", pod))
    controller.dirty.set()
    # The write fails; its retry compares everything, as the failed one may have landed.
    eventually(lambda: writer.fulls == [True, True])
    controller.events.put(("pods", "DELETED", pod))
    controller.dirty.set()
    eventually(lambda: writer.fulls == [True, True, False])  # a change: its node only
    controller.became_leader(True)  # the old leader may have written since
    eventually(lambda: writer.fulls == [True, True, False, True])
    assert [m for m in caplog.messages if m.endswith("retrying")] == [
        "recorder: ConnectionResetError: [Errno 104] Connection reset by peer; retrying",
        "recorder: ConnectionRefusedError: [Errno 111] Connection refused; retrying",
    ]


# ------------------------------------------------- assignments remembered through the ConfigMaps


def test_a_restarted_writer_keeps_what_the_configmaps_say_pods_hold() -> None:
    node, pod = whole_gpu_node("k80", count=2), gpu_pod("b", "k80", 1, "2026-01-02T00:00:00Z")
    # What a previous process wrote: b on GPU 1 (GPU 0's older pod has ended since).
    before = after_one_ended(
        2, [("a", 1, "2026-01-01T00:00:00Z"), ("b", 1, "2026-01-02T00:00:00Z")], ended="a"
    )
    writer = Recorder(written=dict(before.topology().nodes))
    held: list[int] = []

    def sync(state: ClusterState, changed: set[str], full: bool) -> None:
        result = state.results["k80"]
        assert isinstance(result, NodeTopology)
        held.extend(i for i, g in enumerate(result.gpus) if g.status)

    writer.sync = sync  # type: ignore[method-assign]
    leading = [True]
    controller = Controller(None, writer, is_leader=lambda: leading[0])  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=controller.run_writer, args=(stop,), daemon=True)
    thread.start()
    try:
        for what, items in (("nodes", [slim_node(node)]), ("pods", [slim_pod(pod)]),
                            ("layouts", None), ("policies", [])):  # fmt: skip
            controller.events.put((what, "RESET", items))
        controller.dirty.set()
        assert eventually(lambda: held) == [1]  # not GPU 0, where a fresh placement puts it
        assert writer.reads == 1
        controller.became_leader(True)  # a takeover reads them again: the old leader wrote
        eventually(lambda: writer.reads == 2)
    finally:
        stop.set()
        controller.dirty.set()
        thread.join(5)


def test_stepping_down_reads_nothing_and_taking_over_reads_what_the_leader_wrote() -> None:
    writer = Recorder(written={})
    leading = [True]
    controller = Controller(None, writer, is_leader=lambda: leading[0])  # type: ignore[arg-type]
    turns = [0]  # writer-loop turns that got as far as settling the state
    settle = controller.settle

    def counted() -> set[str]:
        turns[0] += 1
        return settle()

    controller.settle = counted  # type: ignore[method-assign]
    stop = threading.Event()
    thread = threading.Thread(target=controller.run_writer, args=(stop,), daemon=True)
    thread.start()
    try:
        for what, items in (("nodes", [slim_node(whole_gpu_node("k80"))]), ("pods", []),
                            ("layouts", None), ("policies", [])):  # fmt: skip
            controller.events.put((what, "RESET", items))
        controller.dirty.set()
        eventually(lambda: writer.writes)
        assert writer.reads == 1
        leading[0] = False
        controller.became_leader(False)  # a standby follows the cluster; nothing to take over
        after = turns[0]
        eventually(lambda: turns[0] >= after + 2)
        assert writer.reads == 1
        leading[0] = True
        controller.became_leader(True)
        eventually(lambda: writer.reads == 2)
    finally:
        stop.set()
        controller.dirty.set()
        thread.join(5)


# ------------------------------------------------- honest health: a dead loop ends the process


@pytest.mark.parametrize("loop_name", ["writer", "pods", "configmaps"])
def test_the_updater_exits_when_one_of_its_loops_stops(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    loop_name: str,
) -> None:
    def broken(self: Controller, stop: threading.Event) -> None:
        return  # the writer loop ends, as a bug would end it

    def watch_or_end(what: str, *args: Any, **kw: Any) -> None:
        if what != loop_name:  # this watch ends, as a bug would end it
            list_watch(what, *args, **kw)

    if loop_name == "writer":
        monkeypatch.setattr(Controller, "run_writer", broken)
    else:
        monkeypatch.setattr(controller_module, "list_watch", watch_or_end)
        monkeypatch.setattr(kube_api, "list_watch", watch_or_end)  # the writers' queued_watch
    monkeypatch.setattr(daemon.signal, "signal", lambda *_: None)  # pytest keeps its handlers
    with KubeAPI.start() as kube:
        config = kube.write_kubeconfig(tmp_path / "kubeconfig")
        started = time.monotonic()
        code = daemon.run(str(config), "per-node", "lease", "me", 30.0, "gpu-operator/x")
    assert code == 1
    assert time.monotonic() - started < 5
    assert f"the {loop_name} thread stopped; exiting to be restarted" in caplog.messages


def test_loops_that_stop_together_are_named_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    looked = threading.Event()  # the watchdog looked once, with every loop running
    health = daemon._health

    def first_look(*args: Any) -> Any:
        looked.set()
        return health(*args)

    def broken(self: Controller, stop: threading.Event) -> None:
        looked.wait(5)

    def watch_or_end(what: str, *args: Any, **kw: Any) -> None:
        if what == "pods":
            looked.wait(5)
        else:
            list_watch(what, *args, **kw)

    monkeypatch.setattr(daemon, "_health", first_look)
    monkeypatch.setattr(Controller, "run_writer", broken)
    monkeypatch.setattr(controller_module, "list_watch", watch_or_end)
    monkeypatch.setattr(daemon.signal, "signal", lambda *_: None)  # pytest keeps its handlers
    with KubeAPI.start() as kube:
        config = kube.write_kubeconfig(tmp_path / "kubeconfig")
        code = daemon.run(str(config), "per-node", "lease", "me", 30.0, "gpu-operator/x")
    assert code == 1
    assert "the pods, writer thread stopped; exiting to be restarted" in caplog.messages


def test_a_failing_pod_watch_pauses_the_writes_until_pods_are_listed_again() -> None:
    """The informers report their failures: the writer waits (`following()` false) from the
    failure until the next good list, as a cache that missed pods must not be written."""
    with KubeAPI.start(strict=True) as kube:
        core = kubernetes.client.CoreV1Api(kube.api_client())
        controller = Controller(core, Recorder())
        stop = threading.Event()
        for thread in controller.informers(stop):
            thread.start()
        seen: list[tuple[bool, bool]] = []  # (pods failing, following), after each event

        def apply_events() -> list[tuple[bool, bool]]:
            while not controller.events.empty():
                controller._apply(*controller.events.get())
                seen.append(("pods" in controller.failing, controller.following()))
            return seen

        try:
            eventually(lambda: apply_events() and seen[-1] == (False, True), timeout=10)
            # What the watches deliver lands in the state as what it is: a node, a pod on it.
            kube.create("nodes", whole_gpu_node("w1"))
            kube.create("pods", gpu_pod("p1", "w1", 1, "2026-01-01T00:00:00Z"), namespace="ns")
            eventually(lambda: apply_events() and "ns/p1" in controller.state.pods.get("w1", {}))
            assert set(controller.state.nodes) == {"w1"}
            seen.clear()
            kube.fail_next(2, action="list", plural="pods")
            kube.cut_watches(abort=True)
            eventually(lambda: apply_events() and seen[-1] == (False, True), timeout=20)
            assert (True, False) in seen  # the writes waited while the pods were not followed
        finally:
            stop.set()
            kube.cut_watches()


@contextlib.contextmanager
def layouts_informer(kube: KubeAPI) -> Iterator[Callable[[], list[tuple[str, object]]]]:
    """The mig-parted ConfigMap's informer, running against `kube`: gives a function that
    returns (kind, payload) of every event it has reported so far, in order."""
    controller = Controller(kubernetes.client.CoreV1Api(kube.api_client()), Recorder())
    stop = threading.Event()
    controller._layouts_informer(stop).start()
    seen: list[tuple[str, object]] = []

    def reported() -> list[tuple[str, object]]:
        while not controller.events.empty():
            _, kind, payload = controller.events.get()
            seen.append((kind, payload))
        return seen

    try:
        yield reported
    finally:
        stop.set()
        kube.cut_watches()


def _layout_events(
    status: int, failures: int, *configmaps: dict[str, Any]
) -> list[tuple[str, object]]:
    """What the mig-parted ConfigMap's informer reports when its first `failures` lists fail
    with `status`, until it lists: (kind, payload) of each event, in order."""
    with KubeAPI.start(strict=True) as kube:
        for cm in configmaps:
            kube.create("configmaps", cm, namespace="gpu-operator")
        kube.fail_next(failures, status=status, action="list", plural="configmaps")
        with layouts_informer(kube) as reported:

            def listed() -> list[tuple[str, object]] | None:
                seen = reported()
                return seen if any(kind == "RESET" for kind, _ in seen) else None

            return eventually(listed, timeout=20)


def test_passing_failures_to_read_the_layouts_are_retried_before_writing_without_them() -> None:
    # Two 500s are retried quietly: the writes go on waiting for the ConfigMap (here absent).
    assert _layout_events(500, LAYOUTS_ATTEMPTS - 1) == [("RESET", None)]
    # As many as LAYOUTS_ATTEMPTS: the writes go on with the built-ins, said once.
    kinds = [kind for kind, _ in _layout_events(500, LAYOUTS_ATTEMPTS)]
    assert kinds == ["ERROR", "RESET"]
    # Listed, it is the one named, not another ConfigMap of its namespace.
    other = {
        "metadata": {"name": "other"},
        "data": {"config.yaml": "version: v1\nmig-configs: {}\n"},
    }
    ((kind, cm),) = _layout_events(500, 0, other, copy.deepcopy(ONE_SMALL))
    assert kind == "RESET" and isinstance(cm, dict)
    assert (cm["metadata"]["name"], cm["data"]) == ("default-mig-parted-config", ONE_SMALL["data"])
    # A 403 will not pass: at once.
    (error, message), _ = _layout_events(403, 1)
    assert error == "ERROR" and "HTTP 403" in str(message)


def test_the_layouts_failures_are_counted_again_from_each_good_list() -> None:
    with KubeAPI.start(strict=True) as kube, layouts_informer(kube) as reported:
        eventually(lambda: [kind for kind, _ in reported()] == ["RESET"], timeout=10)
        for _ in range(2):  # each time one failure short of giving up: never an ERROR
            kube.fail_next(LAYOUTS_ATTEMPTS - 1, action="list", plural="configmaps")
            kube.expire_watches()  # the next watch gets 410 Gone: it lists again
            kube.cut_watches()
            count = len(reported())
            eventually(lambda n=count: len(reported()) > n, timeout=20)
        assert [kind for kind, _ in reported()] == ["RESET"] * 3


def test_the_layouts_configmap_created_and_deleted_after_the_list_is_followed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=controller_module.log.name)
    ref = "configmap gpu-operator/default-mig-parted-config"
    builtin, one = f"{ref} not found: NVIDIA's built-in MIG layouts", f"{ref}: 1 MIG layouts"
    with KubeAPI.start(strict=True) as kube:
        controller = Controller(kubernetes.client.CoreV1Api(kube.api_client()), Recorder())
        stop = threading.Event()
        controller._layouts_informer(stop).start()

        def said() -> list[str]:
            controller.drain()
            return [r.getMessage() for r in caplog.records if r.name == controller_module.log.name]

        try:
            eventually(lambda: said() == [builtin], timeout=10)
            kube.create("configmaps", copy.deepcopy(ONE_SMALL), namespace="gpu-operator")
            eventually(lambda: said() == [builtin, one], timeout=10)
            assert "one-small" in controller.state.layouts
            kube.delete("configmaps", "default-mig-parted-config", "gpu-operator")
            eventually(lambda: said() == [builtin, one, builtin], timeout=10)
            assert "one-small" not in controller.state.layouts
        finally:
            stop.set()
            kube.cut_watches()


@pytest.mark.parametrize("status", [404, 403])
def test_claims_unreadable_from_the_start_are_none_and_once_listed_pause_the_writes(
    status: int,
) -> None:
    """DRA on, on a cluster without `resource.k8s.io/v1` (404) or without the RBAC to read
    claims (403): nothing to wait for, the ConfigMaps are written. Once claims were listed, the
    same failure pauses the writes until they are listed again, and no claim is dropped."""
    with KubeAPI.start(strict=True) as kube:
        core = kubernetes.client.CoreV1Api(kube.api_client())
        controller = Controller(core, Recorder(), dra=DraOptions("type=kwok"))
        kube.fail_next(2, status=status, action="list", plural="resourceclaims")
        stop = threading.Event()
        for thread in controller.informers(stop):
            thread.start()
        seen: list[tuple[bool, bool, int]] = []  # (claims failing, following, claims held)

        def apply_events() -> list[tuple[bool, bool, int]]:
            while not controller.events.empty():
                controller._apply(*controller.events.get())
                seen.append(("claims" in controller.failing, controller.following(),
                             len(controller.state.claims)))  # fmt: skip
            return seen

        try:
            eventually(lambda: apply_events() and seen[-1] == (False, True, 0), timeout=10)
            assert not any(failing for failing, *_ in seen)  # never waited on
            claim = next(yaml.safe_load_all((SAMPLES / "dra" / "claims.yaml").read_text()))
            kube.create("resourceclaims", claim, namespace="gpu-test")
            eventually(lambda: apply_events() and seen[-1] == (False, True, 1), timeout=10)
            seen.clear()
            kube.fail_next(2, status=status, action="list", plural="resourceclaims")
            # Every watch must list again (410 Gone), whether its stream is open or not.
            kube.create(
                "configmaps", {"metadata": {"name": "later"}}, "elsewhere"
            )  # history moves on
            kube.compact()
            kube.cut_watches()
            eventually(lambda: apply_events() and seen[-1] == (False, True, 1), timeout=20)
            assert (True, False, 1) in seen  # the writes waited; the claim was never dropped
            assert all(held == 1 for *_, held in seen)
        finally:
            stop.set()
            kube.cut_watches()


class ScriptedClaims:
    """The ResourceClaims' list call answering in turn from a script: an HTTP status (the API's
    error), "down" (no answer: a connection refused), or "list" (an empty list, or for a watch a
    stream that ends). With the last answer the informer is stopped. `drain`: each call first
    applies what the informer queued, as a writer that keeps up would."""

    def __init__(self, script: list[int | str], stop: threading.Event, drain: Callable[[], None]):
        self.script, self.stop, self.drain = list(script), stop, drain

    def __call__(self, **kwargs: Any) -> Any:
        self.drain()
        answer = self.script.pop(0)
        if not self.script:
            self.stop.set()
        if isinstance(answer, int):
            raise kubernetes.client.ApiException(status=answer, reason=REASONS.get(answer, "No"))
        if answer == "down":
            raise ConnectionRefusedError(111, "Connection refused")
        if kwargs.get("watch"):
            return _EndedStream()
        return _Listed(b'{"items": [], "metadata": {"resourceVersion": "1"}}')


# A gateway's answer whose text names another status: the status chooses, never the text.
REASONS = {502: "Bad Gateway (the aggregated API answered HTTP 404)"}


class _Listed:
    def __init__(self, data: bytes) -> None:
        self.data = data


class _EndedStream:
    status = 200

    def stream(self, amt: object = None, decode_content: object = None) -> Iterator[bytes]:
        return iter(())

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


# (the claims' answers, what the updater says of them in turn: N for "no DRA claims are
# followed", W for "the writes wait", each with its status; whether it writes after)
CLAIMS_UNREADABLE = [
    ([403] * 6, ["N403"], True),  # forbidden, retried: said once, written without claims
    ([404] * 6, ["N404"], True),  # not served (before 1.34): the same
    ([403, 403, 404, 404, 403], ["N403", "N404", "N403"], True),  # again each time it changes
    ([403, 500, 403, 403], ["N403", "N403"], True),  # another failure between: said, written
    ([404, "down", "down", 404], ["N404", "N404"], True),
    ([500, 500], [], False),  # a passing failure before the first list: the writes wait
    ([502, 502], [], False),  # whatever its text says
    (["list", 403, 403], ["W403"], False),  # listed once: a failing watch pauses the writes
    ([403, "list", 404, 404], ["N403", "W404"], False),  # claims held are never dropped
    ([404, "list", 404, 500, 404, 404], ["N404", "W404", "W404"], False),
]


@pytest.mark.parametrize("drain", [False, True], ids=["writer-behind", "writer-keeping-up"])
@pytest.mark.parametrize(("script", "said", "writes"), CLAIMS_UNREADABLE)
def test_claims_that_cannot_be_read_are_said_once_per_change_and_never_hold_the_writes(
    script: list[int | str],
    said: list[str],
    writes: bool,
    drain: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The claims' informer as it runs (list, watch, backoff) against an API answering 403 or
    404 again and again: one warning for as long as one condition lasts, whatever the retries
    and however late the writer applies what the informer queued; the mode is chosen by the
    answer's status."""
    controller = Controller(
        kubernetes.client.CoreV1Api(kubernetes.client.ApiClient()), Recorder(),
        dra=DraOptions("type=kwok"),
    )  # fmt: skip
    controller.synced |= {"nodes", "pods", "layouts", "policies"}
    stop = threading.Event()
    calls = ScriptedClaims(script, stop, controller.drain if drain else lambda: None)
    monkeypatch.setattr(
        kubernetes.client.ResourceV1Api, "list_resource_claim_for_all_namespaces",
        lambda _api, **kwargs: calls(**kwargs),
    )  # fmt: skip
    monkeypatch.setattr(kube_api.Backoff, "wait", lambda _self, _stop: None)
    caplog.set_level(logging.WARNING, logger=controller_module.log.name)
    (claims,) = [t for t in controller.informers(stop) if t.name == "claims"]
    claims.run()  # in this thread, until the script is done
    controller.drain()
    lines = [r.getMessage() for r in caplog.records if r.name == controller_module.log.name]
    kinds = {"N": "no DRA claims are followed until they can be read",
             "W": "the writes wait until they are listed again"}  # fmt: skip
    assert len(lines) == len(said), lines
    for line, what in zip(lines, said, strict=True):
        assert line.startswith(f"claims: HTTP {what[1:]} ") and line.endswith(kinds[what[0]])
    assert controller.following() == writes


def test_the_claims_failure_may_be_handed_its_status(caplog: pytest.LogCaptureFixture) -> None:
    """The informer's callback taking the status itself (as mig_exporter.kube.api could hand it over): the
    same once-per-condition rule, whatever the message says."""
    controller = Controller(None, Recorder(), dra=DraOptions("type=kwok"))  # type: ignore[arg-type]
    caplog.set_level(logging.WARNING, logger=controller_module.log.name)
    for status in (403, 403, 404, 404, 500, 404):
        controller._claims_error("claims: failed", status)
    lines = [r.getMessage() for r in caplog.records if r.name == controller_module.log.name]
    assert [line.split(": ResourceClaims ")[1][:10] for line in lines] == [
        "may not be",
        "are not se",
        "are not se",
    ]
