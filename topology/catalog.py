"""MIG profile catalog: what each GPU model can be partitioned into.

Facts come from `shared/reference/mig-profiles.md` (NVIDIA MIG user guide, `nvidia-smi mig -lgip/-lgipp`
dumps, GFD labels from real nodes). Profile geometry is stable per GPU family; memory in MiB depends
on the driver, so every model states the driver era its numbers are for. Values marked "inferred"
in a comment were not observed on hardware.

Pure data and pure functions: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

MIG_SUFFIX = "-MIG-"
SHARED_PRODUCT_SUFFIX = "-SHARED"  # GFD's product label of a shared GPU (time-slicing, MPS)


@dataclass(frozen=True)
class Engines:
    """What a GPU instance of a profile has: NVML's `GpuInstanceProfileInfo` counts, which the
    DRA driver publishes as a MIG device's capacities (and, with dynamic MIG, counters)."""

    multiprocessors: int
    copy_engines: int
    decoders: int
    jpeg_engines: int
    ofa_engines: int
    encoders: int = 0  # no MIG-capable GPU in the catalog has NVENC


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile, e.g. A100-40GB `1g.5gb`."""

    name: str
    profile_id: int  # the id `nvidia-smi mig -lgip` prints, not the NVML enum
    compute_slices: int
    memory_slices: int
    placements: tuple[int, ...]  # valid start memory slices, as `nvidia-smi mig -lgipp` prints
    max_count: int
    memory_mib: int  # NVML MemorySizeMB of a MIG device with this profile
    # FB_USED + FB_FREE as DCGM reports it for an instance; differs from memory_mib where a real
    # dump shows DCGM losing a MiB to rounding (A100-40GB 2g.10gb: 9855 of 9856).
    dcgm_fb_total_mib: int | None = None
    # Where the driver puts an instance created without a placement (mig-manager's way): the
    # first free start in this order.
    preferred: tuple[int, ...] = ()
    engines: Engines = field(kw_only=True)

    @property
    def fb_total_mib(self) -> int:
        return self.memory_mib if self.dcgm_fb_total_mib is None else self.dcgm_fb_total_mib

    @property
    def is_base(self) -> bool:
        """No attribute such as `+me`: the profiles mig-parted's `all-balanced` is made of."""
        return "+" not in self.name


@dataclass(frozen=True)
class Figures:
    """What a simulated GPU of a model reads: power, clocks and temperatures.

    Power limit and maximum clocks are the datasheet's (SXM form factor where a model has several).
    Idle figures and temperatures are the A100-40GB dumps' (samples/mig/metrics) and scaled from
    them for the other models (`source` says which). DCGM holds the SM clock at its maximum while
    MIG is on, so a MIG-mode GPU idles higher than one with MIG off.
    """

    idle_power_w: float  # MIG off, nothing running, clocks down
    mig_idle_power_w: float  # MIG on, nothing running
    max_power_w: float  # board power limit
    sm_clock_idle_mhz: int
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    gpu_temp_idle_c: int
    gpu_temp_max_c: int  # at the power limit
    memory_temp_offset_c: int  # memory minus GPU temperature
    source: str


