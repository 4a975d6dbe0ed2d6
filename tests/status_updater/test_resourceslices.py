"""The ResourceSlices the NVIDIA DRA driver would publish, against its code's facts (dra.md) and the
Kubernetes schema."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from status_updater.devices import build_node
from status_updater.dra import DYNAMIC, DraOptions, node_slimmer
from status_updater.objects import slim_node
from status_updater.resourceslices import node_slices, quantity, slice_name
from status_updater.slicewriter import _Templates, _Text
from tests.support.allocator import Allocator
from tests.support.base import SAMPLES, examples, run_cli
from topology import dra
from topology.catalog import MODELS, GpuModel
from topology.errors import TopologyError

A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "1"}
ON = {"nvidia.com/mig.config": "all-enabled", "nvidia.com/mig.strategy": "mixed"}
# resource.k8s.io/v1 is GA from 1.34; counters in their own slice from 1.35; list attributes
# from 1.36.
KUBE_VERSIONS = ("1.35", "1.37")


def gpu_node(
    name: str,
    product: str,
    count: int = 1,
    layout: str | None = None,
    dynamic: bool = False,
    **labels: str,
) -> dict[str, Any]:
    """The Node as the updater keeps it, its DRA driver running DynamicMIG where `dynamic`."""
    found = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count), **labels}
    if layout is not None:
        found |= {"nvidia.com/mig.config": layout, "nvidia.com/mig.strategy": "mixed"}
    meta = {"name": name, "uid": f"uid-{name}", "labels": found}
    return node_slimmer(DraOptions("", dynamic_mig=dynamic))({"kind": "Node", "metadata": meta})


def slices(node: dict[str, Any], dynamic: bool = False, **options: Any) -> list[dict[str, Any]]:
    if dynamic and DYNAMIC not in node:
        node = {**node, DYNAMIC: True}
    return node_slices(node, build_node(node), dynamic=dynamic, **options)


def devices(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in found for d in s["spec"].get("devices", [])}


def values(entries: dict[str, dict[str, str]]) -> dict[str, str]:
    return {k: v["value"] for k, v in entries.items()}


def product(model: GpuModel) -> str:
    return model.product_labels[0]


def sample_nodes() -> list[dict[str, Any]]:
    found = []
    for path in sorted((SAMPLES / "static" / "nodes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for obj in doc.get("items", [doc]):
                found.append(slim_node(obj))
    return found


# MIG states a node's layout gives: off, on without instances, a layout's instances, a mixed
# layout; with a GPU count past what one slice or counter slice holds.
STATES = (("whole", None, 2), ("all-enabled", "all-enabled", 9), ("balanced", "all-balanced", 2),
          ("1g", "all-1g.5gb", 20))  # fmt: skip


def cases() -> list[Any]:
    found = [(n["metadata"]["name"], n) for n in sample_nodes()]
    for m in MODELS:
        for what, layout, count in STATES:
            found.append((f"{m.key}-{what}", gpu_node("n", product(m), count, layout)))
    return [
        pytest.param(node, mode, id=f"{what}-{mode}")
        for what, node in found
        for mode in ("static", "dynamic-split", "dynamic-combined", "dynamic-lists")
    ]


def mode_options(mode: str) -> dict[str, Any]:
    return {"dynamic": mode != "static", "layout": "combined" if "combined" in mode else "split",
            "list_attributes": mode.endswith("lists")}  # fmt: skip


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize(("node", "mode"), cases())
def test_every_slice_is_valid_for_the_api(node: dict[str, Any], mode: str, version: str) -> None:
    """Any model, MIG state and slice layout: valid slices, within the API's per-slice limits
    (64 devices where they consume counters, else 128; 8 counter sets), every device once, and
    as many slices as the pool says."""
    try:
        found = slices(node, **mode_options(mode))
    except TopologyError:
        assert mode == "static"  # a layout a model has no profiles for is the node's problem
        return
    if mode.endswith("lists") and version < "1.36":
        version = "1.36"  # list attributes (the driver's DRAListTypeAttributes) are 1.36's
    for s in found:
        try:
            kubernetes_validate.validate(s, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{'.'.join(map(str, e.path))}: {e.message}", pytrace=False)
        listed = s["spec"].get("devices", [])
        consuming = any("consumesCounters" in d for d in listed)
        assert len(listed) <= (64 if consuming else 128)
        assert len(s["spec"].get("sharedCounters", [])) <= 8
    names = [d for s in found for d in (x["name"] for x in s["spec"].get("devices", []))]
    assert len(names) == len(set(names)), "a device name twice in one pool"
    pool = {(s["spec"]["pool"]["name"], s["spec"]["pool"]["resourceSliceCount"]) for s in found}
    assert pool == {(node["metadata"]["name"], len(found))}
    if mode == "static":  # every instance of every GPU is there
        built = build_node(node).gpus
        assert len(names) == sum(1 if g.mig_devices is None else len(g.mig_devices) for g in built)


def test_a_static_pool_past_one_slices_limit_loses_no_device() -> None:
    """The driver publishes one slice; past the API's 128 devices it would fail, and the updater
    goes on in a second slice, every instance once."""
    node = gpu_node("n", "NVIDIA-A100-SXM4-40GB", 24, "all-1g.5gb")  # 168 instances
    found = slices(node)
    assert [len(s["spec"]["devices"]) for s in found] == [128, 40]
    assert len(devices(found)) == 24 * 7
    alone = slices(gpu_node("n", "NVIDIA-A100-SXM4-40GB", 16, "all-1g.5gb"))
    assert [len(s["spec"]["devices"]) for s in alone] == [112]  # the driver's one slice


def test_the_layouts_are_the_drivers_by_kubernetes_version() -> None:
    """Split (1.35+): every counter set first, then a slice per GPU; combined (1.34): a slice per
    GPU holding its own counter set (driver.go, generateSplit/CombinedResourceSlices)."""
    node = gpu_node("n", "NVIDIA-H100-80GB-HBM3", 2, "all-enabled", dynamic=True)
    split = slices(node, dynamic=True)
    assert [sorted(s["spec"]) for s in split] == [
        ["driver", "nodeName", "pool", "sharedCounters"],
        ["devices", "driver", "nodeName", "pool"],
        ["devices", "driver", "nodeName", "pool"],
    ]
    assert [c["name"] for c in split[0]["spec"]["sharedCounters"]] == [
        "gpu-0-counter-set", "gpu-1-counter-set"]  # fmt: skip
    combined = slices(node, dynamic=True, layout="combined")
    assert len(combined) == 2
    for g, s in enumerate(combined):
        assert [c["name"] for c in s["spec"]["sharedCounters"]] == [f"gpu-{g}-counter-set"]
        assert s["spec"]["devices"] == split[g + 1]["spec"]["devices"]
        assert s["spec"]["pool"]["resourceSliceCount"] == 2


def test_an_a100_with_mig_off_under_dynamic_mig_is_whole_after_an_empty_counter_slice() -> None:
    node = gpu_node("n", "NVIDIA-A100-SXM4-40GB", 1, "all-disabled", dynamic=True)
    found = slices(node, dynamic=True)
    assert [sorted(s["spec"]) for s in found] == [
        ["driver", "nodeName", "pool"], ["devices", "driver", "nodeName", "pool"]]  # fmt: skip
    (gpu,) = found[1]["spec"]["devices"]
    assert gpu["name"] == "gpu-0" and values(gpu["capacity"]) == {"memory": "40Gi"}
    assert "consumesCounters" not in gpu


@pytest.mark.parametrize("model", [m for m in MODELS if m.mig_toggles_without_reset],
                         ids=lambda m: m.key)  # fmt: skip
@pytest.mark.parametrize("layout", ["all-disabled", "all-enabled", "all-balanced"])
def test_a_gpu_whose_mig_toggles_offers_itself_and_every_partition_in_any_mig_mode(
    model: GpuModel, layout: str
) -> None:
    """The driver's isDynamicMIGCapable: Hopper and newer, MIG on or off, whole and every
    profile at every placement, with the counter set."""
    node = gpu_node("n", product(model), 1, layout, dynamic=True)
    found = devices(slices(node, dynamic=True))
    expected = {"gpu-0"} | {dra.mig_device(0, p, start) for p in model.profiles
                            for start in p.placements}  # fmt: skip
    assert set(found) == expected
    assert all("consumesCounters" in d for d in found.values())


def test_the_pcie_tree_is_stable_per_gpu_and_agrees_with_the_bus_ids() -> None:
    """pcieRoot is the root complex of the GPU's bus (same domain, two GPUs a root), numaNode
    four GPUs a socket; MIG devices carry their parent's; the list form under the gate."""
    node = gpu_node("n", "NVIDIA-H100-80GB-HBM3", 16, "all-enabled", dynamic=True)
    found = devices(slices(node, dynamic=True))
    for name, d in found.items():
        a = d["attributes"]
        g = int(name.split("-")[1])
        bus = a["resource.kubernetes.io/pciBusID"]["string"]
        root = a["resource.kubernetes.io/pcieRoot"]["string"]
        assert bus == dra.resource_pci_bus_id(g)
        assert re.fullmatch(r"pci[0-9a-f]{4}:[0-9a-f]{2}", root) and root[3:7] == bus[:4]
        assert int(root[-2:], 16) <= int(bus[5:7], 16)  # the root bus is at or below the GPU's
        assert root == dra.pcie_root(g ^ 1)  # its pair shares it
        assert a["resource.kubernetes.io/numaNode"] == {"int": (g % 8) // 4}
    roots = {d["attributes"]["resource.kubernetes.io/pcieRoot"]["string"] for d in found.values()}
    assert len(roots) == 8  # 16 GPUs, two a root
    lists = devices(slices(node, dynamic=True, list_attributes=True))
    assert lists["gpu-5"]["attributes"]["resource.kubernetes.io/numaNode"] == {"ints": [1]}


def test_a_static_mig_instance_is_the_drivers_device() -> None:
    """dra.md's example: an A100-40GB 1g.5gb at placement 4, with the node's driver labels."""
    labels = {
        "nvidia.com/cuda.driver.major": "570",
        "nvidia.com/cuda.driver.minor": "172",
        "nvidia.com/cuda.driver.rev": "08",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "8",
    }
    node = gpu_node("node-a", "NVIDIA-A100-SXM4-40GB", 1, "all-1g.5gb", **labels)
    found = slices(node)
    assert len(found) == 1
    meta = found[0]["metadata"]
    assert meta["name"] == "00000-gpu.nvidia.com-node-a"
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-node-a",
         "controller": True}
    ]  # fmt: skip
    spec = found[0]["spec"]
    assert (spec["driver"], spec["nodeName"]) == ("gpu.nvidia.com", "node-a")
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    device = devices(found)["gpu-0-mig-1g5gb-19-4"]
    gpu = build_node(node).gpus[0]
    instance = next(m for m in gpu.mig_devices or () if m.position == 4)
    assert device["attributes"] == {
        "addressingMode": {"string": "HMM"},
        "architecture": {"string": "Ampere"},
        "brand": {"string": "Nvidia"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "cudaDriverVersion": {"version": "12.8.0"},
        "driverVersion": {"version": "570.172.8"},
        "parentUUID": {"string": gpu.id},
        "productName": {"string": "NVIDIA A100-SXM4-40GB"},
        "profile": {"string": "1g.5gb"},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "type": {"string": "mig"},
        "uuid": {"string": instance.id},
    }
    assert values(device["capacity"]) == {
        "copyEngines": "1", "decoders": "0", "encoders": "0", "jpegEngines": "0",
        "memory": "4864Mi", "memorySlice4": "1", "multiprocessors": "14", "ofaEngines": "0",
    }  # fmt: skip
    assert "consumesCounters" not in device
    assert len(devices(found)) == 7  # all-1g.5gb: seven instances, no whole GPU


def test_a_gpu_with_mig_off_is_one_device_with_its_memory() -> None:
    found = devices(slices(gpu_node("w", "NVIDIA-A100-SXM4-40GB", 2)))
    assert set(found) == {"gpu-0", "gpu-1"}
    gpu = found["gpu-1"]
    assert gpu["attributes"]["type"] == {"string": "gpu"}
    assert gpu["attributes"]["uuid"]["string"].startswith("GPU-")
    assert gpu["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": "0000:0f:00.0"}
    assert values(gpu["capacity"]) == {"memory": "40Gi"}


def test_dynamic_mig_on_an_a100_is_every_partition_and_its_counters() -> None:
    """25 partitions per GPU (7 + 7 +me, 4 two-slice 1g, 3 2g, 2 3g, 1 4g, 1 7g), no whole GPU (an
    Ampere GPU with MIG on is not offered whole); the counter set is the largest of each capacity
    over the profiles (memory: the 7g's, not the GPU's 40960 MiB). Without driver labels the
    node has a driver the DRA driver supports (580.65.06), whose memory a real A100-40GB slice
    shows (Kueue #10283): counter set 40320Mi, 1g.10gb 9984Mi, 7g.40gb 40320Mi."""
    found = slices(gpu_node("d", "NVIDIA-A100-SXM4-40GB", 2, "all-enabled"), dynamic=True)
    counters = found[0]["spec"]["sharedCounters"]
    assert [c["name"] for c in counters] == ["gpu-0-counter-set", "gpu-1-counter-set"]
    assert "devices" not in found[0]["spec"]
    assert values(counters[0]["counters"]) == {
        "copy-engines": "7", "decoders": "5", "encoders": "0", "jpeg-engines": "1",
        "memory": "40320Mi", "multiprocessors": "98", "ofa-engines": "1",
        **{f"memory-slice-{i}": "1" for i in range(8)},
    }  # fmt: skip
    found_devices = devices(found)
    for name, memory in (("gpu-0-mig-1g10gb-15-0", "9984Mi"), ("gpu-0-mig-7g40gb-0-0", "40320Mi")):
        (consumed,) = found_devices[name]["consumesCounters"]
        assert values(consumed["counters"])["memory"] == memory
        assert values(found_devices[name]["capacity"])["memory"] == memory
    assert found_devices["gpu-0-mig-1g10gb-15-0"]["attributes"]["driverVersion"] == {
        "version": "580.65.6"
    }
    per_gpu = [s["spec"]["devices"] for s in found[1:]]
    assert [len(d) for d in per_gpu] == [25, 25]
    assert all(d["name"].startswith("gpu-1-mig-") for d in per_gpu[1])
    device = devices(found)["gpu-0-mig-3g20gb-9-4"]
    assert "uuid" not in device["attributes"]
    assert not any(k.startswith("memorySlice") for k in device["capacity"])
    (consumed,) = device["consumesCounters"]
    assert consumed["counterSet"] == "gpu-0-counter-set"
    assert values(consumed["counters"]) == {
        "copy-engines": "3", "decoders": "2", "encoders": "0", "jpeg-engines": "0",
        "memory": "20096Mi", "multiprocessors": "42", "ofa-engines": "0",
        **{f"memory-slice-{i}": "1" for i in range(4, 8)},
    }  # fmt: skip


@pytest.mark.parametrize(("major", "memory"), [("520", "40192Mi"), ("565", "40320Mi"),
                                               ("580", "40320Mi")])  # fmt: skip
def test_the_nodes_driver_picks_the_profiles_memory(major: str, memory: str) -> None:
    """GFD's driver labels: an R520 node's 7g.40gb is 40192 MiB, a 565+ one's 40320 MiB."""
    labels = {"nvidia.com/cuda.driver.major": major, "nvidia.com/cuda.driver.minor": "1"}
    node = gpu_node("d", "NVIDIA-A100-SXM4-40GB", 1, "all-enabled", **labels)
    found = devices(slices(node, dynamic=True))
    assert values(found["gpu-0-mig-7g40gb-0-0"]["capacity"])["memory"] == memory


def test_dynamic_mig_on_an_h100_also_offers_the_whole_gpu_consuming_everything() -> None:
    found = slices(gpu_node("h", "NVIDIA-H100-80GB-HBM3", 1, "all-enabled"), dynamic=True)
    counters = found[0]["spec"]["sharedCounters"][0]["counters"]
    whole = devices(found)["gpu-0"]
    assert len(devices(found)) == 26
    assert whole["attributes"]["type"] == {"string": "gpu"}
    assert whole["consumesCounters"][0]["counters"] == counters
    assert values(whole["capacity"]) == {
        "copyEngines": "8", "decoders": "7", "encoders": "0", "jpegEngines": "7",
        "memory": "81152Mi", "multiprocessors": "132", "ofaEngines": "1",
    }  # fmt: skip


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_every_profile_at_every_placement_is_offered_with_the_catalogs_capacities(
    model: GpuModel,
) -> None:
    found = devices(slices(gpu_node("c", product(model), 1, "all-enabled"), dynamic=True))
    for p in model.for_driver(dra.DRA_DRIVER).profiles:
        for start in p.placements:
            device = found[dra.mig_device(0, p, start)]
            assert device["attributes"]["profile"] == {"string": p.name}
            capacity = values(device["capacity"])
            assert capacity["memory"] == quantity(p.memory_mib * 2**20)
            assert capacity["multiprocessors"] == str(p.engines.multiprocessors)
            slices_held = {
                k for k in device["consumesCounters"][0]["counters"] if k.startswith("memory-slice")
            }
            assert slices_held == {
                f"memory-slice-{i}" for i in range(start, start + p.memory_slices)
            }


def test_quantities_are_canonical_binary_si() -> None:
    assert [quantity(n) for n in (0, 1, 14, 1024, 4864 * 2**20, 40960 * 2**20)] == [
        "0", "1", "14", "1Ki", "4864Mi", "40Gi",
    ]  # fmt: skip


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest.mark.parametrize("node", ["n" * 250, "GPU_Node.Upper", "..", "node-a"])
def test_every_node_name_gives_a_valid_slice_name(node: str) -> None:
    """As long as a node's name may be, and what a file may hold that the API would not."""
    name = slice_name(node, 3)
    assert len(name) <= 253 and _SUBDOMAIN.fullmatch(name) and name.startswith("00003-gpu.")
    assert name != slice_name(node + "x", 3)
    assert slice_name("node-a", 0) == "00000-gpu.nvidia.com-node-a"


def render_slices(*args: str, env: dict[str, str] | None = None) -> tuple[list[Any], str]:
    done = run_cli("status_updater", "render", "--resource-slices", *args, env=env)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)["items"], done.stderr


