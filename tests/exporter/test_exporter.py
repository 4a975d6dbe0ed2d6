"""The exporter's state machine: render on change, time from a clock freezegun controls,
last good topology kept when an update is bad."""

from __future__ import annotations

import logging
import socket
import threading

import pytest
import yaml
from freezegun import freeze_time

from exporter import dcgm
from exporter.service import Exporter
from mig_exporter.web.server import IOV_MAX, Published, Snapshot, send_all
from tests.support.base import SAMPLES
from tests.support.promtext import by_name, parse
from topology.model import (
    AllocatedBy,
    DeviceStatus,
    Gpu,
    NodeTopology,
    PodUsage,
    Topology,
    Utilization,
    load_yaml,
)

MIG = load_yaml(
    yaml.safe_load((SAMPLES / "topology" / "a100-40gb-active.yaml").read_text())["data"][
        "topology.yml"
    ]
)


def whole_gpu(lo: int, hi: int) -> Topology:
    usage = PodUsage(Utilization(lo, hi), fb_used=1000)
    gpu = Gpu("GPU-1", DeviceStatus(AllocatedBy("ns", "pod", "c"), {"uid-1": usage}))
    return Topology("none", {"n": NodeTopology(2, 11441, "Tesla-K80", gpus=(gpu, Gpu("GPU-2")))})


def util(exporter: Exporter) -> list[float]:
    return [
        s.value for s in by_name(parse(exporter.snapshot().body.decode()), "DCGM_FI_DEV_GPU_UTIL")
    ]


def test_utilization_is_deterministic_in_time_and_within_range() -> None:
    with freeze_time("2026-11-22 10:00:00") as clock:
        exporter = Exporter("n", dcgm.Options("h"), Published())
        exporter.sink.update(whole_gpu(20, 90), "t")
        first = util(exporter)
        assert 20 <= first[0] <= 90 and first[1] == 0  # the free GPU is idle
        clock.tick(dcgm.UTILIZATION_STEP_S - 1)
        assert util(exporter) == first  # one value per step
        seen = set()
        for _ in range(30):
            clock.tick(dcgm.UTILIZATION_STEP_S)
            value = util(exporter)[0]
            assert 20 <= value <= 90
            seen.add(value)
        assert len(seen) > 5  # it moves, step by step
        again = Exporter("n", dcgm.Options("h"), Published())
        again.sink.update(whole_gpu(20, 90), "t")
        assert util(again) == util(exporter)  # same clock, same numbers: reproducible runs


def test_fixed_utilization() -> None:
    exporter = Exporter("n", dcgm.Options("h"), Published())
    exporter.sink.update(whole_gpu(73, 73), "t")
    assert util(exporter) == [73, 0]


def test_health_and_last_good_state(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    exporter = Exporter("qa-mig-worker-gpu-a100", dcgm.Options("h"), Published())
    snap = exporter.snapshot()
    assert (snap.healthy, snap.reason, snap.body) == (False, "no topology yet", b"")
    exporter.sink.update(MIG, "cm")
    good = exporter.snapshot()
    assert good.healthy and len(by_name(parse(good.body.decode()), "DCGM_FI_DEV_FB_USED")) == 3
    # An update whose node no GPU could have: the series stay, health tells why.
    node = MIG.nodes["qa-mig-worker-gpu-a100"]
    bad_gpu = Gpu(node.gpus[0].id, mig_devices=(node.gpus[0].mig_devices or ())[:1] * 2)
    bad = Topology(
        "mixed",
        {"qa-mig-worker-gpu-a100": NodeTopology(1, 40960, node.gpu_product, True, (bad_gpu,))},
    )
    exporter.sink.update(bad, "cm")
    snap = exporter.snapshot()
    assert not snap.healthy and "overlaps" in snap.reason and snap.body == good.body
    # The node leaves the topology (a re-applied seed, say): the last good series stay.
    exporter.sink.update(Topology("mixed", {}), "cm")
    snap = exporter.snapshot()
    assert snap.body == good.body and not snap.healthy
    assert snap.reason == (
        "cm: nodes.qa-mig-worker-gpu-a100: is not in the topology (nodes: none); "
        "serving the last good topology"
    )
    # Among many others: the first ten, by name, and how many more.
    others = {f"n{i:02}": node for i in range(12)}
    exporter.sink.update(Topology("mixed", others), "cm")
    assert exporter.snapshot().reason == (
        "cm: nodes.qa-mig-worker-gpu-a100: is not in the topology (nodes: "
        + ", ".join(f"n{i:02}" for i in range(10))
        + " and 2 more); serving the last good topology"
    )
    exporter.sink.update(MIG, "cm")
    assert exporter.snapshot().healthy
    # Each change of health is said once, in one line; good again at info level.
    assert [(r.levelname, r.getMessage()) for r in caplog.records][-1] == (
        "INFO",
        "topology for node qa-mig-worker-gpu-a100 is good",
    )
    assert [r.levelname for r in caplog.records] == ["INFO", *["WARNING"] * 3, "INFO"]


def test_a_body_of_many_parts_arrives_whole_and_in_order() -> None:
    """/metrics hands the kernel the parts as they are: more than one sendmsg holds, cut at
    arbitrary points by a small socket buffer, and nothing lost or reordered."""
    parts = [f"part {i} ".encode() * (i % 50) for i in range(3 * IOV_MAX + 7)]
    sender, receiver = socket.socketpair()
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender.settimeout(10)  # as a server with a timeout: sends may stop part way
    received = bytearray()

    def read() -> None:
        while chunk := receiver.recv(1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    send_all(sender, parts)
    sender.close()
    reader.join(10)
    receiver.close()
    assert bytes(received) == b"".join(parts)
    snapshot = Snapshot(tuple(parts), True, "ok")
    assert snapshot.size == len(snapshot.body) == len(received)
