"""GPU-instance ids that are the driver's: `GPU_I_ID` is a series' identity on a MIG GPU.

fake-gpu-operator's mig-faker writes each instance's GI *profile* id into `run.ai/mig-mapping`'s
`gpu_instance_id` (19 for every 1g.5gb); a pod's `runai-mig-device` may name a GI too. Whatever
they say, the topology gives each instance an id the driver could give its profile at its
placement (either orientation of mig-profiles.md section 3), distinct on its GPU, and keeps the
mapping's device uuid; an id not taken is said once per node.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from status_updater.state import reconcile
from tests.support.base import examples
from topology.catalog import MODELS, GpuModel, Profile
from topology.errors import TopologyError
from topology.model import Gpu, MigDevice, NodeTopology, Topology
from topology.validate import errors

# fake-gpu-operator 0.2.0 (internal/migfaker/migfaker.go): profile name -> what it writes.
FGO_40GB = {"1g.5gb": 19, "1g.5gb+me": 20, "1g.10gb": 15, "2g.10gb": 14, "3g.20gb": 9,
            "4g.20gb": 5, "7g.40gb": 0}  # fmt: skip
FGO_80GB = {"1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9,
            "4g.40gb": 5, "7g.80gb": 0}  # fmt: skip
MIG_MODELS = [m for m in MODELS if m.profiles]


def model(key: str) -> GpuModel:
    (found,) = (m for m in MODELS if m.key == key)
    return found


def runai_node(
    name: str, product: str, per_gpu: list[list[tuple[int, str]]], mapping: dict[str, Any]
) -> dict[str, Any]:
    """A run:ai dynamic-MIG node as fake-gpu-operator annotates it (current formats)."""
    selected = [{"devices": [g], "mig-enabled": True,
                 "mig-devices": [{"name": p, "position": pos} for pos, p in devices]}
                for g, devices in enumerate(per_gpu)]  # fmt: skip
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(len(per_gpu)),
              "nvidia.com/mig.strategy": "mixed", "node-role.kubernetes.io/runai-dynamic-mig": "true",
              "node-role.kubernetes.io/runai-mig-enabled": "true"}  # fmt: skip
    annotations = {
        "run.ai/mig.config": json.dumps({"version": "v1", "mig-configs": {"selected": selected}}),
        "run.ai/mig-mapping": base64.b64encode(json.dumps(mapping).encode()).decode(),
    }
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
    }


def fgo_mapping(
    per_gpu: list[list[tuple[int, str]]], table: dict[str, int], rnd: random.Random
) -> dict[str, Any]:
    return {
        str(g): [{"position": pos, "device_uuid": f"MIG-{rnd.getrandbits(128):032x}",
                  "gpu_instance_id": table[p]} for pos, p in devices]
        for g, devices in enumerate(per_gpu)
    }  # fmt: skip


def layouts(m: GpuModel) -> st.SearchStrategy[list[tuple[int, str]]]:
    """A valid set of instances on one GPU: (profile, placement)s drawn in any order, each kept
    where it fits beside those kept before."""
    pairs = [(pos, p) for p in m.profiles for pos in p.placements]

    def fit(drawn: list[tuple[int, Profile]]) -> list[tuple[int, str]]:
        used: set[int] = set()
        counts: dict[str, int] = {}
        kept = []
        for pos, p in drawn:
            span = set(range(pos, pos + p.memory_slices))
            if span & used or counts.get(p.name, 0) >= p.max_count:
                continue
            used |= span
            counts[p.name] = counts.get(p.name, 0) + 1
            kept.append((pos, p.name))
        return sorted(kept)

    return st.lists(st.sampled_from(pairs), max_size=10).map(fit)


def instances(topology: Topology, name: str) -> list[list[MigDevice]]:
    return [list(g.mig_devices or ()) for g in topology.nodes[name].gpus]


def assert_the_driver_s(m: GpuModel, gpus: list[list[MigDevice]]) -> None:
    """Each instance's id is one the driver gives its profile there; a GPU's ids are distinct."""
    for devices in gpus:
        ids = [d.gpu_instance_id for d in devices]
        assert len(set(ids)) == len(ids), devices
        for d in devices:
            profile = m.profile(d.name)
            assert profile is not None
            assert d.gpu_instance_id in m.gpu_instance_ids(profile, d.position), d


@pytest.mark.parametrize(
    ("key", "product", "table"),
    [("A100-40GB", "NVIDIA-A100-SXM4-40GB", FGO_40GB), ("A100-80GB", "NVIDIA-A100-SXM4-80GB", FGO_80GB),
     ("H100-80GB", "NVIDIA-H100-80GB-HBM3", FGO_80GB)],
)  # fmt: skip
def test_fake_gpu_operator_s_profile_ids_become_the_driver_s_ids(
    key: str, product: str, table: dict[str, int]
) -> None:
    """Every profile of its tables, as many as fit: seven 1g.5gb all written as GI 19 were one
    series seven times."""
    m = model(key)
    per_gpu = []
    for name in table:
        profile = m.profile(name)
        assert profile is not None, name
        per_gpu.append([(pos, name) for pos in profile.placements[: profile.max_count]])
    mapping = fgo_mapping(per_gpu, table, random.Random(key))
    topology, warnings = reconcile([runai_node("fgo", product, per_gpu, mapping)], [])
    gpus = instances(topology, "fgo")
    assert_the_driver_s(m, gpus)
    assert [[(d.position, d.id) for d in devices] for devices in gpus] == [
        [(e["position"], e["device_uuid"]) for e in mapping[str(g)]] for g in range(len(per_gpu))
    ]
    # 7g's profile id, 0, is its GI id too: every other one was refused, said in one line.
    refused = sum(1 for devices in per_gpu for _, p in devices if table[p] != 0)
    assert [str(w) for w in warnings] == [
        f"node fgo: metadata.annotations[run.ai/mig-mapping]: {refused} gpu_instance_id value(s) "
        f"are not the GI id the driver gives that profile at that placement (GPU 0 position "
        f"{per_gpu[0][0][0]}: {table[per_gpu[0][0][1]]}; fake-gpu-operator writes profile ids): "
        "ids derived from the placements, device uuids kept"
    ]


@settings(max_examples=examples(200), deadline=None)
@given(
    st.sampled_from(MIG_MODELS).flatmap(
        lambda m: st.tuples(st.just(m), st.lists(layouts(m), min_size=1, max_size=3))
    ),
    st.data(),
)
def test_any_mapped_ids_give_distinct_driver_ids_and_keep_the_uuids(
    drawn: tuple[GpuModel, list[list[tuple[int, str]]]], data: st.DataObject
) -> None:
    """Mapped ids of every kind: profile ids, the driver's in either orientation, another
    instance's, anything. Those that are the driver's and agree on one orientation are kept."""
    m, per_gpu = drawn
    mapping: dict[str, Any] = {}
    for g, devices in enumerate(per_gpu):
        entries = []
        for pos, name in devices:
            profile = m.profile(name)
            assert profile is not None
            a, b = m.gpu_instance_ids(profile, pos)
            gi = data.draw(
                st.sampled_from([a, b, profile.profile_id, 0, 7, 1000]) | st.integers(0, 20)
            )
            entries.append(
                {"position": pos, "device_uuid": f"MIG-{g}-{pos}", "gpu_instance_id": gi}
            )
        mapping[str(g)] = entries
    topology, warnings = reconcile([runai_node("n", m.product_labels[0], per_gpu, mapping)], [])
    gpus = instances(topology, "n")
    assert_the_driver_s(m, gpus)
    assert [[d.id for d in devices] for devices in gpus] == [
        [f"MIG-{g}-{pos}" for pos, _ in devices] for g, devices in enumerate(per_gpu)
    ]
    taken = all(
        d.gpu_instance_id == e["gpu_instance_id"]
        for g, devices in enumerate(gpus)
        for d, e in zip(devices, mapping[str(g)], strict=True)
    )
    assert len(warnings) == (0 if taken else 1)
    assert all(w.field == "metadata.annotations[run.ai/mig-mapping]" for w in warnings)


def test_a_gpu_s_mapped_ids_of_one_orientation_set_the_others() -> None:
    """An A100-40GB (half-swapped in the catalog) whose mapping shows the other orientation:
    its unmapped-id instances follow that orientation, so none takes a mapped one's id."""
    m = model("A100-40GB")
    devices = [(0, "2g.10gb"), (4, "2g.10gb")]
    # Orientation A: 2g@0 -> 3; the catalog's own (B) would give 2g@4 the id 3 as well.
    mapping = {"0": [{"position": 0, "device_uuid": "MIG-a", "gpu_instance_id": 3},
                     {"position": 4, "device_uuid": "MIG-b", "gpu_instance_id": 99}]}  # fmt: skip
    topology, warnings = reconcile(
        [runai_node("n", "NVIDIA-A100-SXM4-40GB", [devices], mapping)], []
    )
    (gpu,) = instances(topology, "n")
    assert [(d.position, d.gpu_instance_id) for d in gpu] == [(0, 3), (4, 5)]
    assert_the_driver_s(m, [gpu])
    assert len(warnings) == 1 and "GPU 0 position 4: 99" in str(warnings[0])
    # Both orientations at once is no real GPU: the catalog's orientation for all.
    mapping["0"][1]["gpu_instance_id"] = 3  # 2g@4 in orientation B
    topology, warnings = reconcile(
        [runai_node("n", "NVIDIA-A100-SXM4-40GB", [devices], mapping)], []
    )
    (gpu,) = instances(topology, "n")
    assert [(d.position, d.gpu_instance_id) for d in gpu] == [(0, 5), (4, 3)]
    assert str(warnings[0]).split(": ", 2)[2].startswith("1 gpu_instance_id value(s)")


