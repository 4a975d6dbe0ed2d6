"""The topology schema: round trip, and validation errors that name the node and field."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from mig_exporter.common.text import one_line
from tests.support import tree
from tests.support.base import SAMPLES
from topology.errors import TopologyError
from topology.model import (
    AllocatedBy,
    DeviceStatus,
    DraClaim,
    Fault,
    Fraction,
    Gpu,
    MigDevice,
    NodeTopology,
    PodUsage,
    Replica,
    Sharing,
    Topology,
    Utilization,
    dump_yaml,
    from_dict,
    load_yaml,
)
from topology.validate import errors

SAMPLE = yaml.safe_load((SAMPLES / "topology" / "a100-40gb-active.yaml").read_text())["data"][
    "topology.yml"
]


def test_sample_round_trips_byte_for_byte() -> None:
    topology = load_yaml(SAMPLE)
    assert dump_yaml(topology) == SAMPLE
    assert load_yaml(dump_yaml(topology)) == topology
    assert errors(topology) == []


def test_schema_keys_are_kebab_case_as_documented() -> None:
    doc = yaml.safe_load(SAMPLE)
    node = doc["nodes"]["qa-mig-worker-gpu-a100"]
    assert list(doc) == ["mig-strategy", "nodes"]
    assert list(node) == [
        "gpu-count",
        "gpu-memory",
        "gpu-product",
        "is-dynamic-mig-enabled",
        "gpus",
    ]
    dev = node["gpus"][0]["mig-devices"][0]
    assert list(dev) == ["id", "name", "position", "gpu-instance-id", "status"]
    assert list(dev["status"]) == ["allocated-by", "pod-gpu-usage-status"]
    (usage,) = dev["status"]["pod-gpu-usage-status"].values()
    assert list(usage) == ["utilization", "fb-used", "is-inference-pod"]


def topology_with(devices: list[dict[str, object]], *, gpu_count: int = 1, gpus: int = 1) -> str:
    doc = {
        "mig-strategy": "mixed",
        "nodes": {
            "n1": {
                "gpu-count": gpu_count, "gpu-memory": 40960, "gpu-product": "NVIDIA-A100-SXM4-40GB",
                "is-dynamic-mig-enabled": True,
                "gpus": [{"id": f"GPU-{i}", "mig-devices": devices} for i in range(gpus)],
            }
        },
    }  # fmt: skip
    return yaml.safe_dump(doc)


def one_error(text: str) -> str:
    found = errors(load_yaml(text))
    assert len(found) == 1, found
    message = str(found[0])
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ([{"name": "3g.40gb", "position": 0, "gpu-instance-id": 2}],
         "node n1: gpus[0].mig-devices[0].name: unknown profile '3g.40gb' for A100-40GB"),
        ([{"name": "2g.10gb", "position": 0, "gpu-instance-id": 5}, {"name": "1g.5gb", "position": 1, "gpu-instance-id": 12}],
         "node n1: gpus[0].mig-devices[1].position: 1g.5gb@1 overlaps 2g.10gb@0"),
        ([{"name": "2g.10gb", "position": 1, "gpu-instance-id": 5}],
         "node n1: gpus[0].mig-devices[0].position: 2g.10gb cannot start at 1 (valid: 0, 2, 4)"),
        ([{"name": "3g.20gb", "position": 6, "gpu-instance-id": 2}],
         "node n1: gpus[0].mig-devices[0].position: 3g.20gb at 6 is outside the GPU's 8 memory slices"),
        ([{"name": "1g.5gb", "position": 7, "gpu-instance-id": 10}],
         "node n1: gpus[0].mig-devices[0].position: 1g.5gb cannot start at 7"),
        ([{"id": "MIG-a", "name": "1g.5gb", "position": 0, "gpu-instance-id": 11},
          {"id": "MIG-a", "name": "1g.5gb", "position": 1, "gpu-instance-id": 12}],
         "node n1: gpus[0].mig-devices[1].id: duplicate id MIG-a"),
    ],
)  # fmt: skip
def test_impossible_layouts_are_named(devices: list[dict[str, object]], expected: str) -> None:
    assert one_error(topology_with(devices)).startswith(expected)


def test_gpu_index_beyond_gpu_count() -> None:
    assert (
        one_error(topology_with([], gpu_count=1, gpus=2))
        == "node n1: gpus[1]: GPU index >= gpu-count 1"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nodes: [1, 2]", "topology: nodes: expected a mapping, got list"),
        ("mig-strategy: both", "topology: mig-strategy: must be one of none, single, mixed, got 'both'"),
        ("nodes: {n1: {gpu-count: one}}", "topology: nodes.n1.gpu-count: expected an integer, got 'one'"),
        ("nodes: {n1: {gpu-count: 1, gpu-memory: 1}}", "topology: nodes.n1.gpu-product: is required"),
        ("nodes: {n1: {gpu-count: 1, gpu-memory: 1, gpu-product: x, gpus: [{status: {}}]}}",
         "topology: nodes.n1.gpus[0].id: is required"),
        ("a: [", "topology: topology.yml: is not valid YAML: while parsing a flow node did not find"),
        ("a: *x", "topology: topology.yml: is not valid YAML: found undefined alias"),
    ],
)  # fmt: skip
def test_malformed_documents_are_named(text: str, expected: str) -> None:
    try:
        found = list(load_yaml(text).invalid.values())  # a node's problem is that node's
    except TopologyError as e:
        found = [e]
    assert len(found) == 1
    assert str(found[0]).startswith(expected)
    assert "\n" not in str(found[0])


def test_a_bad_node_entry_leaves_the_other_nodes_readable() -> None:
    good = {"gpu-count": 1, "gpu-memory": 40960, "gpu-product": "A100-SXM4-40GB",
            "gpus": [{"id": "GPU-1"}]}  # fmt: skip
    bad = {**good, "gpus": [{"id": "GPU-2", "status": {"allocated-by": "nobody"}}]}
    topology = load_yaml(yaml.safe_dump({"nodes": {"a": bad, "b": good, "c": bad}}))
    assert set(topology.nodes) == {"b"}
    assert topology.nodes["b"].gpus[0].id == "GPU-1"
    assert sorted(topology.invalid) == ["a", "c"]
    assert str(topology.invalid["a"]) == (
        "topology: nodes.a.gpus[0].status.allocated-by: expected a mapping, got str"
    )
    assert [e.field for e in errors(topology)] == [
        "nodes.a.gpus[0].status.allocated-by", "nodes.c.gpus[0].status.allocated-by"
    ]  # fmt: skip


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=12), c, max_size=4)))  # fmt: skip
def test_any_yaml_document_loads_or_fails_with_a_topology_error(doc: object) -> None:
    try:
        topology = load_yaml(yaml.safe_dump(doc))
    except TopologyError:
        return
    errors(topology)  # a loaded topology can always be validated


# Every shape the schema allows: optional ids and statuses, empty and absent lists, odd strings.
_text = st.one_of(
    st.sampled_from(["1g.5gb", "MIG-1", "true", "null", "a b", "0x1", "é", ""]), st.text(max_size=8)
)
_usage = st.builds(PodUsage, st.builds(Utilization, st.integers(0, 100), st.integers(0, 100)),
                   st.integers(0, 10**6), st.booleans())  # fmt: skip
# With or without the pod's uid and labels (sorted by key, as the reader gives them).
_labels = st.dictionaries(_text, _text, max_size=3).map(lambda d: tuple(sorted(d.items())))
_holder = st.builds(AllocatedBy, _text, _text, _text, _text, _labels)
_name = _text.filter(bool)  # a Kubernetes name: never empty
_claim = st.builds(DraClaim, _holder, _name, _name, _name, _name, st.booleans(), _text,
                   st.none() | st.integers(0, 10**6))  # fmt: skip
_fraction = st.builds(Fraction, _holder, _text, st.integers(0, 10**6),
                      st.sampled_from(["", "time-slicing", "sm-sharing"]))  # fmt: skip
_status = st.builds(
    DeviceStatus,
    st.none() | _holder,
    st.dictionaries(_text, _usage, max_size=2),
    st.lists(st.builds(Replica, st.integers(0, 9), _holder, _text), max_size=2).map(tuple),
    st.lists(_claim, max_size=2).map(tuple),
    st.lists(_fraction, max_size=2).map(tuple),
)
_mig = st.builds(
    MigDevice, _text, st.integers(0, 7), st.integers(0, 14), st.none() | _text, st.none() | _status
)
_time = st.integers(0, 253402300799)  # what RFC 3339 writes: 1970 to 9999
_fault = st.builds(
    Fault, fault=_name, since=_time, until=st.none() | _time, xid=st.none() | st.integers(0, 10**9),
    count=st.integers(0, 10**9), rate=st.none() | st.integers(0, 10**9),  # floats: test_faults
    correctable=st.booleans(), source=_name,
)  # fmt: skip
_counted = st.dictionaries(_name, st.integers(0, 2**53), max_size=3).map(
    lambda d: tuple(sorted(d.items()))
)
_gpu = st.builds(Gpu, _text, st.none() | _status, st.none() | st.lists(_mig, max_size=3).map(tuple),
                 st.lists(_fault, max_size=2).map(tuple), _counted)  # fmt: skip
_sharing = st.builds(Sharing, st.sampled_from(["time-slicing", "mps"]), st.integers(2, 16))
_node = st.builds(NodeTopology, st.integers(0, 64), st.integers(0, 10**6), _text, st.booleans(),
                  st.lists(_gpu, max_size=3).map(tuple), st.none() | _sharing)  # fmt: skip
topologies = st.builds(Topology, st.sampled_from(["none", "single", "mixed"]),
                       st.dictionaries(_text, _node, max_size=3))  # fmt: skip


def edited(topology: Topology, edits: list[tuple[int, int, str]]) -> str:
    """The topology's text with each (where, how many characters cut, what inserted) applied."""
    text = dump_yaml(topology)
    for at, cut, insert in edits:
        at %= len(text) + 1
        text = text[:at] + insert + text[at + cut :]
    return text


