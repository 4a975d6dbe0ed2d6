"""GPU faults: the catalog, one fault entry as users write it, and what faults do over time.

A fault reaches a GPU from its Node's `mig-exporter/gpu-faults` annotation or from a fleet fault
policy (status_updater/faults.py); the updater writes each GPU's faults into the topology with
absolute times (model.Fault), so the exporter needs no API and no memory to serve them: what a
GPU shows at a time is a pure function of its faults and that time (`state`). That is also what
keeps its counters consistent across exporter restarts: every exporter works out the same count
for the same time. A fault that is cleared (its entry or policy gone) leaves what it counted in
the GPU's `counted` totals, so counters never go down.

What each fault does is what the real stack shows, read from DCGM's fields and dcgm-exporter's
collectors (docs/faults.md cites them):
- the last Xid (`DCGM_FI_DEV_XID_ERRORS`) is the Xid of the latest fault begun that raises one,
  while it lasts; 0 once none does;
- ECC, remapped rows, PCIe replays and NVLink CRC errors are counters: a fault adds `count` at
  its start and `rate` a minute while it lasts;
- thermal and power throttling raise the temperature or hold power at its limit, drop the SM
  clock, count the time throttled (µs, as DCGM's violation counters) and set the clocks-event
  reasons DCGM reports;
- a lost GPU (and Xid 79, fallen off the bus) is no longer read: its series are gone.
A fault lasts from `since` until `until` (or until it is cleared); what it counted stays. Health
as the NVIDIA DRA driver sees it is the device taints (`taints`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from topology.model import MAX_COUNT, Fault

ANNOTATION = "mig-exporter/gpu-faults"  # on a Node: a JSON or YAML list of fault entries

# The counters a fault moves, by the name the topology's `counted` keeps them under.
SBE, DBE = "ecc-sbe", "ecc-dbe"
REMAP_CORRECTABLE, REMAP_UNCORRECTABLE = "remapped-correctable", "remapped-uncorrectable"
PCIE_REPLAY, NVLINK_FLIT, NVLINK_DATA = "pcie-replay", "nvlink-crc-flit", "nvlink-crc-data"
# Time throttled in ns, as DCGM counts it (dcgm_fields.h: "Thermal Violation time in ns").
THERMAL_NS, POWER_NS = "thermal-violation-ns", "power-violation-ns"
COUNTERS = (SBE, DBE, REMAP_CORRECTABLE, REMAP_UNCORRECTABLE, PCIE_REPLAY, NVLINK_FLIT,
            NVLINK_DATA, THERMAL_NS, POWER_NS)  # fmt: skip

# DCGM's clocks-event reasons (dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_*), the bits throttling sets.
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL = 0x4, 0x8, 0x20, 0x40
GPU_IDLE = 0x1  # an idle GPU's clocks are low because it is idle

# The driver's taints (kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/
# device_health.go): the Xid's as its decimal value, NoSchedule, or None for the Xids it skips
# as the application's (xidsToSkip); gpu-lost and unmonitored without a value. Never NoExecute.
TAINT_XID, TAINT_LOST, TAINT_UNMONITORED = (
    "gpu.nvidia.com/xid",
    "gpu.nvidia.com/gpu-lost",
    "gpu.nvidia.com/unmonitored",
)
NO_SCHEDULE, NONE = "NoSchedule", "None"
# Xids the driver's health check counts as the application's, not the GPU's (xidsToSkip): it
# taints the device with effect None (told, not kept off). Every other Xid keeps claims off it.
NON_FATAL_XIDS = frozenset({13, 31, 43, 45, 68, 109})
LOST_XIDS = frozenset({79})  # fallen off the bus: the GPU is no longer read


@dataclass(frozen=True)
class Kind:
    """What one fault of the catalog does."""

    name: str
    summary: str
    xid: int | None = None  # the Xid the driver raises with it
    onset: tuple[str, ...] = ()  # counters it adds `count` to at its start
    rates: tuple[str, ...] = ()  # counters it adds `rate` a minute to while it lasts
    rate: float = 0.0  # the default `rate`
    throttle: str | None = None  # "thermal" or "power"
    lost: bool = False  # the GPU is no longer read
    remap_failure: bool = False  # DCGM_FI_DEV_ROW_REMAP_FAILURE is 1 while it lasts
    unmonitored: bool = False  # its health is no longer watched (a taint, nothing served)


CATALOG: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("xid", "an Xid error (`xid`: its number); Xid 79 is a lost GPU"),
        Kind("ecc-sbe", "single-bit ECC errors: `count` at once, then `rate` a minute",
             onset=(SBE,), rates=(SBE,), rate=6.0),
        Kind("ecc-dbe", "a double-bit ECC error (`count` of them), with Xid 48",
             xid=48, onset=(DBE,)),
        Kind("row-remap", "`count` rows remapped for an uncorrectable error, with Xid 63 "
             "(`correctable: true`: for correctable errors, no Xid)",
             xid=63, onset=(REMAP_UNCORRECTABLE,)),
        Kind("row-remap-failure", "row remapping failed, with Xid 64", xid=64,
             remap_failure=True),
        Kind("pcie-replay", "PCIe replays, `rate` a minute", rates=(PCIE_REPLAY,), rate=60.0),
        Kind("nvlink-crc", "NVLink CRC errors (flit and data), `rate` a minute",
             rates=(NVLINK_FLIT, NVLINK_DATA), rate=60.0),
        Kind("thermal", "thermal slowdown: hot, clocks down, time throttled counted",
             throttle="thermal"),
        Kind("power", "power capping: at its limit, clocks down, time throttled counted",
             throttle="power"),
        Kind("lost", "the GPU is lost (no longer read: its series are gone)", lost=True),
        Kind("unmonitored", "the GPU's health is no longer watched", unmonitored=True),
    )
}  # fmt: skip
XIDS = (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120)  # the common ones, documented


def kind(fault: Fault) -> Kind:
    return CATALOG[fault.fault]


def xid_of(fault: Fault) -> int | None:
    """The Xid the fault raises, if any."""
    if fault.fault == "xid":
        return fault.xid
    if fault.fault == "row-remap" and fault.correctable:
        return None
    return CATALOG[fault.fault].xid if fault.fault in CATALOG else None


def active(fault: Fault, t: float) -> bool:
    return fault.since <= t and (fault.until is None or t < fault.until)


def counts(fault: Fault, t: float) -> dict[str, int]:
    """What the fault has counted by `t`, by counter (nothing before it begins)."""
    k = CATALOG.get(fault.fault)
    if k is None or t < fault.since:
        return {}
    lasted = (t if fault.until is None else min(t, fault.until)) - fault.since
    out: dict[str, int] = {}
    onset = k.onset
    if fault.fault == "row-remap" and fault.correctable:
        onset = (REMAP_CORRECTABLE,)
    for name in onset:
        out[name] = out.get(name, 0) + fault.count
    rate = k.rate if fault.rate is None else fault.rate
    for name in k.rates:
        out[name] = out.get(name, 0) + int(rate * lasted / 60)
    if k.throttle == "thermal":
        out[THERMAL_NS] = int(lasted) * 1_000_000_000
    elif k.throttle == "power":
        out[POWER_NS] = int(lasted) * 1_000_000_000
    return out


@dataclass(frozen=True, slots=True)
class State:
    """What a GPU shows at one time."""

    xid: int  # the last Xid, 0: none
    counters: Mapping[str, int]  # every counter, from `counted` and the faults
    lost: bool
    thermal: bool
    power: bool
    remap_failure: bool

    @property
    def reasons(self) -> int:
        """DCGM's clocks-event reasons bitmask the throttling sets."""
        return (SW_THERMAL | HW_THERMAL if self.thermal else 0) | (
            SW_POWER_CAP if self.power else 0
        )


