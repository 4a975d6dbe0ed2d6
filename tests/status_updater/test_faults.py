"""GPU faults from the cluster into the topology and the DRA slices, as a user checks them: the
Node annotation `mig-exporter/gpu-faults` and the fleet fault policies (ConfigMaps) land on the
GPUs they name with absolute times, each bad entry or policy is one line naming its object and
field, a policy's hits are a pure function of it and the nodes, counters never go down, and the
slices carry the NVIDIA DRA driver's health taints (kubernetes-sigs/dra-driver-nvidia-gpu
device_health.go) while a fault lasts."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from status_updater import faults
from status_updater.cli import dra_slices
from status_updater.dra import DraOptions, node_slimmer
from status_updater.objects import slim_node
from status_updater.state import ClusterState
from tests.status_updater.test_reconcile import whole_gpu_node
from tests.support.base import examples, run_cli
from topology import faults as catalog
from topology.errors import TopologyError
from topology.model import (
    MAX_COUNT,
    Fault,
    NodeTopology,
    Topology,
    dump_yaml,
    load_yaml,
    parse_time,
    time_text,
)

T0 = parse_time("2026-03-01T12:00:00Z")
WHERE = f"metadata.annotations[{catalog.ANNOTATION}]"
KWOK = {"type": "kwok"}
STATIC_DRA = DraOptions("type=kwok")
KUBE_VERSIONS = ("1.35", "1.37")


def gpu_node(
    name: str,
    entries: object = None,
    *,
    count: int = 2,
    text: str | None = None,
    labels: Mapping[str, str] = KWOK,
    layout: str | None = None,
    product: str = "Tesla-K80",
) -> dict[str, Any]:
    """A node of `count` GPUs, its faults annotated as JSON (`entries`) or as `text`."""
    node = whole_gpu_node(name, count=count, product=product)
    node["metadata"]["labels"].update(labels)
    if layout is not None:
        node["metadata"]["labels"].update(
            {"nvidia.com/mig.config": layout, "nvidia.com/mig.strategy": "mixed"}
        )
    if entries is not None or text is not None:
        value = text if text is not None else json.dumps(entries)
        node["metadata"]["annotations"] = {catalog.ANNOTATION: value}
    return node


def settled(
    nodes: list[dict[str, Any]],
    policies: list[faults.Policy] | tuple[faults.Policy, ...] = (),
    now: float = T0,
    dra: DraOptions | None = None,
) -> ClusterState:
    state = ClusterState.of(nodes, [], slim=node_slimmer(dra), policies=policies, now=now)
    if dra is not None:
        state.dra_options = dra.slices()
    return state


def result(state: ClusterState, name: str) -> NodeTopology:
    found = state.results[name]
    assert isinstance(found, NodeTopology), found
    return found


def gpu_faults(state: ClusterState, name: str) -> list[tuple[Fault, ...]]:
    return [g.faults for g in result(state, name).gpus]


def warnings(state: ClusterState) -> list[str]:
    return [str(w) for w in state.all_warnings()]


# ------------------------------------------------------------------------------ the annotation

# Each fault of the catalog, as a user writes it, and the Fault it becomes (since T0, 10 minutes).
CATALOG_ENTRIES: dict[str, tuple[dict[str, Any], Fault]] = {
    "xid": ({"xid": 79}, Fault("xid", T0, xid=79)),
    "ecc-sbe": ({"count": 3, "rate": 2}, Fault("ecc-sbe", T0, count=3, rate=2.0)),
    "ecc-dbe": ({"count": 2}, Fault("ecc-dbe", T0, count=2)),
    "row-remap": ({"correctable": True}, Fault("row-remap", T0, correctable=True)),
    "row-remap-failure": ({}, Fault("row-remap-failure", T0)),
    "pcie-replay": ({"rate": 0.5}, Fault("pcie-replay", T0, rate=0.5)),
    "nvlink-crc": ({}, Fault("nvlink-crc", T0)),
    "thermal": ({}, Fault("thermal", T0)),
    "power": ({}, Fault("power", T0)),
    "lost": ({}, Fault("lost", T0)),
    "unmonitored": ({}, Fault("unmonitored", T0)),
}


def test_the_examples_cover_the_whole_catalog() -> None:
    assert set(CATALOG_ENTRIES) == set(catalog.CATALOG)


@pytest.mark.parametrize("fault", sorted(CATALOG_ENTRIES))
@pytest.mark.parametrize("form", ["json", "yaml"])
def test_each_fault_of_the_catalog_is_read_by_index_and_by_uuid(fault: str, form: str) -> None:
    extra, want = CATALOG_ENTRIES[fault]
    uuid = result(settled([gpu_node("k80")]), "k80").gpus[1].id
    entries = [
        {"gpu": 0, "fault": fault, **extra, "since": time_text(T0), "for": "10m"},
        {"gpu": uuid, "fault": fault, **extra, "since": time_text(T0), "for": 600},
    ]
    # YAML as people write it: times and durations unquoted.
    text = json.dumps(entries) if form == "json" else yaml.safe_dump(entries)
    if form == "yaml":
        text = text.replace(f"'{time_text(T0)}'", time_text(T0))
        assert f"since: {time_text(T0)}" in text
    state = settled([gpu_node("k80", text=text)], now=T0 + 5)
    assert warnings(state) == []
    expected = Fault(**{**_fields(want), "until": T0 + 600})
    assert gpu_faults(state, "k80") == [(expected,), (expected,)]


def _fields(f: Fault) -> dict[str, Any]:
    return {name: getattr(f, name) for name in Fault.__slots__}


def test_an_entry_without_a_start_begins_when_first_seen_and_keeps_that_start() -> None:
    entries = [{"gpu": 1, "fault": "ecc-dbe", "for": "1h"}]
    state = settled([gpu_node("k80", entries)], now=T0 + 0.7)
    assert gpu_faults(state, "k80") == [(), (Fault("ecc-dbe", T0, T0 + 3600),)]
    # Another entry comes an hour later: the first keeps its start.
    state.now = T0 + 3600 * 2
    state.set_node(slim_node(gpu_node("k80", [*entries, {"gpu": 1, "fault": "thermal"}])))
    state.settle()
    assert gpu_faults(state, "k80") == [
        (),
        (Fault("ecc-dbe", T0, T0 + 3600), Fault("thermal", T0 + 7200)),
    ]


def test_one_entry_written_without_its_list_is_read() -> None:
    state = settled([gpu_node("k80", text="gpu: 0\nfault: xid\nxid: 48\n")])
    assert gpu_faults(state, "k80") == [(Fault("xid", T0, xid=48),), ()]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[{gpu: 0", "is not JSON or YAML: "),
        ("42", "expected a list of faults, got int"),
        ('"xid"', "expected a list of faults, got str"),
    ],
)
def test_an_annotation_that_is_no_list_is_one_line_and_the_node_still_written(
    text: str, message: str
) -> None:
    state = settled([gpu_node("k80", text=text), gpu_node("other", [{"gpu": 0, "fault": "lost"}])])
    (line,) = warnings(state)
    assert line.startswith(f"node k80: {WHERE}: {message}")
    assert "\n" not in line
    assert gpu_faults(state, "k80") == [(), ()]
    assert gpu_faults(state, "other") == [(Fault("lost", T0),), ()]


def test_more_entries_than_the_bound_keep_the_first_and_say_so() -> None:
    entries = [{"gpu": i % 2, "fault": "ecc-dbe", "since": time_text(T0 + i)} for i in range(1025)]
    state = settled([gpu_node("k80", entries)])
    assert warnings(state) == [f"node k80: {WHERE}: 1025 faults: the first 1024 kept"]
    assert sum(len(f) for f in gpu_faults(state, "k80")) == 1024


# Bad values, by the field each is named by (`` is the entry itself), for an entry on GPU 0.
GOOD = {"gpu": 0, "fault": "xid", "xid": 48}
BAD: list[tuple[str, object]] = [
    ("", "oops"),
    ("", 3),
    ("", [GOOD]),
    (".gpu", {"gpu": None}),
    (".gpu", {"gpu": -1}),
    (".gpu", {"gpu": 2}),
    (".gpu", {"gpu": True}),
    (".gpu", {"gpu": 1.0}),
    (".gpu", {"gpu": "GPU-00000000-0000-0000-0000-000000000000"}),
    (".gpu", {"gpu": [0]}),
    (".gpu", {"gpu": "DELETE"}),
    (".fault", {"fault": "bogus"}),
    (".fault", {"fault": None}),
    (".fault", {"fault": 79}),
    (".fault", {"fault": ["xid"]}),
    (".fault", {"fault": {"xid": 79}}),
    (".xid", {"xid": "DELETE"}),
    (".xid", {"xid": 0}),
    (".xid", {"xid": 65536}),
    (".xid", {"xid": "79"}),
    (".xid", {"xid": True}),
    (".xid", {"xid": 48.0}),
    (".xid", {"fault": "thermal", "xid": 48}),
    (".count", {"fault": "ecc-dbe", "xid": "DELETE", "count": 0}),
    (".count", {"fault": "ecc-dbe", "xid": "DELETE", "count": -3}),
    (".count", {"fault": "ecc-dbe", "xid": "DELETE", "count": 10**9 + 1}),
    (".count", {"fault": "ecc-dbe", "xid": "DELETE", "count": "3"}),
    (".count", {"fault": "ecc-dbe", "xid": "DELETE", "count": 1.5}),
    (".rate", {"rate": 6}),  # an Xid counts nothing a minute
    (".rate", {"fault": "ecc-sbe", "xid": "DELETE", "rate": -1}),
    (".rate", {"fault": "ecc-sbe", "xid": "DELETE", "rate": 1e10}),
    (".rate", {"fault": "ecc-sbe", "xid": "DELETE", "rate": "6"}),
    (".rate", {"fault": "ecc-sbe", "xid": "DELETE", "rate": True}),
    (".rate", {"fault": "ecc-sbe", "xid": "DELETE", "rate": float("nan")}),
    (".correctable", {"correctable": True}),  # an Xid's: only for row-remap
    (".correctable", {"fault": "row-remap", "xid": "DELETE", "correctable": "yes"}),
    (".correctable", {"fault": "row-remap", "xid": "DELETE", "correctable": 1}),
    (".since", {"since": "yesterday"}),
    (".since", {"since": "2026-03-01"}),
    (".since", {"since": "2026-03-01T12:00:00"}),  # no zone
    (".since", {"since": 1772366400}),
    (".since", {"since": "1969-12-31T23:59:59Z"}),
    (".since", {"since": "0001-01-01T00:00:00+01:00"}),
    (".since", {"since": "9999-12-31T23:00:00Z", "for": "2h"}),
    (".for", {"for": 0}),
    (".for", {"for": -5}),
    (".for", {"for": "0s"}),
    (".for", {"for": "10x"}),
    (".for", {"for": "10"}),
    (".for", {"for": ""}),
    (".for", {"for": True}),
    (".for", {"for": [60]}),
    (".for", {"for": 10**10}),
    (".for", {"for": float("inf")}),
    (".extra", {"extra": 1}),
    (".Gpu", {"Gpu": 0}),
]


def _bad_entry(patch: object) -> object:
    if not isinstance(patch, dict):
        return patch
    entry = {**GOOD, **patch}
    return {k: v for k, v in entry.items() if v != "DELETE"}


def good_entries(node_gpus: int, n: int) -> list[dict[str, Any]]:
    kinds = ["ecc-dbe", "thermal", "unmonitored", "pcie-replay"]
    return [
        {"gpu": i % node_gpus, "fault": kinds[i % len(kinds)], "since": time_text(T0 - 60 * i)}
        for i in range(n)
    ]


@settings(max_examples=examples(120), deadline=None)
@given(
    bad=st.sampled_from(BAD),
    goods=st.integers(0, 4),
    at=st.integers(0, 4),
    form=st.sampled_from(["json", "yaml"]),
)
def test_each_bad_entry_is_one_line_naming_node_and_field_and_the_rest_is_kept(
    bad: tuple[str, object], goods: int, at: int, form: str
) -> None:
    suffix, patch = bad
    entries: list[object] = list(good_entries(2, goods))
    at = min(at, len(entries))
    entries.insert(at, _bad_entry(patch))
    text = json.dumps(entries) if form == "json" else yaml.safe_dump(entries)
    others = [{"gpu": 1, "fault": "xid", "xid": 13, "since": time_text(T0)}]
    state = settled([gpu_node("k80", text=text), gpu_node("other", others)])
    lines = warnings(state)
    assert len(lines) == 1, lines
    (line,) = lines
    assert line.startswith(f"node k80: {WHERE}[{at}]{suffix}: "), line
    assert "\n" not in line
    kept = sorted((e["gpu"], e["fault"], parse_time(e["since"])) for e in good_entries(2, goods))
    found = sorted(
        (g, f.fault, f.since) for g, fs in enumerate(gpu_faults(state, "k80")) for f in fs
    )
    assert found == kept
    assert gpu_faults(state, "other") == [(), (Fault("xid", T0, xid=13),)]


def test_a_node_that_stays_bad_is_the_same_warning_not_a_new_one() -> None:
    state = settled([gpu_node("k80", [{"gpu": 0, "fault": "nope"}])])
    first = state.all_warnings()
    state.now += 60
    state.set_node(slim_node({**gpu_node("k80", [{"gpu": 0, "fault": "nope"}]), "status": {}}))
    state.settle()
    assert state.all_warnings() == first


# ------------------------------------------------------------------------------- fleet policies


def policy_cm(
    name: str, body: object, created: str | None = "2026-03-01T11:00:00Z", namespace: str = "ops"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace,
                            "labels": {faults.POLICY_LABEL: "true"}}  # fmt: skip
    if created is not None:
        meta["creationTimestamp"] = created
    text = body if isinstance(body, str) else yaml.safe_dump(body)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {faults.POLICY_KEY: text}}  # fmt: skip


def policy(name: str = "p", now: float = T0, **body: Any) -> faults.Policy:
    spec = {"gpus": {"fraction": 1}, "fault": {"fault": "xid", "xid": 48}, **body}
    return faults.read_policy(policy_cm(name, spec), now)


BAD_POLICIES: list[tuple[object, str]] = [
    ("gpus: [", "data[policy.yaml]"),
    ("[1, 2]", "data[policy.yaml]"),
    ({"gpus": {"fraction": 1}, "fault": {"fault": "xid", "xid": 48}, "when": 1},
     "data[policy.yaml].when"),
    ({"fault": {"fault": "xid", "xid": 48}}, "data[policy.yaml].gpus"),
    ({"gpus": {"fraction": 0.5, "count": 2}, "fault": {"fault": "lost"}}, "data[policy.yaml].gpus"),
    ({"gpus": {"share": 1}, "fault": {"fault": "lost"}}, "data[policy.yaml].gpus"),
    ({"gpus": {"fraction": 1.5}, "fault": {"fault": "lost"}}, "data[policy.yaml].gpus.fraction"),
    ({"gpus": {"fraction": "half"}, "fault": {"fault": "lost"}},
     "data[policy.yaml].gpus.fraction"),
    ({"gpus": {"count": -1}, "fault": {"fault": "lost"}}, "data[policy.yaml].gpus.count"),
    ({"gpus": {"count": 1}}, "data[policy.yaml].fault"),
    ({"gpus": {"count": 1}, "fault": "xid"}, "data[policy.yaml].fault"),
    ({"gpus": {"count": 1}, "fault": {"fault": "fire"}}, "data[policy.yaml].fault.fault"),
    ({"gpus": {"count": 1}, "fault": {"fault": ["xid"]}}, "data[policy.yaml].fault.fault"),
    ({"gpus": {"count": 1}, "fault": {"fault": "xid"}}, "data[policy.yaml].fault.xid"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost", "gpu": 0}}, "data[policy.yaml].fault.gpu"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost", "since": "2026-03-01T00:00:00Z"}},
     "data[policy.yaml].fault.since"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "nodeSelector": "type in kwok"},
     "data[policy.yaml].nodeSelector"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "nodeSelector": 3},
     "data[policy.yaml].nodeSelector"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "nodeSelector": {"app": "x"}},
     "data[policy.yaml].nodeSelector"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "start": "now"},
     "data[policy.yaml].start"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "start": {"in": "1m"}},
     "data[policy.yaml].start"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"},
      "start": {"at": "2026-03-01T00:00:00Z", "after": "1m"}}, "data[policy.yaml].start"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "start": {"at": "tomorrow"}},
     "data[policy.yaml].start.at"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "start": {"after": "soon"}},
     "data[policy.yaml].start.after"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "start": {"within": 0}},
     "data[policy.yaml].start.within"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "start": {"within": "1d"}},
     "data[policy.yaml].start.within"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "for": "2d"}, "data[policy.yaml].for"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"},
      "start": {"at": "9999-12-31T00:00:00Z", "within": "24h"}}, "data[policy.yaml].start"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"},
      "start": {"at": "9999-12-31T00:00:00Z"}, "for": "48h"}, "data[policy.yaml].start"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"},
      "start": {"at": "1969-12-31T23:00:00Z"}}, "data[policy.yaml].start"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"},
      "start": {"at": "9999-12-31T23:00:00Z"}, "for": "2h"}, "data[policy.yaml].start"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "for": "forever"},
     "data[policy.yaml].for"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "seed": "abc"}, "data[policy.yaml].seed"),
    ({"gpus": {"count": 1}, "fault": {"fault": "lost"}, "seed": True}, "data[policy.yaml].seed"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "field"), BAD_POLICIES)
def test_a_bad_policy_is_one_line_naming_its_configmap_and_field(body: object, field: str) -> None:
    with pytest.raises(TopologyError) as e:
        faults.read_policy(policy_cm("p", body), T0)
    assert e.value.obj == "configmap ops/p (fault policy)"
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(f"configmap ops/p (fault policy): {field}: ")
    assert "\n" not in str(e.value)


def test_a_policy_without_its_key_is_named_so() -> None:
    cm = policy_cm("p", {})
    cm["data"] = {"policy.yml": "gpus: {count: 1}"}
    with pytest.raises(TopologyError, match=r"^configmap ops/p \(fault policy\): data\[policy"):
        faults.read_policy(cm, T0)


def fleet(count: int, gpus: int = 4, **labels: str) -> list[dict[str, Any]]:
    return [gpu_node(f"n{i:03d}", count=gpus, labels={**KWOK, **labels}) for i in range(count)]


def hit_gpus(state: ClusterState, source: str = "policy/p") -> dict[tuple[str, int], Fault]:
    found = {}
    for name, res in state.results.items():
        assert isinstance(res, NodeTopology)
        for i, g in enumerate(res.gpus):
            for f in g.faults:
                if f.source == source:
                    assert (name, i) not in found
                    found[(name, i)] = f
    return found


def test_a_fraction_hits_about_that_share_and_other_seeds_hit_others() -> None:
    nodes = fleet(25)  # 100 GPUs
    seen = []
    for seed in range(4):
        hit = hit_gpus(settled(nodes, [policy(gpus={"fraction": 0.3}, seed=seed)]))
        assert 15 <= len(hit) <= 45, len(hit)
        seen.append(frozenset(hit))
    assert len(set(seen)) == 4
    assert hit_gpus(settled(nodes, [policy(gpus={"fraction": 0})])) == {}
    assert len(hit_gpus(settled(nodes, [policy(gpus={"fraction": 1})]))) == 100


@settings(max_examples=examples(20), deadline=None)
@given(order=st.permutations(range(12)), seed=st.integers(0, 2**31))
def test_a_seeded_fraction_hits_the_same_gpus_whatever_order_the_nodes_arrive_in(
    order: list[int], seed: int
) -> None:
    nodes = fleet(12)
    p = policy(gpus={"fraction": 0.4}, seed=seed, start={"within": "1h"})
    expected = hit_gpus(settled(nodes, [p]))
    assert hit_gpus(settled([nodes[i] for i in order], [p])) == expected
    # Arriving one by one, the policy known from the start or set at the end, is the same too.
    state = ClusterState()
    state.now = T0
    state.set_policy(p)
    for i in order:
        state.set_node(slim_node(nodes[i]))
        state.settle()
    assert hit_gpus(state) == expected


def test_other_nodes_coming_and_going_never_change_a_nodes_fraction_hits() -> None:
    p = policy(gpus={"fraction": 0.5}, seed=7)
    nodes = fleet(10)
    state = settled(nodes[:5], [p])
    before = {k: v for k, v in hit_gpus(state).items()}
    assert before  # 20 GPUs at 0.5: some hit
    for node in nodes[5:]:
        state.set_node(slim_node(node))
    state.settle()
    after = hit_gpus(state)
    assert {k: v for k, v in after.items() if k[0] in {n["metadata"]["name"] for n in nodes[:5]}} \
        == before  # fmt: skip
    assert after == hit_gpus(settled(nodes, [p]))
    for node in nodes[:3]:
        state.delete_node(node["metadata"]["name"])
    state.settle()
    assert hit_gpus(state) == {k: v for k, v in after.items() if k[0] >= "n003"}


def test_a_count_hits_exactly_that_many_of_the_selected_gpus_only() -> None:
    nodes = fleet(6, pool="a") + [
        gpu_node(f"m{i}", count=4, labels={**KWOK, "pool": "b"}) for i in range(4)
    ]
    for count in (0, 1, 5, 24, 30):
        hit = hit_gpus(settled(nodes, [policy(gpus={"count": count}, nodeSelector="pool=a")]))
        assert len(hit) == min(count, 24)
        assert all(name.startswith("n") for name, _ in hit)
    sel = {"matchLabels": {"pool": "b"}}
    hit = hit_gpus(settled(nodes, [policy(gpus={"count": 3}, nodeSelector=sel)]))
    assert len(hit) == 3 and all(name.startswith("m") for name, _ in hit)


def test_a_count_is_the_same_gpus_whatever_order_the_nodes_arrive_in() -> None:
    nodes = fleet(8)
    p = policy(gpus={"count": 5}, seed=3)
    expected = hit_gpus(settled(nodes, [p]))
    assert len(expected) == 5
    assert hit_gpus(settled(nodes[::-1], [p])) == expected
    assert hit_gpus(settled(nodes[3:] + nodes[:3], [p])) == expected


def test_start_at_after_within_and_for() -> None:
    nodes = fleet(10)
    at = "2026-03-02T08:00:00Z"
    hit = hit_gpus(settled(nodes, [policy(start={"at": at}, **{"for": "90s"})]))
    assert {(f.since, f.until) for f in hit.values()} == {(parse_time(at), parse_time(at) + 90)}
    # after: from the ConfigMap's creationTimestamp (11:00), not from the updater's clock
    hit = hit_gpus(settled(nodes, [policy(start={"after": "1h30m"}, now=T0 + 999)]))
    created = parse_time("2026-03-01T11:00:00Z")
    assert {(f.since, f.until) for f in hit.values()} == {(created + 5400, None)}
    # within: each hit starts at random in the window, all inside it
    hit = hit_gpus(settled(nodes, [policy(start={"at": at, "within": "10m"}, **{"for": 60})]))
    starts = [f.since for f in hit.values()]
    assert all(parse_time(at) <= s < parse_time(at) + 600 for s in starts)
    assert len(set(starts)) > 10  # spread out, not one time
    assert all(f.until == f.since + 60 for f in hit.values())
    # after and within together: a window from creation + after
    hit = hit_gpus(settled(nodes, [policy(start={"after": "1m", "within": "1m"})]))
    assert all(created + 60 <= f.since < created + 120 for f in hit.values())


def test_a_policy_without_a_creation_time_starts_after_from_now() -> None:
    cm = policy_cm("p", {"gpus": {"count": 1}, "fault": {"fault": "lost"},
                         "start": {"after": "5m"}}, created=None)  # fmt: skip
    assert faults.read_policy(cm, T0 + 0.9).base == T0 + 300


def test_what_a_policy_hit_is_its_status() -> None:
    p = policy(gpus={"count": 3}, start={"at": time_text(T0)}, **{"for": "1h"})
    state = settled(fleet(4), [p])
    body = json.loads(faults.status(p, state.hits["p"]))
    assert body["gpus"] == 3 and body["nodes"] == len({h["node"] for h in body["hits"]})
    assert {(h["node"], h["gpu"]) for h in body["hits"]} == set(hit_gpus(state))
    assert all(h["since"] == time_text(T0) and h["until"] == time_text(T0 + 3600)
               for h in body["hits"])  # fmt: skip
    many = json.loads(faults.status(p, state.hits["p"], limit=2))
    assert len(many["hits"]) == 2 and many["more"] == 1


# ------------------------------------------------------------------- counters never go down


# A pool of entries a schedule picks from: every fault that counts, with and without a start
# and a duration, some twice the same.
POOL: list[dict[str, Any]] = [
    {"gpu": 0, "fault": "ecc-sbe"},
    {"gpu": 0, "fault": "ecc-sbe", "rate": 120},
    {"gpu": 0, "fault": "ecc-dbe", "count": 3},
    {"gpu": 1, "fault": "row-remap", "count": 2},
    {"gpu": 1, "fault": "row-remap", "correctable": True},
    {"gpu": 1, "fault": "pcie-replay", "rate": 30.0},
    {"gpu": 0, "fault": "nvlink-crc"},
    {"gpu": 1, "fault": "thermal"},
    {"gpu": 0, "fault": "power"},
    {"gpu": 0, "fault": "xid", "xid": 48},
]

entry_st = st.builds(
    lambda base, since, lasts: {
        **base,
        **({} if since is None else {"since": time_text(T0 + since)}),
        **({} if lasts is None else {"for": lasts}),
    },
    st.sampled_from(POOL),
    st.none() | st.integers(-3 * 86400, 3 * 86400),
    st.none() | st.integers(1, 2 * 86400),
)
step_st = st.tuples(
    st.floats(0, 86400, allow_nan=False),  # time passes
    st.sampled_from(["annotate", "restart", "both"]),
    st.lists(entry_st, max_size=5),
)


def _counters(topo: NodeTopology, t: float) -> list[dict[str, int]]:
    return [dict(catalog.state(g.faults, g.counted, t).counters) for g in topo.gpus]


def _assert_not_lower(before: list[dict[str, int]], after: list[dict[str, int]], why: str) -> None:
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        for name in old.keys() | new.keys():
            assert new.get(name, 0) >= old.get(name, 0), (why, i, name, old, new)


@settings(max_examples=examples(150), deadline=None)
@given(first=st.lists(entry_st, max_size=5), steps=st.lists(step_st, min_size=1, max_size=8))
def test_counters_never_go_down_whatever_faults_come_change_go_and_restarts(
    first: list[dict[str, Any]], steps: list[tuple[float, str, list[dict[str, Any]]]]
) -> None:
    """Entries appear, change (their start, their duration), go, and the updater restarts
    (reading back what it wrote): at every step, each counter of each GPU is no lower than it
    was at the step before, and a document's counters never go down as time passes."""
    t = T0 + 0.25
    current = first
    state = settled([gpu_node("k80", current)], now=t)
    assert warnings(state) == []
    topo = result(state, "k80")
    seen = _counters(topo, t)
    for dt, action, entries in steps:
        t_next = t + dt
        _assert_not_lower(seen, _counters(topo, t_next), "time passing")
        seen = _counters(topo, t_next)
        if action in ("restart", "both"):
            # A new updater: what the old one wrote, as it reads it back.
            written = load_yaml(dump_yaml(Topology(nodes={"k80": topo}))).nodes["k80"]
            assert written == topo
            state = ClusterState()
            state.remember({"k80": written})
        if action in ("annotate", "both"):
            current = entries
        state.now = t_next
        state.set_node(slim_node(gpu_node("k80", current)))
        state.settle()
        topo = result(state, "k80")
        _assert_not_lower(seen, _counters(topo, t_next), f"{action} at T0+{t_next - T0}")
        seen, t = _counters(topo, t_next), t_next


