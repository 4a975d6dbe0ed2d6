"""Conformance: Nodes exactly as the real producers write them, through `render` and the exporter.

Issue #21, "Real producers as test inputs". There are three sources of Nodes:

- fake-gpu-operator 0.2.0's mig-faker. Every profile of its 40GB and 80GB tables appears, in
  layouts run:ai could ask for, with random uuids. These nodes carry run:ai pods holding some
  of the instances.
- The NVIDIA GPU operator. mig-manager applies mig-parted's default layouts, and GPU feature
  discovery labels the node under the single and the mixed strategy. These nodes carry pods
  that ask the device plugin for instances.
- The real run:ai dumps in samples/mig/nodes and ../shared/samples/node.

tests/support/producers.py builds the first two from the producers' documented formats; the last tests
here hold it to those facts (mig-faker's documented annotation byte for byte, GFD's labels of
the real node and of the GPU operator's guide). Each group of nodes goes through one
`python -m status_updater render`. Then one `python -m exporter --all-nodes --once` serves the
whole group, and `python -m exporter --node-name <node> --once` serves each node on its own:
the first from the List render printed, the others from their `topology-<node>` ConfigMap, as a
DaemonSet pod mounts it. Every exposition must pass three checks: `promtool check metrics`,
prometheus_client's parser, and "no two samples with the same name and label set".

Then come the checks a user makes. There is one series per MIG instance, and each carries
GPU_I_PROFILE and GPU_I_ID. Each (GPU, GPU_I_ID) pair appears once per node. The GI ids follow
the driver's rule, `GI = (slots/size - 1) + physical start/size`, in either orientation of
shared/reference/mig-profiles.md section 3, and they decode to the placements the producer
chose. Every device uuid of `run.ai/mig-mapping` is kept: the topology names the instance by
it, and its (GPU, GI) has exactly one series. The exporter's series carry the parent GPU's
UUID, as dcgm-exporter's do, so a MIG uuid shows only in the topology. Each pod holds the
instances it asked for. A generated test does the same in this process for any layout run:ai
may ask of a fake-gpu-operator node.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter import dcgm
from exporter.generations import DEFAULT
from status_updater.state import ClusterState
from tests.support.base import ROOT, SAMPLES, _in_process, examples, run_cli
from tests.support.producers import (
    FGO_A100,
    FGO_A100_80GB,
    FGO_A100_UPGRADE,
    FGO_H100,
    FGO_PROFILE_IDS,
    MIG_PARTED_DEFAULT,
    FgoPool,
    Layout,
    Obj,
    RefModel,
    RefProfile,
    as_many_as_fit,
    device_plugin_pod,
    fgo_mapping,
    fgo_node,
    fgo_table,
    fits,
    gpu_operator_node,
    read_mig_mapping,
    reference_model,
    runai_pod,
    sanitize_label_value,
)
from tests.support.promtext import Series, by_name, duplicates, parse, promtool_findings
from topology.catalog import model_for_product

SEED = 21  # the number: any fixed seed makes `make test` deterministic
FB_USED = "DCGM_FI_DEV_FB_USED"  # served once per MIG instance and once per MIG-off GPU
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # served for every GPU, MIG on or off
POD_LABELS = ("container", "namespace", "pod")
SHARED_NODES = ROOT.parent / "shared" / "samples" / "node"
# --- what each node should show ------------------------------------------------------------------


@dataclass(frozen=True)
class GpuExpect:
    mig: bool
    counts: Mapping[str, int]  # profile -> instances on this GPU
    placed: Layout | None = None  # the starts, where the producer chose them (not mig-manager)


@dataclass(frozen=True)
class PodExpect:
    namespace: str
    pod: str
    container: str
    profile: str | None  # None: whole GPUs
    count: int
    at: tuple[int, int] | None = None  # (GPU index, start) of a run:ai pod's instance


@dataclass(frozen=True)
class Case:
    group: str
    name: str  # the node
    model: RefModel
    gpus: tuple[GpuExpect, ...]
    uuids: Mapping[tuple[int, int], str] = field(default_factory=dict)  # (GPU, start) -> id
    pods: tuple[PodExpect, ...] = ()
    # The mapping names a gpu_instance_id that no orientation gives its profile at its start.
    bad_mapping_ids: bool = False


@dataclass(frozen=True)
class Group:
    name: str
    cases: tuple[Case, ...]
    nodes: tuple[Obj, ...] = ()  # generated, written to a file for render
    pods: tuple[Obj, ...] = ()
    node_files: tuple[Path, ...] = ()  # real dumps, given to render as they are
    pod_files: tuple[Path, ...] = ()


def expect_layout(layout: Layout | None) -> GpuExpect:
    if layout is None:
        return GpuExpect(False, {})
    return GpuExpect(True, dict(Counter(name for _, name in layout)), layout)


# --- the GI id rule (shared/reference/mig-profiles.md section 3) --------------------------------


def orientations(model: RefModel) -> tuple[bool, ...]:
    """Halves swapped or not: both are seen on 8-slot GPUs, only the identity on the A30."""
    return (False, True) if model.memory_slots == 8 else (False,)


def start_of(model: RefModel, profile: RefProfile, gi: int, swapped: bool) -> int | None:
    """The logical start a GI id means for a profile, or None if no block of its size has it.

    GI ids number the blocks of a binary tree over the physical memory slices:
    `GI = (slots/size - 1) + physical start/size`. The logical start is the physical one, or
    that XOR slots/2 when the halves are swapped; a block spanning both halves is the same.
    """
    size = profile.memory_slices
    blocks = model.memory_slots // size
    index = gi - (blocks - 1)
    if not 0 <= index < blocks:
        return None
    start = index * size
    return (
        start ^ (model.memory_slots // 2) if swapped and size <= model.memory_slots // 2 else start
    )


def mapping_ids_are_gi_ids(model: RefModel, node: Obj) -> bool:
    """Whether every gpu_instance_id of the node's mapping is one its profile can have there."""
    config = yaml.safe_load(node["metadata"]["annotations"]["run.ai/mig.config"])
    names = {
        (int(entry["devices"][0]), d["position"]): d["name"]
        for entry in config["mig-configs"]["selected"]
        for d in entry.get("mig-devices") or ()
    }
    for gpu, entries in read_mig_mapping(node).items():
        for e in entries:
            profile = model.profiles[names[gpu, e["position"]]]
            starts = {
                start_of(model, profile, e["gpu_instance_id"], s) for s in orientations(model)
            }
            if e["position"] not in starts:
                return False
    return True


