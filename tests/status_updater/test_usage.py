"""Simulated usage overrides at their boundaries: what is accepted, and the exact refusal."""

from __future__ import annotations

import pytest

from status_updater.usage import DEFAULT_UTILIZATION, parse_fb_used, parse_utilization, pod_usage
from topology.errors import TopologyError
from topology.model import PodUsage, Utilization

UTIL = "pod p: metadata.annotations[run.ai/simulated-gpu-utilization]: "
FB = "pod p: metadata.annotations[run.ai/simulated-fb-used]: "


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0-100", (0, 100)), (" 7 ", (7, 7)), ("0", (0, 0)), ("100", (100, 100)), ("40-40", (40, 40))],
)
def test_utilization_accepted(text: str, expected: tuple[int, int]) -> None:
    assert parse_utilization(text, "pod p") == Utilization(*expected)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("101", "need 0 <= min <= max <= 100, got '101'"),
        ("0-101", "need 0 <= min <= max <= 100, got '0-101'"),
        ("50-20", "need 0 <= min <= max <= 100, got '50-20'"),
        ("-5-10", "expected 'min-max' percent, got '-5-10'"),
        ("1-2-3", "expected 'min-max' percent, got '1-2-3'"),
        ("lots", "expected 'min-max' percent, got 'lots'"),
    ],
)
def test_utilization_refused(text: str, message: str) -> None:
    with pytest.raises(TopologyError) as e:
        parse_utilization(text, "pod p")
    assert str(e.value) == UTIL + message


@pytest.mark.parametrize(
    ("text", "mib"),
    [("0", 0), ("0%", 0), ("100%", 4864), ("4864", 4864), ("50%", 2432), ("1%", 48), (" 12 ", 12)],
)
def test_fb_used_accepted(text: str, mib: int) -> None:
    assert parse_fb_used(text, "pod p", 4864) == mib


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("4865", "4865 MiB does not fit the device's 4864 MiB"),
        ("-1", "-1 MiB does not fit the device's 4864 MiB"),
        ("100.5%", "need 0% to 100%, got '100.5%'"),
        ("-0.5%", "need 0% to 100%, got '-0.5%'"),
        ("nan%", "need 0% to 100%, got 'nan%'"),
        ("1e400%", "need 0% to 100%, got '1e400%'"),
        ("12.5", "expected MiB or a percentage, got '12.5'"),
        ("%", "expected MiB or a percentage, got '%'"),
    ],
)
def test_fb_used_refused(text: str, message: str) -> None:
    with pytest.raises(TopologyError) as e:
        parse_fb_used(text, "pod p", 4864)
    assert str(e.value) == FB + message


@pytest.mark.parametrize(
    "meta", ["a string", ["a", "list"], None, {"annotations": "x", "labels": 5}]
)
def test_odd_metadata_gives_the_default_usage(meta: object) -> None:
    warnings: list[TopologyError] = []
    assert pod_usage({"metadata": meta}, "pod p", 1000, warnings) == PodUsage(
        DEFAULT_UTILIZATION, 900, False
    )
    assert warnings == []


def test_overrides_and_the_inference_label() -> None:
    pod = {"metadata": {"annotations": {"run.ai/simulated-gpu-utilization": "10-20",
                                        "run.ai/simulated-fb-used": "25%"},
                        "labels": {"serving.knative.dev/service": "svc"}}}  # fmt: skip
    warnings: list[TopologyError] = []
    assert pod_usage(pod, "pod p", 1000, warnings) == PodUsage(Utilization(10, 20), 250, True)
    pod["metadata"]["annotations"] = {"run.ai/simulated-fb-used": "2000",  # type: ignore[index]
                                      "run.ai/simulated-gpu-utilization": "5-1"}  # fmt: skip
    usage = pod_usage(pod, "pod p", 1000, warnings)
    assert (usage.fb_used, usage.utilization) == (900, DEFAULT_UTILIZATION)  # defaults, and said
    assert [str(w) for w in warnings] == [
        UTIL + "need 0 <= min <= max <= 100, got '5-1'",
        FB + "2000 MiB does not fit the device's 1000 MiB",
    ]
