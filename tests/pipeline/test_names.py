"""Every name and selector a daemon is given, by flag or environment, is checked as the API checks
it, at start-up: one line naming it, exit 2. A daemon that cannot do its job is not healthy."""

from __future__ import annotations

import logging
import threading
from typing import Any

import kubernetes
import pytest

from exporter import cli as exporter_cli
from mig_exporter.kube import names
from status_updater import cli as updater_cli
from status_updater import daemon
from status_updater.leader import LeaderElector, Timing
from tests.support.base import SAMPLES
from tests.support.kubeapi import KubeAPI, eventually

# Each kind of name the API refuses, as a name of an object (a DNS subdomain), a namespace (a
# DNS label), and a label selector.
BAD_NAMES = ("Upper", "under_score", "-leading", "trailing-", "a" * 254, "sp ace", "dots..x", "é")
BAD_NAMESPACES = (*BAD_NAMES, "a" * 64, "has.dot")
BAD_SELECTORS = (
    "a in ()",
    "a notin ( )",
    "type=kwok,",
    "a b",
    "k=" + "v" * 64,
    "x" * 64 + "=y",
    "Bad_/k=v",
    "k in a,b",
    "=v",
)
GOOD = {"name": ("topology", "a.b-c", "a" * 253), "namespace": ("gpu-operator", "a" * 63),
        "selector": ("type=kwok", "", "a.b/c in (d,e),!f", "k!=v", "a in (,)", "k=")}  # fmt: skip


def test_the_rules_are_the_api_s() -> None:
    for value in BAD_NAMES:
        assert names.dns1123_subdomain(value) is not None, value
    for value in BAD_NAMESPACES:
        assert names.dns1123_label(value) is not None, value
    for value in BAD_SELECTORS:
        assert names.label_selector(value) is not None, value
    assert not any(names.dns1123_subdomain(v) for v in GOOD["name"])
    assert not any(names.dns1123_label(v) for v in GOOD["namespace"])
    assert not any(names.label_selector(v) for v in GOOD["selector"])


def _cases() -> list[Any]:
    """(daemon, argv, env, what the line names) for each bad value each name can be given."""
    exporter, updater = ["--all-nodes", "--port", "0"], ["run", "--metrics-port", "0"]
    cases = []
    for v in BAD_NAMESPACES:
        cases += [("exporter", exporter, {"TOPOLOGY_CM_NAMESPACE": v}, "env TOPOLOGY_CM_NAMESPACE"),
                  ("updater", updater, {"TOPOLOGY_CM_NAMESPACE": v}, "env TOPOLOGY_CM_NAMESPACE"),
                  ("updater", ["render", "--nodes", "x"], {"TOPOLOGY_CM_NAMESPACE": v},
                   "env TOPOLOGY_CM_NAMESPACE"),
                  ("exporter", [*exporter, "--pod=p-0", f"--pod-namespace={v}"], {}, "--pod-namespace"),
                  ("updater", [*updater, f"--mig-parted-config={v}/x"], {},
                   "--mig-parted-config namespace")]  # fmt: skip
    for v in BAD_NAMES:
        cases += [("exporter", exporter, {"TOPOLOGY_CM_NAME": v}, "env TOPOLOGY_CM_NAME"),
                  ("updater", ["render", "--nodes", "x", "--layout", "single"],
                   {"TOPOLOGY_CM_NAME": v}, "env TOPOLOGY_CM_NAME"),
                  ("updater", [*updater, f"--lease-name={v}"], {}, "--lease-name"),
                  ("updater", updater, {"LEASE_NAME": v}, "--lease-name"),
                  ("exporter", [f"--node-name={v}", "--port", "0"], {}, "--node-name")]  # fmt: skip
        if not v.endswith("-"):  # ending in an ordinal is checked first
            cases.append(
                ("exporter", [*exporter, f"--pod={v}-0", "--pod-namespace=n"], {}, "--pod")
            )
    for v in BAD_SELECTORS:
        cases.append(("exporter", [*exporter, f"--node-selector={v}"], {}, "--node-selector"))
        cases.append(("updater", [*updater, f"--dra-node-selector={v}"], {}, "DRA_NODE_SELECTOR"))
    return [pytest.param(*c, id=f"{c[0]}-{c[3]}-{i}") for i, c in enumerate(cases)]