# --- the producers' nodes ------------------------------------------------------------------------


def _by_profile_id(table: Mapping[str, int], layout: tuple[tuple[int, int], ...]) -> Layout:
    name = {pid: n for n, pid in table.items()}
    return tuple((start, name[pid]) for start, pid in layout)


# run:ai layouts that mix profiles, by the profile ids both tables share (19 the 1-slice 1g, 20
# its +me, 15 the 2-slice 1g, 14 2g, 9 3g, 5 4g, 0 7g), at starts of the reference's
# placements. The config lists them in this order, which is not always the order of the starts.
FGO_MIXED: dict[str, tuple[tuple[int, int], ...] | None] = {
    "2g-1g-1g-3g": ((0, 14), (2, 19), (3, 19), (4, 9)),  # fgo's design notes' example
    "4g-2g-1g": ((0, 5), (4, 14), (6, 19)),
    "3g-1g2slice-1g2slice": ((0, 9), (4, 15), (6, 15)),
    "me-1g-1g-1g-2g-1g": ((0, 20), (1, 19), (2, 19), (3, 19), (4, 14), (6, 19)),
    "3g-at-4": ((4, 9),),
    "1g-out-of-order": ((6, 19), (4, 19), (5, 19), (0, 19)),
    "2g-at-4-3g-at-0": ((4, 14), (0, 9)),
    "enabled-empty": (),
    "disabled": None,
}


def fgo_layouts(pool: FgoPool) -> list[Layout | None]:
    """Every profile of the pool's table as many as fit, then the mixed layouts."""
    model = reference_model(pool.model)
    table = fgo_table(sanitize_label_value(pool.gpu_product))
    layouts: list[Layout | None] = [as_many_as_fit(model, name) for name in table]
    for mixed in FGO_MIXED.values():
        layouts.append(None if mixed is None else _by_profile_id(table, mixed))
    for layout in layouts:
        assert layout is None or fits(model, layout), layout
    return layouts


def fgo_case(
    name: str, pool: FgoPool, layouts: Sequence[Layout | None], rng: random.Random
) -> tuple[Case, Obj, list[Obj]]:
    """A fake-gpu-operator node with these GPU layouts, and a run:ai pod on the first instance
    of every GPU that has one."""
    pool = replace(pool, gpu_count=len(layouts))
    gpus = dict(enumerate(layouts))
    node = fgo_node(name, pool, gpus, rng)
    mapping = read_mig_mapping(node)
    pods, expected = [], []
    for index, layout in gpus.items():
        if not layout:
            continue
        entry = mapping[index][0]
        pod = f"{name}-gpu{index}-job"
        created = f"2025-06-01T09:{index:02d}:00Z"
        profile = layout[0][1]
        pods.append(
            runai_pod(pod, "runai-team-a", name, index, entry, profile, pool.model, created, rng)
        )
        expected.append(
            PodExpect("runai-team-a", pod, "main", profile, 1, (index, entry["position"]))
        )
    model = reference_model(pool.model)
    case = Case(
        group="fake-gpu-operator",
        name=name,
        model=model,
        gpus=tuple(expect_layout(layout) for layout in layouts),
        uuids={(g, e["position"]): e["device_uuid"] for g, es in mapping.items() for e in es},
        pods=tuple(expected),
        bad_mapping_ids=not mapping_ids_are_gi_ids(model, node),
    )
    return case, node, pods


