"""Simulated GPU usage of a pod, as it is written into the topology.

Deterministic: the same pod gives the same numbers on every run. A user steers it per pod:

- `run.ai/simulated-gpu-utilization: "min-max"` (or `"N"`): the utilization range in percent
  the exporter draws from (default 80-100, a busy training job).
- `run.ai/simulated-fb-used: "MiB"` (or `"N%"` of the device): framebuffer the pod uses
  (default 90% of the device, about what a CUDA burn takes).

A pod whose labels carry `serving.knative.dev/service` (run:ai inference) is an inference pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topology.errors import TopologyError
from topology.model import PodUsage, Utilization

ANNOTATION_UTILIZATION = "run.ai/simulated-gpu-utilization"
ANNOTATION_FB_USED = "run.ai/simulated-fb-used"
LABEL_INFERENCE = "serving.knative.dev/service"
DEFAULT_UTILIZATION = Utilization(80, 100)
DEFAULT_FB_FRACTION = 0.9


def parse_utilization(value: str, obj: str) -> Utilization:
    field = f"metadata.annotations[{ANNOTATION_UTILIZATION}]"
    lo_text, _, hi_text = value.strip().partition("-")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if hi_text else lo
    except ValueError:
        raise TopologyError(obj, field, f"expected 'min-max' percent, got {value!r}") from None
    if not 0 <= lo <= hi <= 100:
        raise TopologyError(obj, field, f"need 0 <= min <= max <= 100, got {value!r}")
    return Utilization(lo, hi)


def parse_fb_used(value: str, obj: str, fb_total: int) -> int:
    field = f"metadata.annotations[{ANNOTATION_FB_USED}]"
    text = value.strip()
    try:
        number = float(text[:-1]) if text.endswith("%") else int(text)
    except ValueError:
        raise TopologyError(obj, field, f"expected MiB or a percentage, got {value!r}") from None
    if text.endswith("%"):
        if not 0 <= number <= 100:  # also refuses nan and inf, before int() could overflow
            raise TopologyError(obj, field, f"need 0% to 100%, got {value!r}")
        number = int(fb_total * number / 100)
    mib = int(number)
    if not 0 <= mib <= fb_total:
        raise TopologyError(obj, field, f"{mib} MiB does not fit the device's {fb_total} MiB")
    return mib


def pod_usage(
    pod: Mapping[str, Any],
    obj: str,
    fb_total: int,
    warnings: list[TopologyError],
    share: int | None = None,
) -> PodUsage:
    """The usage a pod simulates on a device of `fb_total` MiB (the most it may use).

    `share`: the MiB that are the pod's fair part of a shared device, which its default use is
    a fraction of (a time-sliced pod may use the whole device, but by default does not).
    A bad override is reported and the default used instead: the allocation is never dropped.
    """
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    utilization = DEFAULT_UTILIZATION
    fb_used = int((fb_total if share is None else share) * DEFAULT_FB_FRACTION)
    if ANNOTATION_UTILIZATION in annotations:
        try:
            utilization = parse_utilization(str(annotations[ANNOTATION_UTILIZATION]), obj)
        except TopologyError as e:
            warnings.append(e)
    if ANNOTATION_FB_USED in annotations:
        try:
            fb_used = parse_fb_used(str(annotations[ANNOTATION_FB_USED]), obj, fb_total)
        except TopologyError as e:
            warnings.append(e)
    labels = meta.get("labels")
    inference = isinstance(labels, Mapping) and LABEL_INFERENCE in labels
    return PodUsage(utilization, fb_used, inference)