def _active(faults: Iterable[Fault], t: float) -> list[tuple[Fault, Kind]]:
    """The faults of the catalog active at `t`, each with its kind."""
    return [(f, CATALOG[f.fault]) for f in faults if f.fault in CATALOG and active(f, t)]


def _latest_xid(now: list[tuple[Fault, Kind]]) -> int | None:
    """The Xid of the latest begun of these faults that raises one (the last of a tie)."""
    xid, latest = None, float("-inf")
    for f, _ in now:
        raised = xid_of(f)
        if raised is not None and f.since >= latest:
            xid, latest = raised, f.since
    return xid


def _loses(f: Fault, k: Kind) -> bool:
    """Whether the fault takes its GPU off the bus (lost, or Xid 79)."""
    return k.lost or xid_of(f) in LOST_XIDS


def state(faults: Iterable[Fault], counted: Iterable[tuple[str, int]], t: float) -> State:
    """The GPU at `t`."""
    faults = tuple(faults)
    total = dict.fromkeys(COUNTERS, 0)
    for name, value in counted:
        total[name] = total.get(name, 0) + value
    for f in faults:
        for name, value in counts(f, t).items():
            total[name] += value
    # At most what a topology document holds (model.MAX_COUNT: 104 days throttled, in ns), as
    # `counted` is kept: a counter that reaches it stays there, never going back.
    total = {name: min(value, MAX_COUNT) for name, value in total.items()}
    now = _active(faults, t)
    return State(
        xid=_latest_xid(now) or 0,
        counters=total,
        lost=any(_loses(f, k) for f, k in now),
        thermal=any(k.throttle == "thermal" for _, k in now),
        power=any(k.throttle == "power" for _, k in now),
        remap_failure=any(k.remap_failure for _, k in now),
    )


