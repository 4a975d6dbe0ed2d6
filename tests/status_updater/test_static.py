"""Static MIG (NVIDIA GPU operator): nodes labelled `nvidia.com/mig.config=<layout>`.

mig-manager applies the named mig-parted layout; the driver places each instance at the first
free start of its profile's default order; the device plugin hands instances to containers by
their `resources.limits`; dcgm-exporter names the pod holding an instance. The expected values
below are facts written out by hand: the real A100-40GB dumps (samples/mig/metrics), NVIDIA's
published layouts (mig-parted `config-default.yaml`, MIG user guide examples) and the GI ids,
memory sizes and default placements of shared/reference/mig-profiles.md (sections 2 and 3).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter import dcgm
from exporter.generations import DEFAULT
from status_updater.objects import slim_node, slim_pod
from status_updater.state import ClusterState
from tests.pipeline.test_golden import FB, NODE, assert_plausible, fb_sums, masked, real
from tests.support.base import SAMPLES, run_cli
from tests.support.promtext import Series, by_name, parse
from topology import migparted
from topology.catalog import MODELS, GpuModel
from topology.model import AllocatedBy, NodeTopology

STATIC = SAMPLES / "static"
LABEL = "nvidia.com/mig.config"
WARNING = f"metadata.labels[{LABEL}]"
RUNAI_LABELS = (
    "node-role.kubernetes.io/runai-dynamic-mig",
    "node-role.kubernetes.io/runai-mig-enabled",
)
# The label names, in order, of a MIG instance's series in a real dcgm-exporter dump.
MIG_LABEL_NAMES = parse(real("a100-40gb-active-1g.5gb.prom"))[0].label_names
EMPTY_DUMP = parse(real("a100-40gb-mig-enabled-empty.prom"))


def model(key: str) -> GpuModel:
    (found,) = (m for m in MODELS if m.key == key)
    return found


# --- inputs and outputs --------------------------------------------------------------------------


def write(path: Path, *objects: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(objects)}))
    return path


def static_node(
    name: str, product: str, count: int, layout: str, strategy: str = "mixed"
) -> dict[str, Any]:
    """A GPU operator node as GFD labels it."""
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
              "nvidia.com/mig.strategy": strategy, LABEL: layout}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def real_node_static(layout: str) -> dict[str, Any]:
    """The real A100-40GB node of the dumps, handed to the GPU operator: run:ai's dynamic-MIG
    labels and annotations gone, the mig-parted layout label set."""
    node: dict[str, Any] = copy.deepcopy(
        yaml.safe_load((SAMPLES / "nodes" / "a100-40gb-3-instances.yaml").read_text())
    )
    for key in RUNAI_LABELS:
        del node["metadata"]["labels"][key]
    for key in ("run.ai/mig.config", "run.ai/mig-mapping"):
        del node["metadata"]["annotations"][key]
    node["metadata"]["labels"][LABEL] = layout
    return node


def pod(
    name: str,
    node: str,
    created: str,
    containers: dict[str, dict[str, str]],
    *,
    namespace: str = "team",
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod asking for devices as with NVIDIA's device plugin: container name -> limits."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "creationTimestamp": created, "annotations": annotations or {}},
        "spec": {"nodeName": node, "containers": [
            {"name": c, "resources": {"limits": limits}} for c, limits in containers.items()]},
        "status": {"phase": phase},
    }  # fmt: skip


@dataclass(frozen=True)
class Rendered:
    stdout: str
    warnings: list[str]  # stderr's lines without the `warning: ` prefix
    nodes: dict[str, dict[str, Any]]  # each node's entry of its topology.yml


def render(
    nodes: list[Path], pods: list[Path] | None = None, config: Path | None = None
) -> Rendered:
    args = ["status_updater", "render", "--nodes", *map(str, nodes)]
    if pods:
        args += ["--pods", *map(str, pods)]
    if config is not None:
        args += ["--mig-parted-config", str(config)]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert all(line.startswith("warning: ") for line in lines), done.stderr
    found: dict[str, dict[str, Any]] = {}
    for item in yaml.safe_load(done.stdout)["items"]:
        found.update(yaml.safe_load(item["data"]["topology.yml"])["nodes"])
    return Rendered(done.stdout, [line.removeprefix("warning: ") for line in lines], found)


def export(tmp_path: Path, rendered: Rendered, node: str) -> str:
    """The node's /metrics, as the exporter serves it from the rendered ConfigMaps."""
    cm = tmp_path / f"topology-{node}.yaml"
    cm.write_text(rendered.stdout)
    out = run_cli("exporter", "--topology-file", str(cm), "--node-name", node, "--once")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    return out.stdout


