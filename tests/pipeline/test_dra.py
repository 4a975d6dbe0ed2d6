"""DRA offline, as the docs walk it: the sample nodes, pods and claims rendered into topologies,
served by the exporter in DRA mode; one bad claim never harms another."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from status_updater.dra import DraOptions, node_slimmer
from status_updater.objects import may_hold_gpu
from status_updater.state import ClusterState
from tests.support.base import SAMPLES, examples, run_cli
from tests.support.promtext import Series, duplicates, parse, promtool_findings
from topology.model import NodeTopology

DRA = SAMPLES / "dra"


def claims() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DRA / "claims.yaml").read_text()))


# The samples as docs/dra.md renders them: dra-h100's driver runs DynamicMIG, the A100s' not.
DYNAMIC_H100 = ("--dra-node-selector", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
                "--dra-dynamic-mig")  # fmt: skip


def render(tmp_path: Path, found: list[dict[str, Any]]) -> tuple[Path, str]:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all(found))
    done = run_cli("status_updater", "render", "--nodes", str(DRA / "nodes.yaml"),
                   "--pods", str(DRA / "pods.yaml"), "--claims", str(path), *DYNAMIC_H100)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = tmp_path / "topology.yaml"
    out.write_text(done.stdout)
    return out, done.stderr


def serve(topology: Path) -> list[Series]:
    """The DRA-mode series (one field's), from an exposition promtool and the duplicate check pass:
    each holder's copy is its own series."""
    done = run_cli("exporter", "--topology-file", str(topology), "--all-nodes", "--once",
                   "--kubernetes-enable-dra")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert promtool_findings(done.stdout) == []
    series = parse(done.stdout)
    assert duplicates(series) == []
    return [s for s in series if s.name == "DCGM_FI_DEV_SM_CLOCK"]


def held(series: list[Series]) -> dict[tuple[str, str], dict[str, str]]:
    """(pod, device) -> the series' labels, for each series a claim holds."""
    return {
        (s.label("pod"), s.label("dra_device_name")): dict(s.labels)
        for s in series
        if "dra_device_name" in s.label_names
    }


def test_the_samples_claims_are_served_with_their_dra_labels(tmp_path: Path) -> None:
    topology, stderr = render(tmp_path, claims())
    assert stderr == ""
    found = held(serve(topology))
    assert set(found) == {
        ("infer-small", "gpu-0-mig-1g5gb-19-2"),
        ("train-pair", "gpu-1-mig-1g5gb-19-2"),
        ("train-pair", "gpu-1-mig-1g5gb-19-3"),
        ("whole-train", "gpu-0"),
    }
    small = found["infer-small", "gpu-0-mig-1g5gb-19-2"]
    assert small["dra_claim_name"] == "infer-small-mig-7xq2k"
    assert (small["dra_pool_name"], small["hostname"]) == ("dra-a100", "dra-a100")
    assert small["dra_mig_profile"] == small["GPU_I_PROFILE"] == "1g.5gb"
    document = yaml.safe_load(topology.read_text())["items"]
    nodes = {
        n: v
        for cm in document
        for n, v in yaml.safe_load(cm["data"]["topology.yml"])["nodes"].items()
    }
    instance = next(m for m in nodes["dra-a100"]["gpus"][0]["mig-devices"] if m["position"] == 2)
    assert small["dra_mig_device_uuid"] == instance["id"]
    # Dynamic MIG: the partition's instance was made for the claim, with the driver's GI id, and
    # is served as dcgm-exporter 4.8 serves it: no pod, no claim (its #714).
    (dynamic,) = [dict(s.labels) for s in serve(topology) if s.label("hostname") == "dra-h100"]
    assert (dynamic["GPU_I_PROFILE"], dynamic["GPU_I_ID"]) == ("3g.40gb", "2")
    assert not dynamic.get("pod") and not any(k.startswith("dra_") for k in dynamic)
    (made,) = nodes["dra-h100"]["gpus"][0]["mig-devices"]
    assert made["status"]["dra-claims"][0]["made"] is True
    # A whole GPU: its series, with no MIG labels of either kind.
    whole = found["whole-train", "gpu-0"]
    assert whole["dra_pool_name"] == whole["hostname"] == "dra-a100-80gb"
    assert not {"GPU_I_ID", "dra_mig_profile", "dra_mig_device_uuid"} & set(whole)


def test_a_released_dynamic_claim_takes_its_instance_with_it(tmp_path: Path) -> None:
    kept = [c for c in claims() if c["metadata"]["name"] != "half-h100"]
    topology, _ = render(tmp_path, kept)
    h100 = [s for s in serve(topology) if s.label("hostname") == "dra-h100"]
    assert h100 and not [s for s in h100 if "GPU_I_PROFILE" in s.label_names]


def test_one_bad_claim_never_harms_another(tmp_path: Path) -> None:
    found = claims()
    bad = copy.deepcopy(found[0])  # infer-small's claim names a device the node does not have
    bad["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-7-mig-1g5gb-19-2"
    topology, stderr = render(tmp_path, [bad, *found[1:]])
    assert stderr.strip() == (
        "warning: pod gpu-test/infer-small: claims[gpu-test/infer-small-mig-7xq2k]: device "
        "gpu-7-mig-1g5gb-19-2 is not on node dra-a100: not placed"
    )
    pods = {pod for pod, _ in held(serve(topology))}
    assert pods == {"train-pair", "whole-train"}


def test_a_claim_not_reserved_for_the_pod_gives_it_nothing(tmp_path: Path) -> None:
    found = claims()
    found[0]["status"]["reservedFor"][0]["uid"] = "someone-else"
    topology, _ = render(tmp_path, found)
    assert "infer-small" not in {pod for pod, _ in held(serve(topology))}


def test_a_pod_asking_for_dra_devices_is_never_dropped_as_no_gpu_pod() -> None:
    for pod in yaml.safe_load_all((DRA / "pods.yaml").read_text()):
        assert may_hold_gpu(pod), pod["metadata"]["name"]


_JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12)
    | st.sampled_from(["gpu-0", "gpu-0-mig-1g5gb-19-2", "gpu-9-mig-7g40gb-0-0", "dra-a100", "pods"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
# Where a hostile or broken claim differs from a good one: any part of what is read of it.
_PLACES = [
    ("metadata",), ("metadata", "name"), ("metadata", "namespace"), ("status",),
    ("status", "allocation"), ("status", "allocation", "devices"),
    ("status", "allocation", "devices", "results"),
    ("status", "allocation", "devices", "results", 0),
    ("status", "allocation", "devices", "results", 0, "device"),
    ("status", "allocation", "devices", "results", 0, "pool"),
    ("status", "allocation", "devices", "results", 0, "driver"),
    ("status", "allocation", "devices", "results", 0, "request"),
    ("status", "reservedFor"), ("status", "reservedFor", 0), ("status", "reservedFor", 0, "uid"),
]  # fmt: skip


def _set(obj: Any, path: tuple[Any, ...], value: object) -> None:
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_PLACES), _JUNK), min_size=1, max_size=3))
def test_a_broken_claim_never_harms_the_others(
    changes: list[tuple[tuple[Any, ...], object]],
) -> None:
    """infer-small's claim broken anywhere, any way: nothing crashes, every problem is a warning,
    and the other pods still hold what their claims give them."""
    found = claims()
    bad = copy.deepcopy(found[0])
    for path, value in changes:
        # An earlier change may have made that place unreachable.
        with contextlib.suppress(KeyError, IndexError, TypeError):
            _set(bad, path, value)
    nodes = list(yaml.safe_load_all((DRA / "nodes.yaml").read_text()))
    pods = list(yaml.safe_load_all((DRA / "pods.yaml").read_text()))
    slim = node_slimmer(DraOptions("", dynamic_mig=True))
    state = ClusterState.of(nodes, pods, None, [bad, *found[1:]], slim)
    assert all("\n" not in str(w) for w in state.all_warnings())
    held = {
        (c.holder.pod, c.device)
        for result in state.results.values()
        if isinstance(result, NodeTopology)
        for g in result.gpus
        for d in (g, *(g.mig_devices or ()))
        if d.status
        for c in d.status.dra_claims
    }
    assert {("train-pair", "gpu-1-mig-1g5gb-19-2"), ("train-pair", "gpu-1-mig-1g5gb-19-3"),
            ("dynamic-infer", "gpu-0-mig-3g40gb-9-4")} <= held  # fmt: skip


