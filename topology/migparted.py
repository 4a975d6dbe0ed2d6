"""NVIDIA mig-parted layouts (static MIG): the config format, the built-in layouts, the placement.

The GPU operator's mig-manager applies the layout a node's `nvidia.com/mig.config` label names,
from the mig-parted config in a ConfigMap (`default-mig-parted-config`, key `config.yaml`):

    version: v1
    mig-configs:
      all-1g.10gb:
        - device-filter: ["0x233010DE"]   # optional: PCI device ids the entry applies to
          devices: all                    # or GPU indices [0, 1]
          mig-enabled: true
          mig-devices: {"1g.10gb": 7}     # profile -> count

Entries apply in order to the GPUs they match, so the last match wins (mig-parted's apply). The
driver places instances created without a placement at the first free start of the profile's
preferred order (catalog.Profile.preferred); mig-parted creates larger profiles first and tries
other orders until one fits. run:ai's `run.ai/mig.config` is the same format with one config,
`selected`, whose mig-devices carry positions (topology/runai.py reads it with `entries`).

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

import yaml

from mig_exporter.common.text import kind_of, one_line
from mig_exporter.common.yamlload import load_document
from topology.catalog import MODELS, GpuModel, Profile, balanced
from topology.errors import TopologyError

LABEL_CONFIG = "nvidia.com/mig.config"
DATA_KEY = "config.yaml"
DEFAULT_CONFIGMAP = "gpu-operator/default-mig-parted-config"
MAX_LAYOUTS = 10_000  # a sanity bound: NVIDIA's default config has about 90
_PCI_ID = re.compile(r"0x[0-9A-F]{8}")
T = TypeVar("T")


def integer(value: object, obj: str, field: str, limit: int = 10**9) -> int:
    """A non-negative int, also from a decimal string (`"1"`): run:ai and YAML write both."""
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,9}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
        raise TopologyError(obj, field, f"expected an integer from 0 to {limit - 1}, got {value!r}")
    return value


@dataclass(frozen=True)
class Entry:
    """One item of a layout: which GPUs, MIG on or off, and the instances."""

    devices: tuple[int, ...] | None  # None: all
    mig_enabled: bool
    mig_devices: tuple[tuple[str, int], ...]  # (profile, count), or (profile, position) for run:ai
    device_filter: tuple[str, ...] = ()  # normalized PCI ids; empty: any GPU

    def matches(self, model: GpuModel | None, index: int) -> bool:
        if self.devices is not None and index not in self.devices:
            return False
        if not self.device_filter:
            return True
        return model is not None and not set(self.device_filter).isdisjoint(model.pci_ids)


Layouts = Mapping[str, tuple[Entry, ...]]


def entries(
    value: object,
    obj: str,
    field: str,
    mig_devices: Callable[[object, str, str], tuple[tuple[str, int], ...]],
) -> tuple[Entry, ...]:
    """A layout's list of entries; `mig_devices` reads the entries' `mig-devices`."""
    if not isinstance(value, list):
        raise TopologyError(obj, field, f"expected a list of entries, got {kind_of(value)}")
    found = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, dict):
            raise TopologyError(obj, where, f"expected a mapping, got {kind_of(item)}")
        on = item.get("mig-enabled", False)
        if not isinstance(on, bool):
            raise TopologyError(obj, f"{where}.mig-enabled", f"expected true or false, got {on!r}")
        found.append(
            Entry(
                devices=_devices(item.get("devices"), obj, f"{where}.devices"),
                mig_enabled=on,
                mig_devices=mig_devices(item.get("mig-devices"), obj, f"{where}.mig-devices")
                if on
                else (),
                device_filter=_device_filter(
                    item.get("device-filter"), obj, f"{where}.device-filter"
                ),
            )
        )
    return tuple(found)


def _devices(value: object, obj: str, field: str) -> tuple[int, ...] | None:
    if value == "all":
        return None
    if not isinstance(value, list) or not value:
        raise TopologyError(obj, field, f"expected a list of GPU indices or 'all', got {value!r}")
    return tuple(integer(v, obj, f"{field}[{i}]", 1024) for i, v in enumerate(value))


def _device_filter(value: object, obj: str, field: str) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if value is None or values == [""]:
        return ()
    if not isinstance(values, list):
        raise TopologyError(obj, field, f"expected PCI device ids, got {value!r}")
    ids = []
    for i, v in enumerate(values):
        normal = v.upper().replace("0X", "0x") if isinstance(v, str) else ""
        if not _PCI_ID.fullmatch(normal):
            raise TopologyError(
                obj, f"{field}[{i}]", f"expected a PCI id like 0x20B010DE, got {v!r}"
            )
        ids.append(normal)
    return tuple(ids)


def _counts(value: object, obj: str, field: str) -> tuple[tuple[str, int], ...]:
    """mig-parted's `{profile: count}`."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise TopologyError(obj, field, f"expected a mapping of profile to count, got {value!r}")
    counts = []
    for name, count in value.items():
        if not isinstance(name, str) or not name:
            raise TopologyError(obj, field, f"expected a profile name, got {name!r}")
        n = integer(count, obj, f"{field}[{name}]", 1000)
        if n:
            counts.append((name, n))
    return tuple(sorted(counts))


