"""The series a real dcgm-exporter serves for one node, built from a topology snapshot.

Pure but for the energy counter: `entities(node, options, now)` -> the node's series subjects;
`fragments` -> each family's series lines of one node; `join` -> the bytes of `/metrics` for one
node or many (the series of a family stay together, under one HELP and TYPE). They run once per
change of the snapshot and once per collection step (values move in time), never per scrape.
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from exporter import readings
from exporter.fields import DEFAULT_COUNTERS, EMPTY, GPU, MIG, Counters, Field, read_counters
from exporter.readings import EnergyMeter
from exporter.series import GpuLabels, InstanceSeries, Labels, Subject, gpu_subjects
from topology import dra
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


@lru_cache(maxsize=1)
def default_counters() -> Counters:
    return read_counters(DEFAULT_COUNTERS)


@dataclass(frozen=True)
class Options:
    hostname: str
    driver_version: str = DEFAULT_DRIVER_VERSION
    counters: Counters = field(default_factory=default_counters)
    # Name the pod holding each MIG instance, as dcgm-exporter does where the kubelet knows it.
    # Off by default: run:ai's dynamic MIG leaves them empty, as the real dumps show.
    mig_pod_labels: bool = False
    # dcgm-exporter's --kubernetes-virtual-gpus: a shared device's series once per replica held,
    # each naming its pod and `vgpu` (the replica); off, one series names one of the pods.
    virtual_gpus: bool = False
    # Whose label set: `default`, the run:ai dumps' exporter; `4.8`, dcgm-exporter 4.8.3's.
    exporter_version: str = "default"
    # dcgm-exporter's --kubernetes-enable-dra: a device DRA claims hold, once per pod container
    # holding it, with the claim's dra_* labels (in 4.8's label set).
    dra: bool = False
    energy: EnergyMeter = field(default_factory=EnergyMeter, compare=False, repr=False)


EXPORTER_VERSIONS = ("default", "4.8")


def gpu_labels(
    options: Options,
    index: int,
    uuid: str,
    minor: int,
    model: str,
    fields: Labels,
    bus: str | None = None,
) -> GpuLabels:
    """A GPU's labels in the label set of the dcgm-exporter version the options name; `bus`, its
    PCI address where NVML read it (a simulated GPU's follows from its index)."""
    if options.exporter_version == "4.8" or options.dra:
        bus = dra.pci_bus_id(index) if bus is None else bus
        return GpuLabels(index, uuid, minor, model, options.hostname, fields, bus, "hostname")
    return GpuLabels(index, uuid, minor, model, options.hostname, fields)


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
    if name == "DCGM_FI_DRIVER_VERSION":
        return options.driver_version
    if name == "DCGM_FI_NVML_VERSION":
        return nvml_version(options.driver_version)
    if name == "DCGM_FI_DEV_BRAND":
        return "NVIDIA"
    return _serial(gpu)  # DCGM_FI_DEV_SERIAL


def _label_fields(options: Options, gpu: Gpu) -> Labels:
    return tuple((name, _label_value(name, options, gpu)) for name in options.counters.labels)


def entities(node: NodeTopology, options: Options, now: float) -> list[Subject]:
    """Every series subject of the node in dcgm-exporter's order: (kind, labels, reading)."""
    model = model_for_product(node.gpu_product)
    model_name = nvml_model_name(node.gpu_product)
    # Static MIG: dcgm-exporter maps instances to pods through the kubelet's pod-resources API.
    # run:ai's dynamic MIG hides them from it, so its series leave the pod labels empty.
    name_holders = options.mig_pod_labels or not node.is_dynamic_mig_enabled
    out: list[Subject] = []
    for index, gpu in enumerate(node.gpus):
        labels = gpu_labels(options, index, gpu.id, index, model_name, _label_fields(options, gpu))
        mig = gpu.mig_devices is not None and model is not None
        devices: tuple[MigDevice, ...] = ()
        if mig and model is not None and gpu.mig_devices:
            devices = tuple(sorted(gpu.mig_devices, key=lambda d: _mig_order(model, d)))
        reading, per_instance = readings.read_gpu(
            gpu, model, node.gpu_memory, now, (options.energy, options.hostname), devices
        )
        instances = [
            InstanceSeries(
                dev.name, dev.gpu_instance_id, dev.status if name_holders else None, r, dev.id
            )
            for dev, r in zip(devices, per_instance, strict=True)
        ]
        out += gpu_subjects(
            labels, reading, gpu.status, instances if mig else None, options.virtual_gpus,
            options.dra,
        )  # fmt: skip
    return out


def _kinds(node: NodeTopology) -> set[str]:
    """The kinds of series subject the node's GPUs give (see `entities`)."""
    mig = model_for_product(node.gpu_product) is not None
    return {
        GPU if gpu.mig_devices is None or not mig else MIG if gpu.mig_devices else EMPTY
        for gpu in node.gpus
    }


def moves_in_time(node: NodeTopology, counters: Counters | None = None) -> bool:
    """Whether the node's values change with the clock (power, energy, activity ...): whether
    a selected field that moves is served for one of its GPUs."""
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


def value_text(value: float, decimal: bool) -> str | None:
    """As dcgm-exporter prints a field: an integer bare, a double with six decimals. None for a
    value that is not `writable`: its series is left out, as dcgm-exporter leaves out a value
    DCGM has not got, rather than fail the scrape of every other series."""
    if not writable(value):
        return None
    return f"{value:.6f}" if decimal else str(int(value))


def fragments(node: NodeTopology, options: Options, now: float) -> dict[str, bytes]:
    """The series lines of one node, per family: what `join` puts together."""
    return subject_fragments(entities(node, options, now), options.counters)


def subject_fragments(subjects: Iterable[Subject], counters: Counters) -> dict[str, bytes]:
    """The series lines of `entities`' subjects (simulated or read), per family: a value the
    source does not have (None) has no line."""
    return Rendered.of(list(subjects), counters).parts


def _label_texts(subjects: list[Subject]) -> list[tuple[str, str]]:
    return [
        (kind, ",".join(f'{k}="{_escape(v)}"' for k, v in labels)) for kind, labels, _ in subjects
    ]


def _family(f: Field, texts: list[tuple[str, str]], subjects: list[Subject]) -> bytes:
    lines = [
        f"{f.name}{{{text}}} {sample}\n"
        for (kind, text), (_, _, reading) in zip(texts, subjects, strict=True)
        if kind in f.where
        and (value := f.read(reading)) is not None
        and (sample := value_text(value, f.decimal)) is not None
    ]
    return "".join(lines).encode()


@dataclass(frozen=True)
class Rendered:
    """A node's series as rendered, with what a collection step keeps: the label text of every
    series, and the families whose values do not move in time. A step (the same topology, a
    later time) computes only the readings and the families that move (`step`)."""

    texts: list[tuple[str, str]]  # (kind, label text) of each subject, in order
    parts: dict[str, bytes]  # family -> its lines

    @classmethod
    def of(cls, subjects: list[Subject], counters: Counters) -> Rendered:
        texts = _label_texts(subjects)
        parts = {}
        for counter in counters.metrics:
            if lines := _family(counter.field, texts, subjects):
                parts[counter.field.name] = lines
        return cls(texts, parts)

    def step(self, subjects: list[Subject], counters: Counters) -> Rendered:
        """The same series at a later time: `subjects` are `entities` of the same topology and
        options, so they come in the same order with the same labels."""
        if len(subjects) != len(self.texts):  # never, for the same topology: render whole
            return Rendered.of(subjects, counters)
        parts = {}
        for counter in counters.metrics:
            f = counter.field
            lines = _family(f, self.texts, subjects) if f.moves else self.parts.get(f.name)
            if lines:
                parts[f.name] = lines
        return Rendered(self.texts, parts)


@lru_cache(maxsize=8)
def _headers(counters: Counters) -> tuple[tuple[str, bytes], ...]:
    return tuple(
        (c.name, f"# HELP {c.name} {help_text(c.help)}\n# TYPE {c.name} {c.type}\n".encode())
        for c in counters.metrics
    )


def join_parts(
    parts: Iterable[Mapping[str, bytes]], counters: Counters | None = None
) -> tuple[bytes, ...]:
    """Prometheus text format as dcgm-exporter writes it, as the pieces to send in order.

    `parts` are `fragments` of one or more nodes; each family is written once, in the counters'
    order, its series in the order of `parts`. Nothing is copied: many nodes' body is large.
    """
    parts = list(parts)
    out: list[bytes] = []
    for name, header in _headers(counters or default_counters()):
        chunks = [p[name] for p in parts if p.get(name)]
        if chunks:
            out.append(header)
            out += chunks
    return tuple(out)


def join(parts: Iterable[Mapping[str, bytes]], counters: Counters | None = None) -> bytes:
    return b"".join(join_parts(parts, counters))


def render(node: NodeTopology | None, options: Options, now: float) -> bytes:
    if node is None:
        return b""
    return join([fragments(node, options, now)], options.counters)