def fake_gpu_operator_group() -> Group:
    rng = random.Random(SEED)
    built = []
    for label, pool in (
        ("a100-40gb", FGO_A100),
        ("h100-80gb", FGO_H100),
        ("a100-80gb", FGO_A100_80GB),
    ):
        layouts = fgo_layouts(pool)
        per_node = pool.gpu_count
        for n, first in enumerate(range(0, len(layouts), per_node), start=1):
            chunk = layouts[first : first + per_node]
            chunk += layouts[: per_node - len(chunk)]  # a node lists every one of its GPUs
            built.append(fgo_case(f"fgo-{label}-{n}", pool, chunk, rng))
    # The upgrade fixture's pool: 4 GPUs labelled 40000 MiB.
    a100 = fgo_layouts(FGO_A100_UPGRADE)
    built.append(
        fgo_case(
            "fgo-a100-40gb-upgrade", FGO_A100_UPGRADE, [a100[0], a100[6], a100[10], a100[13]], rng
        )
    )
    return Group(
        "fake-gpu-operator",
        cases=tuple(c for c, _, _ in built),
        nodes=tuple(n for _, n, _ in built),
        pods=tuple(p for _, _, ps in built for p in ps),
    )


GPU_OPERATOR_MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "A30-24GB", "H200-141GB")


def gpu_operator_group() -> Group:
    """Every sampled mig-parted layout of each model, under both strategies where GFD can label
    it (the single strategy needs one profile, or MIG off)."""
    rng = random.Random(SEED)
    cases, nodes, pods = [], [], []
    for key in GPU_OPERATOR_MODELS:
        model = reference_model(key)
        for layout, counts in MIG_PARTED_DEFAULT[key].items():
            strategies = ["mixed"]
            if counts is None or len(counts) == 1:
                strategies.append("single")
            for strategy in strategies:
                gpus = 8 if layout == "all-balanced" else 2
                name = f"gpuop-{key.lower()}-{strategy}-{layout}"
                nodes.append(gpu_operator_node(name, key, layout, strategy, gpus, rng))
                node_pods, expected = static_pods(name, counts, strategy, gpus, rng)
                pods += node_pods
                per_gpu = GpuExpect(counts is not None, dict(counts or {}))
                cases.append(Case("gpu-operator", name, model, (per_gpu,) * gpus, pods=expected))
    return Group("gpu-operator", cases=tuple(cases), nodes=tuple(nodes), pods=tuple(pods))


def static_pods(
    node: str, counts: Mapping[str, int] | None, strategy: str, gpus: int, rng: random.Random
) -> tuple[list[Obj], tuple[PodExpect, ...]]:
    """Pods asking for part of what the node advertises: a GPU where MIG is off; two instances
    of the first profile (`nvidia.com/gpu` under the single strategy); on a mixed node with
    several profiles, one more pod whose two containers ask for one instance of each other
    profile."""
    created = "2025-06-01T10:00:00Z"
    if counts is None:
        pod = device_plugin_pod(
            f"{node}-whole", "team-a", node, [("cuda", {"nvidia.com/gpu": 1})], created, rng
        )
        return [pod], (PodExpect("team-a", f"{node}-whole", "cuda", None, 1),)
    if not counts:
        return [], ()
    first, per_gpu = sorted(counts.items())[0]
    want = min(2, per_gpu * gpus)
    resource = "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{first}"
    pods = [
        device_plugin_pod(
            f"{node}-trainer", "team-a", node, [("trainer", {resource: want})], created, rng
        )
    ]
    expected = [PodExpect("team-a", f"{node}-trainer", "trainer", first, want)]
    others = sorted(counts)[1:]
    if strategy == "mixed" and others:
        containers = [(f"c{i}", {f"nvidia.com/mig-{p}": 1}) for i, p in enumerate(others)]
        pods.append(
            device_plugin_pod(
                f"{node}-multi", "team-b", node, containers, "2025-06-01T11:00:00Z", rng
            )
        )
        expected += [
            PodExpect("team-b", f"{node}-multi", f"c{i}", p, 1) for i, p in enumerate(others)
        ]
    return pods, tuple(expected)


# --- the real run:ai dumps ------------------------------------------------------------------------

# What each dump's `run.ai/mig.config` asks for, per GPU, written out by hand from the files.
# `a100-80gb-single` is labelled with GFD's single strategy: `nvidia.com/gpu.count: "2"` counts
# its two 1g.10gb devices, which `devices: all` puts on one GPU.
DUMPS: dict[str, tuple[str, dict[int, Layout]]] = {
    "qa-mig-worker-gpu-a100": ("A100-40GB", {0: ((0, "2g.10gb"), (4, "1g.5gb"), (6, "1g.5gb"))}),
    "h100-node-1": (
        "H100-80GB",
        {0: ((0, "3g.40gb"), (4, "2g.20gb"), (6, "1g.10gb")), 1: ((4, "3g.40gb"),)},
    ),
    "h200-node-1": (
        "H200-141GB",
        {
            0: ((0, "4g.71gb"), (4, "1g.35gb"), (6, "1g.18gb")),
            1: ((0, "4g.71gb"), (4, "1g.35gb"), (6, "1g.18gb")),
            2: ((0, "7g.141gb"),),
            3: ((0, "7g.141gb"),),
        },
    ),
    "a100-80gb-single": ("A100-80GB", {0: ((0, "1g.10gb"), (1, "1g.10gb"))}),
}