def parse(text: str, obj: str, field: str = DATA_KEY) -> dict[str, tuple[Entry, ...]]:
    """A mig-parted config document -> layouts by name. TopologyError names the field."""
    return from_document(_load(text, obj, field), obj, field)


def load(text: str, obj: str) -> dict[str, tuple[Entry, ...]]:
    """The GPU operator's ConfigMap manifest (its `config.yaml`), or that bare document."""
    doc = _load(text, obj, "")
    if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
        data = doc.get("data")
        inner = data.get(DATA_KEY) if isinstance(data, dict) else None
        if not isinstance(inner, str):
            raise TopologyError(obj, f"data[{DATA_KEY}]", "is required")
        return parse(inner, obj, f"data[{DATA_KEY}]")
    return from_document(doc, obj, "")


def _load(text: str, obj: str, field: str) -> object:
    try:
        return load_document(text)
    except yaml.YAMLError as e:
        raise TopologyError(obj, field or "config", f"is not valid YAML: {one_line(e)}") from None


def from_document(doc: object, obj: str, field: str) -> dict[str, tuple[Entry, ...]]:
    def at(key: str) -> str:
        return f"{field}.{key}" if field else key

    if not isinstance(doc, dict):
        raise TopologyError(obj, field or "config", f"expected a mapping, got {kind_of(doc)}")
    if doc.get("version") != "v1":
        raise TopologyError(obj, at("version"), f"expected v1, got {doc.get('version')!r}")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict):
        raise TopologyError(obj, at("mig-configs"), f"expected a mapping, got {kind_of(configs)}")
    if len(configs) > MAX_LAYOUTS:
        raise TopologyError(obj, at("mig-configs"), f"more than {MAX_LAYOUTS} layouts")
    return {
        str(name): entries(value, obj, at(f"mig-configs[{name}]"), _counts)
        for name, value in configs.items()
    }


def layout_name(profile: str) -> str:
    """`all-<profile>`, with `+` written as `.` as mig-parted names them (`all-1g.5gb.me`)."""
    return f"all-{profile.replace('+', '.')}"


@lru_cache(maxsize=1)
def builtin() -> dict[str, tuple[Entry, ...]]:
    """The layouts NVIDIA ships, for every model of the catalog: `all-disabled`, `all-enabled`,
    `all-balanced` and `all-<profile>` (as many as fit), each entry filtered to its models."""
    layouts: dict[str, list[Entry]] = {
        "all-disabled": [Entry(None, False, ())],
        "all-enabled": [Entry(None, True, ())],
        "all-balanced": [],
    }
    for model in MODELS:
        mix = tuple(sorted(balanced(model).items()))
        if mix:
            layouts["all-balanced"].append(Entry(None, True, mix, model.pci_ids))
        for p in model.profiles:
            entry = Entry(None, True, ((p.name, p.max_count),), model.pci_ids)
            layouts.setdefault(layout_name(p.name), []).append(entry)
    return {name: tuple(found) for name, found in layouts.items()}


# --- placement -----------------------------------------------------------------------------------


