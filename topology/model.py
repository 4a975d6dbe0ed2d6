"""The topology ConfigMap model: typed, loaded and dumped as the `topology.yml` schema.

Keys on the wire are kebab-case exactly as fake-gpu-operator's topology; optional keys are left out
when empty so a dump round-trips to the same YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml

from mig_exporter.common.text import kind_of, one_line
from mig_exporter.common.yamlload import load_document
from topology import yamltext
from topology.errors import TopologyError

MIG_STRATEGIES = ("none", "single", "mixed")
# No count, id, index or MiB of the schema comes near it (the largest GPU has about 2**18 MiB);
# a larger number is no real value, and would reach the exposition as one no float holds exactly.
MAX_INTEGER = 10**9
# An error counter's most: a GPU's life of errors stays far below it, and it prints exactly.
MAX_COUNT = 2**53


@dataclass(frozen=True, slots=True)
class AllocatedBy:
    namespace: str
    pod: str
    container: str
    uid: str = ""  # the pod's metadata.uid (`pod-uid`): dcgm-exporter's pod_uid; "": unknown
    # The pod's labels (`labels`), where the updater copies them (its --pod-labels): what
    # dcgm-exporter's --kubernetes-enable-pod-labels reads; sorted by key.
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Utilization:
    min: int
    max: int


@dataclass(frozen=True, slots=True)
class PodUsage:
    """Simulated usage of one pod on a device (see status_updater/usage.py)."""

    utilization: Utilization
    fb_used: int  # MiB
    is_inference_pod: bool = False


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica of a shared device (time-slicing or MPS) and the pod container holding it."""

    index: int  # the device plugin's `<uuid>::<index>`: dcgm-exporter's `vgpu` label
    holder: AllocatedBy
    pod_uid: str


@dataclass(frozen=True, slots=True)
class DraClaim:
    """A DRA ResourceClaim allocated this device (driver `gpu.nvidia.com`), and one pod container
    using it (the claim is reserved for the pod, and the container names it in
    `resources.claims`): dcgm-exporter's `dra_*` labels in DRA mode."""

    holder: AllocatedBy
    claim: str  # the ResourceClaim's name
    claim_namespace: str
    device: str  # the driver's device name, e.g. gpu-0-mig-1g5gb-19-2
    pool: str  # the driver's pool: the node's name
    # Its MIG instance was made for the claim (the driver's DynamicMIG): the slices name no uuid,
    # and dcgm-exporter up to 4.8.4 cannot attribute it (its #714).
    made: bool = False
    # Under the driver's ConsumableShares (allowMultipleAllocations), the allocation's `shareID`
    # and the memory it consumed in MiB (`consumedCapacity.memory`): several claims hold one
    # device, each its share. "" and None: the device is the claim's alone.
    share_id: str = ""
    consumed_memory: int | None = None


@dataclass(frozen=True, slots=True)
class Fraction:
    """A pod sharing a device another pod holds: a KAI fraction pod on the GPU its reservation
    pod holds (status_updater/placement/kai.py). The reservation pod is the device's
    `allocated-by`, as the kubelet, and so dcgm-exporter, sees it."""

    holder: AllocatedBy  # the fraction pod's container, with the pod's uid
    group: str  # its GPU group (KAI's runai-gpu-group), shared with the reservation pod
    memory: int  # MiB it may use: its gpu-memory, its gpu-fraction of the device, or its limit
    # NvFractions' compute mode (`time-slicing` or `sm-sharing`); "": none asked
    compute_mode: str = ""


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    # On a shared device: the one pod dcgm-exporter's default mode names, the pod that has
    # shared it longest (see `replicas` for every holder).
    allocated_by: AllocatedBy | None = None
    pod_gpu_usage_status: Mapping[str, PodUsage] = field(default_factory=dict)
    replicas: tuple[Replica, ...] = ()  # a shared device's held replicas, by index
    dra_claims: tuple[DraClaim, ...] = ()  # DRA claims holding it, one per pod container
    fractions: tuple[Fraction, ...] = ()  # the pods sharing it by KAI fractions, by pod