def mig_pod(name: str, gpu: int, position: int, profile: str, **device: object) -> dict[str, Any]:
    annotation = {
        "name": f"nvidia.com/mig-{profile}",
        "position": position,
        "gpuindex": gpu,
    } | device
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "creationTimestamp": f"2026-01-01T00:00:0{len(name) % 10}Z",
                         "annotations": {"runai-mig-device": json.dumps(annotation)}},
            "spec": {"nodeName": "n", "containers": [{"name": "main"}]},
            "status": {"phase": "Running"}}  # fmt: skip


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(0, 20)), max_size=7, unique_by=lambda x: x[0])
)
def test_a_pod_s_annotation_never_gives_an_id_the_driver_would_not_or_a_taken_one(
    claims: list[tuple[int, int]],
) -> None:
    """Pods on 1g.5gb instances the mapping has not named yet, each naming a uuid and a GI."""
    m = model("A100-40GB")
    devices = [(pos, "1g.5gb") for pos in range(7)]
    node = runai_node("n", "NVIDIA-A100-SXM4-40GB", [devices], {})
    pods = [mig_pod(f"p{pos}", 0, pos, "1g.5gb", deviceUUID=f"MIG-p{pos}", gpuinstanceid=gi)
            for pos, gi in claims]  # fmt: skip
    topology, warnings = reconcile([node], pods)
    (gpu,) = instances(topology, "n")
    assert_the_driver_s(m, [gpu])
    assert {d.id for d in gpu if d.id} == {f"MIG-p{pos}" for pos, _ in claims}
    kept = {d.position: d.gpu_instance_id for d in gpu}
    for pos, gi in claims:
        said = [w for w in warnings if w.obj == f"pod team/p{pos}"]
        assert (kept[pos] == gi) != bool(said), (pos, gi, said)
        assert all(w.field == "metadata.annotations[runai-mig-device].gpuinstanceid" for w in said)