def _creation_order(profiles: list[Profile]) -> list[Profile]:
    # mig-parted's Flatten: more compute slices first, then (ours, for a stable order where it
    # leaves ties) more memory slices, then the name.
    return sorted(profiles, key=lambda p: (-p.compute_slices, -p.memory_slices, p.name))


def _place_in_order(model: GpuModel, order: list[Profile]) -> tuple[tuple[int, str], ...] | None:
    used: set[int] = set()
    placed = []
    for p in order:
        for start in p.preferred:
            span = set(range(start, start + p.memory_slices))
            if not span & used:
                used |= span
                placed.append((start, p.name))
                break
        else:
            return None
    return tuple(sorted(placed))


def _permutations(items: list[T]) -> list[list[T]]:
    """Every distinct order, in the order mig-parted tries them (swap, recurse, swap back)."""
    out: list[list[T]] = []

    def walk(i: int) -> None:
        if i == len(items):
            out.append(list(items))
            return
        for j in range(i, len(items)):
            if items[j] not in items[i:j]:
                items[i], items[j] = items[j], items[i]
                walk(i + 1)
                items[i], items[j] = items[j], items[i]

    walk(0)
    return out


class Unplaceable(ValueError):
    """A layout no GPU of the model can hold; the message says why."""


@lru_cache(maxsize=4096)
def place(model: GpuModel, counts: tuple[tuple[str, int], ...]) -> tuple[tuple[int, str], ...]:
    """(start, profile) of each instance, as the driver places what mig-manager creates."""
    profiles = []
    for name, count in counts:
        profile = model.profile(name)
        if profile is None:
            raise Unplaceable(f"{model.key} has no MIG profile {name}")
        if count > profile.max_count:
            raise Unplaceable(f"{count} x {name} is more than the {profile.max_count} that fit")
        profiles += [profile] * count
    if sum(p.compute_slices for p in profiles) > model.compute_slots:
        raise Unplaceable(
            f"{_describe(counts)} needs more than {model.compute_slots} compute slices"
        )
    if sum(p.memory_slices for p in profiles) > model.memory_slots:
        raise Unplaceable(f"{_describe(counts)} needs more than {model.memory_slots} memory slices")
    order = _creation_order(profiles)
    # Nearly always the first order fits; the bounds above keep the rest to at most 7 items.
    for attempt in [order, *_permutations(order)[1:]]:
        placed = _place_in_order(model, attempt)
        if placed is not None:
            return placed
    raise Unplaceable(f"{_describe(counts)} does not fit the placements of a {model.key}")


def _describe(counts: tuple[tuple[str, int], ...]) -> str:
    return " + ".join(f"{n} x {name}" for name, n in counts)


@dataclass(frozen=True)
class GpuLayout:
    mig_enabled: bool
    devices: tuple[tuple[int, str], ...]  # (start, profile)


def node_layout(
    layouts: Layouts, name: str, model: GpuModel | None, gpu_count: int, obj: str
) -> list[GpuLayout]:
    """What layout `name` makes of each GPU of a node. TopologyError on the label when the layout
    is unknown, names no entry for a GPU, or does not fit it."""
    field = f"metadata.labels[{LABEL_CONFIG}]"
    found = layouts.get(name)
    if found is None:
        known = sorted(layouts)
        shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
        raise TopologyError(obj, field, f"unknown layout {name!r} (known: {shown})")
    out = []
    for index in range(gpu_count):
        entry = None
        for e in found:
            if e.matches(model, index):
                entry = e  # later entries override earlier ones, as mig-parted applies them
        what = model.key if model else "this GPU"
        if entry is None:
            raise TopologyError(
                obj, field, f"layout {name!r} has no entry for GPU {index} ({what})"
            )
        if not entry.mig_enabled:
            out.append(GpuLayout(False, ()))
            continue
        if model is None:
            raise TopologyError(obj, field, f"layout {name!r} enables MIG on a GPU without MIG")
        try:
            out.append(GpuLayout(True, place(model, entry.mig_devices)))
        except Unplaceable as e:
            raise TopologyError(obj, field, f"layout {name!r} on GPU {index}: {e}") from None
    return out
