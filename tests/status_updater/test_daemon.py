"""`python -m status_updater run` in this process, against the emulator over HTTP: what the daemon
wires together (the layout's writer and its namespace, the resync period, the elector, SIGTERM).
The live tests run the same daemon as a process; these are quick enough for the mutation run."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from status_updater import daemon
from tests.status_updater.test_reconcile import gpu_pod, whole_gpu_node
from tests.support.kubeapi import KubeAPI, eventually
from topology import configmap as contract
from topology.model import load_yaml

NS = "gpu-ops"
EMPTY = "mig-strategy: none\nnodes: {}\n"


def run_daemon(
    kube: KubeAPI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
    resync_s: float,
    scenario: Callable[[], None],
) -> int:
    """Runs the daemon until `scenario` (in another thread) is over, then sends it SIGTERM;
    its exit code. A scenario's failure is raised here."""
    handlers: dict[int, Any] = {}
    monkeypatch.setattr(daemon.signal, "signal", handlers.__setitem__)  # pytest keeps its own
    monkeypatch.setenv("TOPOLOGY_CM_NAMESPACE", NS)
    config = kube.write_kubeconfig(tmp_path / "kubeconfig")
    failed: list[BaseException] = []

    def drive() -> None:
        try:
            scenario()
        except BaseException as e:
            failed.append(e)
        finally:
            eventually(lambda: signal.SIGTERM in handlers)
            handlers[signal.SIGTERM]()

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    code = daemon.run(str(config), layout, "lease", "me", resync_s, "gpu-operator/absent")
    driver.join(5)
    if failed:
        raise failed[0]
    return code


def test_the_single_layout_writes_in_its_namespace_and_repairs_at_each_resync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOPOLOGY_CM_NAME", "mig-topology")
    with KubeAPI.start() as kube:
        kube.create("nodes", whole_gpu_node("k80", count=2))
        kube.create("pods", gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z"), namespace="ns")

        def text() -> str | None:
            cm = kube.find("configmaps", "mig-topology", NS)
            return cm["data"]["topology.yml"] if cm else None

        def scenario() -> None:
            written = eventually(text, timeout=10)
            assert load_yaml(written).nodes["k80"].gpus[0].status is not None  # the pod's GPU
            # Someone overwrites it. The single layout does not watch its ConfigMap: the next
            # resync (0.5 s here; 30 s by default) compares and writes it back.
            kube.patch("configmaps", "mig-topology", {"data": {"topology.yml": EMPTY}}, NS)
            eventually(lambda: text() == written, timeout=4)

        assert run_daemon(kube, tmp_path, monkeypatch, "single", 0.5, scenario) == 0


def test_the_per_node_layout_cleans_up_at_start_and_follows_its_configmaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    name = contract.node_configmap_name("k80")
    with KubeAPI.start() as kube:
        kube.create("nodes", whole_gpu_node("k80"))
        # Left by a run before: the ConfigMap of a node deleted while the updater was down, and
        # one that is not the updater's.
        kube.create("configmaps", contract.node_configmap("gone", EMPTY, NS, None), NS)
        kube.create("configmaps", {"metadata": {"name": "topology-team"}, "data": {}}, NS)

        def scenario() -> None:
            eventually(
                lambda: (
                    kube.find("configmaps", name, NS)
                    and not kube.find("configmaps", contract.node_configmap_name("gone"), NS)
                ),
                timeout=10,
            )
            # Deleted by someone: the watch sees it (the resync is 30 s away) and it is back.
            kube.delete("configmaps", name, NS)
            eventually(lambda: kube.find("configmaps", name, NS), timeout=4)
            kube.delete("nodes", "k80")
            eventually(lambda: not kube.find("configmaps", name, NS), timeout=4)
            assert kube.find("configmaps", "topology-team", NS)

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario) == 0
    assert f"deleted ConfigMap {name} in {NS}" in caplog.messages