def test_a_faults_rate_is_written_and_read_back() -> None:
    entries = [
        {"gpu": 0, "fault": "ecc-sbe", "rate": 12.0},
        {"gpu": 1, "fault": "nvlink-crc", "rate": 6},
    ]
    topo = result(settled([gpu_node("k80", entries)]), "k80")
    assert load_yaml(dump_yaml(Topology(nodes={"k80": topo}))).nodes["k80"] == topo


def test_a_fractional_rate_is_written_and_read_back() -> None:
    topo = result(settled([gpu_node("k80", [{"gpu": 0, "fault": "ecc-sbe", "rate": 0.5}])]), "k80")
    assert load_yaml(dump_yaml(Topology(nodes={"k80": topo}))).nodes["k80"] == topo


def test_a_cleared_fault_keeps_its_counts_and_the_document_reads_back() -> None:
    entries = [{"gpu": 0, "fault": "ecc-dbe", "count": 3, "since": time_text(T0 - 600)},
               {"gpu": 0, "fault": "ecc-sbe", "since": time_text(T0 - 600)}]  # fmt: skip
    state = settled([gpu_node("k80", entries)])
    assert _counters(result(state, "k80"), T0)[0]["ecc-dbe"] == 3
    assert _counters(result(state, "k80"), T0)[0]["ecc-sbe"] == 61  # 1, then 6 a minute
    state.now = T0 + 120
    state.set_node(slim_node(gpu_node("k80", [])))
    state.settle()
    topo = result(state, "k80")
    assert topo.gpus[0].faults == ()
    # Counted to a minute past the clear (faults.CLEARED_AHEAD_S): an exporter may still serve
    # the old document a step or two, and must never have counted more. 1 + 6 a minute for 13.
    assert faults.CLEARED_AHEAD_S == 60
    assert dict(topo.gpus[0].counted) == {"ecc-dbe": 3, "ecc-sbe": 79}
    assert load_yaml(dump_yaml(Topology(nodes={"k80": topo}))).nodes["k80"] == topo