def test_render_prints_the_slices_of_the_selected_gpu_nodes(tmp_path: Path) -> None:
    nodes = [
        {"kind": "Node", "metadata": {"name": "kwok-1", "labels": {"type": "kwok", **A100}}},
        {"kind": "Node", "metadata": {"name": "real-1", "labels": {"type": "real", **A100, **ON}}},
        {"kind": "Node", "metadata": {"name": "cpu-1", "labels": {"type": "kwok"}}},
    ]
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump_all(nodes))
    found, _ = render_slices("--nodes", str(path), "--dra-node-selector", "type=kwok")
    assert [s["spec"]["nodeName"] for s in found] == ["kwok-1"]
    assert "ownerReferences" not in found[0]["metadata"]  # no uid in the file
    everything, _ = render_slices("--nodes", str(path))  # no selector: every GPU node
    assert sorted(s["spec"]["nodeName"] for s in everything) == ["kwok-1", "real-1"]
    env = {"DRA_NODE_SELECTOR": "type=real", "DRA_DYNAMIC_MIG": "true"}
    dynamic, _ = render_slices("--nodes", str(path), env=env)
    assert [s["spec"]["nodeName"] for s in dynamic] == ["real-1", "real-1"]  # counters, GPU
    assert dynamic[0]["spec"]["sharedCounters"][0]["name"] == "gpu-0-counter-set"


