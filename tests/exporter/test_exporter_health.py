"""`exporter --all-nodes --node-selector`: what is served, and what `/health` says, while the API
fails the Node list (403, 5xx), against the emulated API over HTTP.

- Until the Nodes are listed nothing is known to be selected: nothing is served (`/metrics`
  503), never every node, real ones included, and `/health` says why.
- Once they were listed, a failing list keeps the last selection.
- The ConfigMap watch and the Node watch each have their own problem: one listing again does not
  hide the other's failure, and the Nodes listing again turns `/health` back to 200.

The watches' retries wait on gates the tests open (`gated`), so which watch lists when is decided
here, not by backoff jitter.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter import dcgm, sources
from exporter.many import NodesExporter
from exporter.shards import Shard, shard_of
from exporter.sources import watch_node_configmaps, watch_selected_nodes
from mig_exporter.kube import api
from mig_exporter.web.server import Published
from tests.exporter.test_exporter import MIG
from tests.exporter.test_serve import restore_signals, serve  # noqa: F401 (restore_signals: autouse here too)
from tests.pipeline.test_cli import get
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import parse
from topology.configmap import node_configmap
from topology.model import Topology, dump_yaml

NS = "gpu-operator"
(NODE,) = MIG.nodes
SELECTOR = "type=kwok"


def add_node(kube: KubeAPI, name: str, *, kwok: bool) -> None:
    """A Node, labelled type=kwok or not, and its per-node topology ConfigMap."""
    labels = {"type": "kwok"} if kwok else {}
    kube.create("nodes", {"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "labels": labels}})  # fmt: skip
    add_configmap(kube, name)


def add_configmap(kube: KubeAPI, name: str) -> None:
    text = dump_yaml(Topology(MIG.mig_strategy, {name: MIG.nodes[NODE]}))
    kube.create("configmaps", node_configmap(name, text, NS, None), namespace=NS)


def fail_nodes(kube: KubeAPI, status: int) -> None:
    """Every Node list and watch fails with `status` until `heal`."""
    kube.fail_next(10**6, status=status, plural="nodes")


def heal(kube: KubeAPI) -> None:
    kube.call(lambda emulator: emulator.faults.clear())


def served(many: NodesExporter) -> set[str]:
    return {s.label("Hostname") for s in parse(many.snapshot().body.decode())}


@pytest.fixture
def gated(monkeypatch: pytest.MonkeyPatch) -> dict[str, threading.Event]:
    """A watch thread named here retries after an error only once its gate is open."""
    gates = {"configmaps": threading.Event(), "nodes": threading.Event()}
    gates["configmaps"].set()

    def wait(self: api.Backoff, stop: threading.Event) -> None:
        gate = gates.get(threading.current_thread().name)
        while not stop.is_set() and not (gate is None or gate.wait(0.02)):
            pass

    monkeypatch.setattr(api.Backoff, "wait", wait)
    return gates


@contextmanager
def watching(kube: KubeAPI) -> Iterator[NodesExporter]:
    """Both watches of `--all-nodes --node-selector type=kwok`, in threads named after them."""
    many = NodesExporter(dcgm.Options("h"), Published(), node_selector=SELECTOR)
    stop = threading.Event()
    with kube.api_client() as client:
        threads = [
            threading.Thread(target=watch_node_configmaps, args=(many, stop, client, NS),
                             name="configmaps", daemon=True),
            threading.Thread(target=watch_selected_nodes, args=(many, stop, client, SELECTOR),
                             name="nodes", daemon=True),
        ]  # fmt: skip
        for t in threads:
            t.start()
        try:
            yield many
        finally:
            stop.set()
            kube.cut_watches()
            for t in threads:
                t.join(10)


def after(kube: KubeAPI, plural: str, since: int, *, failed: bool) -> Callable[[], bool]:
    """Whether a list of `plural` was answered (failed or not) after the journal's `since`."""

    def check() -> bool:
        return any(
            e.path.endswith(f"/{plural}") and "watch" not in e.params
            and (e.fault is not None) == failed
            for e in kube.journal()[since:]
        )  # fmt: skip

    return check


