"""`python -m exporter` serving, run in this process: `exporter.cli.main` in the main thread (it
installs the SIGTERM handler a pod's stop sends), scraped over HTTP from another thread, stopped
by a real SIGTERM. The same commands run as processes in test_cli.py and test_live.py; here every
line of the serving path is seen by mutation testing, and the documented defaults are checked.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from exporter import cli, dcgm
from exporter.collector import DEFAULT_INTERVAL_MS
from tests.pipeline.test_cli import free_port, get
from tests.support.base import SAMPLES
from tests.support.fakenvml import FakeNvml, h100_mixed
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import parse
from tests.support.tls import serving_tls
from topology.configmap import configmap, node_configmap

TOPOLOGY = SAMPLES / "topology" / "a100-40gb-active.yaml"
NODE = "qa-mig-worker-gpu-a100"


@pytest.fixture(autouse=True)
def restore_signals() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def serve(args: list[str], check: Callable[[str], None]) -> int:
    """Run the exporter with `args` on a free port until `check(url)` has run, then SIGTERM it.
    Returns its exit code; a failed check fails the test."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    failure: list[BaseException] = []

    def scrape() -> None:
        try:
            eventually(lambda: get(f"{url}/metrics")[0] in (200, 503), timeout=20)
            check(url)
        except BaseException as e:  # reported by the main thread
            failure.append(e)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    checker = threading.Thread(target=scrape, daemon=True)
    checker.start()
    code = cli.main([*args, "--address", "127.0.0.1", "--port", str(port)])
    checker.join(10)
    if failure:
        raise failure[0]
    return code


def hosts(url: str) -> set[str]:
    text = get(f"{url}/metrics")[1].split("# HELP mig_")[0]
    return {s.label("Hostname") for s in parse(text)}


def test_the_documented_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NODE_NAME", "DRIVER_VERSION", "EXPORTER_HOSTNAME", "MIG_POD_LABELS",
                 "DCGM_EXPORTER_COLLECTORS", "WEB_CONFIG_FILE", "KUBECONFIG",
                 "DCGM_EXPORTER_INTERVAL", "KUBERNETES_VIRTUAL_GPUS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    args = cli.parser().parse_args([])
    # The driver: the real dumps' 520.56.06, or with --kubernetes-enable-dra the DRA slices'
    # 580.65.06 (tests/pipeline/test_dra.py serves both).
    assert (args.address, args.port, args.source, args.driver_version) == (
        "", 9400, "topology", None)  # fmt: skip
    assert args.collect_interval == DEFAULT_INTERVAL_MS == 30_000
    assert not (args.mig_pod_labels or args.kubernetes_virtual_gpus or args.all_nodes)
    assert args.node_name is None and args.collectors is None and args.web_config_file is None
    monkeypatch.setenv("NODE_NAME", "n1")
    monkeypatch.setenv("DRIVER_VERSION", "550.54.15")
    monkeypatch.setenv("EXPORTER_HOSTNAME", "dcgm-pod")
    monkeypatch.setenv("DCGM_EXPORTER_COLLECTORS", "/etc/counters.csv")
    monkeypatch.setenv("WEB_CONFIG_FILE", "/etc/web.yml")
    monkeypatch.setenv("KUBECONFIG", "/etc/kubeconfig")
    args = cli.parser().parse_args([])
    assert (args.node_name, args.driver_version, args.hostname) == ("n1", "550.54.15", "dcgm-pod")
    assert (args.collectors, args.web_config_file) == (Path("/etc/counters.csv"),
                                                      Path("/etc/web.yml"))  # fmt: skip
    assert args.kubeconfig == "/etc/kubeconfig"
    for value, on in (("true", True), ("1", True), ("YES", True), ("no", False), ("", False)):
        monkeypatch.setenv("MIG_POD_LABELS", value)
        monkeypatch.setenv("KUBERNETES_VIRTUAL_GPUS", value)
        args = cli.parser().parse_args([])
        assert args.mig_pod_labels is on and args.kubernetes_virtual_gpus is on, value


@pytest.mark.parametrize(("text", "ok"), [("100", True), ("99", False), ("1.5", False)])
def test_the_collect_interval_is_whole_milliseconds_from_100(text: str, ok: bool) -> None:
    if ok:
        assert cli.milliseconds(text) == int(text)
    else:
        with pytest.raises(Exception, match=r"ms|whole number"):
            cli.milliseconds(text)


def test_a_file_is_served_until_sigterm() -> None:
    def check(url: str) -> None:
        eventually(lambda: get(f"{url}/health") == (200, "ok\n"), timeout=10)
        assert hosts(url) == {"h1"}

    assert serve(["--topology-file", str(TOPOLOGY), "--node-name", NODE, "--hostname", "h1"],
                 check) == 0  # fmt: skip


def test_every_node_of_a_file_with_all_nodes() -> None:
    def check(url: str) -> None:
        eventually(lambda: hosts(url) == {NODE}, timeout=10)

    assert serve(["--topology-file", str(TOPOLOGY), "--all-nodes"], check) == 0