def test_the_samples_slices_and_series_name_one_driver_version(tmp_path: Path) -> None:
    """The slices' `driverVersion` (from GFD's labels) is the version the series carry in
    DCGM_FI_DRIVER_VERSION, each in its own form (580.65.6 and 580.65.06): the exporter in DRA
    mode names the DRA driver's default when it is given none."""
    done = run_cli("status_updater", "render", "--nodes", str(DRA / "nodes.yaml"),
                   "--resource-slices", "--dra-dynamic-mig")  # fmt: skip
    assert done.returncode == 0, done.stderr
    versions = {
        d["attributes"]["driverVersion"]["version"]
        for s in yaml.safe_load(done.stdout)["items"]
        for d in s["spec"].get("devices", [])
    }
    topology, _ = render(tmp_path, claims())
    served = {s.label("DCGM_FI_DRIVER_VERSION") for s in serve(topology)}
    assert len(served) == 1 and versions == {".".join(str(int(p)) for p in served.pop().split("."))}


def test_a_holder_listed_twice_in_a_topology_is_served_once(tmp_path: Path) -> None:
    """A topology document is anyone's to write: a device's `dra-claims` naming one holder twice
    gives that holder's series once, never two samples Prometheus would reject."""
    topology, _ = render(tmp_path, claims())
    text = topology.read_text()
    entry = "- claim: infer-small-mig-7xq2k\n"
    assert text.count(entry) == 1
    doubled = tmp_path / "doubled.yaml"
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(entry.strip()))
    indent = len(lines[at]) - len(lines[at].lstrip())
    block = [lines[at]]
    for line in lines[at + 1 :]:
        if len(line) - len(line.lstrip()) <= indent or line.lstrip().startswith("- "):
            break
        block.append(line)
    doubled.write_text("".join(lines[:at] + block + block + lines[at + len(block) :]))
    served = held(serve(doubled))  # serve() fails on any duplicate sample
    assert ("infer-small", "gpu-0-mig-1g5gb-19-2") in served


