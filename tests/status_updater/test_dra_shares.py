"""DRA consumable capacity: the NVIDIA DRA driver's ConsumableShares (`--dra-consumable-shares`).

Checked against the facts read from the driver (`applyConsumableShares`) and Kubernetes'
allocator (`consumable_capacity.go`), never against a copy of our own output: each mode's
devices are the disabled slices' with what the driver changes, and only that; claims the
scheduler's rules allocate several to one device are each held there with what they consumed;
a claim past the device's memory is one line and holds nothing; the ConfigMap carries the shares
through a restart; the exporter serves one copy per holder with the device's values, as
dcgm-exporter's DRA mode does.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import dcgm
from exporter.generations import FIRST_WITH_DRA
from status_updater import claimstatus
from status_updater.claims import holds, read_claim
from status_updater.devices import build_node
from status_updater.dra import DraOptions, node_slimmer
from status_updater.objects import pod_uid, slim_pod
from status_updater.placement.dra import share_mib
from status_updater.reconcile import document, reconcile_node
from status_updater.resourceslices import node_slices
from status_updater.state import ClusterState
from tests.support.allocator import Allocator
from tests.support.base import examples, run_cli
from topology.model import DeviceStatus, DraClaim, NodeTopology, dump_yaml, load_yaml

A100_80 = "NVIDIA-A100-SXM4-80GB"
A100_40 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"
MODES = ("memory", "unlimited", "4")
MIB = 2**20

# Node kinds (product, GPUs, layout, DynamicMIG): a whole GPU, static MIG, DynamicMIG on a GPU
# offered whole and partitioned (H100), on one partitioned only (an A100 with MIG on) and on one
# with MIG off, offered whole only.
KINDS = {
    "whole": (A100_80, 2, None, False),
    "static-mig": (A100_40, 1, "all-balanced", False),
    "dynamic-hopper": (H100, 1, "all-enabled", True),
    "dynamic-ampere-on": (A100_40, 1, "all-enabled", True),
    "dynamic-ampere-off": (A100_40, 1, "all-disabled", True),
}


def node(kind: str, mode: str = "disabled", name: str = "n") -> dict[str, Any]:
    """The Node as the updater's informer keeps it, its driver under `--consumable-shares mode`."""
    product, count, layout, dynamic = KINDS[kind]
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count)}
    if layout is not None:
        labels |= {"nvidia.com/mig.config": layout, "nvidia.com/mig.strategy": "mixed"}
    options = DraOptions("", dynamic_mig=dynamic, consumable_shares=mode)
    return node_slimmer(options)({"kind": "Node",
                                  "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels}})  # fmt: skip


def slices(kind: str, mode: str, name: str = "n") -> list[dict[str, Any]]:
    slim = node(kind, mode, name)
    options = DraOptions("", dynamic_mig=KINDS[kind][3], consumable_shares=mode).slices()
    return node_slices(slim, build_node(slim), **options)


def devices(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in found for d in s["spec"].get("devices", [])}


def mib_of(text: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    for suffix, unit in units.items():
        if text.endswith(suffix):
            return int(text.removesuffix(suffix)) * unit
    assert int(text) % MIB == 0, text
    return int(text) // MIB


# --- what is published ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_mode_publishes_every_device_as_the_driver_shares_it(kind: str, mode: str) -> None:
    """Every device allows several allocations; its memory (already whole MiB: the rounding to
    1Mi keeps it) gets the mode's policy; with N a `shares` capacity of N, one by default; every
    other capacity, the attributes and the counters consumed are as with the feature off, and
    no other capacity has a policy (the driver gives none)."""
    plain, shared = devices(slices(kind, "disabled")), devices(slices(kind, mode))
    assert set(shared) == set(plain)
    for name, device in shared.items():
        before = plain[name]
        assert device["allowMultipleAllocations"] is True
        assert {k: v for k, v in device.items() if k not in ("allowMultipleAllocations",
                "capacity")} == {k: v for k, v in before.items() if k != "capacity"}  # fmt: skip
        capacity = dict(device["capacity"])
        memory, shares = capacity.pop("memory"), capacity.pop("shares", None)
        assert capacity == {k: v for k, v in before["capacity"].items() if k != "memory"}
        assert all("requestPolicy" not in c for c in capacity.values())
        value = before["capacity"]["memory"]["value"]
        assert memory["value"] == value and mib_of(value) > 0
        policy = memory["requestPolicy"]
        assert policy["validRange"]["max"] == value and policy["validRange"]["step"] == "1Mi"
        if mode == "memory":  # a claim without a request takes the whole memory; at least 1Mi
            assert (policy["default"], policy["validRange"]["min"]) == (value, "1Mi")
        else:  # unlimited and N: none by default, from 0
            assert (policy["default"], policy["validRange"]["min"]) == ("0", "0")
        if mode.isdigit():
            assert shares == {"value": mode, "requestPolicy": {
                "default": "1", "validRange": {"min": "1", "max": mode, "step": "1"}}}  # fmt: skip
        else:
            assert shares is None


@pytest.mark.parametrize("version", ["1.35", "1.37"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_shared_slices_are_valid_for_the_api(kind: str, mode: str, version: str) -> None:
    """Valid, and within what validation adds: at most 32 attributes and capacities a device,
    a range's min plus step within the value, max and default whole steps from min."""
    for s in slices(kind, mode):
        kubernetes_validate.validate(s, version, strict=True)
        for d in s["spec"].get("devices", []):
            assert len(d["attributes"]) + len(d["capacity"]) <= 32, d["name"]
            for c in d["capacity"].values():
                if (policy := c.get("requestPolicy")) is None:
                    continue
                r, units = policy["validRange"], MIB if c["value"][-1] == "i" else 1
                value, low, step = (mib_of(x) * MIB if units == MIB else int(x)
                                    for x in (c["value"], r["min"], r["step"]))  # fmt: skip
                top = mib_of(r["max"]) * MIB if units == MIB else int(r["max"])
                default = (
                    mib_of(policy["default"]) * MIB if units == MIB else int(policy["default"])
                )
                assert low + step <= value and top <= value
                assert (top - low) % step == 0 and (default - low) % step == 0


def test_disabled_is_the_default_and_publishes_what_it_did() -> None:
    assert DraOptions("").consumable_shares == "disabled"
    assert "shares" not in DraOptions("").slices()  # the templates' shapes stay as they were
    for kind in KINDS:
        slim = node(kind)
        plain = node_slices(slim, build_node(slim), dynamic=KINDS[kind][3])
        assert slices(kind, "disabled") == plain
        assert all("allowMultipleAllocations" not in d for d in devices(plain).values())


def test_a_thousand_shares_print_as_the_driver_s_decimal_si() -> None:
    """`resource.NewQuantity(1000, DecimalSI)` is `1k`."""
    gpu = devices(slices("whole", "1000"))["gpu-0"]
    assert gpu["capacity"]["shares"]["value"] == "1k"
    assert gpu["capacity"]["shares"]["requestPolicy"]["validRange"]["max"] == "1k"


def test_a_dynamic_gpu_offered_whole_counts_shares_in_its_counter_set_and_no_other_does() -> None:
    """The driver makes a whole GPU's capacity and its counter set from one map, which
    `applyConsumableShares` adds `shares` to first: the counter set of a GPU offered whole
    (Hopper) counts N shares; an Ampere GPU with MIG on is not offered whole, and its set does
    not. What the devices consume is unchanged."""
    hopper = slices("dynamic-hopper", "4")
    (counters,) = [c for s in hopper for c in s["spec"].get("sharedCounters", [])]
    plain = [
        c for s in slices("dynamic-hopper", "disabled") for c in s["spec"].get("sharedCounters", [])
    ]
    assert counters["counters"] == {**plain[0]["counters"], "shares": {"value": "4"}}
    ampere = slices("dynamic-ampere-on", "4")
    assert all(
        "shares" not in c["counters"] for s in ampere for c in s["spec"].get("sharedCounters", [])
    )


@pytest.mark.parametrize("bad", ["1", "0", "-2", "shares", "4.5", "", "1000001"])
def test_a_bad_mode_is_one_line(bad: str) -> None:
    result = run_cli("status_updater", "render", "--nodes", "x.yaml", "--resource-slices",
                     "--dra-consumable-shares", bad)  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "error:" in x]
    assert "--dra-consumable-shares" in line and "disabled, memory, unlimited" in line


def test_the_mode_comes_from_the_environment_too(tmp_path: Any) -> None:
    path = tmp_path / "n.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"apiVersion": "v1", **node("whole")}))
    env = {"DRA_CONSUMABLE_SHARES": "memory"}
    result = run_cli("status_updater", "render", "--nodes", str(path), "--resource-slices", env=env)
    assert result.returncode == 0, result.stderr
    found = list(yaml.safe_load(result.stdout)["items"])
    assert devices(found)["gpu-0"]["capacity"]["memory"]["requestPolicy"]["default"] == "80Gi"
    bad = run_cli(
        "status_updater", "render", "--nodes", str(path), env={"DRA_CONSUMABLE_SHARES": "x"}
    )
    assert bad.returncode == 2 and "DRA_CONSUMABLE_SHARES" in bad.stderr


# --- claims sharing a device -----------------------------------------------------------------------


def day(n: int) -> str:
    return f"2026-01-{n % 28 + 1:02d}T{n // 28 % 24:02d}:00:00Z"


def pod(
    i: int, age: int = 0, containers: tuple[str, ...] = ("main",), where: str = "n"
) -> dict[str, Any]:
    """`p<i>`, its containers using its claim `c<i>`."""
    return {"kind": "Pod",
            "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"uid-p{i}", "creationTimestamp": day(age)},
            "spec": {"nodeName": where,
                     "containers": [{"name": c, "resources": {"claims": [{"name": "gpu"}]}} for c in containers],
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{i}"}]},
            "status": {"phase": "Running"}}  # fmt: skip


def claim(
    i: int, memory: str | None = None, profile: str | None = None, **requests: str
) -> dict[str, Any]:
    """`c<i>`, one request of a GPU (or a MIG device of `profile`) asking `memory` of it (and
    the other capacities `requests`), reserved for `p<i>`."""
    exactly: dict[str, Any] = {"deviceClassName": "mig.nvidia.com" if profile else "gpu.nvidia.com"}
    if profile:
        exactly["selectors"] = [
            {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"}}
        ]
    asks = {**({"memory": memory} if memory else {}), **requests}
    if asks:
        exactly["capacity"] = {"requests": asks}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"c{i}", "namespace": "ns", "uid": f"uid-c{i}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            "status": {"reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": f"uid-p{i}"}]}}  # fmt: skip


def by_hand(
    i: int, device: str, memory: str | None, share: str | None = "", pool: str = "n"
) -> dict[str, Any]:
    """`c<i>` as a hand-written allocation of `device`: its share id (`share` "": one made of
    `i`; None: none, the device the claim's alone) and the memory it consumed."""
    found = claim(i)
    result: dict[str, Any] = {
        "request": "gpu",
        "driver": "gpu.nvidia.com",
        "pool": pool,
        "device": device,
    }
    if share is not None:
        result["shareID"] = share or f"00000000-0000-4000-8000-{i:012d}"
    if memory is not None:
        result["consumedCapacity"] = {"memory": memory}
    found["status"]["allocation"] = {"devices": {"results": [result]}}
    return found


def settled(
    kind: str, mode: str, pods: list[dict[str, Any]], claims: list[dict[str, Any]]
) -> ClusterState:
    options = DraOptions("", dynamic_mig=KINDS[kind][3], consumable_shares=mode)
    raw = node(kind, mode)
    return ClusterState.of([raw], pods, claims=claims, slim=node_slimmer(options))


def result_of(state: ClusterState) -> NodeTopology:
    found = state.results["n"]
    assert isinstance(found, NodeTopology)
    return found


def statuses(found: NodeTopology) -> list[DeviceStatus]:
    return [s for g in found.gpus
            for s in (g.status, *(d.status for d in g.mig_devices or ())) if s is not None]  # fmt: skip


def shares_on(found: NodeTopology) -> dict[str, list[tuple[str, str, int | None]]]:
    """device -> (pod, container, consumed MiB) of each claim holding it."""
    out: dict[str, list[tuple[str, str, int | None]]] = {}
    for s in statuses(found):
        for c in s.dra_claims:
            out.setdefault(c.device, []).append(
                (c.holder.pod, c.holder.container, c.consumed_memory)
            )
    return out


def said(state: ClusterState) -> list[str]:
    return [str(w) for w in state.node_warnings("n")]


def test_the_allocator_rounds_consumption_as_kubernetes_does() -> None:
    """Research's example: `memory` mode, a request of 1500M is 1431Mi (min 1Mi plus whole
    steps of 1Mi, rounded up); no request takes the default: all of it (memory), none (unlimited,
    N); N's shares one each."""
    for mode, asks, memory, shares in (("memory", "1500M", "1431Mi", None),
                                       ("memory", None, "80Gi", None),
                                       ("unlimited", None, "0", None), ("unlimited", "1Gi", "1Gi", None),
                                       ("4", None, "0", "1")):  # fmt: skip
        allocator = Allocator(slices("whole", mode))
        c = claim(0, asks)
        assert allocator.allocate_claim(c)
        (result,) = c["status"]["allocation"]["devices"]["results"]
        assert result["consumedCapacity"] == {
            "memory": memory,
            **({"shares": shares} if shares else {}),
        }
        assert len(result["shareID"]) == 36
        kubernetes_validate.validate(c, "1.35", strict=True)


@pytest.mark.parametrize("mode", ["memory", "unlimited"])
def test_claims_share_a_whole_gpu_each_holding_what_it_consumed(mode: str) -> None:
    """Three claims of 20, 30 and 25 GiB on an 80 GiB GPU: the scheduler gives all three the
    first GPU; each holder is there with its share id and the memory it consumed, and uses 90 %
    of it by default. A fourth of 10 GiB does not fit there (5 left) and goes to the second GPU."""
    allocator = Allocator(slices("whole", mode))
    claims = [claim(i, f"{gib}Gi") for i, gib in enumerate((20, 30, 25, 10))]
    assert all(allocator.allocate_claim(c) for c in claims)
    pods = [pod(i, age=i) for i in range(4)]
    state = settled("whole", mode, pods, claims)
    assert said(state) == []
    found = result_of(state)
    assert shares_on(found) == {"gpu-0": [("p0", "main", 20480), ("p1", "main", 30720), ("p2", "main", 25600)],
                                "gpu-1": [("p3", "main", 10240)]}  # fmt: skip
    gpu = found.gpus[0].status
    assert gpu is not None
    ids = {c.share_id for c in gpu.dra_claims}
    assert len(ids) == 3 and "" not in ids
    used = {uid: u.fb_used for uid, u in gpu.pod_gpu_usage_status.items()}
    assert used == {"uid-p0": 18432, "uid-p1": 27648, "uid-p2": 23040}  # 90 % of each


def test_without_memory_each_holder_uses_its_part_of_the_device() -> None:
    """`unlimited`: claims without a request consume no memory; each of three uses 90 % of a
    third of the device (memory is not isolated: nothing stops it using more)."""
    allocator = Allocator(slices("whole", "unlimited"))
    claims = [claim(i) for i in range(3)]
    assert all(allocator.allocate_claim(c) for c in claims)
    state = settled("whole", "unlimited", [pod(i, age=i) for i in range(3)], claims)
    gpu = result_of(state).gpus[0].status
    assert gpu is not None and len(gpu.dra_claims) == 3
    total = 81920  # the A100 80GB's memory as DCGM totals it
    assert {u.fb_used for u in gpu.pod_gpu_usage_status.values()} == {int(total // 3 * 0.9)}


def test_shares_of_n_use_their_part_of_the_device_in_a_cluster() -> None:
    """N mode (`4`): claims without a request consume no memory and one share each; each of
    three uses 90 % of a quarter of the device, whatever how many share it."""
    allocator = Allocator(slices("whole", "4"))
    claims = [claim(i) for i in range(3)]
    assert all(allocator.allocate_claim(c) for c in claims)
    state = settled("whole", "4", [pod(i, age=i) for i in range(3)], claims)
    gpu = result_of(state).gpus[0].status
    assert gpu is not None and len(gpu.dra_claims) == 3
    total = 81920
    assert {u.fb_used for u in gpu.pod_gpu_usage_status.values()} == {int(total // 4 * 0.9)}


def test_a_pod_s_annotation_still_sets_what_it_uses() -> None:
    allocator = Allocator(slices("whole", "memory"))
    claims = [claim(i, "10Gi") for i in range(2)]
    assert all(allocator.allocate_claim(c) for c in claims)
    pods = [pod(i, age=i) for i in range(2)]
    pods[1]["metadata"]["annotations"] = {"run.ai/simulated-fb-used": "70000"}  # past its 10 GiB
    gpu = result_of(settled("whole", "memory", pods, claims)).gpus[0].status
    assert gpu is not None
    assert gpu.pod_gpu_usage_status["uid-p0"].fb_used == 9216
    assert gpu.pod_gpu_usage_status["uid-p1"].fb_used == 70000


def test_shares_of_n_default_to_their_part_of_the_device() -> None:
    """Under N shares a holder that consumed no memory uses 90 % of its shares' part; with
    memory consumed, of that; without N known, of the device over the allocations sharing it."""
    one = [{"share-id": "a", "consumed-memory": "0", "consumed-shares": "1"}]
    two = [{"share-id": "b", "consumed-memory": "0", "consumed-shares": "2"}]
    assert share_mib(80000, one, 3, 4) == 20000
    assert share_mib(80000, two, 3, 4) == 40000
    assert share_mib(80000, [{"share-id": "c", "consumed-memory": "90000"}], 1, 4) == 80000
    assert share_mib(80000, one, 3, None) == 26666
    assert share_mib(80000, [], 3, 4) is None  # not shared: the device's default


def test_holds_carry_each_share_s_id_and_what_it_consumed() -> None:
    """`holds()` entries name the share and what it consumed (memory in MiB, rounded down; N's
    shares); one container using two shares of one device holds each."""
    allocator = Allocator(slices("whole", "4"))
    c = claim(0, "1500M")
    c["spec"]["devices"]["requests"].append(
        copy.deepcopy(c["spec"]["devices"]["requests"][0]) | {"name": "more"}
    )
    assert allocator.allocate_claim(c)
    first, second = c["status"]["allocation"]["devices"]["results"]
    assert first["device"] == second["device"] == "gpu-0" and first["shareID"] != second["shareID"]
    p = slim_pod(pod(0))
    found = holds(p, {("ns", "c0"): read_claim(c)})
    assert [(h["share-id"], h["consumed-memory"], h["consumed-shares"]) for h in found] == [
        (first["shareID"], "1431", "1"), (second["shareID"], "1431", "1")]  # fmt: skip
    placed, warnings = place(node("whole", "4"), [pod(0)], [c], None)
    assert warnings == []
    gpu = placed.gpus[0].status
    assert gpu is not None and [x.consumed_memory for x in gpu.dra_claims] == [1431, 1431]
    assert gpu.pod_gpu_usage_status["uid-p0"].fb_used == int(2862 * 0.9)  # both its shares
    # Memory a hand wrote in bytes reads in whole MiB, rounded down.
    (entry,) = holds(p, {("ns", "c0"): read_claim(by_hand(0, "gpu-0", "1500M"))})
    assert entry["consumed-memory"] == "1430"


def test_a_claim_past_the_device_s_memory_is_one_line_and_holds_nothing() -> None:
    """Hand-written allocations of 50 and 40 GiB on one 80 GiB GPU (the scheduler never makes
    them): the older pod holds its share, the younger nothing, said in one line naming both
    figures; placing again keeps it so."""
    claims = [by_hand(0, "gpu-0", "50Gi"), by_hand(1, "gpu-0", "40Gi")]
    pods = [pod(0, age=0, containers=("a", "b")), pod(1, age=1)]
    state = settled("whole", "memory", pods, claims)
    assert shares_on(result_of(state)) == {"gpu-0": [("p0", "a", 51200), ("p0", "b", 51200)]}
    assert said(state) == [
        "pod ns/p1: claims[ns/c1]: device gpu-0: its share consumes 40960 MiB "
        "of memory, and the claims sharing it 51200 MiB of its 81920: not placed"
    ]
    # A newer, older pod does not take it either: the holder keeps its share.
    older = pod(2, age=0)
    older["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    state.set_pod(slim_pod(older))
    state.set_claim(read_claim(by_hand(2, "gpu-0", "40Gi")))
    state.settle()
    assert [p for p, _, _ in shares_on(result_of(state))["gpu-0"]] == ["p0", "p0"]


@pytest.mark.parametrize("first_shared", [True, False])
def test_a_device_a_claim_holds_alone_is_shared_with_no_other(first_shared: bool) -> None:
    """A claim allocated without a share id holds the device alone; a shared allocation onto it
    (or the other way round) is the later pod's one line."""
    claims = [by_hand(0, "gpu-0", "1Gi", "" if first_shared else None),
              by_hand(1, "gpu-0", "1Gi", None if first_shared else "")]  # fmt: skip
    state = settled("whole", "memory", [pod(0, age=0), pod(1, age=1)], claims)
    assert [p for p, _, _ in shares_on(result_of(state))["gpu-0"]] == ["p0"]
    (line,) = said(state)
    assert line.startswith("pod ns/p1: claims[ns/c1]: device gpu-0 is held by DRA claim ns/c0")


def test_a_bad_consumed_capacity_is_that_claim_s_one_line() -> None:
    claims = [by_hand(0, "gpu-0", "lots"), by_hand(1, "gpu-0", "1Gi")]
    state = settled("whole", "memory", [pod(0), pod(1, age=1)], claims)
    assert shares_on(result_of(state)) == {"gpu-0": [("p1", "main", 1024)]}
    (line,) = said(state)
    assert line.startswith(
        "pod ns/p0: claims[ns/c0]: status.allocation.devices.results[0]."
        "consumedCapacity.memory: expected a Kubernetes quantity"
    )
    assert line.endswith(": not placed")


@pytest.mark.parametrize("kind", ["static-mig", "dynamic-hopper"])
def test_mig_devices_publish_capacities_a_first_share_takes_whole(kind: str) -> None:
    """The driver's caveat: a MIG device's (and a DynamicMIG whole GPU's) other capacities have no
    policy, so a share without a request for them takes all of each, and a second share fits
    nowhere; only a claim asking 0 of each would fit beside it."""
    mode = "unlimited"
    offered = slices(kind, mode)
    gpu_or_mig = [d for d in devices(offered).values() if "multiprocessors" in d["capacity"]]
    assert gpu_or_mig and all(
        "requestPolicy" not in d["capacity"]["multiprocessors"] for d in gpu_or_mig
    )
    allocator = Allocator(offered)
    first = claim(0, "1Gi", profile="1g.5gb" if kind == "static-mig" else None)
    assert allocator.allocate_claim(first)
    device = first["status"]["allocation"]["devices"]["results"][0]["device"]
    consumed = first["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]
    assert (
        consumed["multiprocessors"]
        == devices(offered)[device]["capacity"]["multiprocessors"]["value"]
    )
    # The same device again, as hand asks for it: a request of every capacity at 0 fits.
    zeros = {k: "0" for k in devices(offered)[device]["capacity"] if k != "memory"}
    taken = [d for d in allocator.devices if d["name"] == device]
    allocator.devices = taken  # offer only that device
    assert (
        allocator.allocate("mig" if "mig" in device else "gpu", None, capacity={"memory": "1Gi"})
        is None
    )
    assert (
        allocator.allocate(
            "mig" if "mig" in device else "gpu", None, capacity={"memory": "1Gi", **zeros}
        )
        is not None
    )


# --- through the ConfigMap, and at the exporter ------------------------------------------------------


def place(
    slim_node: dict[str, Any],
    objects: list[dict[str, Any]],
    claims: list[dict[str, Any]],
    previous: NodeTopology | None,
) -> tuple[NodeTopology, list[str]]:
    """The node's placement, as the state joins the claims to the pods (pure)."""
    pods = [slim_pod(p) for p in objects]
    read = {c.key: c for c in map(read_claim, claims)}
    held = {pod_uid(p): h for p in pods if (h := holds(p, read))}
    found, warnings = reconcile_node(slim_node, pods, previous=previous, holds=held)
    return found, [str(w) for w in warnings]


def read_back(found: NodeTopology) -> NodeTopology:
    """What a restarted updater reads of what it wrote."""
    return load_yaml(dump_yaml(document("n", found, "mixed"))).nodes["n"]


def shared_whole_gpu() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    allocator = Allocator(slices("whole", "memory"))
    claims = [claim(i, f"{gib}Gi") for i, gib in enumerate((20, 30))]
    assert all(allocator.allocate_claim(c) for c in claims)
    return [pod(0, age=0, containers=("a", "b")), pod(1, age=1)], claims


def test_the_configmap_carries_each_share_through_a_restart() -> None:
    pods, claims = shared_whole_gpu()
    slim = node("whole", "memory")
    placed, warnings = place(slim, pods, claims, None)
    assert warnings == []
    back = read_back(placed)
    assert back == placed
    gpu = back.gpus[0].status
    assert gpu is not None
    assert [(c.holder.container, c.consumed_memory) for c in gpu.dra_claims] == [
        ("a", 20480), ("b", 20480), ("main", 30720)]  # fmt: skip
    assert all(c.share_id for c in gpu.dra_claims)
    assert place(slim, pods, claims, back) == (placed, [])


def test_the_exporter_serves_one_copy_per_holder_with_the_device_s_values() -> None:
    """dcgm-exporter's DRA mode: one copy of each series per pod container holding the device,
    each with the device's value and its claim's labels, none naming the share (dcgm-exporter
    has no such label: a sum over pods counts the GPU once per holder). FB_USED is the device's:
    the holders' use added up, at most the device's memory."""
    pods, claims = shared_whole_gpu()
    placed, _ = place(node("whole", "memory"), pods, claims, None)
    options = dcgm.Options("h", generation=FIRST_WITH_DRA, dra=True)
    subjects = dcgm.entities(placed, options, 1_795_000_000.0)
    gpu0 = [(dict(labels), r) for _, labels, r in subjects if dict(labels).get("gpu") == "0"]
    holders = sorted((lab["pod"], lab["container"], lab["dra_claim_name"]) for lab, _ in gpu0)
    assert holders == [("p0", "a", "c0"), ("p0", "b", "c0"), ("p1", "main", "c1")]
    assert not any("share" in k for lab, _ in gpu0 for k in lab)
    readings = {id(r) for _, r in gpu0}
    assert len(readings) == 1  # the same values on every copy
    reading = gpu0[0][1]
    status = placed.gpus[0].status
    assert status is not None
    assert reading.fb_used == min(sum(u.fb_used for u in status.pod_gpu_usage_status.values()),
                                  reading.fb_total or 0)  # fmt: skip
    assert reading.fb_used == 18432 + 27648
    # Past the device's memory (annotations asking more than each share), FB_USED stops there.
    for p in pods:
        p["metadata"]["annotations"] = {"run.ai/simulated-fb-used": "60000"}
    full, _ = place(node("whole", "memory"), pods, claims, None)
    (reading, *_) = [r for _, labels, r in dcgm.entities(full, options, 1_795_000_000.0)
                     if dict(labels).get("gpu") == "0"]  # fmt: skip
    assert reading.fb_used == reading.fb_total == 81920


# --- any sequence of shared allocations -------------------------------------------------------------


def shared_claims(
    kind: str, mode: str, drawn: list[tuple[Any, ...]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Pods and claims: each drawn claim allocated by the allocator (asking some memory or none,
    of a GPU or of a MIG profile), or hand-written onto a device with a share id or none and any
    memory (as a scheduler would never make it); one the allocator cannot fit is left out."""
    offered = slices(kind, mode)
    names = sorted(devices(offered))
    profiles = sorted({d["attributes"]["profile"]["string"] for d in devices(offered).values()
                       if "profile" in d["attributes"]})  # fmt: skip
    allocator = Allocator(offered, seed=len(drawn))
    pods, claims = [], []
    for i, (how, asks, which, share, age, containers) in enumerate(drawn):
        if how == "scheduler":
            profile = profiles[which % len(profiles)] if profiles and which % 2 else None
            c = claim(i, asks, profile)
            if not allocator.allocate_claim(c):
                continue
        else:
            c = by_hand(i, names[which % len(names)], asks or "0", "" if share else None)
        claims.append(c)
        pods.append(pod(i, age=age, containers=("main", "side")[:containers]))
    return pods, claims


def published_memory(kind: str, mode: str) -> dict[str, int]:
    return {
        n: mib_of(d["capacity"]["memory"]["value"]) for n, d in devices(slices(kind, mode)).items()
    }


@settings(max_examples=examples(60), deadline=None)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    mode=st.sampled_from(MODES),
    drawn=st.lists(
        st.tuples(
            st.sampled_from(["scheduler", "scheduler", "by hand"]),
            st.one_of(
                st.none(),
                st.integers(1, 90000).map(lambda n: f"{n}Mi"),
                st.integers(1, 90).map(lambda n: f"{n}G"),
            ),
            st.integers(0, 60),
            st.booleans(),
            st.integers(0, 5),
            st.integers(1, 2),
        ),
        max_size=8,
    ),
)
def test_any_shared_allocations_keep_every_device_within_its_memory_and_are_a_fixed_point(
    kind: str, mode: str, drawn: list[tuple[Any, ...]]
) -> None:
    """Whatever claims the scheduler (and hands) made: no device's holders consumed more than
    the memory it published, a claim's allocation is held on one device only and by each of its
    containers once, a device a claim holds alone has no other claim, and placing again from the
    result, or from what a restarted updater reads back, changes nothing."""
    pods, claims = shared_claims(kind, mode, drawn)
    slim = node(kind, mode)
    placed, _ = place(slim, pods, claims, None)
    memory = published_memory(kind, mode)
    where: dict[tuple[str, str], set[str]] = {}
    for status in statuses(placed):
        held = status.dra_claims
        assert len(set(held)) == len(held), "a container holds one allocation twice"
        by_share = {(c.claim, c.share_id): c.consumed_memory or 0 for c in held}
        device = held[0].device if held else None
        if device is not None:
            assert sum(by_share.values()) <= memory[device], device
            assert all(c.share_id for c in held) or len({c.claim for c in held}) == 1
        for c in held:
            where.setdefault((c.claim, c.share_id), set()).add(c.device)
        assert set(status.pod_gpu_usage_status) == {f"uid-{c.holder.pod}" for c in held}
    assert all(len(found) == 1 for found in where.values())
    again, _ = place(slim, pods, claims, placed)
    assert again == placed
    assert place(slim, pods, claims, read_back(placed))[0] == placed


def test_every_holder_is_counted_once_per_container() -> None:
    pods, claims = shared_whole_gpu()
    placed, _ = place(node("whole", "memory"), pods, claims, None)
    status = placed.gpus[0].status
    assert status is not None
    assert Counter(c.holder.pod for c in status.dra_claims) == {"p0": 2, "p1": 1}
    assert isinstance(status.dra_claims[0], DraClaim)
    assert copy.deepcopy(placed) == placed


def test_the_claims_status_names_each_share_as_the_api_requires() -> None:
    """--dra-claim-status: a shared device's `status.devices` entry carries its allocation's
    shareID (the API refuses one that does not match), one entry per share; a device held
    alone has none."""
    pods, claims = shared_whole_gpu()
    state = settled("whole", "memory", pods, claims)
    said = claimstatus.held(state, "n")
    allocated = {(c["metadata"]["namespace"], c["metadata"]["name"]): {
        r["shareID"] for r in c["status"]["allocation"]["devices"]["results"]} for c in claims}  # fmt: skip
    assert said and {key: {s for *_, s in found} for key, found in said.items()} == allocated
    for found in said.values():
        for pool, device, uuid, share in found:
            entry = claimstatus._entry(pool, device, uuid, share, None)
            assert entry["shareID"] == share and entry["device"] == device
    # Read back from the claim, what was written compares equal: nothing is written again.
    for c in claims:
        key = (c["metadata"]["namespace"], c["metadata"]["name"])
        c["status"]["devices"] = [claimstatus._entry(*d, None) for d in sorted(said[key])]
        assert read_claim(c).devices_status == frozenset(said[key])
    assert "shareID" not in claimstatus._entry("n", "gpu-0", "GPU-1", "", None)