def xid_events(faults: Iterable[Fault], t: float, window_s: float) -> tuple[tuple[int, int], ...]:
    """How many Xid events of each Xid DCGM recorded in the `window_s` up to `t`: one at each
    fault's start that raises an Xid (DCGM appends a sample per NVML event), by Xid."""
    found: dict[int, int] = {}
    for f in faults:
        raised = xid_of(f)
        if raised is not None and t - window_s < f.since <= t:
            found[raised] = found.get(raised, 0) + 1
    return tuple(sorted(found.items()))


def lost(faults: Iterable[Fault], t: float) -> bool:
    """Whether the GPU is lost at `t` (its series are gone)."""
    return any(_loses(f, k) for f, k in _active(faults, t))


@dataclass(frozen=True, slots=True, order=True)
class Taint:
    """A device taint as the driver sets it (resource.k8s.io/v1 DeviceTaint). The driver leaves
    `timeAdded` out for the API server to fill in, and so does the updater."""

    key: str
    value: str
    effect: str

    def body(self) -> dict[str, str]:
        if self.value:
            return {"key": self.key, "value": self.value, "effect": self.effect}
        return {"key": self.key, "effect": self.effect}


LOST_TAINT = Taint(TAINT_LOST, "", NO_SCHEDULE)


def taints(faults: Iterable[Fault], t: float) -> tuple[Taint, ...]:
    """The taints the driver's health check puts on a GPU's devices at `t`: the latest Xid (one
    taint a key: a newer Xid overwrites the value), and `unmonitored` where its health is not
    watched. A lost GPU taints every device of the node (`node_taints`)."""
    now = _active(faults, t)
    xid = _latest_xid(now)
    unwatched = any(k.unmonitored for _, k in now)
    found = []
    if xid is not None:
        found.append(Taint(TAINT_XID, str(xid), NONE if xid in NON_FATAL_XIDS else NO_SCHEDULE))
    if unwatched:
        found.append(Taint(TAINT_UNMONITORED, "", NONE))
    return tuple(found)


def boundaries(faults: Iterable[Fault]) -> Iterable[int]:
    """The times the faults begin and end: where what they show changes."""
    for f in faults:
        yield f.since
        if f.until is not None:
            yield f.until