def test_a_count_past_what_a_document_holds_stays_at_its_bound_and_reads_back() -> None:
    # Thermal time throttled is counted in ns: a fault begun years ago counts past 2**53.
    entries = [{"gpu": 1, "fault": "thermal", "since": "2020-01-01T00:00:00Z"}]
    state = settled([gpu_node("k80", entries)])
    state.set_node(slim_node(gpu_node("k80", [])))
    state.settle()
    topo = result(state, "k80")
    assert dict(topo.gpus[1].counted) == {catalog.THERMAL_NS: MAX_COUNT}
    read = load_yaml(dump_yaml(Topology(nodes={"k80": topo})))
    assert read.invalid == {} and read.nodes["k80"] == topo


def test_a_policy_deleted_clears_its_faults_and_keeps_their_counts() -> None:
    p = policy(
        gpus={"count": 2},
        fault={"fault": "ecc-dbe", "count": 5},
        start={"at": "2026-03-01T00:00:00Z"},
    )
    state = settled(fleet(2), [p])
    assert len(hit_gpus(state)) == 2
    state.delete_policy("p")
    state.now = T0 + 60
    state.settle()
    assert hit_gpus(state) == {} and "p" not in state.hits
    counted = [dict(g.counted) for r in state.results.values()
               for g in r.gpus if isinstance(r, NodeTopology)]  # fmt: skip
    assert sorted(c.get("ecc-dbe", 0) for c in counted) == [0] * 6 + [5, 5]