# GPUs outside the catalog (no MIG): a generic 300 W data-centre card.
GENERIC_FIGURES = Figures(
    50.0, 50.0, 300.0, 300, 1500, 1215, 30, 75, 0, "generic: no model-specific figures"
)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model and its MIG geometry."""

    key: str
    nvml_names: tuple[str, ...]  # NVML `Identifiers.Model`: what DCGM puts in `modelName`
    memory_slots: int  # memory slices of the whole GPU: 8, or 4 on the A30
    total_memory_mib: int  # nvidia-smi total, GFD `nvidia.com/gpu.memory`
    driver_era: str  # the driver the MiB numbers are for
    profiles: tuple[Profile, ...]
    # FB_USED + FB_FREE of a whole idle GPU in DCGM (total minus FB_RESERVED), where observed.
    dcgm_fb_total_mib: int | None = None
    # Halves swapped: logical start = physical start XOR 4. A per-GPU property; the project's
    # A100-SXM4-40GB sample has it, most H100-class dumps do not (mig-profiles.md section 3).
    swapped_halves: bool = False
    figures: Figures = GENERIC_FIGURES
    # PCI device ids (`0x20B010DE`) a mig-parted `device-filter` names this model by: the ids
    # `config-default.yaml` lists for its group (SXM, PCIe and the export variants).
    pci_ids: tuple[str, ...] = ()
    architecture: str = ""  # NVML's name for it, as the DRA driver publishes it: Ampere, Hopper
    # MIG mode changes without a GPU reset (Hopper and newer): the DRA driver's DynamicMIG offers
    # such a GPU whole and in every partition whatever its MIG mode, and turns MIG on or off as
    # it prepares a claim (`supportsMIGModeToggle`).
    mig_toggles_without_reset: bool = False
    # Profile memory on newer drivers, where it differs from `driver_era`'s: (the first driver
    # major with it, ((profile, MiB), ...)), oldest first.
    memory_by_driver: tuple[tuple[int, tuple[tuple[str, int], ...]], ...] = ()
    compute_capability: str = ""  # CUDA's major.minor: 8.0 on the A100
    _by_name: dict[str, Profile] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self._by_name.update({p.name: p for p in self.profiles})

    @property
    def product_labels(self) -> tuple[str, ...]:
        """GFD writes the NVML name with blanks replaced by dashes into `nvidia.com/gpu.product`."""
        return tuple(name.replace(" ", "-") for name in self.nvml_names)

    @property
    def fb_total_mib(self) -> int:
        return self.total_memory_mib if self.dcgm_fb_total_mib is None else self.dcgm_fb_total_mib

    def profile(self, name: str) -> Profile | None:
        return self._by_name.get(name)

    def for_driver(self, version: str | None) -> GpuModel:
        """The model with its profiles' memory on driver `version` (`580.65.06`; None or
        unreadable: `driver_era`'s)."""
        major = version.split(".", 1)[0] if version else ""
        if not self.memory_by_driver or not major.isdigit():
            return self
        return _on_driver(self, int(major))

    @property
    def compute_slots(self) -> int:
        """Compute slices of the whole GPU: those of the profile spanning every memory slice."""
        return max(p.compute_slices for p in self.profiles)

    def gpu_instance_id(self, profile: Profile, position: int, swapped: bool | None = None) -> int:
        """The GI id the driver gives an instance at `position` (the `GPU_I_ID` label), on a GPU
        of this model's orientation (or of the one `swapped` names).

        GI ids number the nodes of a binary tree over the physical memory slices:
        `GI = (slots/size - 1) + phys_start/size`.
        """
        size = profile.memory_slices
        if swapped is None:
            swapped = self.swapped_halves
        physical = position ^ (self.memory_slots // 2) if swapped else position
        # A block spanning both halves (7g) is the same block either way.
        if size > self.memory_slots // 2:
            physical = position
        return (self.memory_slots // size - 1) + physical // size

    def gpu_instance_ids(self, profile: Profile, position: int) -> tuple[int, int]:
        """The GI ids a real GPU of this model can give an instance at `position`: in this
        model's orientation, then in the other (both seen on one node: mig-profiles.md §3)."""
        return (
            self.gpu_instance_id(profile, position, self.swapped_halves),
            self.gpu_instance_id(profile, position, not self.swapped_halves),
        )


def _p(
    name: str,
    profile_id: int,
    compute: int,
    mem_slices: int,
    memory_mib: int,
    engines: Engines,
    *,
    slots: int = 8,
    dcgm_fb_total_mib: int | None = None,
) -> Profile:
    """A profile with the standard placement pattern of an 8-slot (or 4-slot) GPU."""
    plus_me = name.endswith("+me")
    if mem_slices == slots:
        placements: tuple[int, ...] = (0,)
    elif slots == 8 and mem_slices == 4:
        placements = (0,) if compute == 4 else (0, 4)
    elif slots == 8 and mem_slices == 2:
        # 2g uses 0,2,4; the 1-compute-slice profile with two memory slices also fits at 6.
        placements = (0, 2, 4, 6) if compute == 1 else (0, 2, 4)
    elif slots == 8:
        placements = tuple(range(7))  # slot 7 has no compute slice of its own
    elif mem_slices == 2:
        placements = (0, 2)
    else:
        placements = tuple(range(slots))
    # `nvidia-smi mig -cgi` without a placement, on 8-slot GPUs (mig-profiles.md section 3.2):
    # 1-slice instances go to 6, 4, 5, 0, 1, 2, 3; 2-slice to 4, 0, 2 (then 6); 4-slice to 4, 0.
    # Not observed on the A30: lowest start first.
    if slots == 8 and mem_slices < slots:
        first = {1: (6, 4, 5), 2: (4, 0, 2), 4: (4, 0)}[mem_slices]
        preferred = first + tuple(p for p in placements if p not in first)
        preferred = tuple(p for p in preferred if p in placements)
    else:
        preferred = placements
    if plus_me:
        max_count = 1
    elif slots == 8:
        max_count = {1: 7, 2: 4 if compute == 1 else 3, 4: 2 if compute == 3 else 1, 8: 1}[
            mem_slices
        ]
    else:
        max_count = slots // mem_slices
    return Profile(
        name,
        profile_id,
        compute,
        mem_slices,
        placements,
        max_count,
        memory_mib,
        dcgm_fb_total_mib,
        preferred,
        engines=engines,
    )


def _eight_slot(
    small: str,
    small_mib: int,
    two: str,
    two_mib: int,
    half: str,
    half_mib: int,
    full: str,
    full_mib: int,
    *,
    engines: dict[str, Engines],
    two_slice_1g: str | None = None,
    two_slice_1g_mib: int | None = None,
    dcgm: dict[str, int] | None = None,
) -> tuple[Profile, ...]:
    """The profile set every 8-slot GPU (A100, H100, H200, B200) offers, named per model, with
    its family's engines (`_AMPERE`, `_HOPPER`, `_BLACKWELL`)."""
    dcgm = dcgm or {}
    size_gb = small.split(".", 1)[1]
    profiles = [
        _p(small, 19, 1, 1, small_mib, engines["1g"], dcgm_fb_total_mib=dcgm.get(small)),
        _p(f"1g.{size_gb}+me", 20, 1, 1, small_mib, engines["1g+me"]),
    ]
    if two_slice_1g is not None and two_slice_1g_mib is not None:
        profiles.append(_p(two_slice_1g, 15, 1, 2, two_slice_1g_mib, engines["1g, 2 slices"]))
    profiles += [
        _p(two, 14, 2, 2, two_mib, engines["2g"], dcgm_fb_total_mib=dcgm.get(two)),
        _p(f"3g.{half}", 9, 3, 4, half_mib, engines["3g"]),
        _p(f"4g.{half}", 5, 4, 4, half_mib, engines["4g"]),
        _p(full, 0, 7, 8, full_mib, engines["7g"], dcgm_fb_total_mib=dcgm.get(full)),
    ]
    return tuple(profiles)


# Engines per profile shape and GPU family: multiprocessors, then copy engines, decoders, JPEG
# and OFA engines (mig-profiles.md section 2: the MIG user guide's tables and `-lgip` dumps).
_AMPERE = {
    "1g": Engines(14, 1, 0, 0, 0),
    "1g+me": Engines(14, 1, 1, 1, 1),
    "1g, 2 slices": Engines(14, 1, 1, 0, 0),
    "2g": Engines(28, 2, 1, 0, 0),
    "3g": Engines(42, 3, 2, 0, 0),
    "4g": Engines(56, 4, 2, 0, 0),
    "7g": Engines(98, 7, 5, 1, 1),
}
_HOPPER = {
    "1g": Engines(16, 1, 1, 1, 0),
    "1g+me": Engines(16, 1, 1, 1, 1),
    "1g, 2 slices": Engines(26, 1, 1, 1, 0),
    "2g": Engines(32, 2, 2, 2, 0),
    "3g": Engines(60, 3, 3, 3, 0),
    "4g": Engines(64, 4, 4, 4, 0),
    "7g": Engines(132, 8, 7, 7, 1),
}
# H100 PCIe (114 SMs, not SXM5's 132): the DRA driver's log shows 114 multiprocessors as the
# largest profile's (mig-profiles.md, Corrections). The other profiles' were not observed: SXM5's
# scaled by 114/132 and rounded to an even count (inferred); engines as SXM5's.
_HOPPER_PCIE = {
    "1g": Engines(14, 1, 1, 1, 0),
    "1g+me": Engines(14, 1, 1, 1, 1),
    "1g, 2 slices": Engines(22, 1, 1, 1, 0),
    "2g": Engines(28, 2, 2, 2, 0),
    "3g": Engines(52, 3, 3, 3, 0),
    "4g": Engines(56, 4, 4, 4, 0),
    "7g": Engines(114, 8, 7, 7, 1),
}
# B200: 1g and 2g from `-lgip` dumps; 3g, 4g and 7g were not captured: copy engines from the MIG
# user guide, multiprocessors scaled from Hopper by 18/16 (7g: all 148 of the B200), one decoder
# and one JPEG engine per compute slice (inferred).
_BLACKWELL = {
    "1g": Engines(18, 2, 1, 1, 0),
    "1g+me": Engines(18, 2, 1, 1, 1),
    "1g, 2 slices": Engines(30, 2, 1, 1, 0),
    "2g": Engines(36, 4, 2, 2, 0),
    "3g": Engines(68, 6, 3, 3, 0),
    "4g": Engines(72, 8, 4, 4, 0),
    "7g": Engines(148, 16, 7, 7, 1),
}


@lru_cache(maxsize=64)
def _on_driver(model: GpuModel, major: int) -> GpuModel:
    memory: dict[str, int] = {}
    for first, sizes in model.memory_by_driver:
        if major >= first:
            memory.update(sizes)
    if not memory:
        return model
    profiles = tuple(
        replace(p, memory_mib=memory[p.name], dcgm_fb_total_mib=None) if p.name in memory else p
        for p in model.profiles
    )
    return replace(model, profiles=profiles, driver_era=f"{model.driver_era}; R{major} memory")


def _h100_profiles(engines: dict[str, Engines]) -> tuple[Profile, ...]:
    """The H100 80GB's profiles (SXM5 and PCIe), with a part's engines."""
    return _eight_slot("1g.10gb", 9984, "2g.20gb", 20096, "40gb", 40448, "7g.80gb", 81152,
                       engines=engines, two_slice_1g="1g.20gb", two_slice_1g_mib=20096)  # fmt: skip


_H100_SXM_FIGURES = Figures(
    70.0, 115.0, 700.0, 345, 1980, 2619, 30, 72, 2,
    "H100 SXM5 datasheet (700 W, 1980 MHz, HBM3 2619 MHz); idle scaled from A100-40GB",
)  # fmt: skip


_H100_80GB = GpuModel(
    key="H100-80GB",
    nvml_names=("NVIDIA H100 80GB HBM3",),
    memory_slots=8,
    total_memory_mib=81559,
    driver_era="580.65.06 era (GFD 1g.10gb = 9984)",
    profiles=_h100_profiles(_HOPPER),
    architecture="Hopper",
    mig_toggles_without_reset=True,
    compute_capability="9.0",
    pci_ids=("0x233010DE", "0x232210DE", "0x232410DE"),
    figures=_H100_SXM_FIGURES,
)


MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        key="A100-40GB",
        nvml_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
        memory_slots=8,
        total_memory_mib=40960,
        driver_era="520.56.06 (R520+)",
        # 1g.5gb 4864, 2g.10gb 9856, 7g.40gb 40192 are the GFD labels of the sampled node; the
        # sampled DCGM dump shows FB_USED + FB_FREE = 9855 for 2g.10gb.
        profiles=_eight_slot(
            "1g.5gb",
            4864,
            "2g.10gb",
            9856,
            "20gb",
            19968,
            "7g.40gb",
            40192,
            engines=_AMPERE,
            two_slice_1g="1g.10gb",
            two_slice_1g_mib=9856,
            dcgm={"2g.10gb": 9855},
        ),
        dcgm_fb_total_mib=40384,  # the MIG-disabled dump: FB_FREE 40384, FB_USED 0
        swapped_halves=True,  # sample: 2g.10gb@0 -> GI 5, 1g.5gb@4 -> 7, @6 -> 9
        # Drivers the DRA driver supports (565+): a real slice (Kueue #10283) shows 1g.10gb 9984
        # and 7g.40gb 40320, the mid-era column of mig-profiles.md; the others are that column's.
        memory_by_driver=(
            (
                565,
                (
                    ("1g.10gb", 9984),
                    ("2g.10gb", 9984),
                    ("3g.20gb", 20096),
                    ("4g.20gb", 20096),
                    ("7g.40gb", 40320),
                ),
            ),
        ),
        architecture="Ampere",
        compute_capability="8.0",
        pci_ids=("0x20B010DE", "0x20B110DE", "0x20F110DE", "0x20F610DE"),
        figures=Figures(
            46.0,
            76.0,
            400.0,
            210,
            1410,
            1215,
            29,
            70,
            -1,
            "idle, MIG idle, clocks and idle temperatures: the real dumps (driver 520.56.06); "
            "400 W and 1410 MHz: A100 SXM4 datasheet",
        ),
    ),
    GpuModel(
        key="A100-80GB",
        nvml_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
        memory_slots=8,
        total_memory_mib=81920,
        driver_era="515.86.01 (GFD labels); 1g.20gb inferred",
        profiles=_eight_slot(
            "1g.10gb",
            9728,
            "2g.20gb",
            19968,
            "40gb",
            40192,
            "7g.80gb",
            80896,
            engines=_AMPERE,
            two_slice_1g="1g.20gb",
            two_slice_1g_mib=19968,
        ),
        architecture="Ampere",
        compute_capability="8.0",
        pci_ids=("0x20B210DE", "0x20B510DE", "0x20F310DE", "0x20F510DE"),
        figures=Figures(
            50.0,
            80.0,
            400.0,
            210,
            1410,
            1593,
            30,
            70,
            -1,
            "A100 80GB SXM4 datasheet (400 W, 1410 MHz, HBM2e 1593 MHz); idle scaled from A100-40GB",
        ),
    ),
    GpuModel(
        key="A30-24GB",
        nvml_names=("NVIDIA A30",),
        memory_slots=4,
        total_memory_mib=24576,  # nominal 24 GiB; no dump of the total was found
        driver_era="nvidia-smi -lgip GiB x 1024",
        profiles=(
            _p("1g.6gb", 14, 1, 1, 5952, Engines(14, 1, 0, 0, 0), slots=4),
            _p("1g.6gb+me", 21, 1, 1, 5952, Engines(14, 1, 1, 1, 1), slots=4),
            _p("2g.12gb", 5, 2, 2, 11968, Engines(28, 2, 2, 0, 0), slots=4),
            # R525+; its profile id was not observed (the DRA driver's name carries it): 6
            # follows the A30's ids, inferred.
            _p("2g.12gb+me", 6, 2, 2, 11968, Engines(28, 2, 2, 1, 1), slots=4),
            _p("4g.24gb", 0, 4, 4, 24064, Engines(56, 4, 4, 1, 1), slots=4),
        ),
        architecture="Ampere",
        compute_capability="8.0",
        pci_ids=("0x20B710DE",),
        figures=Figures(
            30.0,
            45.0,
            165.0,
            210,
            1440,
            1215,
            30,
            70,
            -1,
            "A30 datasheet (165 W, 1440 MHz boost, HBM2 1215 MHz); idle scaled from A100-40GB",
        ),
    ),
    _H100_80GB,
    # The PCIe part: SXM5's geometry and memory (the DRA driver's log shows an 81152 MiB largest
    # profile), its own multiprocessors (`_HOPPER_PCIE`) and power.
    replace(
        _H100_80GB,
        key="H100-PCIe-80GB",
        nvml_names=("NVIDIA H100 PCIe",),
        driver_era="H100 SXM5's MiB (the DRA driver's log: 81152 MiB largest profile)",
        profiles=_h100_profiles(_HOPPER_PCIE),
        pci_ids=("0x233110DE",),
        figures=Figures(
            50.0,
            85.0,
            350.0,
            345,
            1755,
            1593,
            30,
            72,
            2,
            "H100 PCIe datasheet (350 W, 1755 MHz, HBM2e 1593 MHz); idle scaled from A100-40GB",
        ),
    ),
    GpuModel(
        key="H100-NVL-94GB",
        nvml_names=("NVIDIA H100 NVL",),
        memory_slots=8,
        total_memory_mib=95830,
        driver_era="550.127.06",
        profiles=_eight_slot(
            "1g.12gb",
            10880,
            "2g.24gb",
            22016,
            "47gb",
            47232,
            "7g.94gb",
            94848,
            engines=_HOPPER,
            two_slice_1g="1g.24gb",
            two_slice_1g_mib=22016,
        ),
        architecture="Hopper",
        mig_toggles_without_reset=True,
        compute_capability="9.0",
        pci_ids=("0x232110DE", "0x233A10DE"),
        figures=Figures(
            60.0,
            95.0,
            400.0,
            345,
            1785,
            2619,
            30,
            72,
            2,
            "H100 NVL datasheet (400 W, 1785 MHz, HBM3 2619 MHz); idle scaled from A100-40GB",
        ),
    ),
    GpuModel(
        key="H100-96GB",
        nvml_names=("NVIDIA GH200 480GB", "NVIDIA H100 96GB HBM3"),
        memory_slots=8,
        total_memory_mib=97871,
        driver_era="nvidia-smi -lgip GiB x 1024",
        profiles=_eight_slot(
            "1g.12gb",
            11264,
            "2g.24gb",
            23552,
            "48gb",
            47616,
            "7g.96gb",
            95232,
            engines=_HOPPER,
            two_slice_1g="1g.24gb",
            two_slice_1g_mib=23552,
        ),
        architecture="Hopper",
        mig_toggles_without_reset=True,
        compute_capability="9.0",
        pci_ids=("0x234210DE", "0x233D10DE", "0x20B610DE", "0x232910DE"),
        figures=replace(
            _H100_SXM_FIGURES,
            source="H100 96GB / GH200 GPU: H100 SXM5 figures (700 W, 1980 MHz); idle scaled "
            "from A100-40GB",
        ),
    ),
    GpuModel(
        key="H200-141GB",
        nvml_names=("NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA H200 141GB HBM3e"),
        memory_slots=8,
        total_memory_mib=143771,
        driver_era="R580 (580.159.04): NVML on a real H200, tests/reference/nvml",
        profiles=_eight_slot(
            "1g.18gb",
            16384,
            "2g.35gb",
            33280,
            "71gb",
            71424,
            "7g.141gb",
            143360,
            engines=_HOPPER,
            two_slice_1g="1g.35gb",
            two_slice_1g_mib=33280,
        ),
        architecture="Hopper",
        mig_toggles_without_reset=True,
        compute_capability="9.0",
        pci_ids=("0x233510DE", "0x233B10DE"),
        figures=Figures(
            75.0,
            120.0,
            700.0,
            345,
            1980,
            3201,
            30,
            72,
            2,
            "H200 SXM datasheet (700 W, 1980 MHz, HBM3e 3201 MHz); idle scaled from A100-40GB",
        ),
    ),
    GpuModel(
        key="B200",
        nvml_names=("NVIDIA B200",),
        memory_slots=8,
        total_memory_mib=183359,
        # 3g/4g/7g memory was not captured: inferred as 2x and 4x the 2-slice profile.
        driver_era="mig-parted#187 (2025-03); 3g/4g/7g inferred",
        profiles=_eight_slot(
            "1g.23gb",
            20992,
            "2g.45gb",
            45312,
            "90gb",
            90624,
            "7g.180gb",
            181248,
            engines=_BLACKWELL,
            two_slice_1g="1g.45gb",
            two_slice_1g_mib=45312,
        ),
        architecture="Blackwell",
        mig_toggles_without_reset=True,
        compute_capability="10.0",
        pci_ids=("0x290110DE",),
        figures=Figures(
            120.0,
            180.0,
            1000.0,
            345,
            1965,
            3996,
            30,
            75,
            2,
            "B200 HGX (1000 W, 1965 MHz, HBM3e 3996 MHz; inferred); idle scaled from A100-40GB",
        ),
    ),
)

