"""What the NVIDIA DRA driver calls things, shared by the updater (which publishes the
ResourceSlices the driver would) and the exporter (which labels a claim holder's series).

Names follow kubernetes-sigs/dra-driver-nvidia-gpu (`cmd/gpu-kubelet-plugin`): a GPU is
`gpu-<minor>`, a MIG device `gpu-<minor>-mig-<profile>-<GI profile id>-<placement start>`, a
GPU's counters (dynamic MIG) `gpu-<minor>-counter-set`. A simulated GPU's minor number is its
index on the node.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from topology.catalog import GpuModel, Profile

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"  # the DeviceClasses the driver's chart installs
MIG_CLASS = "mig.nvidia.com"

# GFD's labels for what NVML says of the driver and the GPU, which a DRA device's attributes carry;
# where a node has none, the figures of the driver the real dumps come from.
LABEL_DRIVER = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                "nvidia.com/cuda.driver.rev")  # fmt: skip
LABEL_CUDA = ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")
LABEL_COMPUTE = ("nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor")
# GFD's architecture family (its `getArchFamily`, from the compute capability), and the name NVML
# gives that architecture, which the driver publishes as `architecture` (go-nvlib's
# `GetArchitectureAsString`). GFD's `tesla`, `fermi` and `undefined` have no NVML name.
LABEL_FAMILY = "nvidia.com/gpu.family"
ARCHITECTURES = {"kepler": "Kepler", "maxwell": "Maxwell", "pascal": "Pascal", "volta": "Volta",
                 "turing": "Turing", "ampere": "Ampere", "ada-lovelace": "Ada Lovelace",
                 "hopper": "Hopper", "blackwell": "Blackwell", "rubin": "Rubin"}  # fmt: skip
NODE_LABELS = (*LABEL_DRIVER, *LABEL_CUDA, *LABEL_COMPUTE, LABEL_FAMILY)
DEFAULT_DRIVER = "520.56.06"
DEFAULT_CUDA = "11.8"
# A DRA node without GFD's driver labels: a driver the DRA driver supports (its prerequisites:
# 565 or later), the one the H100 catalog's figures are for.
DRA_DRIVER = "580.65.06"
DRA_CUDA = "13.0"

_NOT_RFC1123 = re.compile(r"[^a-z0-9-.]")


def _rfc1123(text: str) -> str:
    """The driver's `toRFC1123Compliant`: lower case, other characters to `-`, no `-` at the ends,
    no trailing `.`."""
    return _NOT_RFC1123.sub("-", text.lower()).strip("-").removesuffix(".")


def gpu_device(minor: int) -> str:
    return f"gpu-{minor}"


def mig_device(minor: int, profile: Profile, start: int) -> str:
    """`gpu-0-mig-1g5gb-19-4`; `1g.5gb+me` is `1g5gb-me`."""
    name = _rfc1123(profile.name.replace(".", ""))
    return f"gpu-{minor}-mig-{name}-{profile.profile_id}-{start}"


def counter_set(minor: int) -> str:
    return f"{gpu_device(minor)}-counter-set"


# The PCI buses of a DGX A100's eight GPUs; a node with more GPUs goes on in the next PCI domain.
_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def _bus(index: int) -> tuple[int, int]:
    domain, at = divmod(index, len(_BUSES))
    return domain, _BUSES[at]


def pci_bus_id(index: int) -> str:
    """The GPU's bus address as DCGM labels it (`pci_bus_id`): NVML's form, `00000000:07:00.0`."""
    domain, bus = _bus(index)
    return f"{domain:08X}:{bus:02X}:00.0"


def resource_pci_bus_id(index: int) -> str:
    """The same address as a ResourceSlice's `resource.kubernetes.io/pciBusID`: `0000:07:00.0`."""
    domain, bus = _bus(index)
    return f"{domain:04x}:{bus:02x}:00.0"


# The simulated host's PCIe tree, a DGX A100's: two GPUs behind each root complex (AMD's root
# buses 00, 40, 80, a0), four on each socket's NUMA node.
_ROOTS = (0x00, 0x00, 0x40, 0x40, 0x80, 0x80, 0xA0, 0xA0)


def pcie_root(index: int) -> str:
    """The GPU's PCIe root complex as the DRA driver reads it from sysfs: `pci0000:40`."""
    domain, at = divmod(index, len(_BUSES))
    return f"pci{domain:04x}:{_ROOTS[at]:02x}"


def numa_node(index: int) -> int:
    return (index % len(_BUSES)) // 4


def labelled(labels: Mapping[str, str], keys: tuple[str, ...], default: str) -> str:
    """A version as GFD's labels `keys` spell it (`580.65.06`: a missing part is 0), or
    `default` where the node has none of them."""
    parts = [labels.get(k) for k in keys]
    if all(p is None for p in parts):
        return default
    return ".".join(p or "0" for p in parts)


def version(text: str) -> str:
    """A `version` attribute as the driver writes it (semver, coerced): `520.56.06` is `520.56.6`,
    `8.0` is `8.0.0`. ValueError for what is not one to three dot-separated numbers."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() and p.isascii() for p in parts):
        raise ValueError(f"expected a version such as 520.56.06, got {text!r}")
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return ".".join(str(n) for n in numbers)


_DEVICE = re.compile(r"gpu-(\d{1,4})(?:-mig-([a-z0-9-]+)-(\d{1,3})-(\d{1,2}))?")


@dataclass(frozen=True)
class DeviceName:
    """What a device's name says: its GPU, and for a MIG device its profile and placement."""

    minor: int
    profile: Profile | None = None
    start: int | None = None


def parse_device(name: str, model: GpuModel | None) -> DeviceName | None:
    """`gpu-1` or `gpu-0-mig-1g5gb-19-2` (the profile being the model's), else None."""
    m = _DEVICE.fullmatch(name)
    if m is None:
        return None
    minor = int(m[1])
    if m[2] is None:
        return DeviceName(minor)
    start = int(m[4])
    for profile in model.profiles if model else ():
        if mig_device(minor, profile, start) == name and start in profile.placements:
            return DeviceName(minor, profile, start)
    return None
