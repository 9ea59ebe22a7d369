"""How a workload uses the GPU it runs on: the GPU products the simulator knows and the per-profile activity model.

``activity(profile, utilisation)`` says how a workload of a given profile uses the engine at a served
utilisation (0–1 of its capacity); ``device_gauges.device_signals`` turns that into what dcgm-exporter
reports. All pure and deterministic. Profiles (see ``Profile``):

- ``inference`` — GPU_UTIL tracks load; SM_ACTIVE ≈ 0.65 × util (fixture GPU0: 63 % / 0.41).
- ``llm-decode`` — the *utilisation trap*: GPU_UTIL ≈ 100 as soon as any request runs while
  SM_ACTIVE stays ≈ 0.3–0.4 and DRAM_ACTIVE ≈ 0.7 (bandwidth-bound decode); FB ≈ 92 % (KV cache
  pre-allocated).
- ``training`` — load-independent: SM ≈ 0.90, tensor ≈ 0.61, power-capped (mask 0x4), NVLink traffic.
- ``batch-light`` — low, load-proportional use (fixture GPU7: 27 % / 0.22).
- ``idle`` — a pod holds the GPU and a quarter of its memory but runs nothing.

A GPU without a pod uses ``activity(None, 0)`` (``NO_POD``): nothing running.

Numbers are calibrated on the fixtures (``tests/fixtures/dcgm/dcgm-exporter-h100-8gpu.prom``), which are
themselves invented; they are plausible, not measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "A100_SXM4_80GB",
    "H100_SXM",
    "NO_POD",
    "PROFILES",
    "Activity",
    "GpuModel",
    "Profile",
    "activity",
    "clip",
]

Profile = Literal["inference", "llm-decode", "training", "batch-light", "idle"]
PROFILES: tuple[str, ...] = get_args(Profile)


# --- hardware ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU product as the simulator needs it. Power in W, memory in MiB, clocks in MHz."""

    name: str  # dcgm-exporter ``modelName`` label
    product_label: str  # GPU Feature Discovery ``nvidia.com/gpu.product``
    fb_total_mib: int  # FB_USED + FB_FREE + FB_RESERVED
    fb_reserved_mib: int
    power_limit_w: float
    idle_power_w: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    mem_clock_mhz: int
    pci_bus_ids: tuple[str, ...]  # by GPU index, for an 8-GPU board

    @property
    def fb_usable_mib(self) -> int:
        return self.fb_total_mib - self.fb_reserved_mib


# NB: values from the fixtures (p5.48xlarge bus IDs, 81559 MiB per dcgm-exporter #512, 537 MiB reserved).
H100_SXM = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    product_label="NVIDIA-H100-80GB-HBM3",
    fb_total_mib=81559,
    fb_reserved_mib=537,
    power_limit_w=700.0,
    idle_power_w=68.4,
    max_sm_clock_mhz=1980,
    idle_sm_clock_mhz=345,
    mem_clock_mhz=2619,
    pci_bus_ids=tuple(f"00000000:{bus}:00.0" for bus in ("53", "64", "75", "86", "97", "A8", "B9", "CA")),
)

A100_SXM4_80GB = GpuModel(
    name="NVIDIA A100-SXM4-80GB",
    product_label="NVIDIA-A100-SXM4-80GB",
    fb_total_mib=81920,
    fb_reserved_mib=522,
    power_limit_w=400.0,
    idle_power_w=52.0,
    max_sm_clock_mhz=1410,
    idle_sm_clock_mhz=210,
    mem_clock_mhz=1593,
    pci_bus_ids=tuple(
        f"00000000:{bus}.0" for bus in ("10:1C", "10:1D", "20:1C", "20:1D", "90:1C", "90:1D", "A0:1C", "A0:1D")
    ),
)


