"""Faults from the cluster into the topology: a Node's annotation and the fleet fault policies.

Two inputs, both written with kubectl (docs/faults.md has their schema):
- the Node annotation `mig-exporter/gpu-faults`: a JSON or YAML list of entries
  `{"gpu": <index or GPU uuid>, "fault": <name>, "xid": <n>, "since": <RFC 3339>, "for": <duration>}`;
- fault policies: ConfigMaps labelled `mig-exporter/fault-policy` in the updater's namespace,
  each holding one policy in `policy.yaml`: the nodes (a label selector), a fraction or count of
  their GPUs, a fault, a start (at a time, after a delay from the policy's creation, at random
  within a window), a duration (or until the policy is deleted), and a seed. Which GPUs a policy
  hits and when is a pure function of the policy and the nodes: a scenario replays the same way.
A ConfigMap rather than a CRD: it needs no CRD installed (nor the rights to install one) on the
test clusters this runs on, kubectl applies it like any manifest, `render` reads the same file,
and the updater already lists ConfigMaps in its namespace.

`apply` puts a node's faults on its GPUs with absolute times (model.Fault), and folds what a
cleared fault counted into the GPU's `counted`, so its counters never go down. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from mig_exporter.common.text import kind_of, one_line
from mig_exporter.common.yamlload import load_document
from mig_exporter.kube import selectors
from status_updater.objects import Obj, metadata, node_name, strings
from topology import faults as catalog
from topology.errors import TopologyError
from topology.model import MAX_COUNT, MAX_INTEGER, Fault, Gpu, NodeTopology, parse_time

POLICY_LABEL = "mig-exporter/fault-policy"  # marks a ConfigMap as a fault policy
POLICY_KEY = "policy.yaml"
STATUS_ANNOTATION = "mig-exporter/fault-status"  # what the updater says a policy hit
# On a Node, with the updater's --fault-node-labels: how many of its GPUs a device plugin would
# have marked unhealthy (absent: none).
UNHEALTHY_LABEL = "mig-exporter/unhealthy-gpus"
MAX_ENTRIES = 1024  # per node: more is no test anyone runs, and would bloat its document
MAX_RATE = 1e9  # errors a minute
CLEARED_AHEAD_S = 60  # how far ahead a cleared fault's counts are kept (`apply`)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|m|s)")
_UNITS = {"h": 3600, "m": 60, "s": 1}
_FAULT_KEYS = ("fault", "xid", "count", "rate", "correctable")
_ENTRY_KEYS = frozenset({"gpu", "since", "for", *_FAULT_KEYS})
# The times a fault may begin and end: what a topology document writes and reads back as RFC 3339
# (model.time_text: a year of four digits), from the Unix epoch on.
FIRST_TIME, LAST_TIME = 0, 253402300799  # 1970-01-01T00:00:00Z, 9999-12-31T23:59:59Z


class Bad(Exception):
    """A field that cannot be read: `field`, `message` (the caller names the object)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def duration(value: object, field: str) -> int:
    """Seconds of a Go duration (`90s`, `10m`, `1h30m`) or a number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not 0 < value <= MAX_INTEGER:
            raise Bad(field, f"must be a positive number of seconds, got {value!r}")
        return max(int(value), 1)
    if isinstance(value, str):
        text = value.strip()
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
            if 0 < seconds <= MAX_INTEGER:
                return max(int(seconds), 1)
    raise Bad(field, f"expected a duration such as 90s, 10m or 1h30m, got {value!r}")


def _integer(data: Mapping[str, Any], key: str, field: str, low: int, high: int) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Bad(f"{field}.{key}", f"expected an integer from {low} to {high}, got {value!r}")
    return value


def read_fault(data: Mapping[str, Any], field: str, source: str) -> Fault:
    """The fault an entry (or a policy's `fault`) names, its start not yet known (since 0)."""
    name = data.get("fault")
    if not isinstance(name, str) or name not in catalog.CATALOG:
        raise Bad(f"{field}.fault", f"must be one of {', '.join(catalog.CATALOG)}, got {name!r}")
    xid = None
    if name == "xid":
        if "xid" not in data:
            raise Bad(f"{field}.xid", "is required for fault xid (e.g. 79)")
        xid = _integer(data, "xid", field, 1, 65535)
    elif "xid" in data:
        raise Bad(f"{field}.xid", f"is only for fault xid; {name} raises its own")
    count = _integer(data, "count", field, 1, MAX_INTEGER) if "count" in data else 1
    rate = data.get("rate")
    if rate is not None:
        if not catalog.CATALOG[name].rates:
            raise Bad(f"{field}.rate", f"{name} counts nothing a minute")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= MAX_RATE:
            raise Bad(
                f"{field}.rate", f"expected errors a minute (0 to {MAX_RATE:g}), got {rate!r}"
            )
    correctable = data.get("correctable", False)
    if not isinstance(correctable, bool) or (correctable and name != "row-remap"):
        raise Bad(f"{field}.correctable", "is true or false, and only for fault row-remap")
    if rate is not None:
        # A whole rate kept an int: the topology document writes ints, and no float yet
        # (model._fault_lines, yamltext.scalar), so `rate: 6.0` is written as 6.
        rate = int(rate) if float(rate).is_integer() else float(rate)
    return Fault(fault=name, since=0, xid=xid, count=count, rate=rate, correctable=correctable,
                 source=source)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Entry:
    """One fault of one GPU of a node, as its source says it: its start where the source names
    one (None: when the updater first saw it), and how long it lasts (None: until cleared)."""

    gpu: int
    fault: Fault  # since 0 and until None: `apply` sets them
    since: int | None
    lasts: int | None


def _gpu_index(value: object, gpus: Sequence[Gpu], field: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value < len(gpus):
            return value
        raise Bad(
            field, f"GPU {value} is not on this node (it has {len(gpus)}: 0 to {len(gpus) - 1})"
        )
    if isinstance(value, str):
        for i, gpu in enumerate(gpus):
            if gpu.id == value:
                return i
        raise Bad(field, f"no GPU of this node has the uuid {value!r}")
    raise Bad(field, f"expected a GPU index or uuid, got {kind_of(value)}")


def node_entries(node: Obj, gpus: Sequence[Gpu], warnings: list[TopologyError]) -> list[Entry]:
    """The node's annotated faults; each bad entry said (naming the node and field) and left out,
    the others kept."""
    text = strings(metadata(node).get("annotations")).get(catalog.ANNOTATION)
    if text is None:
        return []
    obj, where = f"node {node_name(node)}", f"metadata.annotations[{catalog.ANNOTATION}]"
    try:
        data = load_document(text) if isinstance(text, str) else text
    except (yaml.YAMLError, ValueError) as e:
        warnings.append(TopologyError(obj, where, f"is not JSON or YAML: {one_line(e)}"))
        return []
    if isinstance(data, Mapping):
        data = [data]  # one entry, written without its list
    if not isinstance(data, list):
        warnings.append(
            TopologyError(obj, where, f"expected a list of faults, got {kind_of(data)}")
        )
        return []
    if len(data) > MAX_ENTRIES:
        warnings.append(
            TopologyError(obj, where, f"{len(data)} faults: the first {MAX_ENTRIES} kept")
        )
    out = []
    for i, item in enumerate(data[:MAX_ENTRIES]):
        field = f"{where}[{i}]"
        try:
            out.append(_entry(item, gpus, field))
        except Bad as e:
            warnings.append(TopologyError(obj, e.field, e.message))
    return out


def _entry(item: object, gpus: Sequence[Gpu], field: str) -> Entry:
    if not isinstance(item, Mapping):
        raise Bad(
            field, f"expected a fault such as {{gpu: 0, fault: xid, xid: 79}}, got {kind_of(item)}"
        )
    if unknown := sorted(str(k) for k in item if k not in _ENTRY_KEYS):
        raise Bad(
            f"{field}.{unknown[0]}",
            f"is no key of a fault entry ({', '.join(sorted(_ENTRY_KEYS))})",
        )
    if "gpu" not in item:
        raise Bad(f"{field}.gpu", "is required: the GPU's index or uuid")
    gpu = _gpu_index(item["gpu"], gpus, f"{field}.gpu")
    fault = read_fault(item, field, "annotation")
    since = None
    if item.get("since") is not None:
        try:
            since = parse_time(item["since"])
        except ValueError as e:
            raise Bad(f"{field}.since", str(e)) from None
    lasts = duration(item["for"], f"{field}.for") if item.get("for") is not None else None
    if since is not None:
        _within_times(since, since + (lasts or 0), f"{field}.since")
    return Entry(gpu, fault, since, lasts)


def _within_times(first: int, last: int, field: str) -> None:
    """Bad unless a fault from `first` to `last` can be written (the topology's RFC 3339)."""
    if first < FIRST_TIME:
        raise Bad(field, "is before 1970-01-01T00:00:00Z, the first time a fault may begin")
    if last > LAST_TIME:
        raise Bad(field, "ends after 9999-12-31T23:59:59Z, the last time a fault may end")


# --- fleet policies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """A fault policy: which GPUs of which nodes get a fault, and when."""

    name: str
    selector: str  # kubectl -l syntax; "": every GPU node
    fraction: float | None  # each selected GPU is hit with this chance (seeded)...
    count: int | None  # ...or this many of all selected GPUs are
    fault: Fault  # since 0: each hit's start is worked out
    base: int  # Unix seconds: `start.at`, or the policy's creation + `start.after`
    within: int  # seconds: each hit starts at random within this window from `base`
    lasts: int | None  # seconds; None: until the policy is deleted
    seed: int

    def selects(self, labels: Mapping[str, str]) -> bool:
        return _selector(self.selector)(labels)


_SELECTORS: dict[str, selectors.Selector] = {}


def _selector(text: str) -> selectors.Selector:
    found = _SELECTORS.get(text)
    if found is None:
        found = _SELECTORS[text] = selectors.parse(text)
    return found


_POLICY_KEYS = frozenset({"nodeSelector", "gpus", "fault", "start", "for", "seed"})


def read_policy(cm: Obj, now: float) -> Policy:
    """The policy a ConfigMap holds. TopologyError naming the ConfigMap and field if it is bad.
    `now`: the base of `start.after` for a policy that has no creationTimestamp (a file)."""
    meta = metadata(cm)
    name = str(meta.get("name") or "")
    obj = f"configmap {meta.get('namespace') or 'default'}/{name} (fault policy)"
    where = f"data[{POLICY_KEY}]"
    text = strings(cm.get("data")).get(POLICY_KEY)
    if not isinstance(text, str):
        raise TopologyError(obj, where, "is required: the policy, in YAML")
    try:
        data = load_document(text)
    except (yaml.YAMLError, ValueError) as e:
        raise TopologyError(obj, where, f"is not YAML: {one_line(e)}") from None
    try:
        return _policy(name, data, where, meta.get("creationTimestamp"), now)
    except Bad as e:
        raise TopologyError(obj, e.field, e.message) from None


def _policy(name: str, data: object, where: str, created: object, now: float) -> Policy:
    if not isinstance(data, Mapping):
        raise Bad(where, f"expected a mapping, got {kind_of(data)}")
    if unknown := sorted(str(k) for k in data if k not in _POLICY_KEYS):
        raise Bad(
            f"{where}.{unknown[0]}", f"is no key of a policy ({', '.join(sorted(_POLICY_KEYS))})"
        )
    selector = _node_selector(data.get("nodeSelector"), f"{where}.nodeSelector")
    gpus = data.get("gpus")
    if not isinstance(gpus, Mapping) or len(gpus) != 1 or not {"fraction", "count"} & set(gpus):
        raise Bad(f"{where}.gpus", "expected {fraction: <0 to 1>} or {count: <n>}")
    fraction = count = None
    if "fraction" in gpus:
        f = gpus["fraction"]
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0 <= f <= 1:
            raise Bad(f"{where}.gpus.fraction", f"expected a number from 0 to 1, got {f!r}")
        fraction = float(f)
    else:
        count = _integer(gpus, "count", f"{where}.gpus", 0, MAX_INTEGER)
    spec = data.get("fault")
    if not isinstance(spec, Mapping):
        raise Bad(f"{where}.fault", "expected a fault such as {fault: xid, xid: 48}")
    if unknown := sorted(str(k) for k in spec if k not in _FAULT_KEYS):
        raise Bad(
            f"{where}.fault.{unknown[0]}",
            f"is no key of a policy's fault ({', '.join(_FAULT_KEYS)})",
        )
    fault = read_fault(spec, f"{where}.fault", f"policy/{name}")
    base, within = _start(data.get("start") or {}, f"{where}.start", created, now)
    lasts = duration(data["for"], f"{where}.for") if data.get("for") is not None else None
    _within_times(base, base + within + (lasts or 0), f"{where}.start")
    seed = data.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise Bad(f"{where}.seed", f"expected an integer, got {seed!r}")
    return Policy(name, selector, fraction, count, fault, base, within, lasts, seed)


def _node_selector(value: object, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, Mapping):  # {matchLabels: {...}}, as a LabelSelector's simple form
        if set(value) - {"matchLabels"} or not isinstance(value.get("matchLabels"), Mapping):
            raise Bad(field, "expected a selector string (kubectl -l) or {matchLabels: {...}}")
        labels = value["matchLabels"]
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
            raise Bad(f"{field}.matchLabels", "label values are strings: quote them ('true', '8')")
        value = ",".join(f"{k}={v}" for k, v in labels.items())
    if not isinstance(value, str):
        raise Bad(field, f"expected a label selector such as type=kwok, got {kind_of(value)}")
    try:
        _selector(value)
    except ValueError as e:
        raise Bad(field, str(e)) from None
    return value


def _start(data: object, field: str, created: object, now: float) -> tuple[int, int]:
    """(base, window) of a policy's `start`: {at: <time>} or {after: <duration>} (from the
    policy's creation), and {within: <duration>} for a start at random in that window."""
    if not isinstance(data, Mapping) or set(data) - {"at", "after", "within"}:
        raise Bad(
            field, "expected {at: <RFC 3339>} or {after: <duration>}, and {within: <duration>}"
        )
    if "at" in data and "after" in data:
        raise Bad(field, "at or after, not both")
    try:
        base = int(now) if not isinstance(created, str) else parse_time(created)
        if "at" in data:
            base = parse_time(data["at"])
    except ValueError as e:
        raise Bad(f"{field}.at" if "at" in data else "metadata.creationTimestamp", str(e)) from None
    if "after" in data:
        base += duration(data["after"], f"{field}.after")
    within = duration(data["within"], f"{field}.within") if "within" in data else 0
    return base, within


def _draw(key: str) -> float:
    """A number in [0, 1) fixed by `key`: the same on every run, machine and Python."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()) / 2**64


Nodes = Mapping[str, tuple[Mapping[str, str], int]]  # name -> (labels, GPU count)


def hits(policy: Policy, nodes: Nodes) -> dict[str, list[Entry]]:
    """The GPUs the policy hits, by node. A GPU's chance and start are drawn from the seed, the
    policy's name, the node's name and the GPU's index, never from the order nodes arrive in:
    a `fraction` hits the same GPUs whatever other nodes come and go; a `count` the lowest draws
    of all selected GPUs."""
    key = f"{policy.seed}/{policy.name}"
    chosen: list[tuple[float, str, int]] = []
    for name, (labels, gpus) in nodes.items():
        if not policy.selects(labels):
            continue
        for i in range(gpus):
            chance = _draw(f"{key}/{name}/{i}")
            if policy.fraction is None or chance < policy.fraction:
                chosen.append((chance, name, i))
    if policy.count is not None:
        chosen = sorted(chosen)[: policy.count]
    out: dict[str, list[Entry]] = {}
    for _, name, i in chosen:
        since = policy.base
        if policy.within:
            since += int(_draw(f"{key}/{name}/{i}/start") * policy.within)
        out.setdefault(name, []).append(Entry(i, policy.fault, since, policy.lasts))
    return out


def status(policy: Policy, hit: Mapping[str, Sequence[Entry]], limit: int = 200) -> str:
    """What the policy hit, for its status annotation: a JSON object (the first `limit` GPUs,
    by node and index, and how many in all)."""
    from topology.model import time_text

    rows = sorted((name, e.gpu, e.since or 0) for name, entries in hit.items() for e in entries)
    gpus = [
        {"node": n, "gpu": g, "since": time_text(s),
         **({"until": time_text(s + policy.lasts)} if policy.lasts else {})}
        for n, g, s in rows[:limit]
    ]  # fmt: skip
    body = {"gpus": len(rows), "nodes": len(hit), "hits": gpus}
    if len(rows) > limit:
        body["more"] = len(rows) - limit
    return json.dumps(body, separators=(",", ":"))


# --- onto the GPUs -------------------------------------------------------------------------------


def _key(f: Fault) -> tuple[Any, ...]:
    """A fault as its source names it, whatever its start was resolved to."""
    return (f.source, f.fault, f.xid, f.count, f.rate, f.correctable)


def apply(
    topo: NodeTopology, entries: Iterable[Entry], previous: NodeTopology | None, now: float
) -> NodeTopology:
    """`topo` with each GPU's faults, and what the faults cleared since `previous` counted.

    An entry without a start begins when it was first seen: the start its fault has in
    `previous` (what the updater wrote, read back after a restart too), else `now`. A fault of
    `previous` that no entry names any more is cleared: what it counted stays in `counted`."""
    by_gpu: dict[int, list[Entry]] = {}
    for e in entries:
        by_gpu.setdefault(e.gpu, []).append(e)
    before = {g.id: g for g in previous.gpus} if previous is not None else {}
    if not by_gpu and not any(g.faults or g.counted for g in before.values()):
        return topo  # the common case: a healthy node, no work
    gpus = []
    for i, gpu in enumerate(topo.gpus):
        old = before.get(gpu.id)
        old_faults = old.faults if old is not None else ()
        seen: dict[tuple[Any, ...], list[int]] = {}
        for f in old_faults:
            seen.setdefault(_key(f), []).append(f.since)
        made = []
        for e in by_gpu.get(i, ()):
            since = e.since
            if since is None:
                earlier = seen.get(_key(e.fault))
                since = earlier.pop(0) if earlier else int(now)
            until = None if e.lasts is None else since + e.lasts
            made.append(replace(e.fault, since=since, until=until))
        made.sort(key=lambda f: (f.since, f.source, f.fault))
        counted = dict(old.counted) if old is not None else {}
        # Whatever changed (a fault cleared, shortened, re-dated), no counter may go down:
        # what the old faults count and the new ones do not is kept in `counted`, worked out
        # CLEARED_AHEAD_S ahead: an exporter may serve the old document a step or two longer
        # (the watch's delay, a skewed clock), and must never have counted more by then.
        for name, short in _shortfall(old_faults, made, now, now + CLEARED_AHEAD_S).items():
            if short > 0:
                # At most what a topology document holds (model.MAX_COUNT: 104 days throttled,
                # in ns), so that the exporter, and the updater after a restart, read it back.
                counted[name] = min(counted.get(name, 0) + short, MAX_COUNT)
        gpus.append(replace(gpu, faults=tuple(made),
                            counted=tuple(sorted((k, v) for k, v in counted.items() if v))))  # fmt: skip
    return replace(topo, gpus=tuple(gpus))


def _shortfall(
    old: Sequence[Fault], new: Sequence[Fault], start: float, end: float
) -> dict[str, int]:
    """The most the old faults count above the new ones at any time from `start` to `end`. The
    difference is piecewise linear, bending only where a fault begins or ends: its most is at
    one of those times or at either end."""
    times = {start, end} | {
        b for f in (*old, *new) for b in catalog.boundaries((f,)) if start < b < end
    }
    most: dict[str, int] = {}
    for t in times:
        kept = _total(new, t)
        for name, value in _total(old, t).items():
            most[name] = max(most.get(name, 0), value - kept.get(name, 0))
    return most


def _total(faults: Iterable[Fault], now: float) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in faults:
        for name, value in catalog.counts(f, now).items():
            out[name] = out.get(name, 0) + value
    return out


def next_change(topo: NodeTopology, now: float) -> int | None:
    """The first time after `now` a fault of the node begins or ends (its taints change)."""
    later = [t for g in topo.gpus for t in catalog.boundaries(g.faults) if t > now]
    return min(later) if later else None


def node_taints(topo: NodeTopology, now: float) -> tuple[tuple[catalog.Taint, ...], ...]:
    """Each GPU's device taints at `now` (empty tuples on a healthy node). A lost GPU taints
    every device of the node `gpu-lost`: NVML's event wait answers GPU_IS_LOST, and the driver
    then taints all it publishes (device_health.go sendHealthEventForAllDevices)."""
    if not any(g.faults for g in topo.gpus):
        return ()
    each = [catalog.taints(g.faults, now) for g in topo.gpus]
    if any(catalog.lost(g.faults, now) for g in topo.gpus):
        each = [(catalog.LOST_TAINT, *t) for t in each]
    return tuple(each) if any(each) else ()