def instances(gpu: dict[str, Any]) -> set[tuple[int, str, int]]:
    """(position, profile, GI id) of each MIG instance of a rendered GPU."""
    return {(d["position"], d["name"], d["gpu-instance-id"]) for d in gpu["mig-devices"]}


def held(node: dict[str, Any]) -> dict[tuple[int, int], tuple[str, str, str]]:
    """(GPU index, GI id) -> (namespace, pod, container) of each instance a pod holds."""
    found = {}
    for i, gpu in enumerate(node["gpus"]):
        for d in gpu.get("mig-devices") or ():
            if d.get("status"):
                a = d["status"]["allocated-by"]
                found[(i, d["gpu-instance-id"])] = (a["namespace"], a["pod"], a["container"])
    return found


def holder_labels(series: list[Series]) -> set[tuple[str, str, str, str, str]]:
    """(gpu, GPU_I_ID, container, namespace, pod) of every series that names a pod."""
    return {
        (s.label("gpu"), dict(s.labels).get("GPU_I_ID", ""), s.label("container"),
         s.label("namespace"), s.label("pod"))
        for s in series
        if s.label("pod")
    }  # fmt: skip


# --- 1. the real A100-40GB dumps, reached through mig-parted layouts ----------------------------


def test_custom_layout_with_one_instance_is_the_active_dump_with_the_pod_named(
    tmp_path: Path,
) -> None:
    """`-cgi 19` on an empty GPU lands at start 6 (the default order begins there), which is
    GI 9 on this half-swapped A100: the instance of the real active-1g.5gb dump."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  one-small:\n"
        "  - devices: all\n    mig-enabled: true\n    mig-devices: {1g.5gb: 1}\n"
    )
    job = pod("job-0", NODE, "2026-11-20T09:00:00Z", {"main": {"nvidia.com/mig-1g.5gb": "1"}},
              namespace="team-a", annotations={"run.ai/simulated-fb-used": "1000",
                                               "run.ai/simulated-gpu-utilization": "90-100"})  # fmt: skip
    rendered = render(
        [write(tmp_path / "node.yaml", real_node_static("one-small"))],
        [write(tmp_path / "pod.yaml", job)],
        config,
    )
    assert rendered.warnings == []
    ours = export(tmp_path, rendered, NODE)
    # dcgm-exporter names the holder on static MIG; the dump was taken with nobody named.
    named = 'container="main",namespace="team-a",pod="job-0"'
    dump = real("a100-40gb-active-1g.5gb.prom").replace('container="",namespace="",pod=""', named)
    assert masked(ours, also=frozenset(FB)) == masked(dump, also=frozenset(FB))
    assert fb_sums(parse(ours)) == fb_sums(parse(dump))
    assert_plausible(parse(ours), parse(dump))


@pytest.mark.parametrize(
    ("layout", "dump"),
    [("all-enabled", "a100-40gb-mig-enabled-empty.prom"), ("all-disabled", "a100-40gb-mig-disabled.prom")],
)  # fmt: skip
def test_builtin_enabled_and_disabled_layouts_are_the_real_dumps(
    tmp_path: Path, layout: str, dump: str
) -> None:
    rendered = render([write(tmp_path / "node.yaml", real_node_static(layout))])
    assert rendered.warnings == []
    ours = export(tmp_path, rendered, NODE)
    assert masked(ours) == masked(real(dump))
    assert_plausible(parse(ours), parse(real(dump)))


# --- 2. all-<smallest 1g> per model and strategy -------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    key: str
    product: str  # GFD's nvidia.com/gpu.product of the whole GPU
    model_name: str  # NVML's name: dcgm-exporter's modelName
    small: str  # the 1-slice profile
    mib: int  # its memory, mig-profiles.md section 2
    # GI ids of `-cgi 19x7` (mig-profiles.md 3.2): half-swapped A100-40GB (AWS p4d: 9,7,8,11,12,
    # 13,14), identity elsewhere (H100 NVL, H100 80GB notes: 7..13).
    gis: frozenset[int]


SWAPPED = frozenset({7, 8, 9, 11, 12, 13, 14})
IDENTITY = frozenset(range(7, 14))
GPUS = (
    Gpu("A100-40GB", "NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "1g.5gb", 4864, SWAPPED),
    Gpu("A100-80GB", "NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "1g.10gb", 9728, IDENTITY),
    Gpu("H100-80GB", "NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", "1g.10gb", 9984, IDENTITY),
    Gpu("H200", "NVIDIA-H200", "NVIDIA H200", "1g.18gb", 16384, IDENTITY),
)
CASES = [(g, s) for g in GPUS for s in ("mixed", "single")]


def case_node(gpu: Gpu, strategy: str) -> str:
    return f"{gpu.key.lower()}-{strategy}"


@pytest.fixture(scope="module")
def smallest(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """Every model on all-<1g>, two GPUs each, with a pod asking for three instances: by MIG
    resource on mixed nodes, by nvidia.com/gpu on single ones (where GFD counts 2 x 7 devices)."""
    tmp = tmp_path_factory.mktemp("smallest")
    nodes, pods = [], []
    for gpu, strategy in CASES:
        name = case_node(gpu, strategy)
        if strategy == "mixed":
            nodes.append(static_node(name, gpu.product, 2, f"all-{gpu.small}"))
            resource = f"nvidia.com/mig-{gpu.small}"
        else:
            product = f"{gpu.product}-MIG-{gpu.small}"
            nodes.append(static_node(name, product, 14, f"all-{gpu.small}", "single"))
            resource = "nvidia.com/gpu"
        pods.append(pod(f"job-{name}", name, "2026-11-20T09:00:00Z", {"worker": {resource: "3"}}))
    return render([write(tmp / "nodes.yaml", *nodes)], [write(tmp / "pods.yaml", *pods)])


@pytest.mark.parametrize(("gpu", "strategy"), CASES, ids=[case_node(*c) for c in CASES])
def test_smallest_profile_everywhere(
    smallest: Rendered, tmp_path: Path, gpu: Gpu, strategy: str
) -> None:
    """Seven 1g instances per GPU where `nvidia-smi mig -cgi 19x7` puts them, with the memory,
    names and labels DCGM shows; under the single strategy GFD's count is MIG devices, so 14 of
    them are two GPUs, and `nvidia.com/gpu` hands out instances."""
    assert smallest.warnings == []
    name = case_node(gpu, strategy)
    topology = smallest.nodes[name]
    assert topology["gpu-count"] == 2 and len(topology["gpus"]) == 2
    assert topology["is-dynamic-mig-enabled"] is False
    series = parse(export(tmp_path, smallest, name))
    assert all(s.label_names == MIG_LABEL_NAMES for s in series)
    # DCGM's name for it (the default generation's): NVML's but for the H200 (`1g.16gb`).
    assert {s.label("GPU_I_PROFILE") for s in series} == {
        dcgm.profile_label(DEFAULT, gpu.small, 1, gpu.mib)}  # fmt: skip
    assert {s.label("modelName") for s in series} == {gpu.model_name}
    per_gpu: dict[str, set[int]] = {}
    for s in by_name(series, FB[0]):
        per_gpu.setdefault(s.label("gpu"), set()).add(int(s.label("GPU_I_ID")))
    assert per_gpu == {"0": gpu.gis, "1": gpu.gis}
    # Used + free is the profile's memory; on an idle instance a MiB short, as in the real idle
    # dump (6 + 4857 of 4864: DCGM floors used and free bytes separately).
    for index in ("0", "1"):
        sums = fb_sums([s for s in series if s.label("gpu") == index])
        assert set(sums.values()) <= {gpu.mib, gpu.mib - 1}
        if index == "0":  # the pod's three hold memory: whole MiB
            assert [sums[gi] for gi in ("7", "8", "9")] == [gpu.mib] * 3
    # The device plugin hands out the lowest GPU index and GI id first.
    assert holder_labels(by_name(series, FB[0])) == {
        ("0", str(gi), "worker", "team", f"job-{name}") for gi in (7, 8, 9)
    }


def test_single_strategy_gpus_are_the_counted_devices_over_a_gpu_s_share() -> None:
    """Under the single strategy GFD's count is MIG devices: the GPUs are that count over the
    layout's devices per GPU, rounded up; over what fits of the product's profile where the
    layout is of another profile (relabelled since GFD counted) or unknown."""
    layouts = migparted.parse(
        """
        version: v1
        mig-configs:
          three-small: [{devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 3}}]
          seven: [{devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 7}}]
          all-2g.10gb: [{devices: all, mig-enabled: true, mig-devices: {"2g.10gb": 3}}]
        """,
        "test",
    )
    a100 = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    cases = {
        "three": (a100, 6, "three-small", [3, 3]),
        "eight": (a100, 8, "three-small", [3, 3, 3]),
        "seven": (a100, 7, "seven", [7]),
        "relabelled": (a100, 14, "all-2g.10gb", [3, 3]),  # 14 over the 7 1g.5gb that fit
        "missing": (a100, 14, "missing", [0, 0]),  # MIG on, no instance, and a warning
        "odd-profile": ("NVIDIA-A100-SXM4-40GB-MIG-5g.99gb", 2, "seven", [7, 7]),  # one each
        # What follows the first -MIG- names no profile either, though a later part would.
        "mig-twice": (f"{a100}-MIG-1g.5gb", 2, "seven", [7, 7]),
    }
    nodes = [static_node(n, product, count, layout, "single")
             for n, (product, count, layout, _) in cases.items()]  # fmt: skip
    state = ClusterState.of(nodes, [], layouts)
    for name, (*_, per_gpu) in cases.items():
        result = state.results[name]
        assert isinstance(result, NodeTopology)
        assert result.gpu_count == len(per_gpu), name
        assert [len(g.mig_devices or ()) for g in result.gpus] == per_gpu, name
    assert [str(w) for w in state.all_warnings()] == [
        "node missing: metadata.labels[nvidia.com/mig.config]: unknown layout 'missing' "
        "(known: all-2g.10gb, seven, three-small)"
    ]


def test_each_container_gets_its_own_devices_and_the_pod_is_warned_once() -> None:
    """Containers asking for whole GPUs and MIG instances, interleaved, each get their own, in
    container order; a pod from a file without a namespace is kubectl's `default`; a bad usage
    annotation is one warning however many devices the pod holds."""
    layouts = migparted.parse(
        """
        version: v1
        mig-configs:
          first-split:
            - {devices: [0], mig-enabled: true, mig-devices: {"1g.5gb": 2}}
            - {devices: [1, 2, 3], mig-enabled: false}
        """,
        "test",
    )
    gpu, small = (
        {"nvidia.com/gpu": "1", "cpu": "2", "memory": "1Gi"},
        {"nvidia.com/mig-1g.5gb": "1"},
    )
    job = pod("job", "n", "2024-01-01T00:00:00Z", {"a": gpu, "m1": small, "b": gpu, "m2": small, "c": gpu},
              annotations={"run.ai/simulated-fb-used": "lots"})  # fmt: skip
    del job["metadata"]["namespace"]
    state = ClusterState.of(
        [static_node("n", "NVIDIA-A100-SXM4-40GB", 4, "first-split")], [job], layouts
    )
    result = state.results["n"]
    assert isinstance(result, NodeTopology)
    whole = [g.status.allocated_by.container if g.status and g.status.allocated_by else None
             for g in result.gpus]  # fmt: skip
    assert whole == [None, "a", "b", "c"]
    migs = [(d.gpu_instance_id, d.status.allocated_by if d.status else None)
            for d in result.gpus[0].mig_devices or ()]  # fmt: skip
    assert migs == [
        (7, AllocatedBy("default", "job", "m1", "uid-job")),
        (9, AllocatedBy("default", "job", "m2", "uid-job")),
    ]
    assert [str(w) for w in state.all_warnings()] == [
        "pod default/job: metadata.annotations[run.ai/simulated-fb-used]: expected MiB or a "
        "percentage, got 'lots'"
    ]


def test_a_pod_that_lost_an_instance_to_a_relabel_never_takes_a_younger_pod_s() -> None:
    """The older pod came second (bound later) and holds GI 8 and 9; the new layout has no GI
    8. It is placed first (it is older), yet the free GI 7 is the younger pod's: the older one
    does not fit, and gets nothing, as the kubelet would not admit it."""
    layouts = migparted.parse(
        """
        version: v1
        mig-configs:
          three: [{devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 3}}]
          two: [{devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 2}}]
        """,
        "test",
    )
    old = pod("old", "n", "2024-01-01T00:00:00Z", {"c": {"nvidia.com/mig-1g.5gb": "2"}})
    young = pod("young", "n", "2024-01-02T00:00:00Z", {"c": {"nvidia.com/mig-1g.5gb": "1"}})
    state = ClusterState.of(
        [static_node("n", "NVIDIA-A100-SXM4-40GB", 1, "three")], [young], layouts
    )
    state.set_pod(slim_pod(old))
    state.settle()

    def holders() -> dict[int, str | None]:
        result = state.results["n"]
        assert isinstance(result, NodeTopology)
        return {d.gpu_instance_id: d.status.allocated_by.pod if d.status and d.status.allocated_by else None
                for d in result.gpus[0].mig_devices or ()}  # fmt: skip

    assert holders() == {7: "young", 8: "old", 9: "old"}
    state.set_node(slim_node(static_node("n", "NVIDIA-A100-SXM4-40GB", 1, "two")))
    state.settle()
    assert holders() == {7: "young", 9: None}
    assert [str(w) for w in state.all_warnings()] == [
        "pod team/old: spec.containers[0].resources.limits[nvidia.com/mig-1g.5gb]: asks for 2 "
        "1g.5gb, node n has 1 free"
    ]


# --- 3. built-in layouts and the driver's placement ----------------------------------------------

# NVIDIA's config-default.yaml all-balanced per model: 1g x2, 2g x1, 3g x1.
BALANCED = {
    "A100-40GB": ("1g.5gb", "2g.10gb", "3g.20gb"),
    "A100-80GB": ("1g.10gb", "2g.20gb", "3g.40gb"),
    "H100-80GB": ("1g.10gb", "2g.20gb", "3g.40gb"),
    "H200-141GB": ("1g.18gb", "2g.35gb", "3g.71gb"),
}
WHOLE = {"A100-40GB": "7g.40gb", "A100-80GB": "7g.80gb", "H100-80GB": "7g.80gb",
         "H200-141GB": "7g.141gb"}  # fmt: skip


def layout_of(
    layouts: migparted.Layouts, name: str, key: str, gpus: int = 1
) -> list[migparted.GpuLayout]:
    return migparted.node_layout(layouts, name, model(key), gpus, f"node {key}")


@pytest.mark.parametrize("key", sorted(BALANCED))
def test_builtin_balanced_3g_and_7g_layouts(key: str) -> None:
    one, two, three = BALANCED[key]
    # 3g first, at 4; 2g: 4 is taken, so 0; 1g: 6, 4, 5, 0, 1 are taken, so 2, then 3.
    balanced = [(0, two), (2, one), (3, one), (4, three)]
    assert layout_of(migparted.builtin(), "all-balanced", key) == [
        migparted.GpuLayout(True, tuple(balanced))
    ]
    assert layout_of(migparted.builtin(), f"all-{three}", key) == [
        migparted.GpuLayout(True, ((0, three), (4, three)))
    ]
    (whole,) = layout_of(migparted.builtin(), f"all-{WHOLE[key]}", key)
    assert whole == migparted.GpuLayout(True, ((0, WHOLE[key]),))
    gpu = model(key)
    (profile,) = (p for p in gpu.profiles if p.name == WHOLE[key])
    assert gpu.gpu_instance_id(profile, 0) == 0
    off = migparted.GpuLayout(False, ())
    assert layout_of(migparted.builtin(), "all-disabled", key, 2) == [off, off]


def gis(key: str, placed: tuple[tuple[int, str], ...]) -> list[tuple[int, str, int]]:
    gpu = model(key)
    found = []
    for start, name in placed:
        (profile,) = (p for p in gpu.profiles if p.name == name)
        found.append((start, name, gpu.gpu_instance_id(profile, start)))
    return found


def test_balanced_gi_ids_are_dcgm_issue_138() -> None:
    """NVIDIA/DCGM#138 shows all-balanced on two A100 80GB of one node: GPU 0 (identity) 2g@0
    -> 3, 1g@2,3 -> 9,10, 3g@4 -> 2; GPU 1 (halves swapped) 5, 13, 14, 1."""
    (identity,) = layout_of(migparted.builtin(), "all-balanced", "A100-80GB")
    assert gis("A100-80GB", identity.devices) == [
        (0, "2g.20gb", 3), (2, "1g.10gb", 9), (3, "1g.10gb", 10), (4, "3g.40gb", 2)
    ]  # fmt: skip
    (swapped,) = layout_of(migparted.builtin(), "all-balanced", "A100-40GB")
    assert gis("A100-40GB", swapped.devices) == [
        (0, "2g.10gb", 5), (2, "1g.5gb", 13), (3, "1g.5gb", 14), (4, "3g.20gb", 1)
    ]  # fmt: skip


# `-cgi` repeated with one profile, in creation order (mig-profiles.md 3.2): each prefix of it is
# what a layout with that many instances leaves.
CGI_ORDERS = [
    ("H100-NVL-94GB", "1g.12gb", (13, 11, 12, 7, 8, 9, 10)),  # H100 NVL blog, `-cgi 19x7`
    ("A100-40GB", "1g.5gb", (9, 7, 8, 11, 12, 13, 14)),  # AWS p4d, `-cgi 19x7`
    ("H100-96GB", "1g.24gb", (5, 3, 4)),  # GH200 Slurm notes, `-cgi 15x3`
]


@pytest.mark.parametrize(("key", "profile", "order"), CGI_ORDERS, ids=[c[0] for c in CGI_ORDERS])
def test_partial_layouts_follow_the_default_cgi_order(
    key: str, profile: str, order: tuple[int, ...]
) -> None:
    for count in range(1, len(order) + 1):
        placed = migparted.place(model(key), ((profile, count),))
        assert {gi for _, _, gi in gis(key, placed)} == set(order[:count]), count


def test_mig_user_guide_example_3_placement() -> None:
    """MIG user guide ex.3, `-cgi 14,19x5` on an identity-oriented A100: 2g at 4 (GI 5), the
    1g at 6 (GI 13) and then 0..3 (GI 7..10)."""
    placed = migparted.place(model("A100-80GB"), (("1g.10gb", 5), ("2g.20gb", 1)))
    assert gis("A100-80GB", placed) == [
        (0, "1g.10gb", 7), (1, "1g.10gb", 8), (2, "1g.10gb", 9), (3, "1g.10gb", 10),
        (4, "2g.20gb", 5), (6, "1g.10gb", 13)
    ]  # fmt: skip


def test_mlops_doc_3g_2g_1g_placement() -> None:
    """mig-profiles.md 3.2, A100 80GB PCIe with halves swapped: `-cgi 9,14,19` -> GI 1, 5, 13
    (3g at 4; 2g at 0; the 1g's first free start is 2)."""
    placed = migparted.place(model("A100-40GB"), (("1g.5gb", 1), ("2g.10gb", 1), ("3g.20gb", 1)))
    assert {gi for _, _, gi in gis("A100-40GB", placed)} == {1, 5, 13}


def test_last_matching_entry_wins_and_device_filters_pick_the_model() -> None:
    """mig-parted applies entries in order, so a later entry overrides an earlier one for the
    GPUs both match; device-filter names PCI ids (A100-SXM4-40GB 0x20B0, H100 SXM5 0x2330)."""
    layouts = migparted.parse(
        """
        version: v1
        mig-configs:
          fleet:
            - devices: all
              mig-enabled: true
              mig-devices: {"3g.20gb": 2}
            - device-filter: "0x233010DE"
              devices: all
              mig-enabled: true
              mig-devices: {"7g.80gb": 1}
            - devices: [1]
              mig-enabled: false
        """,
        "test",
    )
    assert layout_of(layouts, "fleet", "A100-40GB", 3) == [
        migparted.GpuLayout(True, ((0, "3g.20gb"), (4, "3g.20gb"))),
        migparted.GpuLayout(False, ()),
        migparted.GpuLayout(True, ((0, "3g.20gb"), (4, "3g.20gb"))),
    ]
    assert layout_of(layouts, "fleet", "H100-80GB", 2) == [
        migparted.GpuLayout(True, ((0, "7g.80gb"),)),
        migparted.GpuLayout(False, ()),
    ]


# --- 4. a mig-parted ConfigMap overriding the built-in layouts -----------------------------------


def bare_config(tmp_path: Path) -> Path:
    """The ConfigMap's config.yaml alone, as a file: the other form --mig-parted-config takes."""
    manifest = yaml.safe_load((STATIC / "custom" / "mig-parted-config.yaml").read_text())
    path = tmp_path / "config.yaml"
    path.write_text(manifest["data"]["config.yaml"])
    return path


@pytest.mark.parametrize("form", ["configmap", "config.yaml"])
def test_custom_configmap_layout(tmp_path: Path, form: str) -> None:
    config = STATIC / "custom" / "mig-parted-config.yaml"
    if form == "config.yaml":
        config = bare_config(tmp_path)
    rendered = render(
        [STATIC / "custom" / "h100-80gb-custom.yaml"], [STATIC / "custom" / "pods.yaml"], config
    )
    assert rendered.warnings == []
    node = rendered.nodes["h100-80gb-custom"]
    gpus = node["gpus"]
    assert len(gpus) == 8
    # H100 is identity-oriented: 2g@0 -> 3, 1g@2,3 -> 9,10, 3g@4 -> 2; 1g@0..6 -> 7..13.
    for gpu in gpus[:4]:
        assert instances(gpu) == {(0, "2g.20gb", 3), (2, "1g.10gb", 9), (3, "1g.10gb", 10),
                                  (4, "3g.40gb", 2)}  # fmt: skip
    for gpu in gpus[4:6]:
        assert instances(gpu) == {(p, "1g.10gb", 7 + p) for p in range(7)}
    # MIG off: whole GPUs, both held by the trainer's nvidia.com/gpu: 2.
    for gpu in gpus[6:]:
        assert "mig-devices" not in gpu
        trainer = {"namespace": "research", "pod": "trainer", "container": "main",
                   "pod-uid": "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c02"}  # fmt: skip
        assert gpu["status"]["allocated-by"] == trainer
    assert held(node) == {(0, 9): ("serving", "inference-0", "server")}
    if form == "configmap":  # the exporter once is enough
        series = parse(export(tmp_path, rendered, "h100-80gb-custom"))
        assert holder_labels(by_name(series, FB[0])) == {
            ("0", "9", "server", "serving", "inference-0"),
            ("6", "", "main", "research", "trainer"),
            ("7", "", "main", "research", "trainer"),
        }


def test_custom_configmap_replaces_the_builtin_names(tmp_path: Path) -> None:
    """With a ConfigMap in use only its layouts exist: all-balanced is unknown there."""
    node = yaml.safe_load((STATIC / "nodes" / "a100-40gb-mixed.yaml").read_text())
    rendered = render(
        [STATIC / "custom" / "h100-80gb-custom.yaml", write(tmp_path / "n.yaml", node)],
        [],
        STATIC / "custom" / "mig-parted-config.yaml",
    )
    (warning,) = rendered.warnings
    assert warning.startswith(f"node a100-40gb-static: {WARNING}: ")
    assert "'all-balanced'" in warning
    assert [gpu["mig-devices"] for gpu in rendered.nodes["a100-40gb-static"]["gpus"]] == [[], []]
    assert len(instances(rendered.nodes["h100-80gb-custom"]["gpus"][0])) == 4


ENTRY = "version: v1\nmig-configs:\n  l:\n  - {%s, mig-enabled: true}\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [("version: v1\nmig-configs: [unclosed\n", "YAML"),
     ("version: v2\nmig-configs: {}\n", "version"),
     ("version: v1\nmig-configs: [a]\n", ": mig-configs: expected a mapping, got list"),
     ("version: v1\nmig-configs: {x: 5}\n", ": mig-configs[x]: expected a list of entries, got int"),
     ("version: v1\nmig-configs: {l: [5]}\n", ": mig-configs[l][0]: expected a mapping, got int"),
     (ENTRY % "devices: []", ".devices: expected a list of GPU indices or 'all', got []"),
     (ENTRY % "devices: [1024]", ".devices[0]: expected an integer from 0 to 1023, got 1024"),
     (ENTRY % "devices: all, device-filter: 5", ".device-filter: expected PCI device ids, got 5"),
     (ENTRY % "devices: all, device-filter: [x]",
      ".device-filter[0]: expected a PCI id like 0x20B010DE, got 'x'")],
    ids=["not-yaml", "wrong-version", "configs-not-a-mapping", "layout-not-a-list",
         "entry-not-a-mapping", "no-devices", "device-index", "filter-not-a-list", "filter-id"],
)  # fmt: skip
def test_bad_mig_parted_config_is_a_one_line_error(tmp_path: Path, text: str, says: str) -> None:
    config = tmp_path / "broken-config.yaml"
    config.write_text(text)
    done = run_cli("status_updater", "render", "--nodes", str(STATIC / "nodes"),
                   "--mig-parted-config", str(config))  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: ") and str(config) in line and says in line


