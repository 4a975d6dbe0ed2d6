"""The series a real dcgm-exporter serves for one node, built from a topology snapshot.

Pure but for the energy counter: `entities(node, options, now)` -> the node's series subjects;
`fragments` -> each family's series lines of one node; `join` -> the bytes of `/metrics` for one
node or many (the series of a family stay together, under one HELP and TYPE). `NodeSeries` keeps
a node's label text and the values of one collection step, and writes the text when asked.
The NVML path (nvml.py) builds its subjects with the same labels (series.py) and shares the rest.

Families, their order, type and help come from the counters CSV (fields.py); values from
readings.py, each field's through its declared reading. On a dynamic-MIG node (the real dumps in
samples/mig/metrics/):

    # HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
    # TYPE DCGM_FI_DEV_FB_FREE gauge
    DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-…",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",
      GPU_I_PROFILE="1g.5gb",GPU_I_ID="7",Hostname="…",DCGM_FI_DRIVER_VERSION="520.56.06",
      container="",namespace="",pod=""} 4766

one series per MIG instance, no utilization fields, pod labels empty (unless `mig_pod_labels`);
on a static-MIG node (`is-dynamic-mig-enabled: false`) they name the pod holding the instance.
A GPU with MIG off has one series per field with the pod that holds it (one per replica
with `virtual_gpus`); a GPU with MIG on and no
instance has its GPU-level series only. Integers print without a decimal point, DCGM's doubles
with six decimals, as dcgm-exporter prints them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache

from exporter import readings
from exporter.fields import (
    EMPTY,
    GPU,
    MIG,
    XID_COUNT,
    Counter,
    Counters,
    canonical,
    read_counters,
)
from exporter.generations import DEFAULT, Generation
from exporter.readings import EnergyMeter, Reading
from exporter.series import (
    Attribution,
    GpuLabels,
    InstanceSeries,
    Labels,
    Subject,
    View,
    gpu_subjects,
    in_output_order,
)
from exporter.xid import xid_text
from mig_exporter.common.podlabels import Allowlist
from topology import dra, faults
from topology.catalog import GpuModel, model_for_product, nvml_model_name
from topology.model import Gpu, MigDevice, NodeTopology

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_USED = "DCGM_FI_DEV_FB_USED"
DEFAULT_DRIVER_VERSION = dra.DEFAULT_DRIVER  # the real dumps' driver, as the DRA slices say
UTILIZATION_STEP_S = readings.STEP_S


def until_next_step(now: float) -> float:
    """Seconds to the next collection: values are sampled on step boundaries."""
    return UTILIZATION_STEP_S - now % UTILIZATION_STEP_S + 0.001


@lru_cache(maxsize=8)
def default_counters(generation: Generation = DEFAULT) -> Counters:
    """The fields a generation collects by default (its counters file)."""
    return read_counters(generation.counters_file)


@dataclass(frozen=True)
class Options:
    hostname: str
    driver_version: str = DEFAULT_DRIVER_VERSION
    counters: Counters = None  # type: ignore[assignment]  # None: the generation's default
    # Name the pod holding each MIG instance, as dcgm-exporter does where the kubelet knows it.
    # Off by default: run:ai's dynamic MIG leaves them empty, as the real dumps show.
    mig_pod_labels: bool = False
    # dcgm-exporter's --kubernetes-virtual-gpus: a shared device's series once per replica held,
    # each naming its pod and `vgpu` (the replica); off, one series names one of the pods.
    virtual_gpus: bool = False
    # Which dcgm-exporter this is (generations.py): labels, names, units, order, value format.
    generation: Generation = DEFAULT
    # dcgm-exporter's --kubernetes-enable-dra: a device DRA claims hold, once per pod container
    # holding it, with the claim's dra_* labels (a generation that has DRA: 4.8.3 on).
    dra: bool = False
    # --kubernetes-enable-pod-uid: the holding pod's uid in `pod_uid` (from 4.8.3; on DRA
    # copies from 4.8.4).
    pod_uid: bool = False
    # --kubernetes-enable-pod-labels (with its allowlist): the holding pod's labels, as the
    # topology carries them (the updater's --pod-labels).
    pod_labels: Allowlist | None = None
    # --dra-claim-status: the claims' status names a DynamicMIG instance's uuid (the updater's
    # --dra-claim-status, as the DRA driver's #1456 designs it): such an instance is attributed
    # as any other device; off, it is not, as dcgm-exporter 4.8 cannot.
    dra_claim_status: bool = False
    # --xid-count-window-size: DCGM_EXP_XID_ERRORS_COUNT counts the Xids of this many ms.
    xid_count_window_ms: int = 300_000
    energy: EnergyMeter = field(default_factory=EnergyMeter, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.counters is None:
            object.__setattr__(self, "counters", default_counters(self.generation))
        if self.dra and not self.generation.dra:
            raise ValueError(f"dcgm-exporter {self.generation.name} has no DRA mode")
        if self.pod_uid and not self.generation.pod_uid:
            raise ValueError(f"dcgm-exporter {self.generation.name} has no pod_uid")
        if self.pod_labels is not None and not self.generation.pod_labels:
            raise ValueError(f"dcgm-exporter {self.generation.name} has no pod labels")

    @property
    def attribution(self) -> Attribution:
        """How a device's series name the pods holding it."""
        g = self.generation
        return Attribution(
            virtual_gpus=self.virtual_gpus, per_process=self.virtual_gpus and g.per_process,
            dra=self.dra, claim_status=self.dra_claim_status,
            free_pod_labels=g.free_pod_labels, dra_uuid_always=g.dra_uuid_always,
            pod_uid=self.pod_uid, dra_pod_uid=self.pod_uid and g.dra_pod_uid,
            pod_labels=self.pod_labels, sorted_labels=g.sorted_output,
        )  # fmt: skip


