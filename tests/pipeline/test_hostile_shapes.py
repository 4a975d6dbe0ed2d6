"""Any shape of input is a value or one clear error, never a crash.

Every parser of what users and other programs write (topology documents and ConfigMaps, mig-parted
configs, run:ai's node and pod annotations, Node and Pod objects) is fed real documents with one
part replaced by anything JSON or YAML can hold: numbers where a list of mappings is expected,
booleans where a number is, dates, nesting, huge and odd numbers. Each must give a value or raise
TopologyError, which the CLIs print as one line naming the object and field.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_exporter.common.yamlload import load_document, load_json
from status_updater.objects import node_name, slim_node, slim_pod
from status_updater.reconcile import reconcile_node
from status_updater.slicewriter import observe
from status_updater.state import ClusterState
from tests.pipeline.test_hostile import NODES, PODS
from tests.support.base import SAMPLES, examples, run_cli
from topology import migparted, runai
from topology.catalog import model_for_product
from topology.configmap import LABEL_MANAGED_BY, MANAGER, parse_document
from topology.errors import TopologyError
from topology.model import MAX_INTEGER, from_dict

# What a document may hold in place of any of its parts.
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**20, max_value=10**400)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["1", "1.5", "²", "٣", "1e3", "-1", "0x10", "1_0", " 2 ", "true", "∞"])
    | st.dates().map(dt.date.isoformat)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON-like document, itself first."""
    found = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += paths(v, (*at, i))
    return found


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(doc)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return out


def mutated(doc: Any) -> st.SearchStrategy[Any]:
    return st.tuples(st.sampled_from(paths(doc)), values).map(lambda pv: replaced(doc, *pv))


def value_or_topology_error(parse: Callable[[], object]) -> None:
    try:
        parse()
    except TopologyError as e:
        assert "\n" not in str(e)


ACTIVE = load_document((SAMPLES / "topology" / "a100-40gb-active.yaml").read_text())
TOPOLOGY = load_document(ACTIVE["data"]["topology.yml"])
RENDERED = load_document(
    (SAMPLES / "topology" / "topology-qa-mig-worker-gpu-a100.yaml").read_text()
)
MIG_PARTED = load_document((SAMPLES / "static" / "custom" / "mig-parted-config.yaml").read_text())
REAL = next(n for n in NODES if runai.ANNOTATION_MIG_CONFIG in n["metadata"].get("annotations", {}))
MIG_CONFIG = load_document(REAL["metadata"]["annotations"][runai.ANNOTATION_MIG_CONFIG])
MAPPINGS = [
    {"0": {"0": "MIG-a", "4": "MIG-b"}},  # older: index -> position -> uuid
    {"0": [{"position": 0, "device_uuid": "MIG-a", "gpu_instance_id": 19}]},  # current
]
POD_DEVICE = {"name": "nvidia.com/mig-1g.5gb", "position": 4, "gpuindex": "0", "deviceUUID": "MIG-x",
              "gpuinstanceid": 7, "gputype": "A100-40GB"}  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(mutated(TOPOLOGY))
def test_a_topology_document_of_any_shape(doc: Any) -> None:
    value_or_topology_error(lambda: from_dict(doc, "topology"))


@settings(max_examples=examples(200), deadline=None)
@given(mutated(RENDERED))
def test_a_rendered_document_of_any_shape(doc: Any) -> None:
    # As the exporter reads a file: YAML text (JSON dumps are YAML).
    value_or_topology_error(lambda: parse_document(json.dumps(doc), "topology file"))


@settings(max_examples=examples(200), deadline=None)
@given(mutated(MIG_PARTED))
def test_a_mig_parted_config_of_any_shape(doc: Any) -> None:
    def parse() -> None:
        layouts = migparted.load(json.dumps(doc), "configmap gpu-operator/mig")
        model = model_for_product("NVIDIA-A100-SXM4-40GB")
        for name in list(layouts)[:5]:
            migparted.node_layout(layouts, name, model, 2, "node n")

    value_or_topology_error(parse)


@settings(max_examples=examples(200), deadline=None)
@given(mutated(MIG_CONFIG))
def test_a_run_ai_mig_config_of_any_shape(doc: Any) -> None:
    value_or_topology_error(lambda: runai.parse_mig_config(json.dumps(doc), "node n", 1))


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(MAPPINGS).flatmap(mutated))
def test_a_run_ai_mig_mapping_of_any_shape(doc: Any) -> None:
    text = base64.b64encode(json.dumps(doc).encode()).decode()
    value_or_topology_error(lambda: runai.parse_mig_mapping(text, "node n"))


