"""Golden tests: the real dcgm-exporter dumps of an A100-SXM4-40GB dynamic-MIG node, line by line.

Inputs are the real Node manifest (or that node with its mig.config changed to the layout of a
dump) and pods holding the dump's instances; the expected output is the real dump itself, compared
line by line: HELP and TYPE lines, family and series order, label names, order and values, and
the value format. Masked, and only these: UUID (ours is derived from the node name), Hostname (a
pod name there), and the digits of values that move in time on a real GPU (temperatures, power,
energy, profiling ratios, PCIe bytes) - their format (integer or six decimals) is still compared.
Frame-buffer values a test sets through the simulated-fb-used annotation are masked too: they
would only echo the input; what the catalog derives (used + free per instance) is compared.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.base import SAMPLES, run_cli
from tests.support.promtext import Series, by_name, parse

NODE = "qa-mig-worker-gpu-a100"
FB = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
MOVING = frozenset(
    {
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    }
)
_SAMPLE = re.compile(r"^(?P<name>\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_MASKED_LABELS = re.compile(r'\b(UUID|Hostname)="[^"]*"')


def shape(value: str) -> str:
    """A value with its digits masked and its format kept: DCGM prints integers bare and
    floating-point fields with exactly six decimals."""
    if re.fullmatch(r"-?\d+", value):
        return "<integer>"
    if re.fullmatch(r"-?\d+\.\d{6}", value):
        return "<six decimals>"
    return value  # anything else is compared as it is, and differs


def masked(text: str, also: frozenset[str] = frozenset()) -> list[str]:
    lines = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None:
            lines.append(line)  # HELP, TYPE: byte for byte
            continue
        labels = _MASKED_LABELS.sub(lambda g: f'{g[1]}="<masked>"', m["labels"])
        value = shape(m["value"]) if m["name"] in MOVING | also else m["value"]
        lines.append(f"{m['name']}{{{labels}}} {value}")
    return lines


def real(dump: str) -> str:
    return (SAMPLES / "metrics" / dump).read_text()


def exported(tmp_path: Path, nodes: list[Path], pods: list[Path]) -> str:
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
    assert out.stderr == ""
    return out.stdout


def fb_sums(series: list[Series]) -> dict[str, float]:
    """Used + free per GPU instance: the instance's memory, which the catalog derives."""
    used = {s.label("GPU_I_ID"): s.value for s in by_name(series, FB[0])}
    free = {s.label("GPU_I_ID"): s.value for s in by_name(series, FB[1])}
    assert used.keys() == free.keys()
    return {gi: used[gi] + free[gi] for gi in used}


def assert_plausible(ours: list[Series], theirs: list[Series]) -> None:
    """Masked gauges still land near what the real GPU showed in the same state."""
    for name, tolerance in (
        ("DCGM_FI_DEV_POWER_USAGE", 0.1),
        ("DCGM_FI_DEV_GPU_TEMP", 0.15),
        ("DCGM_FI_DEV_MEMORY_TEMP", 0.15),
    ):
        for mine, real_one in zip(by_name(ours, name), by_name(theirs, name), strict=True):
            assert mine.value == pytest.approx(real_one.value, rel=tolerance), name


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


def pod_on(
    tmp_path: Path, name: str, profile: str, position: int, fb_used: int, utilization: str
) -> Path:
    annotations = {
        "runai-mig-device": f'{{"name":"nvidia.com/mig-{profile}","position":{position},'
        '"gpuamount":1,"gpuindex":0,"gputype":"A100-40GB"}',
        "run.ai/simulated-fb-used": str(fb_used),
        "run.ai/simulated-gpu-utilization": utilization,
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "runai-p1",
            "uid": f"uid-{name}",
            "annotations": annotations,
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
    # The sample pods set FB used through the annotation: those values are inputs, not output.
    assert masked(ours, also=frozenset(FB)) == masked(dump, also=frozenset(FB))
    assert fb_sums(parse(ours)) == fb_sums(parse(dump))
    assert_plausible(parse(ours), parse(dump))
    # The parent GPU's id is the same on every series, as in the dump.
    assert len({s.label("UUID") for s in parse(ours)}) == 1


def test_idle_allocated_instance_dump(tmp_path: Path) -> None:
    """GI 8 on this half-swapped A100 is logical position 5; the pod holds it and does nothing
    (0 MiB, 0 %): the frame buffer a fresh instance shows, its activity and the GPU's power are
    the exporter's own idle figures, none of them taken from the dump."""
    node = node_with_layout(tmp_path, {5: "1g.5gb"})
    ours = exported(tmp_path, [node], [pod_on(tmp_path, "job-0-0", "1g.5gb", 5, 0, "0")])
    dump = real("a100-40gb-idle-1g.5gb-allocated.prom")
    assert masked(ours) == masked(dump)
    assert_plausible(parse(ours), parse(dump))
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):
        (activity,) = by_name(parse(ours), name)
        assert activity.value < 0.001, name


def test_active_single_instance_dump(tmp_path: Path) -> None:
    node = node_with_layout(tmp_path, {6: "1g.5gb"})
    ours = exported(tmp_path, [node], [pod_on(tmp_path, "job-0-0", "1g.5gb", 6, 1000, "90-100")])
    dump = real("a100-40gb-active-1g.5gb.prom")
    assert masked(ours, also=frozenset(FB)) == masked(dump, also=frozenset(FB))
    assert fb_sums(parse(ours)) == fb_sums(parse(dump))


def test_mig_enabled_without_instances(tmp_path: Path) -> None:
    """MIG on and no instance: one GPU-level series per family, no frame buffer, as DCGM does."""
    ours = exported(tmp_path, [node_with_layout(tmp_path, None)], [])
    dump = real("a100-40gb-mig-enabled-empty.prom")
    assert masked(ours) == masked(dump)
    assert_plausible(parse(ours), parse(dump))


def test_mig_disabled_whole_gpu(tmp_path: Path) -> None:
    ours = exported(tmp_path, [SAMPLES / "whole-gpu" / "a100-40gb-mig-disabled.yaml"], [])
    dump = real("a100-40gb-mig-disabled.prom")
    assert masked(ours) == masked(dump)
    assert_plausible(parse(ours), parse(dump))


def test_masking_keeps_what_is_compared() -> None:
    """The mask hides digits, never the format, a label other than UUID/Hostname, or a field
    outside the moving set."""
    line = 'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-1",Hostname="h",pod=""} 75.690000'
    assert masked(line) == [
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="<masked>",Hostname="<masked>",pod=""} <six decimals>'
    ]
    assert masked(line.replace("75.690000", "75.69")) != masked(line)
    assert masked(line.replace('gpu="0"', 'gpu="1"')) != masked(line)
    steady = 'DCGM_FI_DEV_SM_CLOCK{gpu="0"} 1410'
    assert masked(steady) != masked(steady.replace("1410", "1411"))


def test_bundled_topologies_are_what_render_produces() -> None:
    """samples/mig/topology/ holds docs/configmap.md's samples, one per layout: they must stay the
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