def test_the_nodes_configmap_on_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOPOLOGY_CM_NAMESPACE", "gpu-operator")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    text = TOPOLOGY.read_text().split("topology.yml: |\n", 1)[1].replace("\n    ", "\n")
    with KubeAPI.start() as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        kube.create("configmaps", node_configmap(NODE, text.strip() + "\n", "gpu-operator", None),
                    namespace="gpu-operator")  # fmt: skip

        def check(url: str) -> None:
            eventually(lambda: get(f"{url}/health") == (200, "ok\n"), timeout=15)
            assert hosts(url) == {"h1"}

        args = ["--node-name", NODE, "--kubeconfig", str(kubeconfig), "--hostname", "h1"]
        assert serve(args, check) == 0

        # --all-nodes, per-node layout, only the nodes labelled type=kwok: none yet.
        def check_many(url: str) -> None:
            eventually(lambda: get(f"{url}/health")[0] == 200, timeout=15)
            assert hosts(url) == set()
            kube.create("nodes", {"apiVersion": "v1", "kind": "Node",
                                  "metadata": {"name": NODE, "labels": {"type": "kwok"}}})  # fmt: skip
            eventually(lambda: hosts(url) == {NODE}, timeout=15)

        args = ["--all-nodes", "--node-selector", "type=kwok", "--kubeconfig", str(kubeconfig)]
        assert serve(args, check_many) == 0

        # The single layout: the one `topology` ConfigMap.
        kube.create("configmaps", configmap(text.strip() + "\n", "topology", "gpu-operator"),
                    namespace="gpu-operator")  # fmt: skip
        args = ["--node-name", NODE, "--kubeconfig", str(kubeconfig), "--layout", "single",
                "--hostname", "h2"]  # fmt: skip
        assert serve(args, lambda url: eventually(lambda: hosts(url) == {"h2"}, timeout=15)) == 0


def test_nvml_is_served_and_shut_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([h100_mixed()])
    fake.install(monkeypatch.setattr)

    def check(url: str) -> None:
        eventually(lambda: get(f"{url}/health") == (200, "ok\n"), timeout=10)
        assert hosts(url) == {"gpu-host"}

    args = ["--source", "nvml", "--hostname", "gpu-host", "-c", "200"]
    assert serve(args, check) == 0
    assert not fake.initialised  # nvmlShutdown on the way out


def test_nvml_with_a_topology_file_names_its_pods(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.fakenvml import a100_sample

    FakeNvml(a100_sample()).install(monkeypatch.setattr)
    code = cli.main(["--source", "nvml", "--once", "--topology-file", str(TOPOLOGY),
                     "--node-name", NODE, "--mig-pod-labels"])  # fmt: skip
    assert code == 0
    pods = {s.label("pod") for s in parse(capsys.readouterr().out)}
    assert "" not in pods and len(pods) == 3
    code = cli.main(["--source", "nvml", "--once", "--topology-file", str(TOPOLOGY),
                     "--node-name", "elsewhere"])  # fmt: skip
    assert code == 2
    assert "nodes.elsewhere: is not in the topology" in capsys.readouterr().err


def test_a_port_in_use_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["--topology-file", str(TOPOLOGY), "--node-name", NODE,
                         "--address", "127.0.0.1", "--port", str(port)])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot listen on 127.0.0.1:{port}: ") and err.count("\n") == 1


def test_an_unusable_kubeconfig_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [")
    assert cli.main(["--node-name", NODE, "--kubeconfig", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: kubeconfig {bad}: ") and err.count("\n") == 1
    fake = FakeNvml([h100_mixed()])
    fake.install(monkeypatch.setattr)
    assert cli.main(["--source", "nvml", "--watch-topology", "--node-name", NODE,
                     "--kubeconfig", str(bad)]) == 2  # fmt: skip
    assert capsys.readouterr().err.startswith(f"error: kubeconfig {bad}: ")
    assert pynvml.nvmlDeviceGetCount() == 1  # NVML was opened, and is still usable here


def test_the_start_line_reaches_stderr_and_says_https_under_tls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an operator reads in `kubectl logs` first: where it serves, and how."""
    web, context = serving_tls(tmp_path)
    port = free_port()

    def health() -> int:
        url = f"https://127.0.0.1:{port}/health"
        with urllib.request.urlopen(url, timeout=5, context=context) as r:
            return int(r.status)

    def scrape() -> None:
        try:
            eventually(lambda: health() == 200, timeout=20)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    checker = threading.Thread(target=scrape, daemon=True)
    # The root logger bare, as in a fresh process (pytest's capture handlers set aside), so that
    # main's logging set-up is the one in force.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()
    try:
        checker.start()
        code = cli.main(["--topology-file", str(TOPOLOGY), "--node-name", NODE,
                         "--web-config-file", str(web), "--address", "127.0.0.1",
                         "--port", str(port)])  # fmt: skip
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        root.handlers.extend(handlers)
        root.setLevel(level)
    checker.join(10)
    assert code == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "serving" in line]
    assert [line.split(" ", 2)[2] for line in said] == [
        f"INFO exporter: serving node {NODE} on https://127.0.0.1:{port}/metrics"
    ]


def test_an_internal_error_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/commands.md: a bug ends the exporter with exit 1 and one line, never a traceback."""

    def broken(*_: object) -> bytes:
        raise RuntimeError("the renderer broke")

    monkeypatch.setattr(dcgm, "render", broken)
    code = cli.main(["--topology-file", str(TOPOLOGY), "--node-name", NODE, "--once"])
    assert code == 1
    assert capsys.readouterr().err == "error: internal error: RuntimeError: the renderer broke\n"