def gpu_labels(
    options: Options,
    *,
    index: int,
    uuid: str,
    minor: int,
    model: str,
    fields: Labels,
    bus: str | None = None,
) -> GpuLabels:
    """A GPU's labels in its generation's label set; `bus`, its PCI address where NVML read it
    (a simulated GPU's follows from its index)."""
    g = options.generation
    if g.bus_label and bus is None:
        bus = dra.pci_bus_id(index)
    return GpuLabels(
        index=index, uuid=uuid, minor=minor, model=model, hostname=options.hostname,
        fields=fields, pci_bus_id=bus if g.bus_label else None, hostname_label=g.hostname_label,
    )  # fmt: skip


@lru_cache(maxsize=1024)  # one name object for every instance of a profile, node after node
def profile_label(generation: Generation, nvml_name: str, slices: int, memory_mib: int) -> str:
    """`GPU_I_PROFILE` as the generation names a MIG profile. DCGM names a GPU instance from its
    profile's NVML figures, `<slices>g.<ceil(MiB / 1024)>gb` (DcgmCacheManager.cpp's
    GpuInstanceProfiles): `7g.79gb` on an A100 80GB PCIe, `1g.11gb` on an H100 NVL, NVML's own
    name on an A100 40GB. From 4.8.4 it is NVML's name as NVML returns it, which begins with
    `MIG ` (docs/upgrade.md)."""
    if generation.profile_names == "nvml":
        return f"MIG {nvml_name}"
    return f"{slices}g.{-(-memory_mib // 1024)}gb"


def _mig_order(model: GpuModel, dev: MigDevice) -> tuple[int, int]:
    # dcgm-exporter lists smaller instances first (the dump: 1g@4, 1g@6, then 2g@0).
    profile = model.profile(dev.name)
    return (profile.memory_slices if profile else 0, dev.position)


def nvml_version(driver: str) -> str:
    """NVML's version string: the CUDA major version the driver ships, then the driver's."""
    major = driver.split(".", 1)[0]
    cuda = (
        13
        if major.isdigit() and int(major) >= 580
        else 12
        if major.isdigit() and int(major) >= 525
        else 11
    )
    return f"{cuda}.{driver}"


def _serial(gpu: Gpu) -> str:
    return str(int.from_bytes(hashlib.blake2b(gpu.id.encode(), digest_size=8).digest()) % 10**13)


def _label_value(name: str, options: Options, gpu: Gpu) -> str:
    name = canonical(name)
    if name == "DCGM_FI_DRIVER_VERSION":
        return options.driver_version
    if name == "DCGM_FI_NVML_VERSION":
        return nvml_version(options.driver_version)
    if name == "DCGM_FI_DEV_BRAND":
        return "NVIDIA"
    return _serial(gpu)  # DCGM_FI_DEV_SERIAL


def _label_fields(options: Options, gpu: Gpu) -> Labels:
    return tuple((name, _label_value(name, options, gpu)) for name in options.counters.labels)