def mapped_uuids(node: Obj) -> dict[tuple[int, int], str]:
    """(GPU, start) -> device uuid of `run.ai/mig-mapping`: the older `{gpu: {start: uuid}}`
    or the current `{gpu: [{position, device_uuid, ...}]}`."""
    if "run.ai/mig-mapping" not in (node["metadata"].get("annotations") or {}):
        return {}
    out: dict[tuple[int, int], str] = {}
    for gpu, devices in read_mig_mapping(node).items():
        if isinstance(devices, dict):
            out |= {(gpu, int(start)): uuid for start, uuid in devices.items()}
        else:
            out |= {(gpu, d["position"]): d["device_uuid"] for d in devices}
    return out


def objects(path: Path) -> list[Obj]:
    found: list[Obj] = []
    for doc in yaml.safe_load_all(path.read_text()):
        found += doc["items"] if doc.get("kind") == "List" else [doc]
    return found


def runai_pods(paths: Iterable[Path]) -> dict[str, list[PodExpect]]:
    """Per node, the instance each run:ai pod of these files holds (its `runai-mig-device`)."""
    found: dict[str, list[PodExpect]] = {}
    for path in paths:
        for pod in objects(path):
            device = json.loads(pod["metadata"]["annotations"]["runai-mig-device"])
            found.setdefault(pod["spec"]["nodeName"], []).append(
                PodExpect(
                    pod["metadata"]["namespace"],
                    pod["metadata"]["name"],
                    pod["spec"]["containers"][0]["name"],
                    device["name"].removeprefix("nvidia.com/mig-"),
                    1,
                    (int(device["gpuindex"]), int(device["position"])),
                )
            )
    return found


def dump_group(name: str, directory: Path) -> Group:
    node_files = tuple(sorted(directory.glob("*.yaml")))
    pod_files = tuple(sorted((SAMPLES / "pods").glob("*.yaml")))
    holders = runai_pods(pod_files)
    cases = []
    for path in node_files:
        (node,) = objects(path)
        node_name = node["metadata"]["name"]
        key, layouts = DUMPS[node_name]
        model = reference_model(key)
        cases.append(
            Case(
                name,
                node_name,
                model,
                tuple(expect_layout(layouts[g]) for g in sorted(layouts)),
                mapped_uuids(node),
                tuple(holders.get(node_name, ())),
            )
        )
    return Group(name, tuple(cases), node_files=node_files, pod_files=pod_files)


def groups() -> list[Group]:
    found = [
        fake_gpu_operator_group(),
        gpu_operator_group(),
        dump_group("runai-samples", SAMPLES / "nodes"),
    ]
    if SHARED_NODES.is_dir():  # the project's shared material, beside the checkout
        found.append(dump_group("runai-shared", SHARED_NODES))
    return found


GROUPS = {g.name: g for g in groups()}


def params(keep: Callable[[Case], object] = bool) -> list[Any]:
    """The cases `keep` is true of, each named by its group and node."""
    return [
        pytest.param(c, id=f"{c.group}:{c.name}")
        for g in GROUPS.values()
        for c in g.cases
        if keep(c)
    ]


MODES = ("all-nodes", "per-node")


# --- render and export, once per group -----------------------------------------------------------


@dataclass
class Rendered:
    render: subprocess.CompletedProcess[str]
    topology: dict[str, Any]  # node -> its entry of `topology.yml`
    all_nodes: str  # `exporter --all-nodes --once`
    per_node: dict[str, str]  # node -> `exporter --node-name <node> --once --mig-pod-labels`

    @cached_property
    def by_node(self) -> dict[str, list[Series]]:
        """The `--all-nodes` series of each node (by its Hostname), parsed once."""
        out: dict[str, list[Series]] = {}
        for s in parse(self.all_nodes):
            out.setdefault(s.label("Hostname"), []).append(s)
        return out

    @cached_property
    def own(self) -> dict[str, list[Series]]:
        """Each node's own exporter's series, parsed once."""
        return {node: parse(text) for node, text in self.per_node.items()}

    def text(self, mode: str) -> list[tuple[str, str]]:
        """(what, exposition) of every exporter run of the mode."""
        if mode == "all-nodes":
            return [("--all-nodes", self.all_nodes)]
        return [(f"--node-name {n}", text) for n, text in sorted(self.per_node.items())]


def write_list(path: Path, items: Sequence[Obj]) -> Path:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(items)}))
    return path