@pytest.mark.parametrize(("command", "argv", "env", "what"), _cases())
def test_a_name_the_api_would_refuse_stops_the_daemon_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: str, argv: list[str], env: dict[str, str], what: str,
) -> None:  # fmt: skip
    for name in (
        "POD_NAME",
        "POD_NAMESPACE",
        "TOPOLOGY_CM_NAME",
        "TOPOLOGY_CM_NAMESPACE",
        "LEASE_NAME",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    started: list[str] = []
    monkeypatch.setattr(exporter_cli, "serve", lambda *a, **k: started.append("exporter") or 0)
    monkeypatch.setattr(daemon, "run", lambda *a, **k: started.append("updater") or 0)
    main = exporter_cli.main if command == "exporter" else updater_cli.main
    try:
        code = main(argv)
    except SystemExit as e:  # a flag's own check, argparse's usage line above its error line
        code = e.code  # type: ignore[assignment]
        *_, err = capsys.readouterr().err.splitlines()
        assert err.startswith("python -m status_updater run: error: argument --dra-node-selector")
        assert what in err
    else:
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {what} "), err
    assert code == 2 and started == []


@pytest.mark.parametrize("layout", ["per-node", "single"])
def test_names_the_api_takes_start_the_daemons(
    monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    started: list[str] = []
    monkeypatch.setattr(exporter_cli, "serve", lambda *a, **k: started.append("exporter") or 0)
    monkeypatch.setattr(daemon, "run", lambda *a, **k: started.append("updater") or 0)
    for name in ("POD_NAME", "POD_NAMESPACE", "LEASE_NAME"):
        monkeypatch.delenv(name, raising=False)
    for namespace, name in zip(GOOD["namespace"], GOOD["name"], strict=False):
        monkeypatch.setenv("TOPOLOGY_CM_NAMESPACE", namespace)
        monkeypatch.setenv("TOPOLOGY_CM_NAME", name)
        for selector in GOOD["selector"]:
            argv = ["--all-nodes", "--layout", layout, "--port", "0"]
            assert (
                exporter_cli.main([*argv, "--node-selector", selector] if selector else argv) == 0
            )
        assert exporter_cli.main(["--node-name", "node-1.example", "--layout", layout]) == 0
        assert updater_cli.main(["run", "--lease-name", name, "--layout", layout]) == 0
    assert started.count("updater") == 2


def test_a_file_s_node_names_are_not_api_names(capsys: pytest.CaptureFixture[str]) -> None:
    """With a topology file nothing is asked of the API: its names are not judged."""
    path = SAMPLES / "topology" / "a100-40gb-active.yaml"
    assert exporter_cli.main(["--topology-file", str(path), "--once", "--all-nodes"]) == 0
    assert "qa-mig-worker-gpu-a100" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("status", "refused"), [(422, True), (403, True), (400, True), (500, False), (503, False)]
)
def test_a_replica_the_api_refuses_the_lease_is_not_healthy_and_says_so_once(
    caplog: pytest.LogCaptureFixture, status: int, refused: bool
) -> None:
    """A Lease the API refuses (422 for a name, 403, ...) is never taken however long it is
    tried: /health says so at once. A failing API is a problem only after a whole round of
    tries (the renew deadline); each reason is logged once, not at every try."""
    caplog.set_level(logging.WARNING)
    timing = Timing(lease_duration_s=3, renew_deadline_s=1.0, retry_period_s=0.05)
    with KubeAPI.start() as kube:
        kube.fail_next(10_000, status=status, plural="leases")
        api = kubernetes.client.CoordinationV1Api(kube.api_client())
        elector = LeaderElector(api, "topology-status-updater", "gpu-operator", "me", timing=timing)
        stop = threading.Event()
        thread = threading.Thread(target=elector.run, args=(stop,))
        thread.start()
        try:
            if refused:
                eventually(elector.trouble, timeout=0.9)
            else:
                eventually(lambda: len(kube.journal()) >= 5, timeout=5)
                assert elector.trouble() is None  # within the round: maybe a blip
                eventually(elector.trouble, timeout=5)
            reason = elector.trouble()
            assert reason is not None and f"HTTP {status}" in reason
            health = daemon._health(_Synced(), elector.is_leader(), [], reason)
            assert not health.healthy and health.reason == reason
        finally:
            stop.set()
            thread.join(5)
        said = [r.message for r in caplog.records if "lease gpu-operator/" in r.message]
        assert len(said) == 1, said


class _Synced:
    """A controller whose informers have listed, with nothing invalid."""

    sources: frozenset[str] = frozenset()
    synced: frozenset[str] = frozenset()

    def __init__(self) -> None:
        from mig_exporter.common.selfmetrics import InvalidObjects

        self.invalid = InvalidObjects("x")
