"""run:ai annotation parsers: both generations of each format, and precise errors on bad input."""

from __future__ import annotations

import base64
import contextlib
import json

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from topology.errors import TopologyError
from topology.runai import (
    MappedDevice,
    PodMigDevice,
    parse_mig_config,
    parse_mig_mapping,
    parse_node_labels,
    parse_pod_mig_device,
)

OLDER_CONFIG = """version: v1
mig-configs:
  selected:
  - devices: [0]
    mig-enabled: true
    mig-devices: {0: 3g.20gb, 4: 1g.5gb, 5: 1g.5gb}
"""
CURRENT_CONFIG = """version: v1
mig-configs:
  selected:
  - devices: [1]
    mig-enabled: true
    mig-devices: [{name: 3g.40gb, position: 4, size: 4}]
  - devices: [0]
    mig-enabled: false
"""


def b64(doc: object) -> str:
    return base64.b64encode(json.dumps(doc).encode()).decode()


def test_older_mig_config_maps_position_to_profile() -> None:
    layout = parse_mig_config(OLDER_CONFIG, "node n", 1)
    assert layout.enabled == {0: True}
    assert layout.devices == {0: ((0, "3g.20gb"), (4, "1g.5gb"), (5, "1g.5gb"))}


def test_current_mig_config_lists_devices() -> None:
    layout = parse_mig_config(CURRENT_CONFIG, "node n", 2)
    assert layout.enabled == {0: False, 1: True}
    assert layout.devices == {0: (), 1: ((4, "3g.40gb"),)}


def test_mig_config_devices_all() -> None:
    text = "mig-configs: {selected: [{devices: all, mig-enabled: true, mig-devices: {0: 7g.40gb}}]}"
    assert parse_mig_config(text, "node n", 3).devices == {i: ((0, "7g.40gb"),) for i in range(3)}


def test_both_mapping_generations() -> None:
    older = parse_mig_mapping(b64({"0": {"0": "MIG-aaaa", "4": "MIG-bbbb"}}), "node n")
    assert older == {(0, 0): MappedDevice("MIG-aaaa", None), (0, 4): MappedDevice("MIG-bbbb", None)}
    current = parse_mig_mapping(
        b64({"1": [{"position": 4, "device_uuid": "MIG-cccc", "gpu_instance_id": 1}]}), "node n"
    )
    assert current == {(1, 4): MappedDevice("MIG-cccc", 1)}


def test_both_pod_annotation_generations() -> None:
    older = parse_pod_mig_device(
        '{"name":"nvidia.com/mig-1g.5gb","position":4,"gpuamount":1,"instanceid":"MIG-bbbb",'
        '"gpuindex":0,"gputype":"A100-40GB"}',
        "pod ns/p",
    )
    assert older == PodMigDevice("1g.5gb", 4, 0, "MIG-bbbb", None)
    current = parse_pod_mig_device(
        '{"name":"nvidia.com/mig-3g.40gb","position":4,"gpuamount":3,"deviceUUID":"MIG-cccc",'
        '"gpuinstanceid":1,"gpuindex":"1","gputype":"H100-80GB"}',
        "pod ns/p",
    )
    assert current == PodMigDevice("3g.40gb", 4, 1, "MIG-cccc", 1)


