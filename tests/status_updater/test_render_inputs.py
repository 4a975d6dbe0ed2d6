"""`render` reads what it is given, or says why not: never silence.

The same Nodes and Pods, written in every shape kubectl and people write them (one object per
document, a `kind: List`, a bare YAML sequence or JSON array, `kind: node`), render the same
ConfigMaps; what is no Node or Pod is one warning naming the file and the place, and the rest
is still rendered. A pod asking for a part of a device (`nvidia.com/gpu: 1.5`), which the API
would refuse, is said and not placed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from status_updater.state import ClusterState
from tests.status_updater.test_reconcile import gpu_pod, whole_gpu_node
from tests.support.base import examples, run_cli
from topology.model import NodeTopology

NODES = [whole_gpu_node("k80-a", 2), whole_gpu_node("k80-b", 1)]
PODS = [gpu_pod("p", "k80-a", 1, "2026-01-01T00:00:00Z")]


def write(path: Path, shape: str, objects: list[dict[str, Any]]) -> Path:
    """The objects in one of the shapes users hand to render."""
    if shape == "list":
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    elif shape == "documents":
        path.write_text(yaml.safe_dump_all(objects))
    elif shape == "sequence":
        path.write_text(yaml.safe_dump(objects))
    elif shape == "json-array":
        path = path.with_suffix(".json")
        path.write_text(json.dumps(objects))
    elif shape == "lower-case-kinds":
        path.write_text(yaml.safe_dump_all([{**o, "kind": o["kind"].lower()} for o in objects]))
    else:
        raise AssertionError(shape)
    return path


def render(*args: str) -> tuple[str, list[str]]:
    done = run_cli("status_updater", "render", *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout, done.stderr.splitlines()


SHAPES = ["list", "documents", "sequence", "json-array", "lower-case-kinds"]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_of_the_same_objects_renders_the_same(tmp_path: Path, shape: str) -> None:
    expected, _ = render("--nodes", str(write(tmp_path / "n0.yaml", "list", NODES)),
                         "--pods", str(write(tmp_path / "p0.yaml", "list", PODS)))  # fmt: skip
    got, warnings = render("--nodes", str(write(tmp_path / "n.yaml", shape, NODES)),
                           "--pods", str(write(tmp_path / "p.yaml", shape, PODS)))  # fmt: skip
    assert (got, warnings) == (expected, [])
    assert "topology-k80-a" in got and "topology-k80-b" in got and "pod: p\n" in got


def test_what_is_no_node_or_pod_is_said_and_the_rest_rendered(tmp_path: Path) -> None:
    odd = tmp_path / "odd.yaml"
    odd.write_text(yaml.safe_dump_all([
        {"kind": "List", "items": 5},
        [NODES[0], 7, "text"],
        {"kind": "ConfigMap", "metadata": {"name": "x"}},
        NODES[1],
    ]))  # fmt: skip
    got, warnings = render("--nodes", str(odd))
    assert warnings == [
        f"warning: {odd}: document 1: items: expected a list of objects, got int",
        f"warning: {odd}: document 2: [1]: expected a Node, Pod or ResourceClaim, got int: skipped",
        f"warning: {odd}: document 2: [2]: expected a Node, Pod or ResourceClaim, got str: skipped",
        f"warning: {odd}: document 3: a 'ConfigMap' is no Node, Pod or ResourceClaim: skipped",
    ]
    assert "topology-k80-a" in got and "topology-k80-b" in got


@settings(max_examples=examples(40), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.lists(st.sampled_from(SHAPES), min_size=2, max_size=2))
def test_nodes_and_pods_in_any_two_shapes_render_as_a_list_does(
    tmp_path: Path, shapes: list[str]
) -> None:
    """In this process (render's reading, without a CLI each example)."""
    from status_updater.inputs import load_objects

    skipped: list[str] = []
    n = write(tmp_path / "nodes.yaml", shapes[0], NODES)
    p = write(tmp_path / "pods.yaml", shapes[1], PODS)
    objects = [*load_objects([str(n)], "Node", skipped), *load_objects([str(p)], "Pod", skipped)]
    assert skipped == []
    assert [o["metadata"]["name"] for o in objects] == ["k80-a", "k80-b", "p"]
    assert [o["kind"] for o in objects] == ["Node", "Node", "Pod"]


# --- a part of a device --------------------------------------------------------------------------

odd_counts = (
    st.decimals(min_value=0, max_value=100, places=3).filter(lambda d: d != d.to_integral_value())
    | st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not f.is_integer() if f == f and abs(f) != float("inf") else True)
    | st.sampled_from(["1.5", "500m", "-1", "1e3", "²", " 1", "one", "", "1Ki", "0.5"])
    | st.booleans()
    | st.integers(max_value=-1)
)  # fmt: skip