def test_while_the_nodes_were_never_listed_no_node_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exporter as run: a 403 (RBAC without nodes) serves nothing and says why, rather than
    every node, the real ones (which have their own exporter) included."""
    monkeypatch.setenv("TOPOLOGY_CM_NAMESPACE", NS)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with KubeAPI.start() as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        add_node(kube, "kwok-1", kwok=True)
        add_node(kube, "real-1", kwok=False)
        fail_nodes(kube, 403)

        def check(url: str) -> None:
            eventually(lambda: "403" in get(f"{url}/health")[1], timeout=15)
            status, body = get(f"{url}/metrics")
            assert (status, "real-1" in body) == (503, False)
            reason = (
                f"Nodes -l {SELECTOR}: HTTP 403 Forbidden; serving no node until they are listed"
            )
            assert get(f"{url}/health") == (503, reason + "\n")
            assert body == reason + "\n"  # /metrics says why too
            heal(kube)
            eventually(lambda: get(f"{url}/health") == (200, "ok\n"), timeout=30)
            text = get(f"{url}/metrics")[1].split("# HELP mig_")[0]
            assert {s.label("Hostname") for s in parse(text)} == {"kwok-1"}

        args = ["--all-nodes", "--node-selector", SELECTOR, "--kubeconfig", str(kubeconfig)]
        assert serve(args, check) == 0


def test_a_failing_node_list_keeps_the_last_selection_and_the_configmaps_cannot_hide_it(
    gated: dict[str, threading.Event],
) -> None:
    with KubeAPI.start() as kube, watching(kube) as many:
        add_node(kube, "kwok-1", kwok=True)
        add_node(kube, "real-1", kwok=False)
        eventually(lambda: served(many) == {"kwok-1"} and many.snapshot().healthy, timeout=15)
        # The Nodes fail (a 500 on the watch, then on each list): the Node watch waits to retry.
        since = len(kube.journal())
        fail_nodes(kube, 500)
        kube.cut_watches()
        eventually(lambda: "HTTP 500" in many.snapshot().reason, timeout=15)
        snap = many.snapshot()
        assert not snap.healthy and snap.reason.startswith(f"Nodes -l {SELECTOR}: HTTP 500 ")
        assert snap.reason.endswith("; serving the nodes last selected")
        # The ConfigMap watch lists again meanwhile (its watch expired): that is no news about
        # the Nodes.
        since = len(kube.journal())
        kube.expire_watches(1)
        kube.cut_watches()
        eventually(after(kube, "configmaps", since, failed=False), timeout=15)
        snap = many.snapshot()
        assert not snap.healthy and snap.reason.startswith(f"Nodes -l {SELECTOR}: HTTP 500 ")
        # A node whose ConfigMap appears now is not served: it was never selected. (kwok-1's
        # ConfigMap deleted after it: once that is seen, real-2's has been too.)
        add_configmap(kube, "real-2")  # (its Node cannot be created while the Nodes fail)
        kube.delete("configmaps", "topology-kwok-1", namespace=NS)
        eventually(lambda: served(many) == set(), timeout=15)
        assert not many.snapshot().healthy


def test_once_the_nodes_are_listed_again_health_is_good_again(
    gated: dict[str, threading.Event],
) -> None:
    with KubeAPI.start() as kube, watching(kube) as many:
        add_node(kube, "kwok-1", kwok=True)
        eventually(lambda: served(many) == {"kwok-1"} and many.snapshot().healthy, timeout=15)
        fail_nodes(kube, 503)
        kube.cut_watches()
        eventually(lambda: "HTTP 503" in many.snapshot().reason, timeout=15)
        # Only the Nodes list again; the ConfigMap watch goes on as it was.
        since = len(kube.journal())
        heal(kube)
        gated["nodes"].set()
        eventually(after(kube, "nodes", since, failed=False), timeout=15)
        eventually(lambda: many.snapshot().healthy, timeout=5)
        assert (many.snapshot().reason, served(many)) == ("ok", {"kwok-1"})
        assert not after(kube, "configmaps", since, failed=False)()


class Reads:
    """A sink that records each document it is given."""

    def __init__(self) -> None:
        self.updates: list[Topology] = []

    def update(self, topology: Topology, obj: str) -> None:
        self.updates.append(topology)

    def problem(self, reason: str) -> None:
        raise AssertionError(reason)

    def rejected(self, source: str, e: object) -> None:
        raise AssertionError(e)

    def owns(self, node: str) -> bool:
        return True


def test_a_topology_file_is_read_once_at_start_and_again_when_it_changes(tmp_path: Path) -> None:
    """A 5,000-node file takes seconds to read: the follower starts from the first read's
    stamp instead of reading it a second time, and still sees every change after it."""
    path = tmp_path / "topology.yml"
    (node,) = MIG.nodes.values()
    one = Topology("mixed", {"n1": node})
    path.write_text(dump_yaml(one))
    reads, stop = Reads(), threading.Event()
    thread = sources.file_source(path, reads, stop)
    thread.start()
    try:
        stop.wait(2.5)  # two looks at the file, at least (one a second)
        assert reads.updates == [one]
        two = Topology("mixed", {"n1": node, "n2": node})
        path.write_text(dump_yaml(two))
        eventually(lambda: reads.updates == [one, two], timeout=10)
    finally:
        stop.set()
        thread.join(5)


def test_the_first_list_of_configmaps_is_read_with_its_progress_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The watch says how many it reads and when it has read them; a node's page answers 503
    while it may still come, and 404 once the list is read and it is not there."""
    caplog.set_level(logging.INFO, logger="exporter")
    with KubeAPI.start() as kube:
        for name in ("kwok-1", "kwok-2", "kwok-3"):
            add_node(kube, name, kwok=True)
        with watching(kube) as many:
            eventually(lambda: many.snapshot().healthy, timeout=15)
            assert served(many) == {"kwok-1", "kwok-2", "kwok-3"}
    said = [r.getMessage() for r in caplog.records]
    assert "reading 3 topology ConfigMaps" in said
    assert any(m.startswith("read 3 topology ConfigMaps in ") for m in said), said