# --- 5. pods taking and releasing instances ------------------------------------------------------

# all-balanced on the half-swapped A100-40GB: 2g@0 -> GI 5, 1g@2,3 -> 13,14, 3g@4 -> 1.
A100_BALANCED = {(0, "2g.10gb", 5), (2, "1g.5gb", 13), (3, "1g.5gb", 14), (4, "3g.20gb", 1)}


def test_sample_pods_take_their_instances_and_finished_ones_release(tmp_path: Path) -> None:
    rendered = render(
        [STATIC / "nodes" / "a100-40gb-mixed.yaml"],
        [STATIC / "pods" / "a100-40gb-static-pods.yaml"],
    )
    assert rendered.warnings == []
    node = rendered.nodes["a100-40gb-static"]
    assert [instances(gpu) for gpu in node["gpus"]] == [A100_BALANCED, A100_BALANCED]
    trainer, notebook = ("team-a", "trainer-0", "trainer"), ("team-b", "notebook", "jupyter")
    # finished-job (Succeeded) asked for a 2g.10gb: both stay free.
    assert held(node) == {(0, 13): trainer, (0, 14): trainer, (0, 1): notebook}
    series = parse(export(tmp_path, rendered, "a100-40gb-static"))
    expected = {("0", "13", "trainer", "team-a", "trainer-0"),
                ("0", "14", "trainer", "team-a", "trainer-0"),
                ("0", "1", "jupyter", "team-b", "notebook")}  # fmt: skip
    assert holder_labels(series) == expected
    for name in {s.name for s in series}:  # every family, not only some
        assert holder_labels(by_name(series, name)) == expected, name