def test_render_names_a_node_without_slices_and_prints_the_others(tmp_path: Path) -> None:
    bad = {**A100, "nvidia.com/cuda.driver.major": "five"}
    nodes = [
        {"kind": "Node", "metadata": {"name": "bad", "labels": bad}},
        {"kind": "Node", "metadata": {"name": "good", "labels": A100}},
    ]
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump_all(nodes))
    found, stderr = render_slices("--nodes", str(path))
    assert [s["spec"]["nodeName"] for s in found] == ["good"]
    assert stderr.strip() == (
        "warning: node bad: metadata.labels[nvidia.com/cuda.driver.major]: expected a version "
        "such as 520.56.06, got 'five.0.0'; no ResourceSlices"
    )


@pytest.mark.parametrize("dynamic", [[], ["--dra-dynamic-mig"]])
@pytest.mark.parametrize("output", ["yaml", "json"])
def test_render_warns_of_an_unknown_layout_as_for_configmaps(
    tmp_path: Path, dynamic: list[str], output: str
) -> None:
    nodes = [{"kind": "Node", "metadata": {"name": "odd", "labels": {
        **A100, "nvidia.com/mig.config": "all-nonsense", "nvidia.com/mig.strategy": "mixed"}}}]  # fmt: skip
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump_all(nodes))
    found, stderr = render_slices("--nodes", str(path), "-o", output, *dynamic)
    assert [s["spec"]["nodeName"] for s in found] == ["odd"] * len(found) and found
    configmaps = run_cli("status_updater", "render", "--nodes", str(path))
    assert stderr.startswith("warning: node odd: metadata.labels[nvidia.com/mig.config]: unknown "
                             "layout 'all-nonsense'")  # fmt: skip
    assert stderr == configmaps.stderr


