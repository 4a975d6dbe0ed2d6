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
from prometheus_client.parser import text_string_to_metric_families

from status_updater import cli, daemon
from status_updater.controller import Controller
from status_updater.dra import DraOptions
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
    dra: DraOptions | None = None,
    node_labels: bool = False,
    kai_selector: str | None = None,
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
    code = daemon.run(
        str(config), layout, "lease", "me", resync_s, "gpu-operator/absent", None, dra,
        node_labels=node_labels, kai_selector=kai_selector,
    )  # fmt: skip
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


# --- `run`'s flags and variables ----------------------------------------------------------------


def test_the_kubeconfig_flag_is_the_file_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "from-the-environment"))
    flag = tmp_path / "from-the-flag"
    flag.write_text("clusters: [\n")
    assert cli.main(["run", "--kubeconfig", str(flag), "--metrics-port", "0"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: kubeconfig {flag}: ")


def test_metrics_address_and_mig_parted_config_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    given: list[tuple[object, ...]] = []

    def run(*args: object) -> int:
        given.append(args)
        return 0

    monkeypatch.setattr(daemon, "run", run)
    monkeypatch.setenv("METRICS_ADDRESS", "127.0.0.1")
    monkeypatch.setenv("METRICS_PORT", "9500")
    assert cli.main(["run"]) == 0
    assert given[0][6] == ("127.0.0.1", 9500)
    # Not NAMESPACE/NAME, from the flag or the variable: a usage error naming the flag.
    for argv, env in ((["run", "--mig-parted-config", "layouts"], None), (["run"], "ops/a/b")):
        if env is not None:
            monkeypatch.setenv("MIG_PARTED_CONFIG", env)
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
        bad = argv[-1] if env is None else env
        assert (
            capsys.readouterr()
            .err.splitlines()[-1]
            .endswith(f"error: argument --mig-parted-config: expected NAMESPACE/NAME, got {bad!r}")
        )
    assert len(given) == 1


def test_the_leader_gauge_has_its_help_and_type() -> None:
    """The updater's own /metrics parse as Prometheus text, the leader gauge with its HELP."""
    controller = Controller(None, None)  # type: ignore[arg-type]
    own = daemon._health(controller, leader=True, dead=[]).own.decode()
    families = {f.name: f for f in text_string_to_metric_families(own)}
    leader = families["mig_status_updater_leader"]
    assert (leader.type, leader.documentation) == (
        "gauge",
        "1 while this replica writes the topology ConfigMaps.",
    )
    assert [s.value for s in leader.samples] == [1.0]


@pytest.mark.parametrize(
    ("status", "plural", "method"),
    [(403, "configmaps", "POST"), (500, "configmaps", "POST"), (422, "configmaps", "POST")],
)
def test_a_write_that_keeps_failing_is_said_once_not_at_every_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    status: int, plural: str, method: str,
) -> None:  # fmt: skip
    """The ConfigMaps cannot be written (RBAC, an API in trouble): the writer retries with
    backoff, and says so once, not at each retry; once it writes again, it says that."""
    from status_updater.dra import DraOptions
    from tests.status_updater.test_reconcile import whole_gpu_node

    caplog.set_level(logging.INFO)
    with KubeAPI.start() as kube:
        node = whole_gpu_node("k80")
        node["metadata"]["labels"]["type"] = "kwok"
        kube.create("nodes", node)
        kube.fail_next(10**6, status=status, method=method, plural=plural)

        def scenario() -> None:
            eventually(lambda: len([e for e in kube.journal() if e.fault]) >= 3, timeout=20)
            kube.call(lambda e: e.faults.clear())
            eventually(lambda: kube.find("configmaps", "topology-k80", NS), timeout=20)
            eventually(lambda: any("written again" in m for m in caplog.messages), timeout=5)

        dra = DraOptions("type=kwok", dynamic_mig=False, claim_status=True)
        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, dra) == 0
    said = [m for m in caplog.messages if f"HTTP {status}" in m and "retrying" in m]
    assert len(said) == 1, said


def test_a_writer_that_hangs_is_called_stuck_and_a_busy_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`/health` is never stuck on a loop that is: a writer whose turn never ends (a bug, a lock
    never let go) turns it to 503 once past the longest a busy turn takes, and it is ok again
    when the writer turns again. A writer busy within that time stays healthy."""
    from mig_exporter.web.server import Published
    from status_updater.pernode import PerNodeWriter

    monkeypatch.setattr(daemon, "WRITER_STUCK_S", 3.0)  # a turn: up to 1 s idle, 0.2 s, a pass
    published: list[Published] = []
    monkeypatch.setattr(daemon, "Published", lambda: published.append(Published()) or published[-1])
    real, hang, release = PerNodeWriter.sync, threading.Event(), threading.Event()
    busy = threading.Event()

    def sync(self: PerNodeWriter, *args: Any) -> None:
        if hang.is_set():
            release.wait()
        if busy.is_set():
            threading.Event().wait(1.0)  # busy, within its time
        real(self, *args)

    monkeypatch.setattr(PerNodeWriter, "sync", sync)

    def health() -> tuple[bool, str]:
        return published[0].snapshot.health() if published else (False, "not yet")

    with KubeAPI.start() as kube:
        kube.create("nodes", whole_gpu_node("k80", count=2))

        def scenario() -> None:
            eventually(lambda: kube.find("configmaps", "topology-k80", NS), timeout=10)
            eventually(lambda: health() == (True, "ok"), timeout=10)
            busy.set()
            for i in range(2):  # changes to write, each pass a second long
                kube.create(
                    "pods", gpu_pod(f"b{i}", "k80", 1, "2026-01-01T00:00:00Z"), namespace="ns"
                )
                for _ in range(10):
                    assert health() == (True, "ok")
                    threading.Event().wait(0.1)
            busy.clear()
            hang.set()
            kube.create("nodes", whole_gpu_node("k81"))  # a node to write: the pass hangs
            eventually(lambda: "the writer thread is stuck" in health()[1], timeout=10)
            assert not health()[0]
            hang.clear()
            release.set()
            eventually(lambda: health() == (True, "ok"), timeout=10)

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario) == 0


@pytest.mark.parametrize(
    ("writer_ago", "elector_ago", "stuck"),
    [(1, 1, None), (599, 35, None), (601, 1, "writer"), (1, 37, "elector"), (700, 40, "writer")],
)
def test_a_loop_is_stuck_only_past_the_longest_busy_turn(
    writer_ago: float, elector_ago: float, stuck: str | None
) -> None:
    """The elector turns every retry period and each try ends within its round (client-go's
    2 s and 10 s: stuck past 36 s); the writer's longest busy turn is minutes (stuck past 10)."""
    import time
    from types import SimpleNamespace

    from status_updater.leader import CLIENT_GO

    now = time.monotonic()
    controller = SimpleNamespace(turned=now - writer_ago)
    elector = SimpleNamespace(turned=now - elector_ago, timing=CLIENT_GO)
    said = daemon._stuck(controller, elector)  # type: ignore[arg-type]
    assert (said is None) if stuck is None else (said or "").startswith(f"the {stuck} thread")