# ------------------------------------------------------------------------------ the DRA taints


def slices_at(
    nodes: list[dict[str, Any]],
    t: float,
    dra: DraOptions = STATIC_DRA,
    policies: list[faults.Policy] | None = None,
) -> list[dict[str, Any]]:
    state = settled(nodes, policies or [], now=t, dra=dra)
    found = []
    for item in dra_slices(state):
        assert not isinstance(item, str), item
        found += item
    return found


def device_taints(found: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    return {d["name"]: d.get("taints", []) for s in found for d in s["spec"].get("devices", [])}


def validate(found: list[dict[str, Any]]) -> None:
    for s in found:
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(s, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{'.'.join(map(str, e.path))}: {e.message}", pytrace=False)
        listed = s["spec"].get("devices", [])
        assert len(listed) <= (64 if any("taints" in d for d in listed) else 128)


def xid_taint(xid: int, effect: str) -> dict[str, str]:
    return {"key": "gpu.nvidia.com/xid", "value": str(xid), "effect": effect}


LOST = {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}
UNMONITORED = {"key": "gpu.nvidia.com/unmonitored", "effect": "None"}


def test_a_whole_gpu_is_tainted_while_its_fault_lasts_and_not_after() -> None:
    entries = [{"gpu": 1, "fault": "xid", "xid": 48, "since": time_text(T0), "for": "10m"}]
    nodes = [gpu_node("k80", entries)]
    assert device_taints(slices_at(nodes, T0 - 1)) == {"gpu-0": [], "gpu-1": []}
    during = slices_at(nodes, T0)
    assert device_taints(during) == {"gpu-0": [], "gpu-1": [xid_taint(48, "NoSchedule")]}
    validate(during)
    assert device_taints(slices_at(nodes, T0 + 599)) == device_taints(during)
    assert device_taints(slices_at(nodes, T0 + 600)) == {"gpu-0": [], "gpu-1": []}


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_the_drivers_non_fatal_xids_taint_with_effect_none(xid: int) -> None:
    nodes = [gpu_node("k80", [{"gpu": 0, "fault": "xid", "xid": xid}])]
    assert device_taints(slices_at(nodes, T0 + 1))["gpu-0"] == [xid_taint(xid, "None")]


@pytest.mark.parametrize("xid", [8, 48, 63, 64, 74, 92, 94, 95, 119, 120])
def test_every_other_xid_keeps_claims_off(xid: int) -> None:
    nodes = [gpu_node("k80", [{"gpu": 0, "fault": "xid", "xid": xid}])]
    assert device_taints(slices_at(nodes, T0 + 1)) == {
        "gpu-0": [xid_taint(xid, "NoSchedule")], "gpu-1": []}  # fmt: skip


@pytest.mark.parametrize(
    ("entry", "taints"),
    [
        ({"fault": "ecc-dbe"}, [xid_taint(48, "NoSchedule")]),
        ({"fault": "row-remap"}, [xid_taint(63, "NoSchedule")]),
        ({"fault": "row-remap", "correctable": True}, []),
        ({"fault": "row-remap-failure"}, [xid_taint(64, "NoSchedule")]),
        ({"fault": "ecc-sbe"}, []),
        ({"fault": "thermal"}, []),
        ({"fault": "power"}, []),
        ({"fault": "pcie-replay"}, []),
        ({"fault": "unmonitored"}, [UNMONITORED]),
    ],
)
def test_a_catalog_faults_taints_are_its_xids(entry: dict[str, Any], taints: list[Any]) -> None:
    nodes = [gpu_node("k80", [{"gpu": 1, **entry}])]
    assert device_taints(slices_at(nodes, T0)) == {"gpu-0": [], "gpu-1": taints}


def test_the_latest_xid_is_the_one_taint_of_its_key() -> None:
    entries = [
        {"gpu": 0, "fault": "xid", "xid": 48, "since": time_text(T0)},
        {"gpu": 0, "fault": "xid", "xid": 13, "since": time_text(T0 + 60), "for": "1m"},
        {"gpu": 0, "fault": "unmonitored", "since": time_text(T0 + 30)},
    ]
    nodes = [gpu_node("k80", entries)]
    assert device_taints(slices_at(nodes, T0 + 10))["gpu-0"] == [xid_taint(48, "NoSchedule")]
    assert device_taints(slices_at(nodes, T0 + 90))["gpu-0"] == [xid_taint(13, "None"),
                                                                 UNMONITORED]  # fmt: skip
    # The later Xid over: the earlier one, still on, is back.
    assert device_taints(slices_at(nodes, T0 + 120))["gpu-0"] == [xid_taint(48, "NoSchedule"),
                                                                  UNMONITORED]  # fmt: skip


@pytest.mark.parametrize("lost", [{"fault": "lost"}, {"fault": "xid", "xid": 79}])
def test_a_lost_gpu_taints_every_device_of_the_node(lost: dict[str, Any]) -> None:
    entries = [
        {"gpu": 2, **lost, "since": time_text(T0), "for": "1m"},
        {"gpu": 0, "fault": "unmonitored", "since": time_text(T0)},
    ]
    nodes = [gpu_node("k80", entries, count=3), gpu_node("other", count=1)]
    found = slices_at(nodes, T0 + 30)
    validate(found)
    xid = [xid_taint(79, "NoSchedule")] if lost["fault"] == "xid" else []
    assert device_taints([s for s in found if s["spec"]["nodeName"] == "k80"]) == {
        "gpu-0": [LOST, UNMONITORED], "gpu-1": [LOST], "gpu-2": [LOST, *xid]}  # fmt: skip
    assert device_taints([s for s in found if s["spec"]["nodeName"] == "other"]) == {"gpu-0": []}
    after = device_taints([s for s in slices_at(nodes, T0 + 60) if s["spec"]["nodeName"] == "k80"])
    assert after == {"gpu-0": [UNMONITORED], "gpu-1": [], "gpu-2": []}


def test_static_mig_devices_of_a_faulty_gpu_carry_its_taints_and_a_lost_one_taints_all() -> None:
    a100 = {"product": "NVIDIA-A100-SXM4-40GB", "layout": "all-balanced"}
    entries = [{"gpu": 1, "fault": "xid", "xid": 94}]
    found = slices_at([gpu_node("a100", entries, **a100)], T0)
    validate(found)
    marks = device_taints(found)
    assert len(marks) == 8 and all(name.startswith(("gpu-0-mig-", "gpu-1-mig-")) for name in marks)
    assert {n: t for n, t in marks.items() if t} == {
        n: [xid_taint(94, "NoSchedule")] for n in marks if n.startswith("gpu-1-")
    }
    lost = device_taints(slices_at([gpu_node("a100", [{"gpu": 0, "fault": "lost"}], **a100)], T0))
    assert lost == {name: [LOST] for name in marks}


def test_dynamic_mig_slices_carry_no_taints() -> None:
    entries = [{"gpu": 0, "fault": "xid", "xid": 48}, {"gpu": 1, "fault": "lost"}]
    nodes = [gpu_node("a100", entries, product="NVIDIA-A100-SXM4-40GB")]
    found = slices_at(nodes, T0, DraOptions("type=kwok", dynamic_mig=True))
    assert found and device_taints(found) and not any(device_taints(found).values())
    # The same node without DynamicMIG: both GPUs tainted.
    assert all(device_taints(slices_at(nodes, T0)).values())


def test_a_slice_with_taints_holds_at_most_64_devices() -> None:
    big = {"product": "NVIDIA-A100-SXM4-40GB", "layout": "all-1g.5gb", "count": 10}
    healthy = slices_at([gpu_node("a100", **big)], T0)
    assert [len(s["spec"]["devices"]) for s in healthy] == [70]
    entries = [{"gpu": 9, "fault": "xid", "xid": 48, "since": time_text(T0), "for": "1m"}]
    found = slices_at([gpu_node("a100", entries, **big)], T0)
    validate(found)
    assert [len(s["spec"]["devices"]) for s in found] == [64, 6]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in found} == {2}
    marks = device_taints(found)
    assert len(marks) == 70
    assert {n for n, t in marks.items() if t} == {n for n in marks if n.startswith("gpu-9-")}
    assert [len(s["spec"]["devices"]) for s in slices_at([gpu_node("a100", entries, **big)],
                                                          T0 + 60)] == [70]  # fmt: skip


def test_a_taint_names_no_time_the_api_server_fills_it_in() -> None:
    found = slices_at([gpu_node("k80", [{"gpu": 0, "fault": "unmonitored"}])], T0)
    (marks,) = [d["taints"] for s in found for d in s["spec"]["devices"] if "taints" in d]
    assert marks == [UNMONITORED] and all("timeAdded" not in m for m in marks)


def test_a_policy_fault_taints_the_gpus_it_hits() -> None:
    p = policy(gpus={"count": 2}, fault={"fault": "xid", "xid": 95}, start={"at": time_text(T0)},
               **{"for": "5m"})  # fmt: skip
    nodes = fleet(3, gpus=2)
    found = slices_at(nodes, T0 + 1, policies=[p])
    validate(found)
    tainted = {(s["spec"]["nodeName"], d["name"]) for s in found for d in s["spec"]["devices"]
               if d.get("taints") == [xid_taint(95, "NoSchedule")]}  # fmt: skip
    hit = hit_gpus(settled(nodes, [p]))
    assert tainted == {(name, f"gpu-{i}") for name, i in hit} and len(tainted) == 2
    assert not any(device_taints(slices_at(nodes, T0 + 300, policies=[p])).values())


def test_the_state_wakes_when_a_fault_begins_and_ends() -> None:
    entries = [{"gpu": 0, "fault": "xid", "xid": 48, "since": time_text(T0 + 10), "for": "20s"}]
    state = settled([gpu_node("k80", entries)], dra=STATIC_DRA)
    assert state.taints("k80") == ()
    assert state.due(T0 + 9) == set() and state.taints("k80") == ()
    assert state.due(T0 + 10) == {"k80"}
    assert state.taints("k80") == ((catalog.Taint("gpu.nvidia.com/xid", "48", "NoSchedule"),), ())
    assert state.due(T0 + 29) == set()
    assert state.due(T0 + 31) == {"k80"} and state.taints("k80") == ()
    assert state.due(T0 + 3600) == set()


# ------------------------------------------------------------------------------- render, as a user


def test_render_prints_the_tainted_slices_and_what_each_policy_hit(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    entries = [{"gpu": 0, "fault": "unmonitored"}, {"gpu": 5, "fault": "lost"}]
    nodes.write_text(yaml.safe_dump_all([gpu_node("k80", entries), gpu_node("k80-b")]))
    good = policy_cm("hot", {"gpus": {"count": 1}, "fault": {"fault": "xid", "xid": 74},
                             "nodeSelector": "kubernetes.io/hostname=nowhere"})  # fmt: skip
    good2 = policy_cm("fire", {"gpus": {"count": 1}, "fault": {"fault": "xid", "xid": 74},
                               "start": {"at": time_text(T0)}, "seed": 1})  # fmt: skip
    bad = policy_cm("broken", {"gpus": {"count": 1}, "fault": {"fault": "fire"}})
    policies = tmp_path / "policies.yaml"
    policies.write_text(yaml.safe_dump_all([good, good2, bad]))
    done = run_cli("status_updater", "render", "--nodes", str(nodes), "--fault-policies",
                   str(policies), "--now", time_text(T0 + 5), "--resource-slices",
                   "--dra-node-selector", "type=kwok", "-o", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines == [
        "warning: configmap ops/broken (fault policy): data[policy.yaml].fault.fault: must be "
        f"one of {', '.join(catalog.CATALOG)}, got 'fire'; left out",
        f"warning: node k80: {WHERE}[1].gpu: GPU 5 is not on this node (it has 2: 0 to 1)",
        "fault policy fire: hits 1 GPUs on 1 nodes",
        "fault policy hot: hits 0 GPUs on 0 nodes",
    ]
    found = json.loads(done.stdout)["items"]
    validate(found)
    marks = {(s["spec"]["nodeName"], d["name"]): d.get("taints", [])
             for s in found for d in s["spec"]["devices"]}  # fmt: skip
    assert marks[("k80", "gpu-0")][-1] == UNMONITORED
    fire = {device for device, t in marks.items() if xid_taint(74, "NoSchedule") in t}
    assert len(fire) == 1  # `hot` selects no node
    assert {device for device, t in marks.items() if t} == {("k80", "gpu-0"), *fire}


def test_render_writes_the_faults_into_the_topology(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    entries = [{"gpu": 1, "fault": "ecc-dbe", "count": 2, "for": "1h"}]
    nodes.write_text(yaml.safe_dump(gpu_node("k80", entries)))
    done = run_cli("status_updater", "render", "--nodes", str(nodes), "--now", time_text(T0))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    (cm,) = yaml.safe_load(done.stdout)["items"]
    topo = load_yaml(cm["data"]["topology.yml"]).nodes["k80"]
    assert [g.faults for g in topo.gpus] == [(), (Fault("ecc-dbe", T0, T0 + 3600, count=2),)]


def test_slim_nodes_keep_the_annotation_and_what_a_policy_selects() -> None:
    node = copy.deepcopy(gpu_node("k80", [{"gpu": 0, "fault": "lost"}], labels={"rack": "r7"}))
    node["metadata"]["annotations"]["other"] = "x"
    slim = slim_node(node)
    assert slim["metadata"]["annotations"] == {catalog.ANNOTATION: node["metadata"]["annotations"][
        catalog.ANNOTATION]}  # fmt: skip
    p = policy(gpus={"count": 1}, nodeSelector="rack=r7")
    assert len(hit_gpus(settled([node], [p]))) == 1


def test_a_cleared_fault_never_counts_less_than_an_exporter_still_serving_it() -> None:
    """The exporter may read the new document a step or two late, or on a clock ahead: what it
    served from the old one by then is never above what it serves from the new."""
    entries = [{"gpu": 0, "fault": "pcie-replay", "since": time_text(T0)},
               {"gpu": 0, "fault": "thermal", "since": time_text(T0)}]  # fmt: skip
    state = settled([gpu_node("k80", entries)], now=T0 + 1)
    old = result(state, "k80")
    state.now = T0 + 105.3
    state.set_node(slim_node(gpu_node("k80", [])))
    state.settle()
    new = result(state, "k80")
    for late in (110, 120, 160):
        _assert_not_lower(_counters(old, T0 + late), _counters(new, T0 + late), f"T0+{late}")


def test_a_policy_that_hits_nothing_says_so_in_its_status() -> None:
    state = settled([gpu_node("k80", [])])
    cm = {"metadata": {"name": "none", "creationTimestamp": time_text(T0)},
          "data": {faults.POLICY_KEY: "nodeSelector: nomatch=1\ngpus: {count: 3}\n"
                   "fault: {fault: lost}\n"}}  # fmt: skip
    state.set_policy(faults.read_policy(cm, T0))
    state.settle()
    assert state.hits_changed == {"none"}
    assert json.loads(faults.status(state.policies["none"], state.hits.get("none", {}))) == {
        "gpus": 0, "nodes": 0, "hits": []}  # fmt: skip


def test_match_labels_are_strings_as_the_api_has_them() -> None:
    cm = {"metadata": {"name": "p"},
          "data": {faults.POLICY_KEY: "nodeSelector: {matchLabels: {gpu: true}}\n"
                   "gpus: {count: 1}\nfault: {fault: lost}\n"}}  # fmt: skip
    with pytest.raises(TopologyError, match=r"nodeSelector.matchLabels: label values are strings"):
        faults.read_policy(cm, T0)


def test_a_count_that_reaches_the_bound_stays_there_active_or_cleared() -> None:
    """A thermal fault begun years ago has throttled past 2**53 ns: served at the bound while it
    lasts, and kept at it once cleared, never lower."""
    entries = [{"gpu": 1, "fault": "thermal", "since": "2020-01-01T00:00:00Z"}]
    state = settled([gpu_node("k80", entries)])
    active = _counters(result(state, "k80"), T0)[1][catalog.THERMAL_NS]
    state.set_node(slim_node(gpu_node("k80", [])))
    state.settle()
    cleared = _counters(result(state, "k80"), T0 + 10)[1][catalog.THERMAL_NS]
    assert active == cleared == MAX_COUNT