def test_a_shard_watching_the_configmaps_leaves_other_shards_nodes_unread() -> None:
    """Another shard's node's ConfigMap is not read, however broken; a new shard count that
    makes it this shard's reads it then."""
    names = [f"kwok-{i}" for i in range(8)]
    mine = {n for n in names if shard_of(n, 2) == 0}
    other = sorted(set(names) - mine)[0]
    many = NodesExporter(dcgm.Options("h"), Published(), shard=Shard(0, 2))
    stop = threading.Event()
    with KubeAPI.start() as kube, kube.api_client() as client:
        for name in names:
            if name == other:  # broken past its first lines
                text = f"mig-strategy: mixed\nnodes:\n  {name}:\n    gpus: [\n"
                kube.create("configmaps", node_configmap(name, text, NS, None), namespace=NS)
            else:
                add_configmap(kube, name)
        watch = threading.Thread(target=watch_node_configmaps, args=(many, stop, client, NS),
                                 daemon=True)  # fmt: skip
        watch.start()
        try:
            eventually(lambda: many.snapshot().healthy and served(many) == mine, timeout=15)
            many.reshard(Shard(0, 1))
            snap = many.snapshot()
            assert not snap.healthy and other in snap.reason and "not valid YAML" in snap.reason
            assert served(many) == set(names) - {other}
        finally:
            stop.set()
            kube.cut_watches()
            watch.join(10)
