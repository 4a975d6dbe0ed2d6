"""Static MIG (NVIDIA GPU operator) live: the two daemons as a user runs them (tests/live/test_live.py's
harness) against a node labelled `nvidia.com/mig.config=<layout>`, pods asking for
`nvidia.com/mig-<profile>`, and the GPU operator's mig-parted ConfigMap coming and going.

GI ids on the A100-SXM4-40GB (shared/reference/mig-profiles.md sections 3.1-3.2, the orientation
of the project's A100 samples): the seven 1g.5gb of all-1g.5gb are 7, 8, 9, 11, 12, 13, 14; the
two 3g.20gb of all-3g.20gb are 1 and 2; a lone 1g.5gb goes to start 6 (GI 9), a lone 3g.20gb to
start 4 (GI 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.live.test_live import NODE, NS, Daemons, mig_devices, running
from tests.pipeline.test_cli import get
from tests.support.kubeapi import eventually
from tests.support.promtext import Series, by_name, parse

LABEL = "nvidia.com/mig.config"
WARNED_LABEL = f"node {NODE}: metadata.labels[{LABEL}]"
TEAM = "team-a"
PARTED = "default-mig-parted-config"  # in NS, gpu-operator: the updater's default
SMALL_GIS = ("7", "8", "9", "11", "12", "13", "14")
FREE = ("", "", "")
# (profile, namespace, pod, container) of a MIG instance's series
Instance = tuple[str, str, str, str]


@pytest.fixture(params=[True, False], ids=["strict-emulator", "plain-kmock"])
def static(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemons]:
    with running(tmp_path, strict=request.param) as d:
        yield d


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[Daemons]:
    with running(tmp_path) as d:
        yield d


def static_node(layout: str) -> dict[str, Any]:
    """A one-GPU A100-40GB node as GFD labels it under the GPU operator, mixed strategy."""
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "1",
              "nvidia.com/mig.strategy": "mixed", LABEL: layout}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}


def mig_pod(name: str, created: str, profile: str = "1g.5gb") -> dict[str, Any]:
    """A pod bound to NODE whose container `main` asks for one `nvidia.com/mig-<profile>`."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM, "creationTimestamp": created},
        "spec": {"nodeName": NODE, "containers": [{
            "name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def mig_parted(layouts: dict[str, Any], name: str = PARTED, namespace: str = NS) -> dict[str, Any]:
    """The GPU operator's mig-parted ConfigMap with these layouts."""
    text = yaml.safe_dump({"version": "v1", "mig-configs": layouts})
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace}, "data": {"config.yaml": text}}  # fmt: skip


def only(profile: str) -> list[dict[str, Any]]:
    """A layout of one `profile` instance on every GPU."""
    return [{"devices": "all", "mig-enabled": True, "mig-devices": {profile: 1}}]


def fb_series(url: str) -> list[Series]:
    return by_name(parse(get(f"{url}/metrics")[1]), "DCGM_FI_DEV_FB_USED")


def instances(url: str) -> dict[str, Instance]:
    """GI id -> (profile, namespace, pod, container) of each MIG instance as /metrics shows it."""
    out: dict[str, Instance] = {}
    for s in fb_series(url):
        labels = dict(s.labels)
        if "GPU_I_ID" in labels:
            assert labels["GPU_I_ID"] not in out, f"GPU_I_ID {labels['GPU_I_ID']} twice"
            out[labels["GPU_I_ID"]] = (labels["GPU_I_PROFILE"], labels["namespace"],
                                       labels["pod"], labels["container"])  # fmt: skip
    return out


def mig_on_without_instances(url: str) -> bool:
    """The GPU is in MIG mode with no instance (as in the real dump of such an A100): GPU-level
    series such as its temperature, no series with GPU_I_PROFILE, no framebuffer fields."""
    series = parse(get(f"{url}/metrics")[1])
    return (
        len(by_name(series, "DCGM_FI_DEV_GPU_TEMP")) == 1
        and not any("GPU_I_PROFILE" in s.label_names for s in series)
        and not by_name(series, "DCGM_FI_DEV_FB_USED")
    )


def warnings_naming(log: str, *parts: str) -> list[str]:
    return [line for line in log.splitlines() if " WARNING " in line and all(p in line for p in parts)]  # fmt: skip


def test_relabel_repartitions_and_metrics_name_the_pods(static: Daemons) -> None:
    kube = static.kube
    static.updater()
    url = static.exporter()
    kube.create("nodes", static_node("all-1g.5gb"))
    # train-a is the older (the strict emulator stamps its own time: then names break ties).
    kube.create("pods", mig_pod("train-a", "2026-11-20T09:00:00Z"), namespace=TEAM)
    kube.create("pods", mig_pod("train-b", "2026-11-20T10:00:00Z"), namespace=TEAM)

    # 7 x 1g.5gb; the oldest pod holds the lowest GI id, the next one the next; 5 are free.
    want: dict[str, Instance] = {gi: ("1g.5gb", *FREE) for gi in SMALL_GIS}
    want["7"] = ("1g.5gb", TEAM, "train-a", "main")
    want["8"] = ("1g.5gb", TEAM, "train-b", "main")
    eventually(lambda: instances(url) == want, timeout=30)
    held = {d["gpu-instance-id"]: {k: v for k, v in d["status"]["allocated-by"].items()
                                   if k != "pod-uid"}  # the pod's uid: its own test
            for d in mig_devices(static) or [] if "status" in d}  # fmt: skip
    assert held == {7: {"namespace": TEAM, "pod": "train-a", "container": "main"},
                    8: {"namespace": TEAM, "pod": "train-b", "container": "main"}}  # fmt: skip
    assert not warnings_naming(static.log("updater-0"), f"pod {TEAM}/")

    # Relabelled: two 3g.20gb; the pods' 1g.5gb cannot be met, each is one warning line.
    kube.patch("nodes", NODE, {"metadata": {"labels": {LABEL: "all-3g.20gb"}}})
    both: dict[str, Instance] = {"1": ("3g.20gb", *FREE), "2": ("3g.20gb", *FREE)}
    eventually(lambda: instances(url) == both, timeout=20)

    def warned(pod: str) -> list[str]:
        return warnings_naming(static.log("updater-0"), f"pod {TEAM}/{pod}:")

    for name in ("train-a", "train-b"):
        lines = eventually(partial(warned, name), timeout=10)
        assert len(lines) == 1 and "nvidia.com/mig-1g.5gb" in lines[0], lines
    # A newer pod that fits still gets its instance; the others' warnings are not said again.
    kube.create("pods", mig_pod("notebook", "2026-11-20T11:00:00Z", "3g.20gb"), namespace=TEAM)
    both["1"] = ("3g.20gb", TEAM, "notebook", "main")
    eventually(lambda: instances(url) == both, timeout=20)
    assert [len(warned(name)) for name in ("train-a", "train-b")] == [1, 1]
    assert "Traceback" not in static.log("updater-0") + static.log("exporter")


def test_pods_that_finish_or_go_release_their_instances(static: Daemons) -> None:
    kube = static.kube
    # Everything exists before the daemons start: the updater's first write is the listed state.
    kube.create("nodes", static_node("all-1g.5gb"))
    kube.create("pods", mig_pod("train-a", "2026-11-20T09:00:00Z"), namespace=TEAM)
    kube.create("pods", mig_pod("train-b", "2026-11-20T10:00:00Z"), namespace=TEAM)
    static.updater()
    url = static.exporter()
    want: dict[str, Instance] = {gi: ("1g.5gb", *FREE) for gi in SMALL_GIS}
    want["7"] = ("1g.5gb", TEAM, "train-a", "main")
    want["8"] = ("1g.5gb", TEAM, "train-b", "main")
    eventually(lambda: instances(url) == want, timeout=30)

    # train-b has Succeeded: its instance is free again, train-a keeps its own.
    kube.patch("pods", "train-b", {"status": {"phase": "Succeeded"}}, namespace=TEAM)
    want["8"] = ("1g.5gb", *FREE)
    eventually(lambda: instances(url) == want, timeout=20)

    # train-a deleted: every instance free.
    kube.delete("pods", "train-a", namespace=TEAM)
    want["7"] = ("1g.5gb", *FREE)
    eventually(lambda: instances(url) == want, timeout=20)
    assert "Traceback" not in static.log("updater-0") + static.log("exporter")


def test_mig_parted_configmap_replaces_the_builtin_layouts_while_it_exists(
    static: Daemons,
) -> None:
    kube = static.kube
    static.updater()
    url = static.exporter()
    kube.create("nodes", static_node("all-1g.5gb"))
    # No mig-parted ConfigMap: NVIDIA's built-in layouts.
    eventually(lambda: sorted(instances(url)) == sorted(SMALL_GIS), timeout=30)

    # The GPU operator's ConfigMap appears: only its layouts exist, all-1g.5gb is not one of them.
    kube.create("configmaps", mig_parted({"one-small": only("1g.5gb")}), namespace=NS)
    eventually(lambda: mig_on_without_instances(url), timeout=20)
    eventually(
        lambda: warnings_naming(static.log("updater-0"), WARNED_LABEL, "'all-1g.5gb'"), timeout=10
    )

    # Relabelled to its layout: one 1g.5gb, where the driver puts a lone one (start 6, GI 9).
    kube.patch("nodes", NODE, {"metadata": {"labels": {LABEL: "one-small"}}})
    eventually(lambda: instances(url) == {"9": ("1g.5gb", *FREE)}, timeout=20)

    # Deleted: the built-ins again, which have no one-small: MIG on, no instance, one warning.
    kube.delete("configmaps", PARTED, namespace=NS)
    eventually(lambda: mig_on_without_instances(url), timeout=20)
    lines = eventually(
        lambda: warnings_naming(static.log("updater-0"), WARNED_LABEL, "'one-small'"), timeout=10
    )
    assert len(lines) == 1, lines
    # ...and a built-in name works again.
    kube.patch("nodes", NODE, {"metadata": {"labels": {LABEL: "all-3g.20gb"}}})
    eventually(lambda: sorted(instances(url)) == ["1", "2"], timeout=20)
    # Only that ConfigMap was read as layouts (plain kmock also sends the topology ConfigMaps).
    assert not warnings_naming(static.log("updater-0"), "keeping the layouts in use")
    assert "Traceback" not in static.log("updater-0") + static.log("exporter")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_named_mig_parted_configmap_is_the_one_watched(
    strict: Daemons, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kube = strict.kube
    ref = "team-gpu/my-layouts"
    # A decoy where the default would be, with the layout the node names: it must be ignored.
    kube.create("configmaps", mig_parted({"one-small": only("1g.5gb")}), namespace=NS)
    kube.create("nodes", static_node("one-small"))
    if how == "flag":
        strict.updater("updater-0", "--mig-parted-config", ref)
    else:
        monkeypatch.setenv("MIG_PARTED_CONFIG", ref)
        strict.updater()
    # Nothing is written before the layouts' ConfigMap is listed: the first topology is final.
    eventually(lambda: strict.kube.find("configmaps", strict.configmap, NS), timeout=30)
    assert mig_devices(strict) == []  # MIG on, no instance: one-small is not a built-in
    assert f"configmap {ref} not found" in strict.log("updater-0")
    assert warnings_naming(strict.log("updater-0"), WARNED_LABEL, "'one-small'")

    kube.create("configmaps", mig_parted({"one-small": only("2g.10gb")}, "my-layouts", "team-gpu"),
                namespace="team-gpu")  # fmt: skip
    devices = eventually(lambda: mig_devices(strict), timeout=20)
    assert [d["name"] for d in devices] == ["2g.10gb"]
    assert "Traceback" not in strict.log("updater-0")


def test_invalid_mig_parted_configmap_keeps_the_layouts_in_use(static: Daemons) -> None:
    kube = static.kube
    kube.create("configmaps", mig_parted({"one-small": only("1g.5gb")}), namespace=NS)
    kube.create("nodes", static_node("one-small"))
    static.updater()
    url = static.exporter()
    eventually(lambda: instances(url) == {"9": ("1g.5gb", *FREE)}, timeout=30)
    # The layouts were listed before anything was written: one-small was never unknown.
    assert not warnings_naming(static.log("updater-0"), WARNED_LABEL)

    bad = {"data": {"config.yaml": "version: v2\nmig-configs: {}\n"}}
    kube.patch("configmaps", PARTED, bad, namespace=NS)
    said = f"configmap {NS}/{PARTED}: data[config.yaml].version: expected v1, got 'v2'"
    eventually(lambda: warnings_naming(static.log("updater-0"), said), timeout=20)
    # The same bad content again (another field changed): not said twice. (Its event
    # is sent before the pod's below, which is waited for.)
    kube.patch("configmaps", PARTED, {"metadata": {"labels": {"touched": "yes"}}}, namespace=NS)
    # The node is reconciled again with the kept layout: a new pod takes the kept instance.
    kube.create("pods", mig_pod("late", "2026-11-20T11:00:00Z"), namespace=TEAM)
    eventually(lambda: instances(url) == {"9": ("1g.5gb", TEAM, "late", "main")}, timeout=20)
    lines = warnings_naming(static.log("updater-0"), said)
    assert len(lines) == 1 and lines[0].endswith("; keeping the layouts in use"), lines

    # Mended with another layout under that name: the node follows.
    kube.patch("configmaps", PARTED, {"data": mig_parted({"one-small": only("3g.20gb")})["data"]},
               namespace=NS)  # fmt: skip
    # (late's 1g.5gb cannot be met any more: its instance is gone.)
    eventually(lambda: instances(url) == {"1": ("3g.20gb", *FREE)}, timeout=20)
    assert "Traceback" not in static.log("updater-0") + static.log("exporter")