def test_oldest_pod_first_and_pods_that_do_not_fit_get_nothing(tmp_path: Path) -> None:
    node = STATIC / "nodes" / "a100-40gb-mixed.yaml"  # 2 GPUs x all-balanced: two 3g.20gb
    at = "a100-40gb-static"
    three, two = {"nvidia.com/mig-3g.20gb": "1"}, {"nvidia.com/mig-2g.10gb": "1"}
    pods = [
        # Listed youngest first, and named against their age: only creationTimestamp orders them.
        pod("aa-young", at, "2026-11-20T09:00:00Z", {"main": three}),
        pod("zz-old", at, "2026-11-20T08:00:00Z", {"main": three}),
        pod("first", at, "2026-11-20T07:00:00Z", {"main": three}),
        # Its first container fits, its second cannot: the kubelet admits a pod whole or not.
        pod("two-part", at, "2026-11-20T10:00:00Z", {"a": two, "b": three}),
        # Placed after the warnings: asks for both 2g.10gb, which two-part left free.
        pod("late", at, "2026-11-20T12:00:00Z", {"main": {"nvidia.com/mig-2g.10gb": "2"}}),
    ]
    rendered = render([node], [write(tmp_path / "pods.yaml", *pods)])
    assert sorted(rendered.warnings) == [
        "pod team/aa-young: spec.containers[0].resources.limits[nvidia.com/mig-3g.20gb]: "
        "asks for 1 3g.20gb, node a100-40gb-static has 0 free",
        "pod team/two-part: spec.containers[1].resources.limits[nvidia.com/mig-3g.20gb]: "
        "asks for 1 3g.20gb, node a100-40gb-static has 0 free",
    ]
    assert held(rendered.nodes[at]) == {
        (0, 1): ("team", "first", "main"),
        (1, 1): ("team", "zz-old", "main"),
        (0, 5): ("team", "late", "main"),
        (1, 5): ("team", "late", "main"),
    }