def test_render_writes_the_same_list_as_yaml_and_as_json(tmp_path: Path) -> None:
    """Written a node at a time, both forms are the List of every node's slices; no node at all
    is an empty List."""
    nodes = [{"kind": "Node", "metadata": {"name": f"n{i}", "labels": {**A100, **ON}}}
             for i in range(3)]  # fmt: skip
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump_all(nodes))
    expected = [s for n in nodes for s in slices(node_slimmer(DraOptions(""))(n), dynamic=True)]
    for output in ("yaml", "json"):
        done = run_cli("status_updater", "render", "--resource-slices", "--dra-dynamic-mig",
                       "--nodes", str(path), "-o", output)  # fmt: skip
        found = json.loads(done.stdout) if output == "json" else yaml.safe_load(done.stdout)
        assert found == {"apiVersion": "v1", "kind": "List", "items": expected}
        path.write_text("")
        empty = run_cli("status_updater", "render", "--resource-slices", "--nodes", str(path),
                        "-o", output)  # fmt: skip
        assert yaml.safe_load(empty.stdout) == {"apiVersion": "v1", "kind": "List", "items": []}
        path.write_text(yaml.safe_dump_all(nodes))


def test_a_bad_selector_is_a_usage_error() -> None:
    done = run_cli(
        "status_updater", "render", "--nodes", "x", "--resource-slices",
        "--dra-node-selector", "type in kwok",
    )  # fmt: skip
    assert done.returncode == 2
    assert "--dra-node-selector" in done.stderr and "Traceback" not in done.stderr