@given(topologies)
def test_the_fast_writer_writes_what_the_generic_one_does(topology: Topology) -> None:
    text = dump_yaml(topology)
    assert text == tree.dump(tree.to_dict(topology))  # which PyYAML reads back (test_yamltext.py)
    assert yaml.safe_load(text) == tree.to_dict(topology)


def test_no_holder_and_empty_names_read_back_as_written() -> None:
    """A device with no holder stays without one, and an emulated pod's empty names (a holder's,
    a replica's) are read as they were written."""
    empty = AllocatedBy("ns", "p", "")
    free = DeviceStatus(None, {"uid-1": PodUsage(Utilization(0, 100), 10, False)})
    shared = DeviceStatus(
        empty, {}, (Replica(0, empty, ""), Replica(1, AllocatedBy("", "", ""), "u"))
    )
    node = NodeTopology(1, 40960, "NVIDIA-A100-SXM4-40GB", False,
                        (Gpu("GPU-1", free), Gpu("GPU-2", DeviceStatus()), Gpu("GPU-3", shared)),
                        Sharing("time-slicing", 2))  # fmt: skip
    topology = Topology("mixed", {"n1": node})
    back = load_yaml(dump_yaml(topology))
    assert back == topology
    assert [g.status.allocated_by for g in back.nodes["n1"].gpus if g.status] == [None, None, empty]


