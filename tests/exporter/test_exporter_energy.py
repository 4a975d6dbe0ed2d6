"""DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION is a counter: within a process it never goes back, for any
(node, GPU), whatever the clock does and whatever nodes come and go.

A decrease is a counter reset to Prometheus: `rate()` and `increase()` would add the whole count
again, a spike of megawatts on a dashboard.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import dcgm
from exporter.many import NodesExporter
from exporter.readings import BOOT_EPOCH_S, EnergyMeter
from mig_exporter.web.server import Published
from tests.exporter.test_exporter import MIG, whole_gpu
from tests.support.base import examples
from tests.support.promtext import parse
from topology.model import Topology

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
START = BOOT_EPOCH_S + 400 * 86_400.0
DAY = 86_400
NODES = ("a", "b", "c")
STEPS = st.one_of(
    st.integers(-3, 3).map(lambda n: n * dcgm.UTILIZATION_STEP_S),  # a step or a few
    st.integers(-2 * DAY, 2 * DAY),  # NTP or a person setting the clock, either way
    st.floats(-3600, 3600, allow_nan=False),
)
ACTIONS = st.one_of(
    st.tuples(st.just("clock"), STEPS),
    st.tuples(st.just("present"), st.sampled_from(NODES[1:]), st.integers(0, 100)),
    st.tuples(st.just("absent"), st.sampled_from(NODES[1:])),
    st.tuples(st.just("select"), st.frozensets(st.sampled_from(NODES))),
)


def node_doc(name: str, percent: int) -> Topology:
    """A node's own ConfigMap: two whole GPUs, one `percent` busy (its power), or the MIG node."""
    base = whole_gpu(percent, percent) if name != "c" else MIG
    (node,) = base.nodes.values()
    return Topology(base.mig_strategy, {name: node})


@settings(derandomize=True, max_examples=examples(150), deadline=None)
@given(st.lists(ACTIONS, min_size=1, max_size=40))
def test_no_gpus_counter_ever_goes_back_whatever_the_clock_and_the_nodes_do(
    actions: list[tuple],  # type: ignore[type-arg]
) -> None:
    now = [START]
    many = NodesExporter(dcgm.Options("ignored"), Published(), clock=lambda: now[0])
    highest: dict[tuple[str, str], float] = {}  # (Hostname, UUID) -> the most it served
    for action in actions:
        if action[0] == "clock":
            now[0] += action[1]
        elif action[0] == "present":
            many.update_source(f"topology-{action[1]}", node_doc(action[1], action[2]), "cm")
        elif action[0] == "absent":
            many.remove_source(f"topology-{action[1]}")
        else:
            many.select(set(action[1]))
        for s in parse(many.snapshot().body.decode()):
            if s.name == ENERGY:
                key = (s.label("Hostname"), s.label("UUID"))
                assert s.value >= highest.get(key, 0), (key, s.value, highest[key])
                highest[key] = s.value


GPUS = st.sampled_from(["GPU-1", "GPU-2"])
POWERS = st.floats(-50, 2000, allow_nan=False)  # watts, past the limit and below zero too
LIMITS = st.sampled_from([72.0, 400.0, 700.0])  # an L4's, an A100's, an H100's
READS = st.one_of(
    st.tuples(st.just("read"), st.sampled_from(NODES), GPUS, POWERS, LIMITS),
    st.tuples(st.just("drop"), st.sampled_from(NODES), GPUS),
    st.tuples(st.just("clock"), STEPS),
)


@settings(derandomize=True, max_examples=examples(300), deadline=None)
@given(st.lists(READS, min_size=1, max_size=60), st.sampled_from([4096, 1]))
def test_the_meter_never_counts_back_whatever_it_is_given(
    actions: list[tuple],  # type: ignore[type-arg]
    retired: int,
) -> None:
    """Any power (above the limit, below zero), any limit: each (node, GPU) only counts up. With
    room for one gone GPU only, the others come back from the most they can have drawn: limits
    then stay each GPU's own (a GPU whose limit changes is kept among the gone)."""
    meter = EnergyMeter()
    meter.RETIRED = retired
    limits: dict[tuple[str, str], float] = {}
    at, highest = START, {}
    for action in actions:
        if action[0] == "clock":
            at += action[1]
        elif action[0] == "drop":
            meter.drop(action[1], [action[2]])
        else:
            _, node, gpu, power, limit = action
            if retired == 1:
                limit = limits.setdefault((node, gpu), limit)
            count = meter.read(node, gpu, at, power, limit)
            assert count >= highest.get((node, gpu), 0), (node, gpu)
            highest[node, gpu] = count


def test_a_node_that_comes_back_after_the_clock_went_back_counts_on_from_its_last_value() -> None:
    """The case that went back: a node's GPUs are dropped when it goes, the clock steps back
    (an NTP correction), the node returns: its counters start from at least where they were."""
    now = [START]
    many = NodesExporter(dcgm.Options("ignored"), Published(), clock=lambda: now[0])

    def energy() -> dict[str, float]:
        return {s.label("UUID"): s.value for s in parse(many.snapshot().body.decode())
                if s.name == ENERGY}  # fmt: skip

    many.update_source("topology-a", node_doc("a", 100), "cm")
    for _ in range(30):
        now[0] += dcgm.UTILIZATION_STEP_S
        before = energy()
    many.remove_source("topology-a")
    assert energy() == {}
    now[0] -= 3600
    many.update_source("topology-a", node_doc("a", 100), "cm")
    after = energy()
    assert after.keys() == before.keys()
    assert all(after[gpu] >= before[gpu] for gpu in before), (before, after)
    # And it counts on as the clock moves again: the power series is its rate.
    now[0] += 3600 + dcgm.UTILIZATION_STEP_S
    assert all(v > after[gpu] for gpu, v in energy().items())


def test_what_the_meter_holds_stays_bounded_as_nodes_come_and_go() -> None:
    """KWOK clusters create and delete nodes all day: the meter counts the GPUs served, and keeps
    the last count of at most RETIRED gone ones."""
    meter = EnergyMeter()
    for n in range(EnergyMeter.RETIRED + 100):
        meter.read(f"node-{n}", "GPU-1", START, 100.0, 400.0)
        meter.drop(f"node-{n}", ["GPU-1"])
    assert len(meter) == 0 and len(meter._retired) == EnergyMeter.RETIRED
    # The oldest were forgotten: such a GPU starts again at the most it can have drawn.
    again = meter.read("node-0", "GPU-1", START, 100.0, 400.0)
    assert again == EnergyMeter().read("node-0", "GPU-1", START, 100.0, 400.0)


def test_a_gpu_whose_limit_went_down_comes_back_from_its_count() -> None:
    """The same GPU ids on a node re-created as a smaller model: its count can be above what
    the new model could have drawn since boot, and it still never goes back."""
    meter = EnergyMeter()
    first = meter.read("n", "GPU-1", START, 700.0, 700.0)
    later = meter.read("n", "GPU-1", START + 3600, 700.0, 700.0)
    assert later > first
    meter.drop("n", ["GPU-1"])
    assert meter.read("n", "GPU-1", START + 3600, 72.0, 72.0) >= later