DRA_SAMPLES = SAMPLES / "dra"


def dra_sample(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DRA_SAMPLES / name).read_text()))


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", ["nodes.yaml", "claim-templates.yaml", "pods.yaml", "claims.yaml"])
def test_the_dra_samples_are_valid_for_the_api(name: str, version: str) -> None:
    for doc in dra_sample(name):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_sample_claims_hold_devices_the_sample_nodes_offer() -> None:
    """What the scheduler allocated exists in the slices render prints for the sample nodes, is
    of the requested class and profile, keeps `matchAttribute` (one parent GPU), and belongs to
    the pod the claim is reserved for."""
    offered: dict[tuple[str, str], dict[str, Any]] = {}
    for node in dra_sample("nodes.yaml"):
        slim = slim_node(node)
        for s in [*slices(slim), *slices(slim, dynamic=True)]:
            for d in s["spec"].get("devices", []):
                offered[s["spec"]["pool"]["name"], d["name"]] = d["attributes"]
    pods = {p["metadata"]["name"]: p for p in dra_sample("pods.yaml")}
    for claim in dra_sample("claims.yaml"):
        requests = {r["name"]: r["exactly"] for r in claim["spec"]["devices"]["requests"]}
        results = claim["status"]["allocation"]["devices"]["results"]
        held = []
        for result in results:
            attributes = offered[result["pool"], result["device"]]
            request = requests[result["request"]]
            assert request["deviceClassName"] == f"{attributes['type']['string']}.nvidia.com"
            if "profile" in attributes:  # a MIG device: the profile the selector asks for
                profile = attributes["profile"]["string"]
                assert all(f"== '{profile}'" in c["cel"]["expression"]
                           for c in request["selectors"])  # fmt: skip
            else:
                assert "selectors" not in request  # a whole GPU, any
            held.append(attributes)
        for constraint in claim["spec"]["devices"].get("constraints", []):
            key = constraint["matchAttribute"].removeprefix("gpu.nvidia.com/")
            assert len({a[key]["string"] for a in held}) == 1
        (reserved,) = claim["status"]["reservedFor"]
        pod = pods[reserved["name"]]
        assert reserved["uid"] == pod["metadata"]["uid"]
        names = [
            s["resourceClaimName"] for s in pod.get("status", {}).get("resourceClaimStatuses", [])
        ]
        names += [
            c["resourceClaimName"]
            for c in pod["spec"]["resourceClaims"]
            if "resourceClaimName" in c
        ]
        assert claim["metadata"]["name"] in names