SHARING_STRATEGIES = ("time-slicing", "mps")


@dataclass(frozen=True, slots=True)
class Sharing:
    """The device plugin's GPU sharing on a node: each GPU (or static MIG instance) is
    advertised as `replicas` devices."""

    strategy: str  # time-slicing | mps
    replicas: int


@dataclass(frozen=True, slots=True)
class MigDevice:
    name: str  # profile, e.g. 1g.5gb
    position: int  # start memory slice
    gpu_instance_id: int
    id: str | None = None  # MIG-<uuid>, absent until run.ai/mig-mapping names it
    status: DeviceStatus | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault of a GPU (topology/faults.py: the catalog, and what each does over time): from
    the Node's `mig-exporter/gpu-faults` annotation or a fleet fault policy."""

    fault: str  # its name in faults.CATALOG
    since: int  # Unix seconds: when it begins (it may be ahead)
    until: int | None = None  # when it ends; None: while its source says so
    xid: int | None = None  # fault `xid`: the Xid raised
    count: int = 1  # errors at its start (ecc-sbe, ecc-dbe, row-remap)
    rate: float | None = None  # errors a minute while it lasts (None: the catalog's)
    correctable: bool = False  # row-remap: a correctable error's row
    source: str = "annotation"  # `annotation`, or `policy/<name>`


@dataclass(frozen=True, slots=True)
class Gpu:
    id: str  # GPU-<uuid>
    status: DeviceStatus | None = None
    mig_devices: tuple[MigDevice, ...] | None = None
    faults: tuple[Fault, ...] = ()  # its faults, past, present and ahead, by start
    # What faults cleared since counted, by counter (faults.COUNTERS), sorted: a GPU's error
    # counters keep what they counted once its fault is cleared, as its InfoROM does.
    counted: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeTopology:
    gpu_count: int
    gpu_memory: int  # MiB
    gpu_product: str
    is_dynamic_mig_enabled: bool = False
    gpus: tuple[Gpu, ...] = ()
    sharing: Sharing | None = None
    # The node's NVIDIA driver, where its document names it (a DRA node: what its slices say),
    # in NVML's form (`580.65.06`); None: the exporter's --driver-version.
    driver_version: str | None = None


@dataclass(frozen=True, slots=True)
class Topology:
    mig_strategy: str = "none"
    nodes: Mapping[str, NodeTopology] = field(default_factory=dict)
    # Node entries that could not be read, and why: a bad entry is that node's problem only, so
    # the other nodes of the same document are still read (and served).
    invalid: Mapping[str, TopologyError] = field(default_factory=dict)