# --- 6. layouts that cannot be applied ----------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "config"),
    [
        ("no-such-layout", None),
        ("all-1g.5gb", None),  # an A100-40GB profile: NVIDIA's layout has no H100 entry
        ("lacks", {"1g.5gb": 1}),
        ("too-big", {"7g.80gb": 1, "1g.10gb": 1}),
    ],
    ids=["unknown", "builtin-without-h100-entry", "profile-h100-lacks", "does-not-fit"],
)
def test_layout_that_cannot_be_applied(
    tmp_path: Path, layout: str, config: dict[str, int] | None
) -> None:
    node = yaml.safe_load((STATIC / "nodes" / "h100-80gb-mixed.yaml").read_text())
    node["metadata"]["labels"][LABEL] = layout
    path = None
    if config is not None:
        path = tmp_path / "config.yaml"
        entry = {"devices": "all", "mig-enabled": True, "mig-devices": config}
        path.write_text(yaml.safe_dump({"version": "v1", "mig-configs": {layout: [entry]}}))
    rendered = render([write(tmp_path / "node.yaml", node)], [], path)
    (warning,) = rendered.warnings
    assert warning.startswith(f"node h100-80gb-static: {WARNING}: ") and f"'{layout}'" in warning
    # MIG stays on (mig-manager failed half way or never started): no instance on any GPU.
    assert [gpu["mig-devices"] for gpu in rendered.nodes["h100-80gb-static"]["gpus"]] == [[]] * 8
    series = parse(export(tmp_path, rendered, "h100-80gb-static"))
    # GPU-level series only, as DCGM shows a MIG-enabled GPU without instances.
    assert {s.label_names for s in series} == {s.label_names for s in EMPTY_DUMP}
    assert {s.name for s in series} == {s.name for s in EMPTY_DUMP}
    for name in {s.name for s in series}:
        assert sorted(s.label("gpu") for s in by_name(series, name)) == [str(i) for i in range(8)]