@settings(max_examples=examples(30), deadline=None)
@given(data=st.data())
@pytest.mark.parametrize("layout", ["split", "combined"])
@pytest.mark.parametrize("state", ["all-enabled", "all-disabled"])
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_what_the_scheduler_allocates_never_overlaps(
    model: GpuModel, state: str, layout: str, data: st.DataObject
) -> None:
    """Partitions requested in any order, allocated as the scheduler would against the counters
    (in either slice layout, MIG on, or off where it toggles): no two allocated instances share
    a memory slice (by the catalog's geometry, not the counters), and none is allocated beside
    the whole GPU."""
    node = gpu_node("a", product(model), 1, state, dynamic=True)
    allocator = Allocator(slices(node, dynamic=True, layout=layout))
    names = [p.name for p in model.profiles]
    requests = data.draw(st.lists(st.sampled_from([*names, "whole"]), max_size=12))
    taken: set[int] = set()
    whole = False
    for request in requests:
        device = (
            allocator.allocate("gpu") if request == "whole" else allocator.allocate("mig", request)
        )
        if device is None:
            continue
        parsed = dra.parse_device(device["name"], model)
        assert parsed is not None
        if parsed.profile is None:
            assert not taken, "the whole GPU beside a partition"
            whole = True
            continue
        assert not whole, "a partition beside the whole GPU"
        assert parsed.start is not None
        held = set(range(parsed.start, parsed.start + parsed.profile.memory_slices))
        assert not held & taken, f"{device['name']} overlaps {sorted(taken)}"
        taken |= held