@dataclass(frozen=True)
class _GpuPlan:
    """What a GPU's series are made of that does not change with time: its labels, its
    instances in dcgm-exporter's order, and what its readings need."""

    gpu: Gpu
    labels: GpuLabels
    mig: bool  # MIG on, on a model the catalog knows: one series per instance
    devices: tuple[MigDevice, ...]
    profiles: tuple[str, ...]  # each device's GPU_I_PROFILE, as the generation names it
    reads: readings.GpuPlan


def lost_gpus(node: NodeTopology, now: float) -> frozenset[int]:
    """The GPUs lost at `now` (a fault): DCGM reads them no more, and their series are gone."""
    return frozenset(i for i, g in enumerate(node.gpus) if g.faults and faults.lost(g.faults, now))


def _plans(node: NodeTopology, options: Options, lost: frozenset[int]) -> list[_GpuPlan]:
    model = model_for_product(node.gpu_product)
    if model is not None:  # its profiles' memory on the driver the series name
        model = model.for_driver(options.driver_version)
    model_name = nvml_model_name(node.gpu_product)
    out = []
    for index, gpu in enumerate(node.gpus):
        if index in lost:
            continue
        labels = gpu_labels(options, index=index, uuid=gpu.id, minor=index, model=model_name,
                            fields=_label_fields(options, gpu))  # fmt: skip
        mig = gpu.mig_devices is not None and model is not None
        devices: tuple[MigDevice, ...] = ()
        if mig and model is not None and gpu.mig_devices:
            devices = tuple(sorted(gpu.mig_devices, key=lambda d: _mig_order(model, d)))
        reads = readings.plan_gpu(gpu, model, node.gpu_memory, devices,
                                  options.xid_count_window_ms / 1000)  # fmt: skip
        profiles = tuple(_profile(model, d.name, options.generation) for d in devices)
        out.append(_GpuPlan(gpu, labels, mig, devices, profiles, reads))
    return out


def _profile(model: GpuModel | None, name: str, generation: Generation) -> str:
    profile = model.profile(name) if model is not None else None
    if profile is None:
        return name
    return profile_label(generation, name, profile.compute_slices, profile.memory_mib)


def _read(
    plans: list[_GpuPlan], options: Options, now: float
) -> list[tuple[Reading, list[Reading]]]:
    """Each GPU's reading and its instances' at `now`."""
    energy = (options.energy, options.hostname)
    return [readings.read_plan(p.reads, now, energy) for p in plans]


def _for_node(node: NodeTopology, options: Options) -> Options:
    """The options with the node's own driver, where its document names one (a DRA node: what
    its slices say), over --driver-version."""
    if node.driver_version is None or node.driver_version == options.driver_version:
        return options
    return replace(options, driver_version=node.driver_version)


def entities(node: NodeTopology, options: Options, now: float) -> list[Subject]:
    """Every series subject of the node in dcgm-exporter's order: (kind, labels, reading)."""
    options = _for_node(node, options)
    return _subjects(node, _plans(node, options, lost_gpus(node, now)), options, now)[0]


# Which reading a subject has: its GPU, its instance or -1 for the GPU's, and which of its values
# (series.View; None: all of them).
Shape = tuple[int, int, View | None]


def _subjects(
    node: NodeTopology, plans: list[_GpuPlan], options: Options, now: float
) -> tuple[list[Subject], list[Shape]]:
    """The subjects, and which reading each has (`Shape`)."""
    # Static MIG: dcgm-exporter maps instances to pods through the kubelet's pod-resources API.
    # run:ai's dynamic MIG hides them from it, so its series leave the pod labels empty.
    name_holders = options.mig_pod_labels or not node.is_dynamic_mig_enabled
    attribution = options.attribution
    out: list[Subject] = []
    shape: list[Shape] = []
    step = readings.step_of(now)
    for g, (plan, (reading, per_instance)) in enumerate(
        zip(plans, _read(plans, options, now), strict=True)
    ):
        instances = [
            InstanceSeries(
                profile=profile, gpu_instance_id=dev.gpu_instance_id, reading=r,
                status=dev.status if name_holders else None, uuid=dev.id, nvml_profile=dev.name,
            )
            for dev, profile, r in zip(plan.devices, plan.profiles, per_instance, strict=True)
        ]  # fmt: skip
        views: list[View | None] = []
        subjects = gpu_subjects(plan.labels, reading, plan.gpu.status,
                                instances if plan.mig else None, attribution, views)  # fmt: skip
        which = {id(r): k for k, r in enumerate(per_instance)}
        shape += [
            (g, which.get(id(r), -1), v) for (_, _, r), v in zip(subjects, views, strict=True)
        ]
        out += [(kind, labels, r if v is None else v.of(r, step))
                for (kind, labels, r), v in zip(subjects, views, strict=True)]  # fmt: skip
    if options.generation.sorted_output:
        order = in_output_order(out)
        out, shape = [out[k] for k in order], [shape[k] for k in order]
    return out, shape


