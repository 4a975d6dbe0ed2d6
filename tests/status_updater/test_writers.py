"""The updater's API edge against a fake API object: what each call carries, and what a
conflict makes it do. (The live tests show the same against the emulator; these pin it down.)"""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from freezegun import freeze_time
from kubernetes.client import (
    V1ConfigMap,
    V1Lease,
    V1LeaseSpec,
    V1ObjectMeta,
)
from kubernetes.client.exceptions import ApiException

from status_updater.leader import LeaderElector, Timing
from status_updater.pernode import PerNodeWriter
from status_updater.reconcile import document
from status_updater.single import SingleWriter
from status_updater.state import ClusterState
from tests.status_updater.test_reconcile import gpu_pod, whole_gpu_node
from topology import configmap as contract
from topology.model import NodeTopology, dump_yaml, load_yaml

NS = "gpu-operator"


@dataclass
class Response:
    data: bytes


@dataclass
class FakeCore:
    """ConfigMaps in memory, with resourceVersions and the API's 409 on a stale one."""

    cms: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    version: int = 0
    others_write: int = 0  # the next N patches find that someone else wrote first
    others_text: str = "someone else's"  # what they wrote

    def put(self, name: str, data: dict[str, str], labels: dict[str, str] | None = None) -> None:
        self.version += 1
        self.cms[name] = {"metadata": {"name": name, "namespace": NS, "labels": labels or {},
                                       "resourceVersion": str(self.version)}, "data": data}  # fmt: skip

    def _answer(self, name: str, preload: bool) -> Any:
        cm = self.cms[name]
        if not preload:
            return Response(json.dumps(cm).encode())
        meta = cm["metadata"]
        return V1ConfigMap(
            metadata=V1ObjectMeta(name=name, labels=meta["labels"],
                                  resource_version=meta["resourceVersion"]),
            data=dict(cm["data"]),
        )  # fmt: skip

    def read_namespaced_config_map(self, name: str, namespace: str, **kw: Any) -> Any:
        assert namespace == NS
        self.calls.append(("read", name, None))
        if name not in self.cms:
            raise ApiException(status=404)
        return self._answer(name, kw.get("_preload_content", True))

    def create_namespaced_config_map(self, namespace: str, body: Any, **kw: Any) -> Any:
        assert namespace == NS
        name = body["metadata"]["name"]
        self.calls.append(("create", name, body))
        if name in self.cms:
            raise ApiException(status=409)
        self.put(name, body["data"], body["metadata"].get("labels"))
        return self._answer(name, kw.get("_preload_content", True))

    def patch_namespaced_config_map(self, name: str, namespace: str, body: Any, **kw: Any) -> Any:
        assert namespace == NS
        self.calls.append(("patch", name, body))
        if name not in self.cms:
            raise ApiException(status=404)
        if self.others_write:
            self.others_write -= 1
            self.put(name, {"topology.yml": self.others_text}, self.cms[name]["metadata"]["labels"])
        self._unless_moved(name, (body.get("metadata") or {}).get("resourceVersion"))
        labels = {**self.cms[name]["metadata"]["labels"], **(body.get("metadata") or {}).get("labels", {})}  # fmt: skip
        self.put(name, {**self.cms[name]["data"], **body["data"]}, labels)
        return self._answer(name, kw.get("_preload_content", True))

    def delete_namespaced_config_map(self, name: str, namespace: str, body: Any, **kw: Any) -> None:
        assert namespace == NS
        self.calls.append(("delete", name, body))
        if name not in self.cms:
            raise ApiException(status=404)
        self._unless_moved(name, (body.get("preconditions") or {}).get("resourceVersion"))
        del self.cms[name]

    def _unless_moved(self, name: str, version: str | None) -> None:
        """The API's 409 for a write based on a version the ConfigMap has moved on from."""
        if version is not None and version != self.cms[name]["metadata"]["resourceVersion"]:
            raise ApiException(status=409)

    def writes(self) -> list[tuple[str, Any]]:
        return [(verb, body) for verb, _, body in self.calls if verb in ("create", "patch")]