@pytest.mark.parametrize("layout", ["split", "combined"])
@pytest.mark.parametrize("state", ["all-enabled", "all-disabled"])
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_every_device_offered_can_be_allocated_on_an_empty_gpu(
    model: GpuModel, state: str, layout: str
) -> None:
    node = gpu_node("a", product(model), 1, state, dynamic=True)
    offered = slices(node, dynamic=True, layout=layout)
    for device in devices(offered).values():
        allocator = Allocator(offered)
        attributes = device["attributes"]
        kind = attributes["type"]["string"]
        profile = attributes.get("profile", {}).get("string")
        # The first of its kind and profile on an empty GPU: then each placement in turn.
        allocator.allocated = [
            d for d in allocator.devices
            if d["name"] != device["name"] and d["attributes"]["type"]["string"] == kind
            and d["attributes"].get("profile", {}).get("string") == profile
        ]  # fmt: skip
        assert allocator.allocate(kind, profile) == device, device["name"]


def test_an_h100_pcie_is_its_own_part_with_114_multiprocessors() -> None:
    """The driver's log for an H100 PCIe: 114 multiprocessors the largest profile's (its PR
    #1018), not SXM5's 132; the same names, memory and placements as SXM5."""
    pcie = slices(gpu_node("p", "NVIDIA-H100-PCIe", 1, "all-enabled", dynamic=True), dynamic=True)
    sxm = slices(gpu_node("s", "NVIDIA-H100-80GB-HBM3", 1, "all-enabled", dynamic=True),
                 dynamic=True)  # fmt: skip
    counters = values(pcie[0]["spec"]["sharedCounters"][0]["counters"])
    assert (counters["multiprocessors"], counters["memory"]) == ("114", "81152Mi")
    assert set(devices(pcie)) == set(devices(sxm))
    whole = devices(pcie)["gpu-0"]
    assert whole["attributes"]["productName"] == {"string": "NVIDIA H100 PCIe"}
    assert values(whole["capacity"])["multiprocessors"] == "114"


def test_an_a30_offers_its_2g_me_profile_as_the_driver_names_it() -> None:
    """`2g.12gb+me` is `gpu-0-mig-2g12gb-me-6-<start>` (the profile id inferred: none was
    published), with its media engines; 4 memory slices a counter set, 11 counters."""
    found = slices(gpu_node("a", "NVIDIA-A30", 1, "all-enabled", dynamic=True), dynamic=True)
    (counter_set,) = found[0]["spec"]["sharedCounters"]
    assert len(counter_set["counters"]) == 11
    me = {n: d for n, d in devices(found).items() if "2g12gb-me" in n}
    assert set(me) == {"gpu-0-mig-2g12gb-me-6-0", "gpu-0-mig-2g12gb-me-6-2"}
    device = me["gpu-0-mig-2g12gb-me-6-2"]
    assert device["attributes"]["profile"] == {"string": "2g.12gb+me"}
    assert values(device["capacity"]) == {
        "copyEngines": "2", "decoders": "2", "encoders": "0", "jpegEngines": "1",
        "memory": "11968Mi", "multiprocessors": "28", "ofaEngines": "1"}  # fmt: skip
    layout = gpu_node("l", "NVIDIA-A30", 1, "all-2g.12gb.me")
    (instance,) = build_node(layout).gpus[0].mig_devices or ()
    assert instance.name == "2g.12gb+me"