def run(group: Group, directory: Path) -> Rendered:
    nodes = [str(p) for p in group.node_files]
    pods = [str(p) for p in group.pod_files]
    if group.nodes:
        nodes.append(str(write_list(directory / "nodes.yaml", group.nodes)))
    if group.pods:
        pods.append(str(write_list(directory / "pods.yaml", group.pods)))
    render = run_cli(
        "status_updater", "render", "--nodes", *nodes, *(["--pods", *pods] if pods else [])
    )
    assert render.returncode == 0, render.stderr
    topology_file = directory / "topology.yaml"
    topology_file.write_text(render.stdout)
    topology: dict[str, Any] = {}
    configmaps: dict[str, Path] = {}
    for cm in yaml.safe_load(render.stdout)["items"]:
        node = cm["metadata"]["labels"]["node-name"]
        topology[node] = yaml.safe_load(cm["data"]["topology.yml"])["nodes"][node]
        # What the node's exporter pod mounts: its own `topology-<node>` ConfigMap.
        configmaps[node] = directory / f"{cm['metadata']['name']}.yaml"
        configmaps[node].write_text(yaml.safe_dump(cm))
    everything = run_cli("exporter", "--topology-file", str(topology_file), "--all-nodes", "--once")
    assert everything.returncode == 0, everything.stderr
    per_node: dict[str, str] = {}
    for node, path in sorted(configmaps.items()):
        # The same CLI, in this process: a process per node would cost a second each. The
        # first node is read from the whole List that render printed, the others from their
        # own ConfigMap.
        source = topology_file if not per_node else path
        one = _in_process(
            [
                "exporter",
                "--topology-file",
                str(source),
                "--node-name",
                node,
                "--hostname",
                node,
                "--mig-pod-labels",
                "--once",
            ],
            {},
        )
        assert one.returncode == 0, one.stderr
        per_node[node] = one.stdout
    return Rendered(render, topology, everything.stdout, per_node)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Rendered]:
    @cache
    def of(name: str) -> Rendered:
        return run(GROUPS[name], tmp_path_factory.mktemp(name))

    return of


# --- every exposition: promtool, prometheus_client, no duplicates --------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group", GROUPS)
def test_promtool_accepts_the_exposition(
    group: str, mode: str, rendered: Callable[[str], Rendered]
) -> None:
    bad = {
        what: found
        for what, text in rendered(group).text(mode)
        if (found := promtool_findings(text))
    }
    assert not bad, bad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group", GROUPS)
def test_prometheus_client_parses_the_exposition(
    group: str, mode: str, rendered: Callable[[str], Rendered]
) -> None:
    for what, text in rendered(group).text(mode):
        families = list(text_string_to_metric_families(text))
        assert families and all(f.samples for f in families), what


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("group", GROUPS)
def test_no_two_samples_share_a_label_set(
    group: str, mode: str, rendered: Callable[[str], Rendered]
) -> None:
    found = {
        what: [f"{s.name}{dict(s.labels)}" for s in dup[:3]]
        for what, text in rendered(group).text(mode)
        if (dup := duplicates(parse(text)))
    }
    assert not found, found


@pytest.mark.parametrize("group", GROUPS)
def test_render_gives_every_node_its_configmap(
    group: str, rendered: Callable[[str], Rendered]
) -> None:
    r = rendered(group)
    assert set(r.topology) == {c.name for c in GROUPS[group].cases}
    warnings = [line for line in r.render.stderr.splitlines() if line.startswith("warning:")]
    if group == "fake-gpu-operator":  # its mappings' profile ids, once per node (below)
        warnings = [w for w in warnings if "metadata.annotations[run.ai/mig-mapping]" not in w]
    assert warnings == []


@pytest.mark.parametrize("case", params(lambda c: c.group == "fake-gpu-operator"))
def test_fake_gpu_operator_profile_ids_are_reported_once_per_node(
    case: Case, rendered: Callable[[str], Rendered]
) -> None:
    """mig-faker writes profile ids as `gpu_instance_id`: one warning line per node says so."""
    lines = rendered(case.group).render.stderr.splitlines()
    mine = [line for line in lines if line.startswith(f"warning: node {case.name}: ")]
    if case.bad_mapping_ids:
        assert len(mine) == 1, mine
        assert "metadata.annotations[run.ai/mig-mapping]" in mine[0]
    else:
        assert mine == []


# --- what a user checks, node by node ------------------------------------------------------------


def gpu_model(series: list[Series]) -> str:
    return next((s.label("modelName") for s in series), "")


def dcgm_names(model_name: str) -> tuple[dict[str, str], dict[str, str]]:
    """NVML's profile names -> DCGM's (the default generation's GPU_I_PROFILE), and back (a
    `+me` profile shares its base profile's DCGM name: back to the base)."""
    model = model_for_product(model_name.replace(" ", "-"))
    if model is None:
        return {}, {}
    model = model.for_driver(dcgm.DEFAULT_DRIVER_VERSION)
    named = {p.name: dcgm.profile_label(DEFAULT, p.name, p.compute_slices, p.memory_mib)
             for p in model.profiles}  # fmt: skip
    back = {label: name for name, label in reversed(named.items())}
    return named, back