def state_with(*pods: dict[str, Any]) -> ClusterState:
    return ClusterState.of([whole_gpu_node("k80", count=2)], list(pods))


# --- the single layout ---------------------------------------------------------------------------


def test_single_creates_then_patches_with_the_version_it_read() -> None:
    core = FakeCore()
    writer = SingleWriter(core, "topology", NS)  # type: ignore[arg-type]
    writer.sync(state_with(), set(), full=True)
    [(verb, body)] = core.writes()
    assert verb == "create" and body["metadata"]["name"] == "topology"
    writer.sync(state_with(gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z")), {"k80"}, full=False)
    verb, body = core.writes()[-1]
    assert verb == "patch" and body["metadata"] == {"resourceVersion": "1"}
    written = load_yaml(core.cms["topology"]["data"]["topology.yml"])
    assert written.nodes["k80"].gpus[0].status is not None


def test_single_rereads_and_applies_again_on_a_409() -> None:
    core = FakeCore()
    state = state_with(gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z"))
    core.put("topology", {"topology.yml": "mig-strategy: none\nnodes: {}\n"})
    core.others_write = 1  # between our read and our patch, someone writes
    SingleWriter(core, "topology", NS).write(state.topology())  # type: ignore[arg-type]
    patches = [body for verb, body in core.writes() if verb == "patch"]
    assert [p["metadata"]["resourceVersion"] for p in patches] == ["1", "2"]  # read again
    assert [verb for verb, _, _ in core.calls] == ["read", "patch", "read", "patch"]
    assert load_yaml(core.cms["topology"]["data"]["topology.yml"]) == state.topology()


def test_single_gives_up_after_five_conflicts_in_a_row() -> None:
    core = FakeCore()
    core.put("topology", {"topology.yml": "mig-strategy: none\nnodes: {}\n"})
    core.others_write = 99
    with pytest.raises(ApiException) as e:
        SingleWriter(core, "topology", NS).write(state_with().topology())  # type: ignore[arg-type]
    assert e.value.status == 409
    assert sum(verb == "patch" for verb, _, _ in core.calls) == 5


def test_single_writes_nothing_when_the_configmap_already_holds_it() -> None:
    core = FakeCore()
    state = state_with()
    core.put("topology", {"topology.yml": dump_yaml(state.topology())})
    SingleWriter(core, "topology", NS).sync(state, set(), full=True)  # type: ignore[arg-type]
    assert core.writes() == []


# --- the per-node layout -------------------------------------------------------------------------


def per_node(core: FakeCore) -> PerNodeWriter:
    writer = PerNodeWriter(core, NS)  # type: ignore[arg-type]
    managed = [cm for cm in core.cms.values() if contract.is_managed(cm["metadata"]["labels"])]
    writer._events.put(("RESET", managed))  # what its ConfigMap watch lists
    assert writer.ready()
    return writer


def written_once(core: FakeCore) -> tuple[PerNodeWriter, ClusterState, str]:
    """A per-node writer that has written node k80, pod p on one of its GPUs: the writer, that
    state and the ConfigMap's name."""
    writer = per_node(core)
    state = state_with(gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z"))
    writer.sync(state, {"k80"}, full=False)
    return writer, state, contract.node_configmap_name("k80")


def test_per_node_rereads_on_a_409_and_stops_when_the_content_is_there() -> None:
    core = FakeCore()
    writer, _, name = written_once(core)
    assert [verb for verb, _ in core.writes()] == ["create"]
    # The pod ends; someone else writes first: the patch carries the version seen, gets 409,
    # reads again and patches with the new one.
    core.others_write = 1
    writer.sync(state_with(), {"k80"}, full=False)
    patches = [body for verb, body in core.writes() if verb == "patch"]
    assert [p["metadata"]["resourceVersion"] for p in patches] == ["1", "2"]
    assert load_yaml(core.cms[name]["data"]["topology.yml"]).nodes["k80"].gpus[0].status is None
    # The same document again: nothing to write.
    before = len(core.writes())
    writer.sync(state_with(), {"k80"}, full=True)
    assert len(core.writes()) == before


def test_per_node_stops_when_the_conflicting_write_was_its_own_document() -> None:
    core = FakeCore()
    writer = per_node(core)
    writer.sync(state_with(gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z")), {"k80"}, full=False)
    # Another replica (a leader about to step down) writes the very document we are about to.
    core.others_write, core.others_text = 1, dump_yaml(state_with().topology())
    writer.sync(state_with(), {"k80"}, full=False)
    assert [verb for verb, _ in core.writes()] == ["create", "patch"]  # no second patch


def test_per_node_never_touches_a_configmap_it_does_not_manage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = FakeCore()
    name = contract.node_configmap_name("k80")
    core.put(name, {"topology.yml": "hands off"}, {"team": "someone-else"})
    writer = per_node(core)
    writer.sync(state_with(), {"k80"}, full=False)
    assert [verb for verb, _ in core.writes()] == ["create"]  # refused with 409, then read
    assert core.cms[name]["data"] == {"topology.yml": "hands off"}
    assert "exists and was not created by the updater: not touched" in caplog.text


def test_per_node_remembers_what_its_configmaps_hold() -> None:
    core = FakeCore()
    state = state_with(gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z"))
    writer = per_node(core)
    writer.sync(state, {"k80"}, full=True)
    core.put("unrelated", {"topology.yml": dump_yaml(state_with().topology())})  # not managed
    core.list_namespaced_config_map = lambda namespace, **kw: _page(core, kw)  # type: ignore[attr-defined]
    assert writer.remembered() == dict(state.topology().nodes)


def test_per_node_deletes_its_configmaps_of_nodes_gone_while_it_was_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    core = FakeCore()
    gone = [contract.node_configmap_name(n) for n in ("gone-1", "gone-2")]
    for name, node in zip(gone, ("gone-1", "gone-2"), strict=True):
        core.put(name, {"topology.yml": "written before"}, contract.node_labels(node))
    core.put("topology-team", {"topology.yml": "hands off"}, {"team": "someone-else"})
    writer = per_node(core)
    writer.sync(state_with(), set(), full=True)  # the first sync after start
    assert sorted(core.cms) == ["topology-k80", "topology-team"]
    deletes = [(name, body) for verb, name, body in core.calls if verb == "delete"]
    # Each with the version it was seen at: one rewritten meanwhile is judged again, not lost.
    assert deletes == [(gone[0], {"preconditions": {"resourceVersion": "1"}}),
                       (gone[1], {"preconditions": {"resourceVersion": "2"}})]  # fmt: skip
    assert f"deleted ConfigMaps {gone[0]}, {gone[1]} in {NS}" in caplog.messages
    assert f"wrote ConfigMap topology-k80 in {NS}" in caplog.messages


def test_per_node_writes_again_a_configmap_deleted_under_it() -> None:
    core = FakeCore()
    writer, state, name = written_once(core)
    written = core.cms.pop(name)  # someone deletes it: the watch says so
    writer._events.put(("DELETED", written))
    writer.sync(state, set(), full=False)  # nothing changed in the cluster
    assert core.cms[name]["data"] == written["data"]
    # Its node goes, then comes back before any watch event: deleted, then created afresh.
    writer.sync(ClusterState(), {"k80"}, full=False)
    assert name not in core.cms
    writer.sync(state, {"k80"}, full=False)
    assert core.cms[name]["data"] == written["data"]
    assert [verb for verb, _, _ in core.calls] == ["create", "create", "delete", "create"]


def _page(core: FakeCore, kw: dict[str, Any]) -> Response:
    # Like plain kmock, it ignores the label selector: the writer must pick its own.
    assert kw["label_selector"] == contract.MANAGED_SELECTOR
    return Response(json.dumps({"items": list(core.cms.values()), "metadata": {}}).encode())


# --- the Lease -----------------------------------------------------------------------------------


@dataclass
class FakeLeases:
    lease: V1Lease | None = None
    fail: bool = False
    patches: list[Any] = field(default_factory=list)
    timeouts: list[Any] = field(default_factory=list)  # each call's _request_timeout

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> V1Lease:
        assert namespace == NS
        self.timeouts.append(kw.get("_request_timeout"))
        if self.fail:
            raise ApiException(status=503)
        if self.lease is None or self.lease.metadata.name != name:
            raise ApiException(status=404)
        return self.lease

    def create_namespaced_lease(self, namespace: str, body: Any, **kw: Any) -> None:
        assert namespace == NS
        if self.lease is not None:
            raise ApiException(status=409)
        spec = body["spec"]
        self.lease = V1Lease(
            metadata=V1ObjectMeta(name=body["metadata"]["name"], resource_version="1"),
            spec=V1LeaseSpec(holder_identity=spec["holderIdentity"],
                             lease_duration_seconds=spec["leaseDurationSeconds"],
                             renew_time=spec["renewTime"]),
        )  # fmt: skip

    def patch_namespaced_lease(self, name: str, namespace: str, body: Any, **kw: Any) -> None:
        assert namespace == NS and self.lease is not None and self.lease.metadata.name == name
        self.timeouts.append(kw.get("_request_timeout"))
        self.patches.append(body)
        self.lease.spec = self.lease.spec or V1LeaseSpec()
        self.lease.spec.holder_identity = body["spec"]["holderIdentity"]
        self.lease.spec.renew_time = body["spec"]["renewTime"]


def test_a_leader_that_cannot_renew_steps_down_at_the_deadline() -> None:
    changes: list[bool] = []
    api = FakeLeases()
    elector = LeaderElector(api, "lease", NS, "me", changes.append)  # type: ignore[arg-type]
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with freeze_time(start) as clock:
        assert elector.try_acquire_or_renew()
        elector._set(True)
        assert elector.is_leader() and changes == [True]
        api.fail = True  # the API goes away: no renewal from now on
        clock.tick(Timing().renew_deadline_s - 0.5)
        assert elector.is_leader()  # still within the deadline
        clock.tick(1.0)
        assert not elector.is_leader()  # past it: another replica may take over soon
        assert changes == [True, False]


@pytest.mark.parametrize("timing", [Timing(), Timing(60, 40, 5), Timing(4, 3, 1)])
def test_a_lease_call_may_take_what_is_left_of_the_renew_deadline(timing: Timing) -> None:
    """As client-go's renew loop: an API answering slowly, but within the renew deadline, never
    costs the lease; a fixed short timeout (3 s) lost it while the API was busy publishing."""
    api = FakeLeases()
    elector = LeaderElector(api, "lease", NS, "me", timing=timing)  # type: ignore[arg-type]
    with freeze_time("2026-01-01T00:00:00Z") as clock:
        assert elector.try_acquire_or_renew()
        api.timeouts.clear()
        elector._deadline = 0.0  # a new try, started now
        clock.tick(0.0)
        assert elector.try_acquire_or_renew()
        read, patch = api.timeouts
        assert read == (timing.renew_deadline_s, timing.renew_deadline_s)
        assert patch[1] == pytest.approx(timing.renew_deadline_s)


@pytest.mark.parametrize(
    ("timing", "problem"),
    [(Timing(10, 10, 2), "--lease-duration"), (Timing(15, 2, 2), "--renew-deadline"),
     (Timing(15, 10, 0), "--retry-period"), (Timing(15, 10, 2), None)],
)  # fmt: skip
def test_lease_timings_client_go_refuses_are_refused(timing: Timing, problem: str | None) -> None:
    found = timing.problem()
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_an_expired_lease_is_taken_over_and_a_live_one_is_not() -> None:
    api = FakeLeases()
    with freeze_time("2026-01-01T00:00:00Z") as clock:
        other = LeaderElector(api, "lease", NS, "other")  # type: ignore[arg-type]
        assert other.try_acquire_or_renew()
        me = LeaderElector(api, "lease", NS, "me")  # type: ignore[arg-type]
        clock.tick(Timing().lease_duration_s - 1)
        assert not me.try_acquire_or_renew()  # the holder renewed recently enough
        clock.tick(2)
        assert me.try_acquire_or_renew()
        assert api.lease is not None and api.lease.spec is not None
        assert api.lease.spec.holder_identity == "me"


def test_a_leader_clears_its_own_lease_on_shutdown_and_a_standby_clears_nothing() -> None:
    changes: list[bool] = []
    api = FakeLeases()
    with freeze_time("2026-01-01T00:00:00Z"):
        me = LeaderElector(api, "lease", NS, "me", changes.append)  # type: ignore[arg-type]
        assert me.try_acquire_or_renew()
        me._set(True)
        standby = LeaderElector(api, "lease", NS, "standby")  # type: ignore[arg-type]
        assert not standby.try_acquire_or_renew()
        standby.release()  # not its lease to clear
        assert api.lease is not None and api.lease.spec is not None
        assert api.lease.spec.holder_identity == "me" and api.patches == []
        me.release()
        assert api.lease.spec.holder_identity is None and changes == [True, False]
        # Only the version it read is cleared: a lease taken over meanwhile is left alone.
        assert api.patches == [{"metadata": {"resourceVersion": "1"},
                                "spec": {"holderIdentity": None, "renewTime": None}}]  # fmt: skip
        assert not me.is_leader()
        fresh = LeaderElector(api, "lease", NS, "fresh")  # type: ignore[arg-type]
        assert fresh.try_acquire_or_renew()  # at once, not when the lease runs out
        renewal = api.patches[-1]
        assert renewal["metadata"]["resourceVersion"] == "1"  # the write is based on what it read
        assert renewal["spec"]["holderIdentity"] == "fresh"


def test_a_lease_without_spec_is_free_to_take() -> None:
    api = FakeLeases(V1Lease(metadata=V1ObjectMeta(name="lease", resource_version="7")))
    me = LeaderElector(api, "lease", NS, "me")  # type: ignore[arg-type]
    assert me.try_acquire_or_renew()
    assert api.lease is not None and api.lease.spec is not None
    assert api.lease.spec.holder_identity == "me"
    assert api.patches[0]["metadata"]["resourceVersion"] == "7"  # based on what it read
    assert "acquireTime" in api.patches[0]["spec"]  # a take-over, not a renewal


def _edit_label(cm: dict[str, Any]) -> None:
    cm["metadata"]["labels"][contract.LABEL_NODE_NAME] = "someone-else"


def _drop_label(cm: dict[str, Any]) -> None:
    del cm["metadata"]["labels"][contract.LABEL_NODE_NAME]


def _edit_data(cm: dict[str, Any]) -> None:
    cm["data"] = {contract.DATA_KEY: "mig-strategy: none\nnodes: {}\n"}


@pytest.mark.parametrize("edit", [_edit_label, _drop_label, _edit_data])
def test_per_node_repairs_what_another_writer_edits_in_its_configmap(
    edit: Callable[[dict[str, Any]], None],
) -> None:
    """docs/operations.md promises repair: the node-name label (which the exporter selects its
    node's ConfigMap by) edited or removed with the data left alone, or the data edited."""
    core = FakeCore()
    writer, state, name = written_once(core)
    written = copy.deepcopy(core.cms[name])
    edit(core.cms[name])
    core.version += 1
    core.cms[name]["metadata"]["resourceVersion"] = str(core.version)
    writer._events.put(("MODIFIED", copy.deepcopy(core.cms[name])))
    writer.sync(state, set(), full=False)  # nothing changed in the cluster
    repaired = core.cms[name]
    assert repaired["data"] == written["data"]
    assert repaired["metadata"]["labels"] == written["metadata"]["labels"]
    assert [verb for verb, _ in core.writes()] == ["create", "patch"]


def test_a_release_the_api_refuses_steps_down_and_names_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    changes: list[bool] = []
    api = FakeLeases()
    me = LeaderElector(api, "lease", NS, "me", changes.append)  # type: ignore[arg-type]
    assert me.try_acquire_or_renew()
    me._set(True)
    api.fail = True  # the API is gone at shutdown: the lease runs out instead
    me.release()
    assert changes == [True, False] and not me.is_leader()
    (message,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert message.startswith(f"lease {NS}/lease not released: ")


def test_per_node_repairs_an_edit_seen_before_its_first_write() -> None:
    core = FakeCore()
    state = state_with()
    name = contract.node_configmap_name("k80")
    result = state.results["k80"]
    assert isinstance(result, NodeTopology)
    wanted = contract.node_configmap("k80", dump_yaml(document("k80", result, None)), NS,
                                     state.node_uid("k80"))  # fmt: skip
    core.put(name, wanted["data"], wanted["metadata"]["labels"])
    writer = per_node(core)  # listed: it holds what is wanted
    _edit_data(core.cms[name])  # then edited, and the watch says so before any write
    writer._events.put(("MODIFIED", copy.deepcopy(core.cms[name])))
    assert writer.ready() and writer.has_work()
    writer.sync(state, set(), full=False)
    assert core.cms[name]["data"] == wanted["data"]
    assert [verb for verb, _ in core.writes()] == ["patch"]


def test_per_node_creates_again_a_configmap_deleted_before_the_watch_said_so() -> None:
    core = FakeCore()
    writer, _, name = written_once(core)
    del core.cms[name]  # gone, and the watch has not told yet: the writer patches, gets 404
    writer.sync(state_with(), {"k80"}, full=False)  # the pod ended: a new document
    assert [verb for verb, _, _ in core.calls] == ["create", "patch", "read", "create"]
    assert load_yaml(core.cms[name]["data"]["topology.yml"]).nodes["k80"].gpus[0].status is None


def test_after_release_the_elector_never_takes_the_lease_again() -> None:
    """SIGTERM: the lease is let go for a standby; the loop still running must not renew it."""
    api = FakeLeases()
    with freeze_time("2026-01-01T00:00:00Z"):
        me = LeaderElector(api, "lease", NS, "me")  # type: ignore[arg-type]
        assert me.try_acquire_or_renew()
        me._set(True)
        me.release()
        stop = threading.Event()
        loop = threading.Thread(target=me.run, args=(stop,), daemon=True)
        loop.start()
        loop.join(timeout=5)  # returns at once: released
        stop.set()
        assert not loop.is_alive(), "the elector kept running after release"
        assert api.lease is not None and api.lease.spec is not None
        assert api.lease.spec.holder_identity is None and not me.is_leader()


class SlowCore(FakeCore):
    """An API that takes `delay` seconds to answer each write: a busy one, or a paced client."""

    delay: float = 0.02

    def create_namespaced_config_map(self, namespace: str, body: Any, **kw: Any) -> Any:
        threading.Event().wait(self.delay)
        return super().create_namespaced_config_map(namespace, body, **kw)


@pytest.mark.parametrize("nodes", [1, 7, 40])
def test_a_pass_of_many_writes_ends_in_time_and_the_rest_follows(nodes: int) -> None:
    """A leader with thousands of ConfigMaps to write (at the API's pace, minutes) writes for at
    most a pass's time (at least one node), so that the controller looks at the Lease between
    passes: a busy leader never writes on after it stopped leading. Every node is written in
    the end, each once."""
    core = SlowCore()
    writer = per_node(core)
    writer.pass_s = 0.05
    names = [f"n{i:02d}" for i in range(nodes)]
    state = ClusterState.of([whole_gpu_node(n, count=1) for n in names], [])
    passes = 0
    writer.sync(state, set(), full=True)
    assert 1 <= len(core.writes()) <= 0.05 / core.delay + 1
    while writer.has_work():
        passes += 1
        assert passes < 100
        before = len(core.writes())
        writer.sync(state, set(), full=False)
        assert 1 <= len(core.writes()) - before <= 0.05 / core.delay + 1
    assert sorted(name for verb, name, _ in core.calls if verb == "create") == [
        contract.node_configmap_name(n) for n in names
    ]
    assert passes == 0 if nodes == 1 else passes >= 1