def _kinds(node: NodeTopology) -> set[str]:
    """The kinds of series subject the node's GPUs give (see `entities`)."""
    mig = model_for_product(node.gpu_product) is not None
    return {
        GPU if gpu.mig_devices is None or not mig else MIG if gpu.mig_devices else EMPTY
        for gpu in node.gpus
    }


def moves_in_time(node: NodeTopology, counters: Counters | None = None) -> bool:
    """Whether the node's values change with the clock (power, energy, activity ...): whether
    a selected field that moves is served for one of its GPUs, or one of them has faults (they
    begin, count and end with the clock)."""
    if any(g.faults for g in node.gpus):
        return True
    kinds = _kinds(node)
    return any(
        c.field.moves and kinds & c.field.where for c in (counters or default_counters()).metrics
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def help_text(text: str) -> str:
    """HELP as the text format writes it: a backslash and a line break escaped (`\\\\`, `\\n`),
    nothing else. A counters file's help is the user's text: one raw backslash made Prometheus
    reject the whole scrape ("invalid escape sequence"), a line break would end the line."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def writable(value: float) -> bool:
    """Whether a sample value is a finite float, the only value worth writing: NaN or an
    infinity says nothing about a GPU, and an integer past a float's range (a 400-digit
    `gpu-memory`) is a line Prometheus rejects, and the whole scrape with it."""
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def value_text(
    value: float, decimal: bool, write: Callable[[float, bool], str] = DEFAULT.value_text
) -> str | None:
    """As a generation's dcgm-exporter prints a field (`write`: its `Generation.value_text`).
    None for a value that is not `writable`: its series is left out, as dcgm-exporter leaves
    out a value DCGM has not got, rather than fail the scrape of every other series."""
    if not writable(value):
        return None
    return write(value, decimal)


def fragments(node: NodeTopology, options: Options, now: float) -> dict[str, bytes]:
    """The series lines of one node, per family: what `join` puts together."""
    return subject_fragments(entities(node, options, now), options)


def subject_fragments(subjects: Iterable[Subject], options: Options) -> dict[str, bytes]:
    """The series lines of `entities`' subjects (simulated or read), per family: a value the
    source does not have (None) has no line."""
    subjects = list(subjects)
    return _families(options, _label_texts(subjects, options), [r for _, _, r in subjects])


# A label text and where DCGM_FI_DEV_XID_ERRORS's err_code and err_msg go in it: among the
# attributes dcgm-exporter sorts by name (after container and the dra_* labels, before
# namespace, pod, pod_uid and vgpu).
# And where DCGM_EXP_XID_ERRORS_COUNT's window_size_in_ms and xid go: after the label fields, in
# the map dcgm-exporter keeps them in, before the attributes.
LabelText = tuple[str, str, int, int]  # (kind, text, where err_* go, where the window goes)
_AFTER_ERR = frozenset({"namespace", "pod", "pod_uid", "vgpu"})
_ATTRIBUTES = frozenset({"container", *_AFTER_ERR})


def _label_texts(subjects: list[Subject], options: Options) -> list[LabelText]:
    """Each subject's label text; where err_* go only where the generation writes them (an int
    per series held, 5,000 nodes' worth, is worth keeping only then)."""
    xid = options.generation.xid_labels and any(map(_is_xid, options.counters.metrics))
    window = any(c.field.name == XID_COUNT for c in options.counters.metrics)
    out = []
    for kind, labels, _ in subjects:
        parts = [f'{k}="{_escape(v)}"' for k, v in labels]
        text = ",".join(parts)
        if not (xid or window):
            out.append((kind, text, 0, 0))
            continue
        cut = next((i for i, (k, _) in enumerate(labels) if k in _AFTER_ERR), len(labels))
        attributes = next((i for i, (k, _) in enumerate(labels)
                           if k in _ATTRIBUTES or k.startswith("dra_")), len(labels))  # fmt: skip
        out.append((kind, text, len(",".join(parts[:cut])), len(",".join(parts[:attributes]))))
    return out