def test_a_dra_nodes_series_name_the_driver_its_slices_name(tmp_path: Path) -> None:
    """Each DRA node's series carry the driver its slices say (its GFD labels, or the DRA
    driver's default 580.65.06), whatever the exporter's --driver-version; a node DRA does not
    select keeps the flag's."""
    nodes = list(yaml.safe_load_all((DRA / "nodes.yaml").read_text()))
    labels = nodes[0]["metadata"]["labels"]  # dra-a100: driver 570.172.08
    labels.update({"nvidia.com/cuda.driver.major": "570", "nvidia.com/cuda.driver.minor": "172",
                   "nvidia.com/cuda.driver.rev": "08"})  # fmt: skip
    for key in ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                "nvidia.com/cuda.driver.rev"):  # fmt: skip
        del nodes[1]["metadata"]["labels"][key]  # dra-h100: no driver labels
    nodes[2]["metadata"]["labels"]["type"] = "real"  # dra-a100-80gb: not a DRA node
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump_all(nodes))
    sliced = run_cli("status_updater", "render", "--nodes", str(path), "--resource-slices",
                     "--dra-node-selector", "type=kwok", "--dra-dynamic-mig")  # fmt: skip
    said: dict[str, set[str]] = {}
    for item in yaml.safe_load(sliced.stdout)["items"]:
        for d in item["spec"].get("devices", []):
            version = d["attributes"]["driverVersion"]["version"]
            said.setdefault(item["spec"]["nodeName"], set()).add(version)
    assert said == {"dra-a100": {"570.172.8"}, "dra-h100": {"580.65.6"}}
    done = run_cli("status_updater", "render", "--nodes", str(path), "--dra-node-selector",
                   "type=kwok")  # fmt: skip
    topology = tmp_path / "topology.yaml"
    topology.write_text(done.stdout)
    served = run_cli("exporter", "--topology-file", str(topology), "--all-nodes", "--once",
                     "--kubernetes-enable-dra", "--driver-version", "520.56.06")  # fmt: skip
    found = {(s.label("hostname"), s.label("DCGM_FI_DRIVER_VERSION")) for s in parse(served.stdout)
             if "DCGM_FI_DRIVER_VERSION" in s.label_names}  # fmt: skip
    assert found == {("dra-a100", "570.172.08"), ("dra-h100", "580.65.06"),
                     ("dra-a100-80gb", "520.56.06")}  # fmt: skip