def time_text(t: int) -> str:
    """Unix seconds as RFC 3339 in UTC, as Kubernetes writes times: `2026-11-28T09:00:00Z`."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> int:
    """RFC 3339 (`2026-11-28T09:00:00Z`, or with an offset) as Unix seconds. ValueError if not."""
    if not isinstance(text, str) or "T" not in text.upper():
        raise ValueError(f"expected an RFC 3339 time such as 2026-11-28T09:00:00Z, got {text!r}")
    try:
        at = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise ValueError(
            f"expected an RFC 3339 time such as 2026-11-28T09:00:00Z, got {text!r}"
        ) from None
    if at.tzinfo is None:
        raise ValueError(f"an RFC 3339 time names its zone (Z or an offset), got {text!r}")
    return int(at.timestamp())


# --- to the wire ---------------------------------------------------------------------------------


def dump_yaml(topology: Topology) -> str:
    """The `topology.yml` text, in PyYAML's block layout.

    Written straight from the dataclasses, on the updater's per-event path: several times faster
    than walking a tree, and many times faster than PyYAML. tests/topology/test_topology_model.py
    proves it is the block YAML of the schema's tree (the oracle in tests/support/tree.py), and
    that PyYAML reads that back, for generated topologies.
    """
    q = yamltext.scalar
    out = [f"mig-strategy: {q(topology.mig_strategy)}"]
    if not topology.nodes:
        out.append("nodes: {}")
    else:
        out.append("nodes:")
    for name in sorted(topology.nodes):
        node = topology.nodes[name]
        out += [
            yamltext.key(name, "  "),
            f"    gpu-count: {node.gpu_count}",
            f"    gpu-memory: {node.gpu_memory}",
            f"    gpu-product: {q(node.gpu_product)}",
            f"    is-dynamic-mig-enabled: {q(node.is_dynamic_mig_enabled)}",
        ]
        if not node.gpus:
            out.append("    gpus: []")
        else:
            out.append("    gpus:")
            _dump_gpus(node, out)
        if node.sharing is not None:
            out += ["    sharing:", f"      strategy: {q(node.sharing.strategy)}",
                    f"      replicas: {node.sharing.replicas}"]  # fmt: skip
        if node.driver_version is not None:
            out.append(f"    driver-version: {q(node.driver_version)}")
    return "\n".join(out) + "\n"


def _dump_gpus(node: NodeTopology, out: list[str]) -> None:
    q = yamltext.scalar
    for gpu in node.gpus:
        out.append(f"    - id: {q(gpu.id)}")
        if gpu.status is not None:
            _dump_status(gpu.status, "      ", out)
        if gpu.mig_devices is not None:
            _dump_migs(gpu.mig_devices, out)
        if gpu.faults:
            out.append("      faults:")
            out += [line for f in gpu.faults for line in _fault_lines(f)]
        if gpu.counted:
            out.append("      counted:")
            out += [f"{yamltext.key(k, '        ')} {v}" for k, v in gpu.counted]


def _fault_lines(f: Fault) -> list[str]:
    q = yamltext.scalar
    lines = [f"fault: {q(f.fault)}", f"since: {q(time_text(f.since))}"]
    if f.until is not None:
        lines.append(f"until: {q(time_text(f.until))}")
    if f.xid is not None:
        lines.append(f"xid: {f.xid}")
    if f.count != 1:
        lines.append(f"count: {f.count}")
    if f.rate is not None:
        lines.append(f"rate: {_decimal(f.rate)}")
    if f.correctable:
        lines.append("correctable: true")
    lines.append(f"source: {q(f.source)}")
    return [f"      - {lines[0]}", *(f"        {line}" for line in lines[1:])]


def _decimal(value: float) -> str:
    """A number as YAML reads it back exactly: an integer's digits, else a float with its dot
    (PyYAML reads `1e-05`, without one, as a string)."""
    if float(value).is_integer():
        return str(int(value))
    text = repr(float(value))
    return text if "e" not in text else f"{value:.15f}".rstrip("0")


def _dump_migs(migs: tuple[MigDevice, ...], out: list[str]) -> None:
    q = yamltext.scalar
    if not migs:
        out.append("      mig-devices: []")
    else:
        out.append("      mig-devices:")
        for dev in migs:
            lines = [] if dev.id is None else [f"id: {q(dev.id)}"]
            lines += [f"name: {q(dev.name)}", f"position: {dev.position}",
                      f"gpu-instance-id: {dev.gpu_instance_id}"]  # fmt: skip
            out.append(f"      - {lines[0]}")
            out += [f"        {line}" for line in lines[1:]]
            if dev.status is not None:
                _dump_status(dev.status, "        ", out)


def _dump_status(status: DeviceStatus, indent: str, out: list[str]) -> None:
    q = yamltext.scalar
    a = status.allocated_by
    if (
        a is None
        and not status.pod_gpu_usage_status
        and not status.replicas
        and not status.dra_claims
        and not status.fractions
    ):
        out.append(f"{indent}status: {{}}")
        return
    out.append(f"{indent}status:")
    if a is not None:
        out += [f"{indent}  allocated-by:", f"{indent}    namespace: {q(a.namespace)}",
                f"{indent}    pod: {q(a.pod)}", f"{indent}    container: {q(a.container)}"]  # fmt: skip
        if a.uid:
            out.append(f"{indent}    pod-uid: {q(a.uid)}")
        _labels(out, a, f"{indent}    ")
    if status.pod_gpu_usage_status:
        out.append(f"{indent}  pod-gpu-usage-status:")
        for uid, u in sorted(status.pod_gpu_usage_status.items()):
            out += [
                yamltext.key(uid, f"{indent}    "),
                f"{indent}      utilization:",
                f"{indent}        min: {u.utilization.min}",
                f"{indent}        max: {u.utilization.max}",
                f"{indent}      fb-used: {u.fb_used}",
                f"{indent}      is-inference-pod: {q(u.is_inference_pod)}",
            ]
    if status.replicas:
        out.append(f"{indent}  replicas:")
        for r in status.replicas:
            h = r.holder
            out += [f"{indent}  - replica: {r.index}", f"{indent}    namespace: {q(h.namespace)}",
                    f"{indent}    pod: {q(h.pod)}", f"{indent}    container: {q(h.container)}",
                    f"{indent}    pod-uid: {q(r.pod_uid)}"]  # fmt: skip
            _labels(out, h, f"{indent}    ")
    if status.dra_claims:
        out.append(f"{indent}  dra-claims:")
        for c in status.dra_claims:
            h = c.holder
            out += [f"{indent}  - claim: {q(c.claim)}",
                    f"{indent}    claim-namespace: {q(c.claim_namespace)}",
                    f"{indent}    device: {q(c.device)}", f"{indent}    pool: {q(c.pool)}",
                    f"{indent}    namespace: {q(h.namespace)}", f"{indent}    pod: {q(h.pod)}",
                    f"{indent}    container: {q(h.container)}"]  # fmt: skip
            if h.uid:
                out.append(f"{indent}    pod-uid: {q(h.uid)}")
            _labels(out, h, f"{indent}    ")
            if c.made:
                out.append(f"{indent}    made: true")
            if c.share_id:
                out.append(f"{indent}    share-id: {q(c.share_id)}")
            if c.consumed_memory is not None:
                out.append(f"{indent}    consumed-memory: {c.consumed_memory}")
    if status.fractions:
        out.append(f"{indent}  fractions:")
        for f in status.fractions:
            h = f.holder
            out += [f"{indent}  - namespace: {q(h.namespace)}", f"{indent}    pod: {q(h.pod)}",
                    f"{indent}    container: {q(h.container)}", f"{indent}    pod-uid: {q(h.uid)}",
                    f"{indent}    gpu-group: {q(f.group)}", f"{indent}    memory: {f.memory}"]  # fmt: skip
            if f.compute_mode:
                out.append(f"{indent}    compute-mode: {q(f.compute_mode)}")
            _labels(out, h, f"{indent}    ")


def _labels(out: list[str], holder: AllocatedBy, indent: str) -> None:
    if holder.labels:
        out.append(f"{indent}labels:")
        out += [f"{yamltext.key(k, indent + '  ')} {yamltext.scalar(v)}" for k, v in holder.labels]


# --- from the wire -------------------------------------------------------------------------------


class _Reader:
    """Typed access to a YAML mapping that names the exact path in every error."""

    def __init__(self, data: object, where: str, obj: str) -> None:
        if not isinstance(data, Mapping):
            raise TopologyError(
                obj, where or "topology", f"expected a mapping, got {kind_of(data)}"
            )
        self.data: Mapping[str, Any] = data
        self.where = where
        self.obj = obj

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, message: str) -> TopologyError:
        return TopologyError(self.obj, self._path(key), message)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def raw(self, key: str) -> Any:
        if key not in self.data:
            raise self.error(key, "is required")
        return self.data[key]

    def integer(self, key: str, *, minimum: int = 0, maximum: int = MAX_INTEGER) -> int:
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, f"expected an integer, got {_short(value)}")
        if value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {_short(value)}")
        if value > maximum:
            raise self.error(key, f"must be <= {maximum}, got {_short(value)}")
        return value

    def time(self, key: str) -> int:
        try:
            return parse_time(self.raw(key))
        except ValueError as e:
            raise self.error(key, str(e)) from None

    def string(self, key: str, *, empty: bool = False) -> str:
        value = self.raw(key)
        if not isinstance(value, str) or not (value or empty):
            raise self.error(key, f"expected a non-empty string, got {value!r}")
        return value

    def boolean(self, key: str, default: bool = False) -> bool:
        if key not in self.data:
            return default
        value = self.data[key]
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def sub(self, key: str) -> _Reader:
        return _Reader(self.raw(key), self._path(key), self.obj)

    def items(self, key: str) -> list[_Reader]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.error(key, f"expected a list, got {kind_of(value)}")
        return [_Reader(item, f"{self._path(key)}[{i}]", self.obj) for i, item in enumerate(value)]


def _short(value: object) -> str:
    """A value for a message: a huge integer by its length (Python refuses to print one of more
    than 4,300 digits, and a 400-digit one is no help to read)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
        return f"a {len(str(abs(value))) if abs(value) < 10**4000 else 'many'}-digit number"
    return repr(value)