# --- what a workload does to the engine --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Activity:
    """How busy one workload keeps the engine it runs on. Every field is a ratio 0–1 unless named.

    ``busy`` is the share of time any kernel runs (GPU_UTIL / 100); ``power`` the dynamic-power share
    ``(P − idle) / (limit − idle)``; ``fb`` the share of usable framebuffer held.
    """

    busy: float = 0.0
    gr_engine: float = 0.0
    sm_active: float = 0.0
    sm_occupancy: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0
    mem_copy: float = 0.0
    power: float = 0.0
    fb: float = 0.0
    pcie_tx_bps: float = 0.0
    pcie_rx_bps: float = 0.0
    nvlink_bps: float = 0.0
    power_capped: bool = False


NO_POD = Activity()


def clip(x: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo if x < lo else hi if x > hi else x


def activity(profile: Profile | None, utilisation: float, *, variation: float = 0.0) -> Activity:
    """What a workload of ``profile`` does to its GPU at a served ``utilisation`` (0–1 of its capacity).

    ``profile=None`` is a GPU without a pod. ``variation`` in [-1, 1] perturbs the values by a few percent
    so that identical GPUs do not report identical numbers (the caller makes it deterministic).
    """
    u = clip(utilisation)
    v = 1.0 + 0.03 * clip(variation, -1.0, 1.0)
    if profile is None:
        return NO_POD
    if profile == "inference":
        return Activity(
            busy=u,
            gr_engine=clip(0.99 * u * v),
            sm_active=clip(0.655 * u * v),
            sm_occupancy=clip(0.29 * u * v),
            tensor=clip(0.19 * u * v),
            dram=clip(0.35 * u * v),
            mem_copy=clip(0.33 * u * v),
            power=clip(0.61 * u * v),
            fb=0.16 + 0.04 * u,
            pcie_tx_bps=290e6 * u * v,
            pcie_rx_bps=970e6 * u * v,
        )
    if profile == "llm-decode":
        # NB: continuous batching keeps a kernel running whenever any sequence is in flight, so GPU_UTIL
        # saturates at ~5 % of capacity while SM and tensor activity stay low: the "100 % util" trap.
        busy = clip(u / 0.05)
        return Activity(
            busy=busy,
            gr_engine=clip(0.99 * busy),
            sm_active=clip(busy * (0.25 + 0.16 * u) * v),
            sm_occupancy=clip(busy * (0.06 + 0.06 * u) * v),
            tensor=clip(busy * (0.03 + 0.05 * u) * v),
            dram=clip(busy * (0.45 + 0.32 * u) * v, hi=0.8),
            mem_copy=clip(busy * (0.35 + 0.29 * u) * v),
            power=clip(busy * (0.55 + 0.105 * u) * v),
            fb=0.92,  # KV cache pre-allocated at start, whatever the load
            pcie_tx_bps=2.1e6 * busy * v,
            pcie_rx_bps=3.4e6 * busy * v,
        )
    if profile == "training":
        return Activity(
            busy=1.0,
            gr_engine=0.9875,
            sm_active=clip(0.90 * v),
            sm_occupancy=clip(0.32 * v),
            tensor=clip(0.61 * v),
            dram=clip(0.443 * v),
            mem_copy=0.47,
            power=1.0,
            fb=0.94,
            pcie_tx_bps=41.3e6 * v,
            pcie_rx_bps=39.9e6 * v,
            nvlink_bps=108.9e9 * v,
            power_capped=True,
        )
    if profile == "batch-light":
        return Activity(
            busy=u,
            gr_engine=clip(0.995 * u * v),
            sm_active=clip(0.81 * u * v),
            sm_occupancy=clip(0.35 * u * v),
            tensor=clip(0.33 * u * v),
            dram=clip(0.27 * u * v),
            mem_copy=clip(0.22 * u * v),
            power=clip(0.70 * u * v),
            fb=0.113,
            pcie_tx_bps=194e6 * u * v,
            pcie_rx_bps=361e6 * u * v,
        )
    if profile == "idle":
        return Activity(fb=0.25)
    raise ValueError(f"unknown profile {profile!r}; valid profiles: {', '.join(PROFILES)}")