def gfd(family: str | None, major: str | None = None, minor: str | None = None) -> dict[str, str]:
    """GFD's architecture labels (`newArchitectureLabels`), those given."""
    found = {"nvidia.com/gpu.family": family, "nvidia.com/gpu.compute.major": major,
             "nvidia.com/gpu.compute.minor": minor}  # fmt: skip
    return {k: v for k, v in found.items() if v is not None}


# (product, GFD's labels, the architecture and compute capability NVML gives: None, none known).
ARCHITECTURES = [
    ("Tesla-T4", gfd("turing", "7", "5"), "Turing", "7.5.0"),
    ("NVIDIA-L4", gfd("ada-lovelace", "8", "9"), "Ada Lovelace", "8.9.0"),
    ("NVIDIA-L40S", gfd("ada-lovelace", "8", "9"), "Ada Lovelace", "8.9.0"),
    ("NVIDIA-A10", gfd("ampere", "8", "6"), "Ampere", "8.6.0"),
    ("Tesla-V100-SXM2-16GB", gfd("volta", "7", "0"), "Volta", "7.0.0"),
    ("Tesla-P100-PCIE-16GB", gfd("pascal", "6", "0"), "Pascal", "6.0.0"),
    ("Tesla-K80", gfd("kepler", "3", "7"), "Kepler", "3.7.0"),
    ("Tesla-M60", gfd("maxwell", "5", "2"), "Maxwell", "5.2.0"),
    ("NVIDIA-RTX-PRO-6000-Blackwell", gfd("blackwell", "12", "0"), "Blackwell", "12.0.0"),
    ("NVIDIA-GH200-480GB", gfd("hopper", "9", "0"), "Hopper", "9.0.0"),
    ("NVIDIA-Vera-Rubin", gfd("rubin", "13", "0"), "Rubin", "13.0.0"),
    # Without GFD's labels, a GPU outside the catalog has neither: nothing is made up.
    ("Tesla-T4", {}, None, None),
    ("NVIDIA-L4", gfd(None, "8", "9"), None, "8.9.0"),  # a family label missing: none
    ("NVIDIA-L4", gfd("ada-lovelace"), "Ada Lovelace", None),  # compute labels missing: none
    ("Some-GPU", gfd("undefined", "11", "0"), None, "11.0.0"),  # GFD knows no family for 11.x
    ("Tesla-C2050", gfd("fermi", "2", "0"), None, "2.0.0"),  # NVML names nothing before Kepler
    # The catalog's GPUs without labels: the catalog's figures; GFD's labels where they say.
    ("NVIDIA-A100-SXM4-40GB", {}, "Ampere", "8.0.0"),
    ("NVIDIA-H100-80GB-HBM3", {}, "Hopper", "9.0.0"),
    ("NVIDIA-B200", {}, "Blackwell", "10.0.0"),
    ("NVIDIA-A100-SXM4-40GB", gfd("undefined"), "Ampere", "8.0.0"),
    ("NVIDIA-H100-80GB-HBM3", gfd("hopper", "9", "0"), "Hopper", "9.0.0"),
]


@pytest.mark.parametrize("dynamic", [False, True])
def test_architecture_and_compute_capability_are_nvmls_or_absent(dynamic: bool) -> None:
    """Every device carries the GPU's `architecture` (NVML's name, as the driver publishes it)
    and `cudaComputeCapability` from GFD's labels or the catalog; where neither says (a T4 without
    GFD), the device has no such attribute. The same through the writer's templates, where nodes
    of one product but other labels are of another shape."""
    templates = _Templates()
    for product, labels, architecture, compute in ARCHITECTURES:
        node = gpu_node("n", product, 2, None, dynamic, **labels, **{"nvidia.com/gpu.memory": "1"})
        found = slices(node, dynamic)
        every = list(devices(found).values())
        assert every, product
        for device in every:
            attributes = device["attributes"]
            assert attributes.get("architecture") == (
                {"string": architecture} if architecture else None
            ), (product, labels)
            assert attributes.get("cudaComputeCapability") == (
                {"version": compute} if compute else None
            ), (product, labels)
        options = {"dynamic": dynamic, "layout": "split", "list_attributes": False}
        made = templates.texts(node, build_node(node), options)
        assert [t.spec for t in made] == [_Text.of(s).spec for s in found], (product, labels)