def _families(options: Options, texts: list[LabelText], values: list[Reading]) -> dict[str, bytes]:
    """Each family's lines; a family without a line is left out."""
    generation = options.generation
    return {c.name: lines for c in options.counters.metrics
            if (lines := _window_family(c, texts, values, options) if c.field.name == XID_COUNT
                else _family(c, texts, values, generation))}  # fmt: skip


def _window_family(
    c: Counter, texts: list[LabelText], values: list[Reading], options: Options
) -> bytes:
    """DCGM_EXP_XID_ERRORS_COUNT: a series per Xid DCGM recorded within the window, its count,
    with `window_size_in_ms` and `xid`; one of 0 without `xid` where none was (dcgm-exporter's
    expcollector.go)."""
    window = f'window_size_in_ms="{options.xid_count_window_ms}"'
    lines = []
    for (kind, text, _, cut), reading in zip(texts, values, strict=True):
        events = c.field.read(reading)
        if kind not in c.field.where or not isinstance(events, tuple):
            continue
        head, tail = text[:cut], text[cut:].lstrip(",")
        # By label signature, as expfmt sorts them from 4.8.3: a shorter value first.
        ordered = sorted(events, key=lambda e: (len(str(e[0])), e[0])) if events else [(None, 0)]
        for xid, count in ordered:
            added = window if xid is None else f'{window},xid="{xid}"'
            inner = ",".join(p for p in (head, added, tail) if p)
            lines.append(f"{c.name}{{{inner}}} {count}\n")
    return "".join(lines).encode()


def _family(
    c: Counter, texts: list[LabelText], values: list[Reading], generation: Generation
) -> bytes:
    f, scale, write = c.field, c.scale, generation.value_text
    decimal = f.decimal or not float(scale).is_integer()
    xid = generation.xid_labels and _is_xid(c)
    blank = generation.xid_blank and _is_xid(c)
    lines = []
    for (kind, text, cut, _), reading in zip(texts, values, strict=True):
        value = f.read(reading)
        if kind not in f.where or value is None or isinstance(value, tuple):
            continue
        if blank and not value:
            continue  # DCGM has no sample before a GPU's first Xid: the series is blank
        if scale != 1:
            value = value * scale
        if (sample := value_text(value, decimal, write)) is None:
            continue
        if xid:
            text = _with_xid(text, cut, int(value))
        lines.append(f"{c.name}{{{text}}} {sample}\n")
    return "".join(lines).encode()


XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"


def _is_xid(c: Counter) -> bool:
    """Whether the family is the last Xid's, under either of its names (a Field is declared by
    its legacy name)."""
    return c.field.name == XID_ERRORS


def _with_xid(text: str, cut: int, code: int) -> str:
    """The label text with err_code and err_msg where dcgm-exporter sorts them."""
    err = f'err_code="{code}",err_msg="{_escape(xid_text(code))}"'
    head, tail = text[:cut], text[cut:]
    return ",".join(p for p in (head, err, tail.lstrip(",")) if p)