def _holder(r: _Reader, uid: bool = True) -> AllocatedBy:
    """namespace, pod, container (and the pod's uid, where the writer knew it; a replica's is
    its own `pod-uid`, not its holder's)."""
    namespace, pod, container = (r.string(k, empty=True) for k in ("namespace", "pod", "container"))
    labels: tuple[tuple[str, str], ...] = ()
    if r.has("labels"):
        found = r.sub("labels")
        labels = tuple(sorted((str(k), found.string(k, empty=True)) for k in found.data))
    return AllocatedBy(
        namespace,
        pod,
        container,
        r.string("pod-uid", empty=True) if uid and r.has("pod-uid") else "",
        labels,
    )


def _status_from(r: _Reader) -> DeviceStatus:
    allocated_by = None
    if r.has("allocated-by"):
        a = r.sub("allocated-by")
        # Kubernetes names are never empty, but an emulated or hand-made pod's may be: the
        # exporter shows what the writer saw (an empty label), rather than refusing the node.
        allocated_by = _holder(a)
    usage: dict[str, PodUsage] = {}
    if r.has("pod-gpu-usage-status"):
        u = r.sub("pod-gpu-usage-status")
        for uid in u.data:
            p = u.sub(str(uid))
            util = p.sub("utilization")
            lo, hi = util.integer("min"), util.integer("max")
            if not lo <= hi <= 100:
                raise util.error("max", f"need 0 <= min <= max <= 100, got {lo}-{hi}")
            usage[str(uid)] = PodUsage(
                Utilization(lo, hi), p.integer("fb-used"), p.boolean("is-inference-pod")
            )
    replicas = tuple(
        Replica(
            x.integer("replica"),
            _holder(x, uid=False),
            x.string("pod-uid", empty=True),
        )
        for x in (r.items("replicas") if r.has("replicas") else [])
    )
    claims = tuple(
        DraClaim(
            _holder(x),
            x.string("claim"),
            x.string("claim-namespace"),
            x.string("device"),
            x.string("pool"),
            x.boolean("made"),
            x.string("share-id", empty=True) if x.has("share-id") else "",
            x.integer("consumed-memory") if x.has("consumed-memory") else None,
        )
        for x in (r.items("dra-claims") if r.has("dra-claims") else [])
    )
    fractions = tuple(
        Fraction(
            _holder(x),
            x.string("gpu-group", empty=True),
            x.integer("memory"),
            x.string("compute-mode", empty=True) if x.has("compute-mode") else "",
        )
        for x in (r.items("fractions") if r.has("fractions") else [])
    )
    return DeviceStatus(allocated_by, usage, replicas, claims, fractions)