def gpu_problems(case: Case, series: list[Series]) -> list[str]:
    """The node's GPUs; one series per MIG instance with its profile and GI id; (GPU, GI) once
    per family; the GI ids those the driver gives, decoding to a placement that fits (the
    producer's, if it chose one), in one orientation per GPU."""
    problems = []
    gpus = sorted({int(s.label("gpu")) for s in series})
    if gpus != list(range(len(case.gpus))):
        problems.append(f"GPUs {gpus}, expected {len(case.gpus)}")
    for index, want in enumerate(case.gpus):
        gpu = str(index)
        mine = [s for s in series if s.label("gpu") == gpu]
        if not by_name(mine, SM_CLOCK):
            problems.append(f"GPU {gpu}: no series")
        fb = by_name(mine, FB_USED)
        instances = [s for s in fb if "GPU_I_PROFILE" in s.label_names]
        if not want.mig:
            if len(fb) != 1 or instances:
                problems.append(f"GPU {gpu}: MIG off, expected one {FB_USED}, got {len(fb)}")
            continue
        if len(instances) != len(fb) or any("GPU_I_ID" not in s.label_names for s in fb):
            problems.append(f"GPU {gpu}: a series without GPU_I_PROFILE and GPU_I_ID")
        # The default generation names a profile as DCGM does (`7g.79gb` for NVML's 7g.80gb).
        named, nvml_name = dcgm_names(mine[0].label("modelName"))
        got = Counter(s.label("GPU_I_PROFILE") for s in instances)
        expected: Counter[str] = Counter()
        for p, n in want.counts.items():
            expected[named.get(p, p)] += n
        if got != expected:
            problems.append(f"GPU {gpu}: instances {dict(got)}, expected {dict(expected)}")
        repeated = [
            name for name in sorted({s.name for s in mine}) if repeats_gi(by_name(mine, name))
        ]
        if repeated:
            ids = sorted(s.label("GPU_I_ID") for s in instances)
            problems.append(
                f"GPU {gpu}: GPU_I_ID repeated in {len(repeated)} families ({repeated[0]} ...): {ids}"
            )
        pairs = [(nvml_name.get(p, p), int(s.label("GPU_I_ID")))
                 for s in instances for p in [s.label("GPU_I_PROFILE")]]  # fmt: skip
        placed = None if want.placed is None else tuple(
            (start, nvml_name.get(named.get(p, p), p)) for start, p in want.placed)  # fmt: skip
        if not any(
            fitting(case.model, pairs, swapped, placed) for swapped in orientations(case.model)
        ):
            problems.append(
                f"GPU {gpu}: (profile, GI) {sorted(pairs)} are no placement of "
                f"{sorted(want.placed) if want.placed else 'the layout'}"
            )
    return problems


def repeats_gi(series: list[Series]) -> bool:
    ids = [s.label("GPU_I_ID") for s in series if "GPU_I_ID" in s.label_names]
    return len(ids) != len(set(ids))


def fitting(
    model: RefModel, pairs: list[tuple[str, int]], swapped: bool, placed: Layout | None
) -> bool:
    starts = [start_of(model, model.profiles[p], gi, swapped) for p, gi in pairs]
    layout = tuple((s, p) for s, (p, _) in zip(starts, pairs, strict=True) if s is not None)
    if len(layout) < len(pairs) or not fits(model, layout):
        return False
    return placed is None or sorted(layout) == sorted(placed)


@pytest.mark.parametrize("case", params())
def test_one_series_per_instance_with_gi_ids_the_driver_gives(
    case: Case, rendered: Callable[[str], Rendered]
) -> None:
    problems = gpu_problems(case, rendered(case.group).by_node[case.name])
    assert not problems, problems


@pytest.mark.parametrize("case", params(lambda c: c.uuids))
def test_every_mapped_device_uuid_is_kept_and_has_one_series(
    case: Case, rendered: Callable[[str], Rendered]
) -> None:
    r = rendered(case.group)
    problems = uuid_problems(case, r.topology[case.name], r.by_node[case.name])
    assert not problems, problems


def uuid_problems(case: Case, topology: Mapping[str, Any], series: list[Series]) -> list[str]:
    fb = by_name(series, FB_USED)
    problems = []
    for (index, start), uuid in sorted(case.uuids.items()):
        gpu = topology["gpus"][index]
        devices = [d for d in gpu.get("mig-devices") or () if d["position"] == start]
        if [d.get("id") for d in devices] != [uuid]:
            problems.append(f"GPU {index} at {start}: {uuid} not kept ({devices})")
            continue
        (dev,) = devices
        labels = {
            ("UUID", gpu["id"]),
            ("GPU_I_PROFILE", dcgm_names(gpu_model(series))[0].get(dev["name"], dev["name"])),
            ("GPU_I_ID", str(dev["gpu-instance-id"])),
        }
        found = [s for s in fb if labels <= set(s.labels)]
        if len(found) != 1:
            problems.append(
                f"{uuid} (GPU {index}, GI {dev['gpu-instance-id']}): {len(found)} series"
            )
    return problems