class NodeSeries:
    """One node's series at one time: the label text of each series, kept from step to step,
    and the values of that time. The text is written when asked (a scrape), not held: 5,000
    busy nodes' text is 575 MiB, their label text 36 MiB. A collection step (`at`, the same
    topology at a later time) reads the GPUs again and nothing else.

    The values are kept as plain tuples: the garbage collector stops following a plain tuple
    of numbers, never a named one, and 5,000 nodes hold 200,000 of them; following them all
    took a second every other step. A node whose GPUs have no faults keeps only each reading's
    first values (readings.HOT): the rest is the same for every healthy GPU (HEALTHY), and held
    per series it was 16 MiB of 5,000 nodes' 450."""

    __slots__ = ("_faulty", "_healthy", "_lost", "_parts", "_plans", "_shape", "_values",
                 "_viewed", "node", "options", "texts")  # fmt: skip

    def __init__(self, node: NodeTopology, options: Options, now: float) -> None:
        options = _for_node(node, options)
        self.node, self.options = node, options
        self._faulty = any(g.faults for g in node.gpus)  # a GPU may be lost or come back
        self._lost = lost_gpus(node, now) if self._faulty else frozenset()
        self._plans = _plans(node, options, self._lost)
        subjects, self._shape = _subjects(node, self._plans, options, now)
        self._healthy = not self._faulty and not any(g.counted for g in node.gpus)
        # Copies of some values only (series.View: per-process values), worked out each step.
        self._viewed = any(v is not None for _, _, v in self._shape)
        self.texts = _label_texts(subjects, options)  # (kind, label text, err cut), in order
        if self._healthy:
            self._values = [r[: readings.HOT] for _, _, r in subjects]
        else:
            self._values = [tuple(r) for _, _, r in subjects]
        self._parts: dict[str, bytes] | None = None

    def at(self, now: float) -> NodeSeries:
        """The same series at `now` (other series where a GPU was lost or came back since)."""
        if self._faulty and lost_gpus(self.node, now) != self._lost:
            return NodeSeries(self.node, self.options, now)
        new = object.__new__(NodeSeries)
        new.node, new.options, new.texts = self.node, self.options, self.texts
        new._plans, new._shape, new._parts = self._plans, self._shape, None
        new._faulty, new._healthy, new._lost = self._faulty, self._healthy, self._lost
        new._viewed = self._viewed
        read = _read(self._plans, self.options, now)
        hot = readings.HOT
        if not self._viewed:
            if self._healthy:
                new._values = [(read[g][0] if k < 0 else read[g][1][k])[:hot]
                               for g, k, _ in self._shape]  # fmt: skip
            else:
                new._values = [tuple(read[g][0] if k < 0 else read[g][1][k])
                               for g, k, _ in self._shape]  # fmt: skip
            return new
        step = readings.step_of(now)
        seen = [r if v is None else v.of(r, step) for g, k, v in self._shape
                for r in (read[g][0] if k < 0 else read[g][1][k],)]  # fmt: skip
        new._values = [r[:hot] for r in seen] if self._healthy else [tuple(r) for r in seen]
        return new

    def parts(self) -> dict[str, bytes]:
        """Each family's lines. Kept once written (`/metrics` whole asks for them, and every
        scrape of it until the next step shares them); a page alone is written each time."""
        parts = self._parts
        if parts is None:
            parts = self._parts = self._write()
        return parts

    def _write(self) -> dict[str, bytes]:
        if self._healthy and self._viewed:
            # A copy of FB_USED and GPU_UTIL alone has none of the values a healthy GPU reads 0.
            tails = [readings.BLANK if v is not None and v.shares is not None
                     else readings.HEALTHY for _, _, v in self._shape]  # fmt: skip
            values = [Reading._make(v + t) for v, t in zip(self._values, tails, strict=True)]
        elif self._healthy:
            healthy = readings.HEALTHY
            values = [Reading._make(v + healthy) for v in self._values]
        else:
            values = [Reading._make(v) for v in self._values]
        return _families(self.options, self.texts, values)

    def page(self) -> tuple[bytes, ...]:
        """The node's own page, as its exporter would serve it."""
        parts = self._parts if self._parts is not None else self._write()
        return join_parts([parts], self.options)


@lru_cache(maxsize=8)
def _headers(counters: Counters, by_name: bool) -> tuple[tuple[str, bytes], ...]:
    metrics = sorted(counters.metrics, key=lambda c: c.name) if by_name else counters.metrics
    return tuple(
        (c.name, f"# HELP {c.name} {help_text(c.help)}\n# TYPE {c.name} {c.type}\n".encode())
        for c in metrics
    )


def join_parts(
    parts: Iterable[Mapping[str, bytes]], options: Options | None = None
) -> tuple[bytes, ...]:
    """Prometheus text format as dcgm-exporter writes it, as the pieces to send in order.

    `parts` are `fragments` of one or more nodes; each family is written once, in the counters'
    order (by name, in a generation that sorts them), its series in the order of `parts`.
    Nothing is copied: many nodes' body is large.
    """
    options = options or Options(hostname="")
    parts = list(parts)
    out: list[bytes] = []
    for name, header in _headers(options.counters, options.generation.sorted_output):
        chunks = [p[name] for p in parts if p.get(name)]
        if chunks:
            out.append(header)
            out += chunks
    return tuple(out)


def join(parts: Iterable[Mapping[str, bytes]], options: Options | None = None) -> bytes:
    return b"".join(join_parts(parts, options))


def render(node: NodeTopology | None, options: Options, now: float) -> bytes:
    if node is None:
        return b""
    return join([fragments(node, options, now)], options)