# --- 7. dynamic MIG keeps empty pod labels ------------------------------------------------------


def test_dynamic_mig_series_do_not_name_pods(tmp_path: Path) -> None:
    """run:ai's dynamic MIG hides instances from dcgm-exporter's pod mapping. The GPU operator
    labels MIG-capable nodes with a layout too (all-disabled by default): with run:ai's two
    labels the node stays run:ai's, with its own instances."""
    node = yaml.safe_load((SAMPLES / "nodes" / "a100-40gb-3-instances.yaml").read_text())
    node["metadata"]["labels"][LABEL] = "all-disabled"
    rendered = render([write(tmp_path / "node.yaml", node)], [SAMPLES / "pods"])
    assert rendered.warnings == []
    topology = rendered.nodes[NODE]
    assert topology["is-dynamic-mig-enabled"] is True
    # The real node's run.ai/mig.config: 2g@0 -> GI 5, 1g@4 -> 7, 1g@6 -> 9.
    assert instances(topology["gpus"][0]) == {(0, "2g.10gb", 5), (4, "1g.5gb", 7), (6, "1g.5gb", 9)}
    assert held(topology)  # the pods do hold instances
    series = parse(export(tmp_path, rendered, NODE))
    assert any("GPU_I_PROFILE" in s.label_names for s in series)
    assert holder_labels(series) == set()


def test_single_strategy_request_over_the_instances_names_them_mig_devices() -> None:
    """Under the single strategy `nvidia.com/gpu` is a MIG instance of any profile: a pod asking
    for more than are free is told in those words."""
    node = static_node("s", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 7, "all-1g.5gb", "single")
    greedy = pod("greedy", "s", "2024-01-01T00:00:00Z", {"c": {"nvidia.com/gpu": "8"}})
    state = ClusterState.of([node], [greedy])
    assert [str(w) for w in state.all_warnings()] == [
        "pod team/greedy: spec.containers[0].resources.limits[nvidia.com/gpu]: asks for 8 "
        "MIG device, node s has 7 free"
    ]