@settings(max_examples=examples(100), deadline=None)
@given(
    odd_counts,
    st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared"]),
)
def test_a_pod_asking_for_a_part_of_a_device_is_said_and_not_placed(
    value: object, resource: str
) -> None:
    pod = gpu_pod("part", "k80-a", 1, "2026-01-01T00:00:00Z")
    pod["spec"]["containers"][0]["resources"]["limits"] = {resource: value}
    state = ClusterState.of([whole_gpu_node("k80-a", 2)], [pod])
    result = state.results["k80-a"]
    assert isinstance(result, NodeTopology) and all(g.status is None for g in result.gpus)
    (warning,) = state.node_warnings("k80-a")
    assert (warning.obj, warning.field) == (
        "pod ns/part",
        f"spec.containers[0].resources.limits[{resource}]",
    )
    assert warning.message.startswith("expected a whole number of devices, got ")
    assert warning.message.endswith(": not placed") and "\n" not in warning.message


def test_whole_counts_in_any_form_the_api_or_yaml_writes_are_placed() -> None:
    for value in ("1", 1, "0", 0):
        pod = gpu_pod("whole", "k80-a", 1, "2026-01-01T00:00:00Z")
        pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": value}
        state = ClusterState.of([whole_gpu_node("k80-a", 2)], [pod])
        result = state.results["k80-a"]
        assert isinstance(result, NodeTopology) and state.node_warnings("k80-a") == []
        assert sum(g.status is not None for g in result.gpus) == int(value)


def test_a_file_that_is_no_regular_file_is_refused_not_read_forever(tmp_path: Path) -> None:
    """A FIFO would block render, /dev/zero never end: both are one line naming the path."""
    fifo = tmp_path / "nodes.yaml"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        result = run_cli("status_updater", "render", "--nodes", path, timeout=20)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines() == [f"error: {path}: not a regular file"]


def test_a_file_over_the_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from status_updater import inputs

    monkeypatch.setattr(inputs, "MAX_INPUT_BYTES", 100)
    big = write(tmp_path / "nodes.yaml", "documents", [whole_gpu_node(f"n{i}") for i in range(3)])
    with pytest.raises(inputs.InputError, match=r"nodes.yaml: larger than 100 bytes$"):
        list(inputs.load_objects([str(big)], "Node", []))


def test_objects_without_kind_are_what_their_flag_says(tmp_path: Path) -> None:
    """kubectl-style manifests may leave `kind` out: in --nodes a Node, in --pods a Pod."""
    expected, _ = render("--nodes", str(write(tmp_path / "n0.yaml", "list", NODES)),
                         "--pods", str(write(tmp_path / "p0.yaml", "list", PODS)))  # fmt: skip
    kindless = [{k: v for k, v in o.items() if k != "kind"} for o in NODES + PODS]
    nodes, pods = tmp_path / "nodes.yaml", tmp_path / "pods.yaml"
    nodes.write_text(yaml.safe_dump_all(kindless[:2]))
    pods.write_text(yaml.safe_dump_all(kindless[2:]))
    assert render("--nodes", str(nodes), "--pods", str(pods)) == (expected, [])


def test_an_object_without_a_name_is_said_and_skipped(tmp_path: Path) -> None:
    """The API names every object: one from a file without a name is no node called ''."""
    nameless = whole_gpu_node("x")
    del nameless["metadata"]["name"]
    listed = whole_gpu_node("y")
    listed["metadata"]["name"] = ["y"]  # YAML for a name, not a name
    pod = gpu_pod("p", "k80-a", 1, "2026-01-01T00:00:00Z")
    del pod["metadata"]["name"]
    nodes, pods = tmp_path / "nodes.yaml", tmp_path / "pods.yaml"
    nodes.write_text(yaml.safe_dump_all([nameless, listed, NODES[0]]))
    pods.write_text(yaml.safe_dump(pod))
    got, warnings = render("--nodes", str(nodes), "--pods", str(pods), "--layout", "single")
    assert warnings == [
        f"warning: {nodes}: document 1: a Node without metadata.name: skipped",
        f"warning: {nodes}: document 2: a Node without metadata.name: skipped",
        f"warning: {pods}: a Pod without metadata.name: skipped",
    ]
    rendered = yaml.safe_load(yaml.safe_load(got)["data"]["topology.yml"])
    assert list(rendered["nodes"]) == ["k80-a"]
    assert all("status" not in gpu for gpu in rendered["nodes"]["k80-a"]["gpus"])