@settings(max_examples=examples(200), deadline=None)
@given(mutated(POD_DEVICE))
def test_a_pod_s_mig_device_of_any_shape(doc: Any) -> None:
    value_or_topology_error(lambda: runai.parse_pod_mig_device(json.dumps(doc), "pod a/b"))


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from(NODES).flatmap(mutated), st.sampled_from(PODS).flatmap(mutated))
def test_nodes_and_pods_of_any_shape(node: Any, pod: Any) -> None:
    """A Node or Pod from a file or an emulator, changed anywhere: building and placing it is a
    result or TopologyErrors, never an exception the last guard has to turn into 'cannot be
    read'."""
    if not isinstance(node, dict) or not isinstance(pod, dict):
        return
    slim = slim_pod(pod)
    if isinstance(pod.get("spec"), dict):
        slim["spec"]["nodeName"] = node_name(node)
    try:
        _, warnings = reconcile_node(slim_node(node), [slim], migparted.builtin())
    except TopologyError:
        return
    assert not [w for w in warnings if "cannot be read" in w.message], warnings


SLICE = {"metadata": {"name": "00000-gpu.nvidia.com-n", "resourceVersion": "7",
                      "labels": {LABEL_MANAGED_BY: MANAGER}},
         "spec": {"driver": "gpu.nvidia.com", "nodeName": "n",
                  "pool": {"name": "n", "generation": 3, "resourceSliceCount": 1},
                  "devices": [{"name": "gpu-0"}]}}  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(mutated(SLICE))
def test_a_watched_resource_slice_of_any_shape(doc: Any) -> None:
    """What the slice watch delivers, changed anywhere: read as one of ours or not, never an
    exception in the writer thread."""
    if isinstance(doc, dict):
        name, observed = observe(doc)
        assert isinstance(name, str)
        assert observed is None or isinstance(observed.generation, int)


DRA_NODES = [load_document(t) for t in (SAMPLES / "dra" / "nodes.yaml").read_text().split("---")]
DRA_POD = {**next(load_document(t) for t in (SAMPLES / "dra" / "pods.yaml").read_text().split("---")
                  if "dynamic-infer" in t),
           "status": {"phase": "Running", "extendedResourceClaimStatus": {
               "resourceClaimName": "half-h100", "requestMappings": [
                   {"containerName": "ctr0", "resourceName": "nvidia.com/gpu",
                    "requestName": "mig"}]}}}  # fmt: skip
DRA_CLAIM = next(load_document(t) for t in (SAMPLES / "dra" / "claims.yaml").read_text().split("---")
                 if "name: half-h100" in t)  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(mutated(DRA_POD), mutated(DRA_CLAIM))
def test_a_dra_pod_and_its_claim_of_any_shape(pod: Any, claim: Any) -> None:
    """A pod naming DRA claims (by entry, template or extended resource) and its claim, changed
    anywhere: joined and placed as results or TopologyErrors, never 'cannot be read'."""
    if not isinstance(pod, dict) or not isinstance(claim, dict):
        return
    try:
        state = ClusterState.of(DRA_NODES, [pod], claims=[claim])
    except TopologyError:
        return
    assert not [w for w in state.all_warnings() if "cannot be read" in w.message]
    for result in state.results.values():  # each holder once: its series are served once each
        for gpu in getattr(result, "gpus", ()):
            for status in [gpu.status, *(d.status for d in gpu.mig_devices or ())]:
                held = status.dra_claims if status else ()
                assert len(set(held)) == len(held), held


