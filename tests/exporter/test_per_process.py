"""Per-pod values with --kubernetes-virtual-gpus, as dcgm-exporter 4.5.3 and later serve them (its
PR #594, read from its code: transformation/process_metrics.go and kubernetes.go).

What a user checks: each pod sharing a GPU (time-slicing or MPS replicas, KAI fractions) has its
own FB_USED and GPU_UTIL, with `pod_uid`; the device keeps its own series of those two, without
pod labels, and the pods' values add up to it; every other field is one copy per holder with the
device's value; an older generation copies the device's values to every holder; nothing is
served twice.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import dcgm
from exporter.fields import canonical
from exporter.generations import G483, G484, G490, G2022, Generation
from exporter.series import apportion
from tests.pipeline.test_generations import NOW
from tests.support.base import examples, run_cli
from tests.support.promtext import Series, duplicates, parse, promtool_findings
from topology.configmap import parse_document
from topology.model import (
    AllocatedBy,
    DeviceStatus,
    Gpu,
    NodeTopology,
    PodUsage,
    Replica,
    Sharing,
    Utilization,
)

PER_PROCESS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL")


@cache
def sample(node: str) -> NodeTopology:
    """A sample node as `render` places its pods."""
    files = {
        "h100-kai-0": ("samples/mig/kai/nodes.yaml", "samples/mig/kai/pods.yaml"),
        "a100-time-sliced": ("samples/mig/sharing/a100-40gb-time-sliced.yaml",
                             "samples/mig/sharing/pods.yaml"),
    }[node]  # fmt: skip
    done = run_cli("status_updater", "render", "--nodes", files[0], "--pods", files[1])
    assert done.returncode == 0, done.stderr
    return parse_document(done.stdout, "samples").nodes[node]


def served(node: NodeTopology, g: Generation, now: float = NOW) -> list[Series]:
    text = dcgm.render(node, dcgm.Options("n", generation=g, virtual_gpus=True), now).decode()
    series = parse(text)  # Prometheus takes it whole: it parses, no sample twice
    assert duplicates(series) == []
    return series


def by_device(series: list[Series], family: str) -> dict[str, list[Series]]:
    out: dict[str, list[Series]] = defaultdict(list)
    for s in series:
        if canonical(s.name) == family:
            out[s.label("UUID") + dict(s.labels).get("GPU_I_ID", "")].append(s)
    return out


@pytest.mark.parametrize("node", ["h100-kai-0", "a100-time-sliced"])
@pytest.mark.parametrize("g", [G483, G484, G490], ids=lambda g: g.name)
def test_each_pod_has_its_own_memory_and_utilization_adding_up_to_the_devices(
    node: str, g: Generation
) -> None:
    topology = sample(node)
    series = served(topology, g)
    statuses = {gpu.id: gpu.status for gpu in topology.gpus}
    checked = 0
    for family in PER_PROCESS:
        for device, copies in by_device(series, family).items():
            status = statuses[device]
            own = [s for s in copies if "pod" not in s.label_names]
            pods = [s for s in copies if "pod" in s.label_names]
            if status is None or status.allocated_by is None:
                assert pods == [] and len(own) == 1  # a free GPU: its one series
                continue
            (device_series,) = own  # the device's own, without pod labels
            assert all(s.label_names[-1] in ("pod_uid", "vgpu") for s in pods)
            # One value per pod (every copy of a pod carries the pod's), adding up to the device.
            per_pod = {s.label("pod_uid"): s.value for s in pods}
            assert set(per_pod) == set(status.pod_gpu_usage_status)
            scale = 1.0 if family == "DCGM_FI_DEV_FB_USED" or g is not G490 else 100.0
            total = round(sum(per_pod.values()) * scale)
            assert total == round(device_series.value * scale)
            if family == "DCGM_FI_DEV_FB_USED" and g is not G490:
                for uid, value in per_pod.items():
                    assert value <= status.pod_gpu_usage_status[uid].fb_used
            checked += 1
    assert checked


@pytest.mark.parametrize("g", [G483, G490], ids=lambda g: g.name)
def test_other_fields_are_one_copy_per_holder_with_the_devices_value(g: Generation) -> None:
    topology = sample("h100-kai-0")
    series = served(topology, g)
    power = [s for s in series if canonical(s.name) == "DCGM_FI_DEV_POWER_USAGE"]
    for gpu in topology.gpus:
        copies = [s for s in power if s.label("UUID") == gpu.id]
        held = gpu.status is not None and gpu.status.allocated_by is not None
        holders = 1 + len(gpu.status.fractions) if gpu.status and held else 1
        assert len(copies) == holders
        assert len({s.value for s in copies}) == 1  # the device's, on every copy
        assert all(("pod" in s.label_names) == held for s in copies)


def test_before_4_5_3_every_copy_carries_the_devices_values() -> None:
    series = served(sample("a100-time-sliced"), G2022)
    for family in PER_PROCESS:
        for copies in by_device(series, family).values():
            assert len({s.value for s in copies}) == 1
            assert all("pod" in s.label_names for s in copies)
            assert all("pod_uid" not in s.label_names for s in copies)


def test_a_later_step_is_served_as_a_fresh_exporter_serves_it() -> None:
    """The values kept from step to step (NodeSeries.at) are what a new render gives."""
    topology = sample("h100-kai-0")
    options = dcgm.Options("n", generation=G484, virtual_gpus=True)
    first = dcgm.NodeSeries(topology, options, NOW)
    for later in (NOW + 10, NOW + 20, NOW + 3600):
        stepped = b"".join(dcgm.join_parts([first.at(later).parts()], options))
        fresh_options = dcgm.Options("n", generation=G484, virtual_gpus=True)
        fresh = dcgm.render(topology, fresh_options, later)
        assert _without_energy(stepped) == _without_energy(fresh)


def _without_energy(text: bytes) -> list[bytes]:
    return [line for line in text.splitlines() if b"ENERGY" not in line]


def test_the_exposition_passes_promtool() -> None:
    text = dcgm.render(sample("h100-kai-0"), dcgm.Options("n", generation=G484,
                                                          virtual_gpus=True), NOW).decode()  # fmt: skip
    assert promtool_findings(text) == []


@given(st.lists(st.integers(0, 200), max_size=8), st.integers(0, 300))
def test_apportion_keeps_values_within_the_device_and_adds_up_to_it(
    values: list[int], most: int
) -> None:
    shares = apportion(values, most)
    assert len(shares) == len(values)
    assert sum(shares) == min(sum(values), most)
    assert all(0 <= s <= v for s, v in zip(shares, values, strict=True))


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100), st.integers(0, 90_000)),
             min_size=1, max_size=6),
    st.sampled_from([G483, G484, G490]),
    st.integers(0, 10**6),
)  # fmt: skip
def test_any_pods_sharing_a_gpu_add_up_to_it_at_any_step(
    pods: list[tuple[int, int, int]], g: Generation, step: int
) -> None:
    """Replicas of a time-sliced GPU with any usage (their sums past the GPU's memory and 100 %
    included): each pod's own values are at most its use, and add up to the device's."""
    usage = {f"u{i}": PodUsage(Utilization(min(a, b), max(a, b)), fb)
             for i, (a, b, fb) in enumerate(pods)}  # fmt: skip
    holders = [AllocatedBy("ns", f"p{i}", "c") for i in range(len(pods))]
    replicas = tuple(Replica(i, h, f"u{i}") for i, h in enumerate(holders))
    status = DeviceStatus(holders[0], usage, replicas)
    node = NodeTopology(1, 81_920, "NVIDIA-H100-80GB-HBM3", gpus=(Gpu("GPU-1", status),),
                        sharing=Sharing("time-slicing", len(pods) + 1))  # fmt: skip
    series = served(node, g, NOW + 10 * step)
    for family in PER_PROCESS:
        copies = [s for s in series if canonical(s.name) == family]
        (device,) = [s for s in copies if "pod" not in s.label_names]
        own = {s.label("pod_uid"): s.value for s in copies if "pod" in s.label_names}
        assert set(own) == set(usage)
        scale = 100.0 if g is G490 and family == "DCGM_FI_DEV_GPU_UTIL" else 1.0
        assert round(sum(own.values()) * scale) == round(device.value * scale)
        if family == "DCGM_FI_DEV_FB_USED" and g is not G490:
            assert all(own[uid] <= u.fb_used for uid, u in usage.items())