def test_a_missing_flag_reads_as_false() -> None:
    text = """
    nodes:
      n1:
        gpu-count: 1
        gpu-memory: 40960
        gpu-product: NVIDIA-A100-SXM4-40GB
        gpus:
          - id: GPU-1
            status:
              allocated-by: {namespace: ns, pod: p, container: c}
              pod-gpu-usage-status:
                uid-1: {utilization: {min: 0, max: 100}, fb-used: 10}
    """
    node = load_yaml(text).nodes["n1"]
    assert not node.is_dynamic_mig_enabled
    status = node.gpus[0].status
    assert status is not None
    assert not status.pod_gpu_usage_status["uid-1"].is_inference_pod


@given(topologies)
def test_sharing_adds_keys_and_changes_nothing_a_reader_of_the_old_schema_reads(
    topology: Topology,
) -> None:
    # A reader that knows nothing of sharing (the exporter before it, fake-gpu-operator) ignores
    # `sharing` and `replicas`: what it reads is the topology without them.
    def without(value: object, names: bool = False) -> object:
        """`names`: the keys are names (of nodes, of pods' uids), which may be any word."""
        if isinstance(value, dict):
            return {k: without(v, k in ("nodes", "pod-gpu-usage-status")) for k, v in value.items()
                    if names or k not in ("sharing", "replicas")}  # fmt: skip
        if isinstance(value, list):
            return [without(v) for v in value]
        return value

    old = from_dict(without(tree.to_dict(topology)))
    unshared = {
        name: replace(node, sharing=None, gpus=tuple(
            replace(g, status=_unshared(g.status), mig_devices=None if g.mig_devices is None
                    else tuple(replace(d, status=_unshared(d.status)) for d in g.mig_devices))
            for g in node.gpus))
        for name, node in topology.nodes.items()
    }  # fmt: skip
    assert old == from_dict(tree.to_dict(replace(topology, nodes=unshared)))


def _unshared(status: DeviceStatus | None) -> DeviceStatus | None:
    return None if status is None else replace(status, replicas=())


def test_duplicate_gpu_and_mig_ids_name_where_they_were_first_seen() -> None:
    node = {"gpu-count": 1, "gpu-memory": 40960, "gpu-product": "NVIDIA-A100-SXM4-40GB",
            "is-dynamic-mig-enabled": True,
            "gpus": [{"id": "GPU-1", "mig-devices": [
                {"id": "MIG-1", "name": "1g.5gb", "position": 0, "gpu-instance-id": 13}]}]}  # fmt: skip
    topology = load_yaml(yaml.safe_dump({"nodes": {"a": node, "b": node}}))
    assert [str(e) for e in errors(topology)] == [
        "node b: gpus[0].id: duplicate id GPU-1 (also node a gpus[0].id)",
        "node b: gpus[0].mig-devices[0].id: duplicate id MIG-1 (also node a gpus[0].mig-devices[0].id)",
    ]  # fmt: skip