# --- the named cases of each class ---------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "when: 2024-02-30", "when: 2024-02-30T00:00:00Z", "x: 9999-99-99", "- 2023-13-01",
    "nodes: {n: {gpu-count: 1, created: 2024-02-30}}",
])  # fmt: skip
def test_an_impossible_date_is_text_not_a_crash(text: str) -> None:
    """YAML 1.1 makes dates of what looks like one; an impossible one raised ValueError."""
    doc = load_document(text)
    assert "2024-02-30" in json.dumps(doc) or "99" in json.dumps(doc) or "13" in json.dumps(doc)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_json_nested_past_the_recursion_limit_is_one_error(depth: int) -> None:
    deep = "[" * depth + "]" * depth
    for parse in (
        lambda: runai.parse_mig_mapping(base64.b64encode(deep.encode()).decode(), "node n"),
        lambda: runai.parse_pod_mig_device(deep, "pod a/b"),
    ):
        with pytest.raises(
            TopologyError, match=r"nests more than 1000 levels deep|expected a JSON object"
        ):
            parse()
    with pytest.raises(ValueError, match="nests more than 1000 levels deep"):
        load_json('{"a": ' * depth + "1" + "}" * depth)


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [("gpu-count", "nodes.n.gpu-count"), ("gpu-memory", "nodes.n.gpu-memory")],
)
def test_yaml_true_is_no_number(yaml_text: str, field: str) -> None:
    """A planted bug survived the suite: `true` read as the integer 1 where a number is expected."""
    doc = {"nodes": {"n": {"gpu-count": 1, "gpu-memory": 40960, "gpu-product": "x"}}}
    doc["nodes"]["n"][yaml_text] = True
    e = from_dict(doc).invalid["n"]
    assert (e.field, e.message) == (field, "expected an integer, got True")
    with pytest.raises(TopologyError, match="got True"):
        migparted.integer(True, "x", "f")
    with pytest.raises(TopologyError, match="got True"):
        runai.parse_pod_mig_device(json.dumps(POD_DEVICE | {"position": True}), "pod a/b")
    mapping = {"0": [{"position": True, "device_uuid": "MIG-a"}]}
    with pytest.raises(TopologyError, match="got True"):
        runai.parse_mig_mapping(base64.b64encode(json.dumps(mapping).encode()).decode(), "node n")


def test_a_number_too_large_to_be_real_is_refused_naming_its_field() -> None:
    doc = copy.deepcopy(TOPOLOGY)
    (name,) = doc["nodes"]
    doc["nodes"][name]["gpu-memory"] = int("9" * 400)
    topology = from_dict(doc)
    assert str(topology.invalid[name]) == (
        f"topology: nodes.{name}.gpu-memory: must be <= {MAX_INTEGER}, got a {400}-digit number"
    )
    doc["nodes"][name]["gpu-memory"] = MAX_INTEGER
    assert name in from_dict(doc).nodes


@pytest.mark.parametrize("text", ["²", "٣", "0" * 5000, "1" * 20, " 4", "4.0", "+4"])
def test_counts_in_labels_are_ascii_decimal_digits(text: str) -> None:
    """str.isdigit() takes `²` (int() then raises) and `٣` (int() reads 3), and any length."""
    from topology.sharing import parse_sharing, shared_by_allocatable

    with pytest.raises(TopologyError, match=r"replicas\]: expected 0 to 1024, got "):
        parse_sharing({"nvidia.com/gpu.replicas": text}, "node n")
    assert shared_by_allocatable({"nvidia.com/gpu.shared": text}, 1) is None


@pytest.mark.parametrize("text", ["²", "٣", "0" * 5000, "65536", "-1"])
def test_a_port_is_ascii_decimal_digits(text: str) -> None:
    import argparse

    from mig_exporter.kube.api import port

    with pytest.raises(argparse.ArgumentTypeError, match="expected a port 0-65535"):
        port(text)
    assert port("0") == 0 and port("9400") == 9400


# --- as a user meets them: the commands, exit 0 or 2, never 1 -----------------------------------

HOSTILE_FILES = {
    "impossible-date.yaml": "kind: Node\nmetadata: {name: n, creationTimestamp: 2024-02-30T00:00:00Z,"
    " labels: {nvidia.com/gpu.product: Tesla-K80}}\n",
    "deep.json": "[" * 100_000 + "]" * 100_000,
    "deep.yaml": "a: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "huge-number.yaml": "kind: Node\nmetadata: {name: n, labels: {nvidia.com/gpu.count: "
    + "9" * 5000 + "}}\n",
    "items-number.yaml": "kind: List\nitems: 5\n",
    "topology-date.yaml": "mig-strategy: none\nnodes:\n  n: 2024-02-30\n",
    "topology-huge.yaml": "nodes:\n  n: {gpu-count: 1, gpu-memory: " + "9" * 5000
    + ", gpu-product: Tesla-K80}\n",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HOSTILE_FILES))
@pytest.mark.parametrize("command", ["render", "exporter", "show"])
def test_hostile_files_are_exit_0_or_2_and_one_line_each(
    tmp_path: Path, name: str, command: str
) -> None:
    path = tmp_path / name
    path.write_text(HOSTILE_FILES[name])
    args = {
        "render": ["status_updater", "render", "--nodes", str(path)],
        "exporter": ["exporter", "--topology-file", str(path), "--node-name", "n", "--once"],
        "show": ["topology", "show", str(path)],
    }[command]
    done = run_cli(*args)
    assert done.returncode in (0, 2), done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    for line in done.stderr.splitlines():
        assert line.startswith(("error: ", "warning: ", "python -m ")), line
        assert len(line) < 2000