def pod_problems(case: Case, topology: Mapping[str, Any], series: list[Series]) -> list[str]:
    fb = by_name(series, FB_USED)
    problems = []
    for want in case.pods:
        held = [
            s
            for s in fb
            if (s.label("namespace"), s.label("pod"), s.label("container"))
            == (want.namespace, want.pod, want.container)
        ]
        profiles = {
            s.label("GPU_I_PROFILE") if "GPU_I_PROFILE" in s.label_names else None for s in held
        }
        named = dcgm_names(gpu_model(series))[0]
        expected = named.get(want.profile, want.profile) if want.profile else want.profile
        if len(held) != want.count or profiles != {expected}:
            problems.append(
                f"{want.pod}/{want.container}: {len(held)} x {profiles}, expected "
                f"{want.count} x {expected}"
            )
        if want.at is not None and held:
            index, start = want.at
            devices = topology["gpus"][index].get("mig-devices") or ()
            (dev,) = [d for d in devices if d["position"] == start]
            holder = dev.get("status", {}).get("allocated-by", {}).get("pod")
            if holder != want.pod or held[0].label("gpu") != str(index):
                problems.append(f"{want.pod}: not on GPU {index} at {start} ({holder})")
    return problems


@pytest.mark.parametrize("case", params(lambda c: c.pods))
def test_each_pod_holds_what_it_asked_for(case: Case, rendered: Callable[[str], Rendered]) -> None:
    """On the node's own exporter, run with `--mig-pod-labels` so that run:ai's instances name
    their holders too; and on `--all-nodes`, where static MIG names them by default, as
    dcgm-exporter does through the kubelet."""
    r = rendered(case.group)
    problems = pod_problems(case, r.topology[case.name], r.own[case.name])
    if case.group == "gpu-operator":
        problems += [
            f"--all-nodes: {p}"
            for p in pod_problems(case, r.topology[case.name], r.by_node[case.name])
        ]
    assert not problems, problems


@pytest.mark.parametrize("case", params())
def test_the_node_exporter_serves_the_series_all_nodes_serves(
    case: Case, rendered: Callable[[str], Rendered]
) -> None:
    """The same series from the node's own exporter as from `--all-nodes` (values move with
    time, and only the node's own names the holders of dynamic-MIG instances)."""
    r = rendered(case.group)

    def keys(series: list[Series]) -> Counter[tuple[str, frozenset[tuple[str, str]]]]:
        return Counter(
            (s.name, frozenset(kv for kv in s.labels if kv[0] not in POD_LABELS)) for s in series
        )

    assert keys(r.own[case.name]) == keys(r.by_node[case.name])


# --- generated: any layout run:ai may ask of a fake-gpu-operator node ----------------------------


@st.composite
def gpu_layouts(draw: st.DrawFn, model: RefModel, table: Mapping[str, int]) -> Layout | None:
    """A layout of one GPU: profiles of the fake operator's table, each at a start that fits
    beside the ones before, listed in the order drawn; or MIG off."""
    if draw(st.integers(0, 9)) == 0:
        return None
    layout: Layout = ()
    for name in draw(st.lists(st.sampled_from(sorted(table)), max_size=7)):
        starts = [s for s in model.profiles[name].placements if fits(model, (*layout, (s, name)))]
        if starts:
            layout = (*layout, (draw(st.sampled_from(starts)), name))
    return layout