def test_node_labels() -> None:
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb", "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.memory": "9728", "nvidia.com/mig.strategy": "single",
        "node-role.kubernetes.io/runai-dynamic-mig": "true", "node-role.kubernetes.io/runai-mig-enabled": "true",
    }  # fmt: skip
    parsed = parse_node_labels(labels, "node n")
    assert (parsed.gpu_product, parsed.gpu_count, parsed.mig_strategy) == (
        "NVIDIA-A100-80GB-PCIe",
        2,
        "single",
    )
    assert parsed.is_dynamic_mig_enabled
    labels["node-role.kubernetes.io/runai-mig-enabled"] = "false"
    assert not parse_node_labels(labels, "node n").is_dynamic_mig_enabled


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda: parse_mig_config("mig-configs: {selected: {}}", "node n", 1),
         "node n: metadata.annotations[run.ai/mig.config].mig-configs.selected: expected a list"),
        (lambda: parse_mig_config("mig-configs: {selected: [{devices: [2], mig-enabled: true}]}", "node n", 1),
         "node n: metadata.annotations[run.ai/mig.config].mig-configs.selected[0].devices[0]: GPU index 2 >= gpu count 1"),
        (lambda: parse_mig_config("{", "node n", 1), "node n: metadata.annotations[run.ai/mig.config]: is not valid YAML"),
        (lambda: parse_mig_mapping("not base64!", "node n"), "node n: metadata.annotations[run.ai/mig-mapping]: is not base64-encoded JSON"),
        (lambda: parse_mig_mapping(b64({"0": {"0": 5}}), "node n"),
         "node n: metadata.annotations[run.ai/mig-mapping][0][0]: expected a MIG-<uuid> device id, got 5"),
        (lambda: parse_pod_mig_device("{", "pod a/b"),
         "pod a/b: metadata.annotations[runai-mig-device]: is not JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (lambda: parse_pod_mig_device('{"name":"nvidia.com/gpu","position":0,"gpuindex":0}', "pod a/b"),
         "pod a/b: metadata.annotations[runai-mig-device].name: expected nvidia.com/mig-<profile>"),
        (lambda: parse_pod_mig_device('{"name":"nvidia.com/mig-1g.5gb","gpuindex":0}', "pod a/b"),
         "pod a/b: metadata.annotations[runai-mig-device].position: expected an integer, got None"),
        (lambda: parse_pod_mig_device('{"name":"nvidia.com/mig-1g.5gb","position":0,"gpuindex":"one"}', "pod a/b"),
         "pod a/b: metadata.annotations[runai-mig-device].gpuindex: expected an integer, got 'one'"),
        (lambda: parse_node_labels({"nvidia.com/gpu.product": "X", "nvidia.com/gpu.count": "many"}, "node n"),
         "node n: metadata.labels[nvidia.com/gpu.count]: expected an integer, got 'many'"),
        (lambda: parse_node_labels({"nvidia.com/gpu.count": "1"}, "node n"),
         "node n: metadata.labels[nvidia.com/gpu.product]: expected a GPU model name, got ''"),
    ],
)  # fmt: skip
def test_bad_annotations_name_object_and_field(call, expected: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TopologyError) as e:
        call()
    assert str(e.value).startswith(expected)
    assert "\n" not in str(e.value)


# A one-GPU run:ai layout whose GPU 0 has the given mig-devices.
LAYOUT = "mig-configs: {selected: [{devices: [0], mig-enabled: true, mig-devices: %s}]}"


@pytest.mark.parametrize(
    ("devices", "says"),
    [
        ("{x: 1g.5gb}", "[x]: expected an integer, got 'x'"),
        ("{0: 5}", "[0]: expected a profile name, got 5"),
        ("[5]", "[0]: expected a mapping, got 5"),
        ("[{position: 0}]", "[0].name: expected a profile name, got None"),
        ("5", ": expected a mapping or a list, got 5"),
        ("[{name: 1g.5gb, position: x}]", "[0].position: expected an integer, got 'x'"),
    ],
)
def test_each_mig_devices_problem_names_its_field(devices: str, says: str) -> None:
    with pytest.raises(TopologyError) as e:
        parse_mig_config(LAYOUT % devices, "node n", 1)
    field = "metadata.annotations[run.ai/mig.config].mig-configs.selected[0].mig-devices"
    assert str(e.value) == f"node n: {field}{says}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
)


@given(st.text(max_size=200))
@example("mig-configs: {selected: [{devices: ['--0'], mig-enabled: true}]}")
@example(
    "mig-configs: {selected: [{devices: [0], mig-enabled: true, mig-devices: {'--0': 1g.5gb}}]}"
)
@example("mig-configs: {selected: [{devices: [99999999999999999999], mig-enabled: true}]}")
def test_mig_config_parser_is_total(text: str) -> None:
    with contextlib.suppress(TopologyError):
        parse_mig_config(text, "node n", 8)


@given(json_values)
@example({"--0": {"0": "MIG-a"}})
@example({"0": [{"position": "1e400", "device_uuid": "MIG-a", "gpu_instance_id": "--0"}]})
def test_mapping_parser_is_total(doc: object) -> None:
    with contextlib.suppress(TopologyError):
        parse_mig_mapping(b64(doc), "node n")


@given(json_values | st.fixed_dictionaries({"name": st.just("nvidia.com/mig-1g.5gb")}, optional={
    "position": json_values, "gpuindex": json_values, "deviceUUID": json_values, "gpuinstanceid": json_values}))  # fmt: skip
@example({"name": "nvidia.com/mig-1g.5gb", "position": "--0", "gpuindex": "0"})
@example(
    {"name": "nvidia.com/mig-1g.5gb", "position": 0, "gpuindex": "\u0661"}
)  # an Arabic-Indic one
def test_pod_annotation_parser_is_total(doc: object) -> None:
    with contextlib.suppress(TopologyError):
        parse_pod_mig_device(json.dumps(doc), "pod a/b")