def from_dict(data: object, obj: str = "topology") -> Topology:
    """Parse the `topology.yml` document. Raises TopologyError naming the field on bad input."""
    root = _Reader(data, "", obj)
    strategy = root.data.get("mig-strategy", "none")
    if strategy not in MIG_STRATEGIES:
        raise root.error(
            "mig-strategy", f"must be one of {', '.join(MIG_STRATEGIES)}, got {strategy!r}"
        )
    nodes: dict[str, NodeTopology] = {}
    invalid: dict[str, TopologyError] = {}
    node_map = root.sub("nodes") if root.has("nodes") else _Reader({}, "nodes", obj)
    for name in node_map.data:
        try:
            nodes[str(name)] = _node_from(node_map.sub(str(name)))
        except TopologyError as e:
            invalid[str(name)] = e
    return Topology(mig_strategy=strategy, nodes=nodes, invalid=invalid)


def _node_from(n: _Reader) -> NodeTopology:
    gpus = []
    for g in n.items("gpus") if n.has("gpus") else []:
        migs = None
        if g.has("mig-devices"):
            migs = tuple(
                MigDevice(
                    name=m.string("name"),
                    position=m.integer("position"),
                    gpu_instance_id=m.integer("gpu-instance-id"),
                    id=m.string("id") if m.has("id") else None,
                    status=_status_from(m.sub("status")) if m.has("status") else None,
                )
                for m in g.items("mig-devices")
            )
        status = _status_from(g.sub("status")) if g.has("status") else None
        faults = tuple(_fault_from(f) for f in g.items("faults")) if g.has("faults") else ()
        counted: tuple[tuple[str, int], ...] = ()
        if g.has("counted"):
            c = g.sub("counted")
            counted = tuple(sorted((str(k), c.integer(str(k), maximum=MAX_COUNT)) for k in c.data))
        gpus.append(
            Gpu(id=g.string("id"), status=status, mig_devices=migs, faults=faults, counted=counted)
        )
    return NodeTopology(
        gpu_count=n.integer("gpu-count"),
        gpu_memory=n.integer("gpu-memory"),
        gpu_product=n.string("gpu-product"),
        is_dynamic_mig_enabled=n.boolean("is-dynamic-mig-enabled"),
        gpus=tuple(gpus),
        sharing=_sharing_from(n.sub("sharing")) if n.has("sharing") else None,
        driver_version=n.string("driver-version") if n.has("driver-version") else None,
    )


def _fault_from(r: _Reader) -> Fault:
    rate = r.raw("rate") if r.has("rate") else None
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not 0 <= rate <= MAX_INTEGER):  # fmt: skip
        raise r.error("rate", f"expected a number of errors a minute, got {_short(rate)}")
    return Fault(
        fault=r.string("fault"),
        since=r.time("since"),
        until=r.time("until") if r.has("until") else None,
        xid=r.integer("xid") if r.has("xid") else None,
        count=r.integer("count") if r.has("count") else 1,
        rate=None if rate is None else float(rate),
        correctable=r.boolean("correctable"),
        source=r.string("source"),
    )


def _sharing_from(r: _Reader) -> Sharing:
    strategy = r.raw("strategy")
    if strategy not in SHARING_STRATEGIES:
        raise r.error(
            "strategy", f"must be one of {', '.join(SHARING_STRATEGIES)}, got {strategy!r}"
        )
    return Sharing(strategy, r.integer("replicas", minimum=2))


def load_yaml(text: str, obj: str = "topology") -> Topology:
    try:
        data = load_document(text)
    except yaml.YAMLError as e:
        raise TopologyError(obj, "topology.yml", f"is not valid YAML: {one_line(e)}") from None
    return from_dict(data, obj)