def test_a_pod_naming_a_neighbour_s_gi_is_told_and_the_ids_stay_distinct() -> None:
    devices = [(4, "1g.5gb"), (5, "1g.5gb")]  # the catalog (half-swapped): GI 7 and 8
    pods = [mig_pod("late", 0, 5, "1g.5gb", deviceUUID="MIG-x", gpuinstanceid=7)]
    topology, warnings = reconcile([runai_node("n", "NVIDIA-A100-SXM4-40GB", [devices], {})], pods)
    (gpu,) = instances(topology, "n")
    assert [(d.position, d.gpu_instance_id, d.id) for d in gpu] == [(4, 7, None), (5, 8, "MIG-x")]
    assert [str(w) for w in warnings] == [
        "pod team/late: metadata.annotations[runai-mig-device].gpuinstanceid: 7 is not the GI id "
        "the driver gives 1g.5gb at position 5, or is another instance's: 8 kept"
    ]


def test_a_topology_with_one_gi_id_twice_on_a_gpu_is_refused_naming_the_field() -> None:
    """The exporter's side: a topology written by hand (or by an older updater) with two
    instances of one GI id is that node's error, not two series with one label set."""
    twice = (MigDevice("1g.5gb", 4, 7), MigDevice("1g.5gb", 5, 7))
    node = NodeTopology(1, 40960, "NVIDIA-A100-SXM4-40GB", True, (Gpu("GPU-x", None, twice),))
    assert errors(Topology("mixed", {"n": node})) == [
        TopologyError("node n", "gpus[0].mig-devices[1].gpu-instance-id", "7 is also 1g.5gb@4's")
    ]
    other_gpu = (Gpu("GPU-x", None, twice[:1]), Gpu("GPU-y", None, twice[1:]))
    node = NodeTopology(2, 40960, "NVIDIA-A100-SXM4-40GB", True, other_gpu)
    assert errors(Topology("mixed", {"n": node})) == []  # (GPU, GI): another GPU may have it