def test_messages_escape_control_characters_and_stay_short() -> None:
    e = TopologyError("pod a\nb", "f\t", "x\ry\x1b\u2028" + "z" * 1000)
    assert str(e).startswith("pod a\\nb: f\\t: x\\ry\\x1b\\x2028zzz")
    assert len(e.message) == 400 and e.message.endswith("z…")
    assert TopologyError("o", "f", "m" * 400).message == "m" * 400  # at the limit: whole
    assert one_line(ValueError("a\n  b\tc")) == "a b c"


def test_every_problem_of_every_gpu_is_reported_in_order() -> None:
    ids = iter(range(100))  # each its own GI id: one id twice is an error of its own

    def dev(name: str, position: int) -> dict[str, object]:
        return {"name": name, "position": position, "gpu-instance-id": next(ids)}

    h100 = {"gpu-count": 2, "gpu-memory": 81559, "gpu-product": "NVIDIA-H100-80GB-HBM3",
            "is-dynamic-mig-enabled": True, "gpus": [
                {"id": "GPU-0", "mig-devices": [dev("9g.9gb", 0), dev("3g.40gb", 4), dev("2g.20gb", 5),
                                                dev("4g.40gb", 0), dev("7g.80gb", 1), dev("1g.10gb", 4),
                                                dev("1g.20gb", 3)]},
                {"id": "GPU-1", "mig-devices": [dev("1g.10gb+me", 0), dev("1g.10gb+me", 1),
                                                dev("1g.10gb", 2)]}]}  # fmt: skip
    k80 = {"gpu-count": 3, "gpu-memory": 11441, "gpu-product": "Tesla-K80", "gpus": [
        {"id": "GPU-4"}, {"id": "GPU-2", "mig-devices": [dev("1g.5gb", 0)]},
        {"id": "GPU-3", "mig-devices": [dev("1g.5gb", 0)]}]}  # fmt: skip
    found = errors(load_yaml(yaml.safe_dump({"nodes": {"h": h100, "k": k80}})))
    assert [str(e) for e in found] == [
        "node h: gpus[0].mig-devices[0].name: unknown profile '9g.9gb' for H100-80GB (1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb)",
        "node h: gpus[0].mig-devices[2].position: 2g.20gb cannot start at 5 (valid: 0, 2, 4)",
        "node h: gpus[0].mig-devices[4].position: 7g.80gb at 1 is outside the GPU's 8 memory slices",
        "node h: gpus[0].mig-devices[5].position: 1g.10gb@4 overlaps 3g.40gb@4",
        "node h: gpus[0].mig-devices[6].position: 1g.20gb cannot start at 3 (valid: 0, 2, 4, 6)",
        "node h: gpus[1].mig-devices[1].name: more than 1 1g.10gb+me on one GPU",
        "node k: gpus[1].mig-devices: GPU 'Tesla-K80' does not support MIG",
        "node k: gpus[2].mig-devices: GPU 'Tesla-K80' does not support MIG",
    ]  # fmt: skip
    overlap = {**h100, "gpus": [{"id": "GPU-9", "mig-devices": [dev("1g.10gb", 0), dev("1g.10gb", 1),
                                                                dev("3g.40gb", 0)]}]}  # fmt: skip
    (clash,) = errors(load_yaml(yaml.safe_dump({"nodes": {"h": overlap}})))
    assert clash.message == "3g.40gb@0 overlaps 1g.10gb@0, 1g.10gb@1"


def test_a_dra_claim_reads_back_and_a_bad_one_names_its_field() -> None:
    claim = {"claim": "c", "claim-namespace": "ns", "device": "gpu-0-mig-1g5gb-19-0", "pool": "n1",
             "namespace": "ns", "pod": "p", "container": "ctr0"}  # fmt: skip
    held = {"name": "1g.5gb", "position": 0, "gpu-instance-id": 11,
            "status": {"dra-claims": [claim]}}  # fmt: skip
    (gpu,) = load_yaml(topology_with([held])).nodes["n1"].gpus
    (dev,) = gpu.mig_devices or ()
    assert dev.status is not None
    assert dev.status.dra_claims == (
        DraClaim(AllocatedBy("ns", "p", "ctr0"), "c", "ns", "gpu-0-mig-1g5gb-19-0", "n1"),
    )
    assert dev.status.allocated_by is None  # a claim names no pod for the default label set
    del claim["device"]
    bad = load_yaml(topology_with([held]), "ConfigMap ns/t")
    assert str(bad.invalid["n1"]) == (
        "ConfigMap ns/t: nodes.n1.gpus[0].mig-devices[0].status.dra-claims[0].device: is required"
    )
