"""The downward API's pod variables never stop an exporter: sharding by a StatefulSet is asked
for by flag, or found by reading the pod's owner; any other pod serves every node, said once."""

from __future__ import annotations

import itertools
import logging
import threading
from typing import Any

import pytest

from exporter import cli, dcgm, wiring
from exporter.many import NodesExporter
from exporter.shards import shard_of
from exporter.sources import watch_own_statefulset
from mig_exporter.web.server import Published
from tests.exporter.test_many import doc
from tests.exporter.test_targets import MIG, NAMES, STS
from tests.support.base import SAMPLES
from tests.support.kubeapi import KubeAPI, eventually

TOPOLOGY = SAMPLES / "topology" / "a100-40gb-active.yaml"

# What a platform may set in a pod's environment: nothing, a namespace alone, a name alone, a
# Deployment's pod name (its random suffix may end in digits), a StatefulSet's pod name.
POD_NAMES = (None, "exporter-7d9c8f6b5-x2k9p", "exporter-7d9c8f6b5-24567", f"{STS}-0", "")
NAMESPACES = (None, "gpu-operator", "")


def _environments() -> list[Any]:
    return [
        pytest.param(pod, ns, id=f"{pod}-{ns}")
        for pod, ns in itertools.product(POD_NAMES, NAMESPACES)
    ]


@pytest.mark.parametrize(("pod", "namespace"), _environments())
@pytest.mark.parametrize("how", ["--all-nodes", "--node-name"])
def test_no_pod_environment_stops_an_exporter_reading_a_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    pod: str | None, namespace: str | None, how: str,
) -> None:  # fmt: skip
    for name, value in (("POD_NAME", pod), ("POD_NAMESPACE", namespace)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    for name in ("TOTAL_SHARDS", "SHARD"):
        monkeypatch.delenv(name, raising=False)
    node = ["--node-name", "qa-mig-worker-gpu-a100"] if how == "--node-name" else ["--all-nodes"]
    assert cli.main(["--topology-file", str(TOPOLOGY), "--once", *node]) == 0
    assert "DCGM_FI_DEV_GPU_TEMP{" in capsys.readouterr().out


@pytest.mark.parametrize(("pod", "namespace"), _environments())
def test_only_a_statefulset_s_pod_named_by_the_platform_is_looked_up_to_shard(
    monkeypatch: pytest.MonkeyPatch, pod: str | None, namespace: str | None
) -> None:
    """On the cluster: the environment names a pod to look up only when it names both, and
    the name ends in an ordinal; the lookup is not required (a Deployment's pod is no shard)."""
    built: list[dict[str, Any]] = []

    class Built(Exception):
        pass

    def record(*args: Any, **kwargs: Any) -> NodesExporter:
        built.append(kwargs)
        raise Built

    monkeypatch.setattr(wiring, "NodesExporter", record)
    for name, value in (("POD_NAME", pod), ("POD_NAMESPACE", namespace)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert cli.main(["--all-nodes", "--port", "0"]) == 1  # stopped where it was built
    looked_up = bool(pod and namespace) and pod.rsplit("-", 1)[-1].isdigit()
    assert built[0]["autoshard"] == (f"StatefulSet of pod {namespace}/{pod}" if looked_up else None)
    assert built[0]["shard"] is None  # until the StatefulSet's replicas are read


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--pod", f"{STS}-1"], "--pod goes with --pod-namespace"),
        (["--pod-namespace", "ns"], "--pod-namespace goes with --pod"),
        (["--pod", "no-ordinal", "--pod-namespace", "ns"], "ends in no StatefulSet ordinal"),
        (
            ["--pod", f"{STS}-1", "--pod-namespace", "ns", "--total-shards", "2"],
            "not with --total-shards",
        ),
    ],
)
def test_flags_that_ask_for_autosharding_are_checked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    argv: list[str], message: str,
) -> None:  # fmt: skip
    for name in ("POD_NAME", "POD_NAMESPACE", "TOTAL_SHARDS", "SHARD"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--all-nodes", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def _pods(kube: KubeAPI) -> None:
    kube.create("statefulsets", {"metadata": {"name": STS}, "spec": {"replicas": 2}}, "ops")
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": STS, "uid": "u"}
    kube.create("pods", {"metadata": {"name": f"{STS}-1", "ownerReferences": [owner]}}, "ops")
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "exporter-7d9c8f6b5", "uid": "r"}
    kube.create(
        "pods", {"metadata": {"name": "exporter-7d9c8f6b5-24567", "ownerReferences": [rs]}}, "ops"
    )


@pytest.mark.parametrize(
    ("pod", "fault", "required", "served"),
    [
        (f"{STS}-1", None, False, "shard"),  # found: a StatefulSet's pod shards
        (f"{STS}-1", None, True, "shard"),
        ("exporter-7d9c8f6b5-24567", None, False, "every"),  # a Deployment's: every node
        ("exporter-7d9c8f6b5-24567", None, True, "none"),  # asked for by flag: none, 503
        ("gone-3", None, False, "every"),  # not there (404)
        (f"{STS}-1", 403, False, "every"),  # not readable
        (f"{STS}-1", 401, False, "every"),
    ],
)
def test_a_pod_the_platform_names_shards_only_when_a_statefulset_owns_it(
    caplog: pytest.LogCaptureFixture, pod: str, fault: int | None, required: bool, served: str
) -> None:
    caplog.set_level(logging.INFO, "exporter")
    with KubeAPI.start() as kube:
        _pods(kube)
        if fault is not None:
            kube.fail_next(50, status=fault, plural="pods")
        # Options of its own: the energy each node has counted is the options' (a shared one
        # would move on for other tests' nodes of the same names).
        options = dcgm.Options("ignored", "535.104.05")
        many = NodesExporter(options, Published(), autoshard=f"StatefulSet of pod ops/{pod}")
        for name in NAMES:
            many.update_source(f"topology-{name}", doc(name, MIG), f"ConfigMap {name}")
        many.problem(None)
        stop = threading.Event()
        watch = threading.Thread(target=watch_own_statefulset,
                                 args=(many, stop, kube.api_client(), pod, "ops", required))  # fmt: skip
        watch.start()
        try:
            if served == "shard":
                mine = {n for n in NAMES if shard_of(n, 2) == 1}
                eventually(lambda: set(many.snapshot().pages) == mine, timeout=10)
            elif served == "every":
                eventually(lambda: set(many.snapshot().pages) == set(NAMES), timeout=10)
                assert many.snapshot().healthy
                said = [r.message for r in caplog.records if "not sharding" in r.message]
                assert len(said) == 1 and pod in said[0] and "serving every node" in said[0]
            else:
                eventually(lambda: "is no StatefulSet's" in many.snapshot().reason, timeout=10)
                assert not many.snapshot().healthy and many.snapshot().pages == {}
        finally:
            stop.set()
            kube.cut_watches()
            watch.join(5)
