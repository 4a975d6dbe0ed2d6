"""Golden tests: the real dcgm-exporter dumps of an A100-SXM4-40GB dynamic-MIG node, reproduced.

Inputs are the real Node manifest (or that node with its mig.config changed to the layout of a
dump) and pods holding the dump's instances; the expected output is the real dump itself.
Only UUID (ours is derived from the node name) and Hostname (a pod name there) may differ.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import SAMPLES, run_cli
from promtext import Series, by_name, parse

NODE = "qa-mig-worker-gpu-a100"
FB = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
IGNORED = {"UUID", "Hostname"}


def real(dump: str) -> list[Series]:
    return parse((SAMPLES / "metrics" / dump).read_text())


def exported(tmp_path: Path, nodes: list[Path], pods: list[Path]) -> list[Series]:
    args = ["status_updater", "render", "--nodes", *map(str, nodes)]
    if pods:
        args += ["--pods", *map(str, pods)]
    rendered = run_cli(*args)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stderr == ""
    cm = tmp_path / "topology.yaml"
    cm.write_text(rendered.stdout)
    out = run_cli("exporter", "--topology-file", str(cm), "--node-name", NODE, "--once")
    assert out.returncode == 0, out.stderr
    return parse(out.stdout)


def comparable(series: list[Series]) -> list[tuple[str, tuple[str, ...], tuple[str, ...], float]]:
    """Name, label names in order, label values but UUID/Hostname, value; sorted by GI id."""
    rows = [
        (s.name, s.label_names, tuple(v for k, v in s.labels if k not in IGNORED), s.value)
        for s in series
    ]
    return sorted(rows, key=lambda r: (r[0], r[2]))


def fb_sums(series: list[Series]) -> dict[str, float]:
    used = {s.label("GPU_I_ID"): s.value for s in by_name(series, FB[0])}
    free = {s.label("GPU_I_ID"): s.value for s in by_name(series, FB[1])}
    assert used.keys() == free.keys()
    return {gi: used[gi] + free[gi] for gi in used}


def node_with_layout(tmp_path: Path, mig_devices: dict[int, str] | None) -> Path:
    """The real node with run.ai/mig.config set to another layout (None: MIG on, no devices)."""
    node: dict[str, Any] = yaml.safe_load(
        (SAMPLES / "nodes" / "a100-40gb-3-instances.yaml").read_text()
    )
    node = copy.deepcopy(node)
    annotations = node["metadata"]["annotations"]
    annotations.pop("run.ai/mig-mapping")
    config = {"version": "v1", "mig-configs": {"selected": [{"devices": [0], "mig-enabled": True}]}}
    if mig_devices is not None:
        config["mig-configs"]["selected"][0]["mig-devices"] = mig_devices
    annotations["run.ai/mig.config"] = yaml.safe_dump(config)
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(node))
    return path


def pod_on(tmp_path: Path, name: str, profile: str, position: int, fb_used: int) -> Path:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "runai-p1",
            "uid": f"uid-{name}",
            "annotations": {
                "runai-mig-device": f'{{"name":"nvidia.com/mig-{profile}","position":{position},'
                '"gpuamount":1,"gpuindex":0,"gputype":"A100-40GB"}',
                "run.ai/simulated-fb-used": str(fb_used),
            },
        },
        "spec": {"nodeName": NODE, "containers": [{"name": name}]},
        "status": {"phase": "Running"},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(pod))
    return path


def test_active_2x1g_1x2g_dump_is_reproduced_from_the_real_node(tmp_path: Path) -> None:
    dump = real("a100-40gb-active-2x1g.5gb-1x2g.10gb.prom")
    ours = exported(
        tmp_path, [SAMPLES / "nodes" / "a100-40gb-3-instances.yaml"], [SAMPLES / "pods"]
    )
    want = [s for s in dump if s.name in FB]
    assert comparable(ours) == comparable(want)
    assert fb_sums(ours) == fb_sums(want) == {"7": 4864, "9": 4864, "5": 9855}
    # The parent GPU's id is the same on every series, as in the dump.
    assert len({s.label("UUID") for s in ours}) == 1
    assert not by_name(ours, "DCGM_FI_DEV_GPU_UTIL")


@pytest.mark.parametrize(
    ("dump", "layout", "fb_used"),
    [
        # GI 8 on this half-swapped A100 is logical position 5; the pod holds it but is idle.
        ("a100-40gb-idle-1g.5gb-allocated.prom", {5: "1g.5gb"}, 0),
        ("a100-40gb-active-1g.5gb.prom", {6: "1g.5gb"}, 4384),
    ],
)
def test_single_instance_dumps(
    tmp_path: Path, dump: str, layout: dict[int, str], fb_used: int
) -> None:
    ((position, profile),) = layout.items()
    node = node_with_layout(tmp_path, layout)
    pod = pod_on(tmp_path, "job-0-0", profile, position, fb_used)
    ours = exported(tmp_path, [node], [pod])
    want = [s for s in real(dump) if s.name in FB]
    assert comparable(ours) == comparable(want)
    assert fb_sums(ours) == fb_sums(want)


def test_mig_enabled_without_instances_has_no_fb_series(tmp_path: Path) -> None:
    dump = real("a100-40gb-mig-enabled-empty.prom")
    assert not [s for s in dump if s.name in FB]  # what the real exporter does
    ours = exported(tmp_path, [node_with_layout(tmp_path, None)], [])
    assert ours == []


def test_mig_disabled_whole_gpu(tmp_path: Path) -> None:
    dump = real("a100-40gb-mig-disabled.prom")
    ours = exported(tmp_path, [SAMPLES / "whole-gpu" / "a100-40gb-mig-disabled.yaml"], [])
    names = ("DCGM_FI_DEV_GPU_UTIL", *FB)
    assert sorted(s.name for s in ours) == sorted(names)
    for name in names:
        (mine,) = by_name(ours, name)
        (theirs,) = by_name(dump, name)
        assert mine.value == theirs.value
        # Whole-GPU series carry the fake-gpu-operator label set: the dump's minus the driver label.
        assert mine.label_names == tuple(
            k for k in theirs.label_names if k != "DCGM_FI_DRIVER_VERSION"
        )
        assert mine.label("modelName") == theirs.label("modelName") == "NVIDIA A100-SXM4-40GB"


def test_bundled_topologies_are_what_render_produces() -> None:
    """samples/mig/topology/ holds the README's samples, one per layout: they must stay the
    render of the sample node and pods."""
    args = ("status_updater", "render", "--nodes", str(SAMPLES / "nodes" / "a100-40gb-3-instances.yaml"),
            "--pods", str(SAMPLES / "pods"))  # fmt: skip
    single = run_cli(*args, "--layout", "single")
    assert single.returncode == 0, single.stderr
    assert single.stdout == (SAMPLES / "topology" / "a100-40gb-active.yaml").read_text()
    per_node = run_cli(*args, "--layout", "per-node")
    assert per_node.returncode == 0, per_node.stderr
    (cm,) = yaml.safe_load(per_node.stdout)["items"]
    sample = SAMPLES / "topology" / f"topology-{NODE}.yaml"
    assert cm == yaml.safe_load(sample.read_text())
    assert cm["data"] == yaml.safe_load(single.stdout)["data"]  # one node: the same document