# mig-parted's `all-balanced`: per compute-slot count of the GPU, instances per compute size (1g,
# 2g, 3g), each the base profile of that size with the highest max count (pkg/mig/builder).
_BALANCED = {7: {1: 2, 2: 1, 3: 1}, 4: {1: 2, 2: 1}}


def balanced(model: GpuModel) -> dict[str, int]:
    """The `all-balanced` mix of a model: 2x 1g, 1x 2g, 1x 3g on 7 compute slices."""
    mix: dict[str, int] = {}
    for size, count in _BALANCED.get(model.compute_slots, {}).items():
        fits = [p for p in model.profiles if p.is_base and p.compute_slices == size]
        if fits:
            mix[max(fits, key=lambda p: p.max_count).name] = count
    return mix


_BY_LABEL: dict[str, GpuModel] = {label: m for m in MODELS for label in m.product_labels}


def base_product(product_label: str) -> str:
    """`NVIDIA-A100-80GB-PCIe-MIG-1g.10gb` (single strategy) -> `NVIDIA-A100-80GB-PCIe`; GPU
    sharing's `-SHARED` suffix (`NVIDIA-A100-SXM4-40GB-SHARED`) goes too."""
    return product_label.removesuffix(SHARED_PRODUCT_SUFFIX).split(MIG_SUFFIX, 1)[0]


def model_for_product(product_label: str) -> GpuModel | None:
    """The catalog entry for a `nvidia.com/gpu.product` label value, if the GPU supports MIG."""
    return _BY_LABEL.get(base_product(product_label))


def nvml_model_name(product_label: str) -> str:
    """The `modelName` DCGM would report: `NVIDIA-A100-SXM4-40GB` -> `NVIDIA A100-SXM4-40GB`.

    GFD's blank-to-dash replacement is not reversible in general, so unknown GPUs keep the label.
    """
    base = base_product(product_label)
    model = _BY_LABEL.get(base)
    if model is None:
        return base
    return model.nvml_names[model.product_labels.index(base)]