@settings(derandomize=True, max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_generated_fake_gpu_operator_nodes(data: st.DataObject) -> None:
    pool = data.draw(st.sampled_from([FGO_A100, FGO_H100, FGO_A100_80GB]))
    model = reference_model(pool.model)
    table = fgo_table(sanitize_label_value(pool.gpu_product))
    layouts = data.draw(st.lists(gpu_layouts(model, table), min_size=1, max_size=4))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    case, node, pods = fgo_case("fgo-generated", pool, layouts, rng)
    state = ClusterState.of([node], pods)
    assert "fgo-generated" in state.topology().nodes, state.all_warnings()
    topology = state.topology().nodes["fgo-generated"]
    series = parse(dcgm.render(topology, dcgm.Options(hostname="fgo-generated"), 0.0).decode())
    assert not duplicates(series)
    assert not gpu_problems(case, series)
    entry = {
        "gpus": [
            {
                "id": g.id,
                "mig-devices": [
                    {
                        "id": d.id,
                        "name": d.name,
                        "position": d.position,
                        "gpu-instance-id": d.gpu_instance_id,
                    }
                    for d in g.mig_devices or ()
                ],
            }
            for g in topology.gpus
        ]
    }
    assert not uuid_problems(case, entry, series)


# --- the producers themselves --------------------------------------------------------------------


class Draws(random.Random):
    """A `random.Random` whose 128-bit draws are given: the uuids a test wants."""

    def __init__(self, uuids: Iterable[str]) -> None:
        super().__init__(0)
        self.draws = iter(int(u.replace("-", ""), 16) for u in uuids)

    def getrandbits(self, k: int) -> int:
        return next(self.draws)


# fake-gpu-operator's facts (its migfaker.go, written out in the project's research notes): the
# annotation mig-faker writes for this config on an A100-40GB, with these uuids.
FGO_EXAMPLE_LAYOUT: Layout = ((0, "2g.10gb"), (2, "1g.5gb"), (3, "1g.5gb"), (4, "3g.20gb"))
FGO_EXAMPLE_UUIDS = (
    "3f2c1a9e-7b4d-4c1e-9a2f-5d8e6b0c1a23",
    "a1b2c3d4-e5f6-4789-8abc-def012345678",
    "0f9e8d7c-6b5a-4321-bcde-f0123456789a",
    "9c8b7a65-4321-4fed-8cba-0987654321fe",
)
FGO_EXAMPLE_MAPPING = (
    "eyIwIjpbeyJwb3NpdGlvbiI6MCwiZGV2aWNlX3V1aWQiOiJNSUctM2YyYzFhOWUtN2I0ZC00YzFlLTlhMmYtNWQ4ZTZi"
    "MGMxYTIzIiwiZ3B1X2luc3RhbmNlX2lkIjoxNH0seyJwb3NpdGlvbiI6MiwiZGV2aWNlX3V1aWQiOiJNSUctYTFiMmMz"
    "ZDQtZTVmNi00Nzg5LThhYmMtZGVmMDEyMzQ1Njc4IiwiZ3B1X2luc3RhbmNlX2lkIjoxOX0seyJwb3NpdGlvbiI6Mywi"
    "ZGV2aWNlX3V1aWQiOiJNSUctMGY5ZThkN2MtNmI1YS00MzIxLWJjZGUtZjAxMjM0NTY3ODlhIiwiZ3B1X2luc3RhbmNl"
    "X2lkIjoxOX0seyJwb3NpdGlvbiI6NCwiZGV2aWNlX3V1aWQiOiJNSUctOWM4YjdhNjUtNDMyMS00ZmVkLThjYmEtMDk4"
    "NzY1NDMyMWZlIiwiZ3B1X2luc3RhbmNlX2lkIjo5fV19"
)


def test_the_mapping_is_the_one_mig_faker_writes() -> None:
    product = sanitize_label_value(FGO_A100.gpu_product)
    mapping = fgo_mapping(product, {0: FGO_EXAMPLE_LAYOUT}, Draws(FGO_EXAMPLE_UUIDS))
    assert mapping == FGO_EXAMPLE_MAPPING


def test_the_producers_draw_version_4_uuids_from_the_seed() -> None:
    node = fgo_node("n", FGO_A100, {0: FGO_EXAMPLE_LAYOUT}, random.Random(1))
    assert node == fgo_node("n", FGO_A100, {0: FGO_EXAMPLE_LAYOUT}, random.Random(1))
    assert node != fgo_node("n", FGO_A100, {0: FGO_EXAMPLE_LAYOUT}, random.Random(2))
    (entries,) = read_mig_mapping(node).values()
    for e in entries:
        uuid = UUID(e["device_uuid"].removeprefix("MIG-"))
        assert (uuid.version, e["device_uuid"]) == (4, f"MIG-{uuid}")
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"


def test_every_profile_of_both_fake_gpu_operator_tables_is_covered() -> None:
    placed = {
        (c.model.key, p)
        for c in GROUPS["fake-gpu-operator"].cases
        for g in c.gpus
        for p in g.counts
    }
    for size, table in FGO_PROFILE_IDS.items():
        models = {"40GB": ("A100-40GB",), "80GB": ("A100-80GB", "H100-80GB")}[size]
        assert {(m, p) for m in models for p in table} <= placed


def test_mixed_strategy_labels_are_those_of_the_real_node() -> None:
    """GFD's labels of each profile on the real dump (all but its instance counts)."""
    (real,) = objects(SAMPLES / "nodes" / "a100-40gb-3-instances.yaml")
    ours = gpu_operator_node("n", "A100-40GB", "all-balanced", "mixed", 1, random.Random(0))
    for labels in (real, ours):
        labels["metadata"]["labels"] = {
            k: v
            for k, v in labels["metadata"]["labels"].items()
            if k.startswith(("nvidia.com/mig-1g.5gb.", "nvidia.com/mig-2g.10gb."))
            or k in ("nvidia.com/gpu.product", "nvidia.com/gpu.memory", "nvidia.com/mig.strategy")
            if not k.endswith(".count")
        }
    assert ours["metadata"]["labels"] == real["metadata"]["labels"]


def test_single_strategy_labels_are_those_the_gpu_operator_documents() -> None:
    """The GPU operator's MIG guide: one H100 after `nvidia.com/mig.config=all-1g.10gb`."""
    node = gpu_operator_node("n", "H100-80GB", "all-1g.10gb", "single", 1, random.Random(0))
    documented = {
        "nvidia.com/gpu.count": "7",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
        "nvidia.com/gpu.slices.ci": "1",
        "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.config": "all-1g.10gb",
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/mig.strategy": "single",
    }
    assert documented.items() <= node["metadata"]["labels"].items()
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "7"
