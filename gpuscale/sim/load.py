"""The load model of the simulated cluster: offered request rates over time, and what they do to a GPU.

Three layers, all pure and deterministic (same inputs and seed → same numbers, in any process):

1. **Offered load over time.** A ``LoadModel`` answers ``rate_at(t)``: requests per second offered to a
   whole workload at simulated time ``t`` (seconds). ``ConstantLoad`` and ``StepLoad`` are for tests,
   ``PiecewiseLinearLoad`` replays a trace (``RepeatingLoad`` loops one), ``DiurnalLoad`` is a smooth daily
   sinusoid plus seeded bursts and jitter for demos. None keeps state, so ``rate_at`` may be called for any
   ``t`` in any order.

2. **GPU signals.** ``activity(profile, utilisation)`` says how a workload of a given profile uses the
   engine at a served utilisation (0–1 of its capacity); ``device_signals(hardware, activity)`` turns that
   into the values dcgm-exporter reports (``SimGpuGauges``); ``gpu_signals(profile, offered_rps=…, replicas=…,
   capacity_rps=…)`` does both from an offered rate. Units follow ``reference/gpu-metrics.md``: ``*_pct``
   are percent (GPU_UTIL), PROF fields are ratios 0–1, framebuffer is MiB, power W, clocks MHz, PCIe/NVLink
   B/s, energy mJ, violations ns.

   Profiles (see ``Profile``):

   - ``inference`` — GPU_UTIL tracks load; SM_ACTIVE ≈ 0.65 × util (fixture GPU0: 63 % / 0.41).
   - ``llm-decode`` — the *utilisation trap*: GPU_UTIL ≈ 100 as soon as any request runs while
     SM_ACTIVE stays ≈ 0.3–0.4 and DRAM_ACTIVE ≈ 0.7 (bandwidth-bound decode); FB ≈ 92 % (KV cache
     pre-allocated).
   - ``training`` — load-independent: SM ≈ 0.90, tensor ≈ 0.61, power-capped (mask 0x4), NVLink traffic.
   - ``batch-light`` — low, load-proportional use (fixture GPU7: 27 % / 0.22).
   - ``idle`` — a pod holds the GPU and a quarter of its memory but runs nothing.

   A GPU without a pod uses ``activity(None, 0)``: nothing running, FB_USED 0, clock-event mask 0x1.

3. **Triton queueing.** Per replica, ``replica_queue`` is a fluid queue: below capacity the mean wait is
   ``queue_wait_ratio(ρ)`` × compute time (< 1 for ρ < 1, exactly 1 at ρ = 1); above capacity the excess
   accumulates as a backlog (``advance_backlog``) that adds ``backlog / capacity`` seconds of wait to every
   request, up to the queue timeout, beyond which requests are REJECTED. ``triton_rates`` splits that per
   model into per-second increments of Triton's counters and the pending-request gauge. So the
   ``queue:compute`` ratio of the autoscaling recipe stays below 1 under light load and grows past 1 as an
   overload persists — honest-ish, not an M/M/c model.

Numbers are calibrated on the fixtures (``tests/fixtures/dcgm/dcgm-exporter-h100-8gpu.prom``), which are
themselves invented; they are plausible, not measured.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, get_args

__all__ = [
    "A100_SXM4_80GB",
    "H100_SXM",
    "PROFILES",
    "Activity",
    "ConstantLoad",
    "DiurnalLoad",
    "GpuModel",
    "InstanceLoad",
    "InstanceSignals",
    "LoadModel",
    "ModelRates",
    "PiecewiseLinearLoad",
    "Profile",
    "QueueState",
    "SimGpuGauges",
    "StepLoad",
    "TritonModel",
    "activity",
    "advance_backlog",
    "device_signals",
    "gpu_signals",
    "queue_wait_ratio",
    "replica_queue",
    "smooth_noise",
    "triton_rates",
    "unit_hash",
    "utilisation",
]

Profile = Literal["inference", "llm-decode", "training", "batch-light", "idle"]
PROFILES: tuple[str, ...] = get_args(Profile)

# Clock-event reason bits (DCGM_CLOCKS_EVENT_REASON_*), see reference/gpu-metrics.md §3.
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_SW_POWER_CAP = 0x4


# --- deterministic randomness ------------------------------------------------------------------------


def unit_hash(*parts: object) -> float:
    """A deterministic pseudo-random number in [0, 1) for ``parts`` (stable across processes and runs).

    NB: not ``hash()``, which is salted per process for str.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def smooth_noise(t: float, *key: object) -> float:
    """Smooth deterministic jitter in [-1, 1] at time ``t`` seconds, different for every ``key``.

    A weighted sum of three sinusoids with seeded periods (≈ 20 s, 2 min, 10 min) and phases: continuous,
    so consecutive scrapes differ a little, never jump.
    """
    total = 0.0
    for i, (weight, lo, hi) in enumerate(((0.5, 17.0, 41.0), (0.3, 60.0, 180.0), (0.2, 300.0, 900.0))):
        period = lo + (hi - lo) * unit_hash(*key, "period", i)
        phase = 2 * math.pi * unit_hash(*key, "phase", i)
        total += weight * math.sin(2 * math.pi * t / period + phase)
    return total


# --- offered load over time --------------------------------------------------------------------------


class LoadModel(Protocol):
    """Requests per second offered to a whole workload (all replicas together) at time ``t`` seconds."""

    def rate_at(self, t: float) -> float: ...


@dataclass(frozen=True, slots=True)
class ConstantLoad:
    """The same offered rate at every instant."""

    rps: float

    def rate_at(self, t: float) -> float:
        return max(0.0, self.rps)


@dataclass(frozen=True, slots=True)
class StepLoad:
    """A piecewise-constant rate: ``steps`` are ``(start_s, rps)`` pairs, ascending by start.

    Before the first start the rate is ``initial_rps``. ``StepLoad(((60, 500),), initial_rps=50)`` offers
    50 rps until t = 60 s and 500 rps from then on.
    """

    steps: tuple[tuple[float, float], ...]
    initial_rps: float = 0.0

    def __post_init__(self) -> None:
        starts = [start for start, _ in self.steps]
        if starts != sorted(starts):
            raise ValueError(f"StepLoad steps must be ascending by start time, got {starts}")

    def rate_at(self, t: float) -> float:
        rate = self.initial_rps
        for start, rps in self.steps:
            if t < start:
                break
            rate = rps
        return max(0.0, rate)


@dataclass(frozen=True, slots=True)
class PiecewiseLinearLoad:
    """Linear interpolation between ``(t_s, rps)`` points (e.g. a request trace binned per minute).

    Before the first point and after the last the rate is held constant.
    """

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("PiecewiseLinearLoad needs at least one point")
        times = [t for t, _ in self.points]
        if times != sorted(times):
            raise ValueError(f"PiecewiseLinearLoad points must be ascending by time, got {times[:5]}…")

    def rate_at(self, t: float) -> float:
        points = self.points
        if t <= points[0][0]:
            return max(0.0, points[0][1])
        for (t0, r0), (t1, r1) in itertools.pairwise(points):
            if t <= t1:
                if t1 == t0:
                    return max(0.0, r1)
                return max(0.0, r0 + (r1 - r0) * (t - t0) / (t1 - t0))
        return max(0.0, points[-1][1])


@dataclass(frozen=True, slots=True)
class RepeatingLoad:
    """``inner`` from ``start_s`` for ``period_s`` seconds, then the same period again and again (a trace slice
    looped, as the demo replays it until Ctrl-C); before ``start_s`` it is ``inner`` unchanged."""

    inner: LoadModel
    start_s: float
    period_s: float

    def __post_init__(self) -> None:
        if not self.period_s > 0:
            raise ValueError(f"RepeatingLoad period_s must be > 0, got {self.period_s}")

    def rate_at(self, t: float) -> float:
        if t <= self.start_s:
            return self.inner.rate_at(t)
        return self.inner.rate_at(self.start_s + (t - self.start_s) % self.period_s)


@dataclass(frozen=True, slots=True)
class DiurnalLoad:
    """A smooth daily cycle plus seeded bursts and jitter.

    ``rate_at(t) = mean_rps × (1 + amplitude·cos(2π(t − peak_at_s)/period_s)) + burst(t) + jitter(t)``

    - Bursts: time is cut into slots of ``burst_every_s``; each slot holds one burst with probability
      ``burst_probability`` (seeded), at a seeded offset, shaped as a raised cosine of
      ``burst_duration_s`` whose height is ``burst_factor × mean_rps × (0.5 … 1.5)``.
    - Jitter: ``noise × mean_rps × smooth_noise(t)``.

    Use a short ``period_s`` (e.g. 900 s, "a compressed day") for demos and replays.
    """

    mean_rps: float
    amplitude: float = 0.4
    period_s: float = 86_400.0
    peak_at_s: float = 14 * 3600.0
    burst_every_s: float = 3600.0
    burst_probability: float = 0.5
    burst_factor: float = 1.0
    burst_duration_s: float = 120.0
    noise: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        if self.burst_every_s > 0 and self.burst_duration_s > self.burst_every_s:
            raise ValueError("burst_duration_s must not exceed burst_every_s")

    def burst_at(self, t: float) -> float:
        """The burst component alone (rps) at ``t``; 0 outside bursts."""
        if self.burst_every_s <= 0 or self.burst_factor <= 0:
            return 0.0
        slot = math.floor(t / self.burst_every_s)
        if unit_hash(self.seed, "burst", slot) >= self.burst_probability:
            return 0.0
        start = slot * self.burst_every_s + unit_hash(self.seed, "offset", slot) * (
            self.burst_every_s - self.burst_duration_s
        )
        x = (t - start) / self.burst_duration_s
        if not 0.0 <= x <= 1.0:
            return 0.0
        height = self.burst_factor * self.mean_rps * (0.5 + unit_hash(self.seed, "height", slot))
        return height * 0.5 * (1.0 - math.cos(2 * math.pi * x))

    def rate_at(self, t: float) -> float:
        daily = 1.0 + self.amplitude * math.cos(2 * math.pi * (t - self.peak_at_s) / self.period_s)
        jitter = self.noise * smooth_noise(t, self.seed, "diurnal")
        return max(0.0, self.mean_rps * (daily + jitter) + self.burst_at(t))


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


_NO_POD = Activity()


def _clip(x: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return lo if x < lo else hi if x > hi else x


def activity(profile: Profile | None, utilisation: float, *, variation: float = 0.0) -> Activity:
    """What a workload of ``profile`` does to its GPU at a served ``utilisation`` (0–1 of its capacity).

    ``profile=None`` is a GPU without a pod. ``variation`` in [-1, 1] perturbs the values by a few percent
    so that identical GPUs do not report identical numbers (the caller makes it deterministic).
    """
    u = _clip(utilisation)
    v = 1.0 + 0.03 * _clip(variation, -1.0, 1.0)
    if profile is None:
        return _NO_POD
    if profile == "inference":
        return Activity(
            busy=u,
            gr_engine=_clip(0.99 * u * v),
            sm_active=_clip(0.655 * u * v),
            sm_occupancy=_clip(0.29 * u * v),
            tensor=_clip(0.19 * u * v),
            dram=_clip(0.35 * u * v),
            mem_copy=_clip(0.33 * u * v),
            power=_clip(0.61 * u * v),
            fb=0.16 + 0.04 * u,
            pcie_tx_bps=290e6 * u * v,
            pcie_rx_bps=970e6 * u * v,
        )
    if profile == "llm-decode":
        # NB: continuous batching keeps a kernel running whenever any sequence is in flight, so GPU_UTIL
        # saturates at ~5 % of capacity while SM and tensor activity stay low: the "100 % util" trap.
        busy = _clip(u / 0.05)
        return Activity(
            busy=busy,
            gr_engine=_clip(0.99 * busy),
            sm_active=_clip(busy * (0.25 + 0.16 * u) * v),
            sm_occupancy=_clip(busy * (0.06 + 0.06 * u) * v),
            tensor=_clip(busy * (0.03 + 0.05 * u) * v),
            dram=_clip(busy * (0.45 + 0.32 * u) * v, hi=0.8),
            mem_copy=_clip(busy * (0.35 + 0.29 * u) * v),
            power=_clip(busy * (0.55 + 0.105 * u) * v),
            fb=0.92,  # KV cache pre-allocated at start, whatever the load
            pcie_tx_bps=2.1e6 * busy * v,
            pcie_rx_bps=3.4e6 * busy * v,
        )
    if profile == "training":
        return Activity(
            busy=1.0,
            gr_engine=0.9875,
            sm_active=_clip(0.90 * v),
            sm_occupancy=_clip(0.32 * v),
            tensor=_clip(0.61 * v),
            dram=_clip(0.443 * v),
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
            gr_engine=_clip(0.995 * u * v),
            sm_active=_clip(0.81 * u * v),
            sm_occupancy=_clip(0.35 * u * v),
            tensor=_clip(0.33 * u * v),
            dram=_clip(0.27 * u * v),
            mem_copy=_clip(0.22 * u * v),
            power=_clip(0.70 * u * v),
            fb=0.113,
            pcie_tx_bps=194e6 * u * v,
            pcie_rx_bps=361e6 * u * v,
        )
    if profile == "idle":
        return Activity(fb=0.25)
    raise ValueError(f"unknown profile {profile!r}; valid profiles: {', '.join(PROFILES)}")


# --- device-level signals ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceSignals:
    """Per-MIG-instance values (the rest of a MIG series repeats the parent GPU's device values)."""

    gr_engine_active: float
    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_active: float
    fb_used_mib: int
    fb_free_mib: int


@dataclass(frozen=True, slots=True)
class SimGpuGauges:
    """Everything dcgm-exporter reports for one GPU at one instant.

    Gauges come from ``device_signals``; the cumulative fields (``total_energy_mj``, ``*_violation_ns``,
    ECC and remap counts, ``pcie_replay_count``) are 0 there and filled in by whoever integrates over time
    (``exporters.ClusterSim``). ``xid_window`` holds ``(xid, count)`` pairs seen in the exporter's window;
    ``clock_events_in_window`` is the count reported for every set bit of ``clock_event_mask``.
    ``instances`` maps GPU_I_ID → per-instance values for a MIG-enabled GPU (empty otherwise).
    """

    gpu_util_pct: int
    mem_copy_util_pct: int
    sm_clock_mhz: int
    mem_clock_mhz: int
    clock_event_mask: int
    gpu_temp_c: int
    memory_temp_c: int
    power_w: float
    power_limit_w: float
    fb_free_mib: int
    fb_used_mib: int
    fb_reserved_mib: int
    gr_engine_active: float
    sm_active: float
    sm_occupancy: float
    tensor_active: float
    dram_active: float
    pcie_tx_bytes: int
    pcie_rx_bytes: int
    nvlink_tx_bytes: int
    nvlink_rx_bytes: int
    nvlink_bandwidth_total: int
    enc_util_pct: int = 0
    dec_util_pct: int = 0
    total_energy_mj: int = 0
    power_violation_ns: int = 0
    thermal_violation_ns: int = 0
    pcie_replay_count: int = 0
    last_xid: int = 0
    xid_window: tuple[tuple[int, int], ...] = ()
    clock_events_in_window: int = 10
    ecc_sbe_vol_total: int = 0
    ecc_dbe_vol_total: int = 0
    ecc_sbe_agg_total: int = 0
    ecc_dbe_agg_total: int = 0
    uncorrectable_remapped_rows: int = 0
    correctable_remapped_rows: int = 0
    row_remap_failure: int = 0
    vgpu_license_status: int = 0
    instances: Mapping[int, InstanceSignals] = field(default_factory=dict)


class InstanceLoad(NamedTuple):
    """One MIG instance's share of its parent GPU and what runs on it."""

    slice_fraction: float  # compute slices / 7
    fb_total_mib: int
    activity: Activity | None


def device_signals(
    hardware: GpuModel,
    act: Activity | None,
    *,
    variation: float = 0.0,
    instances: Mapping[int, InstanceLoad] | None = None,
) -> SimGpuGauges:
    """Device-level values for one GPU running ``act`` (or, with ``instances``, one MIG-enabled GPU).

    For a MIG GPU the device's power, temperature and clocks come from the slice-weighted sum of the
    instances' activities; ``act`` is ignored and the GPU_UTIL-like fields are 0 (not reported for MIG).
    """
    var = _clip(variation, -1.0, 1.0)
    act = act or _NO_POD
    instance_signals: dict[int, InstanceSignals] = {}
    if instances:
        power = sum(inst.slice_fraction * (inst.activity or _NO_POD).power for inst in instances.values())
        busy = max(((inst.activity or _NO_POD).busy for inst in instances.values()), default=0.0)
        for gi_id, inst in instances.items():
            a = inst.activity or _NO_POD
            used = round(13 + (inst.fb_total_mib - 13) * a.fb)  # 13 MiB: an empty instance's context
            instance_signals[gi_id] = InstanceSignals(
                gr_engine_active=a.gr_engine,
                sm_active=a.sm_active,
                sm_occupancy=a.sm_occupancy,
                tensor_active=a.tensor,
                dram_active=a.dram,
                fb_used_mib=used,
                fb_free_mib=inst.fb_total_mib - used,
            )
        capped = False
        pcie_tx = sum((inst.activity or _NO_POD).pcie_tx_bps * inst.slice_fraction for inst in instances.values())
        pcie_rx = sum((inst.activity or _NO_POD).pcie_rx_bps * inst.slice_fraction for inst in instances.values())
        nvlink = 0.0
        fb_used = sum(s.fb_used_mib for s in instance_signals.values())
    else:
        power = act.power
        busy = act.busy
        capped = act.power_capped
        pcie_tx, pcie_rx, nvlink = act.pcie_tx_bps, act.pcie_rx_bps, act.nvlink_bps
        fb_used = round(hardware.fb_usable_mib * act.fb)

    span = hardware.power_limit_w - hardware.idle_power_w
    power_w = hardware.idle_power_w * (1.0 + 0.01 * var) + span * _clip(power)
    if capped:
        # NB: a power-capped GPU hovers just under its limit (fixture: 691–699 W at 700 W).
        power_w = hardware.power_limit_w - 1.0 - 4.0 * (1.0 + var)
    power_w = round(min(power_w, hardware.power_limit_w), 3)
    heat = _clip((power_w - hardware.idle_power_w) / span) if span > 0 else 0.0
    gpu_temp = round(31 + 36 * heat**0.6 + var)
    mask = 0
    if busy <= 0.0 and not instances:
        mask |= CLOCK_EVENT_GPU_IDLE
    if capped:
        mask |= CLOCK_EVENT_SW_POWER_CAP
    idle_clock = busy <= 0.0 and not instances
    fb_used = min(fb_used, hardware.fb_usable_mib)
    return SimGpuGauges(
        gpu_util_pct=0 if instances else round(100 * _clip(busy)),
        mem_copy_util_pct=0 if instances else round(100 * _clip(act.mem_copy)),
        sm_clock_mhz=hardware.idle_sm_clock_mhz if idle_clock else hardware.max_sm_clock_mhz,
        mem_clock_mhz=hardware.mem_clock_mhz,
        clock_event_mask=mask,
        gpu_temp_c=gpu_temp,
        memory_temp_c=round(gpu_temp + 6 + 3 * heat),
        power_w=power_w,
        power_limit_w=hardware.power_limit_w,
        fb_free_mib=hardware.fb_usable_mib - fb_used,
        fb_used_mib=fb_used,
        fb_reserved_mib=hardware.fb_reserved_mib,
        gr_engine_active=act.gr_engine,
        sm_active=act.sm_active,
        sm_occupancy=act.sm_occupancy,
        tensor_active=act.tensor,
        dram_active=act.dram,
        pcie_tx_bytes=round(pcie_tx) + 118784,  # NB: an idle GPU still shows ~100 KB/s of PCIe traffic
        pcie_rx_bytes=round(pcie_rx) + 96256,
        nvlink_tx_bytes=round(nvlink),
        nvlink_rx_bytes=round(nvlink * 0.997),
        nvlink_bandwidth_total=round(nvlink / 535_000) if nvlink else 0,
        instances=instance_signals,
    )


def utilisation(offered_rps: float, replicas: int, capacity_rps: float) -> float:
    """Offered load as a share of capacity, ``offered / (replicas × capacity)`` (may exceed 1)."""
    if replicas <= 0 or capacity_rps <= 0:
        return 0.0
    return max(0.0, offered_rps) / (replicas * capacity_rps)


def gpu_signals(
    profile: Profile | None,
    *,
    offered_rps: float,
    replicas: int,
    capacity_rps: float,
    hardware: GpuModel = H100_SXM,
    variation: float = 0.0,
) -> SimGpuGauges:
    """Signals of one GPU of a workload whose ``replicas`` share ``offered_rps`` equally.

    ``capacity_rps`` is what one replica serves at saturation; above it the GPU stays saturated (the excess
    queues, see ``replica_queue``).
    """
    u = min(1.0, utilisation(offered_rps, replicas, capacity_rps))
    return device_signals(hardware, activity(profile, u, variation=variation), variation=variation)


# --- Triton queueing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TritonModel:
    """A model a Triton server serves. Durations are per request, in µs.

    ``share`` is this model's relative weight in the workload's traffic (normalised over the server's
    models). ``max_batch_size`` > 1 enables dynamic batching: the mean batch grows with load.
    """

    name: str
    version: str = "1"
    share: float = 1.0
    compute_infer_us: float = 5000.0
    compute_input_us: float | None = None  # default 8 % of compute_infer_us
    compute_output_us: float | None = None  # default 4.5 % of compute_infer_us
    max_batch_size: int = 1
    load_duration_s: float = 5.0

    @property
    def input_us(self) -> float:
        return self.compute_input_us if self.compute_input_us is not None else 0.08 * self.compute_infer_us

    @property
    def output_us(self) -> float:
        return self.compute_output_us if self.compute_output_us is not None else 0.045 * self.compute_infer_us


def queue_wait_ratio(rho: float) -> float:
    """Steady-state mean queue wait as a multiple of compute time at utilisation ``rho``.

    ``ρ⁴ / (2 − ρ⁴)``: ≈ 0 under light load, 0.26 at ρ = 0.8, 0.49 at 0.9, exactly 1 at saturation. A
    stylised curve for a batching server (queues form only near saturation), not a queueing-theory result.
    """
    r = _clip(rho) ** 4
    return r / (2.0 - r)


@dataclass(frozen=True, slots=True)
class QueueState:
    """One replica's queue at an instant. Rates in requests/s, waits in s."""

    offered_rps: float
    capacity_rps: float
    served_rps: float
    rejected_rps: float
    backlog: float  # requests queued beyond the steady state
    wait_ratio: float  # steady-state wait / compute time
    backlog_wait_s: float  # extra wait every request sees because of the backlog
    max_backlog: float

    @property
    def utilisation(self) -> float:
        """Served share of capacity, 0–1 (what the GPU sees)."""
        return self.served_rps / self.capacity_rps if self.capacity_rps > 0 else 0.0


def replica_queue(
    offered_rps: float, *, capacity_rps: float, backlog: float = 0.0, timeout_s: float = 1.0
) -> QueueState:
    """The queue of one replica offered ``offered_rps`` while ``backlog`` requests are already waiting.

    The server runs at capacity while it is overloaded or draining a backlog. The backlog is bounded by
    ``capacity × timeout_s`` (a request would wait longer than the queue timeout); arrivals beyond that are
    rejected (Triton's REJECTED reason).
    """
    lam = max(0.0, offered_rps)
    mu = max(0.0, capacity_rps)
    backlog = max(0.0, backlog)
    max_backlog = mu * max(0.0, timeout_s)
    if mu <= 0:
        return QueueState(lam, mu, 0.0, lam, backlog, 0.0, 0.0, max_backlog)
    saturated = lam >= mu or backlog > 0
    served = mu if saturated else lam
    rejected = lam - mu if (lam > mu and backlog >= max_backlog) else 0.0
    rho = 1.0 if saturated else lam / mu
    return QueueState(
        offered_rps=lam,
        capacity_rps=mu,
        served_rps=served,
        rejected_rps=rejected,
        backlog=backlog,
        wait_ratio=queue_wait_ratio(rho),
        backlog_wait_s=backlog / mu,
        max_backlog=max_backlog,
    )


def advance_backlog(queue: QueueState, dt: float) -> float:
    """The backlog ``dt`` seconds later if rates stay as in ``queue`` (fluid approximation)."""
    change = queue.offered_rps - queue.served_rps - queue.rejected_rps
    return _clip(queue.backlog + change * max(0.0, dt), 0.0, queue.max_backlog)


@dataclass(frozen=True, slots=True)
class ModelRates:
    """Per-second increments of one model's Triton counters on one replica, plus its pending gauge."""

    success: float
    inference_count: float
    exec_count: float
    request_duration_us: float
    queue_duration_us: float
    compute_input_duration_us: float
    compute_infer_duration_us: float
    compute_output_duration_us: float
    rejected: float  # model-level failure reason="REJECTED"
    canceled: float  # model-level failure reason="CANCELED"
    pending: float  # nv_inference_pending_request_count (model level)


def triton_rates(models: Sequence[TritonModel], queue: QueueState) -> dict[tuple[str, str], ModelRates]:
    """Split one replica's queue into per-model counter increments, keyed by ``(model, version)``.

    Mean wait of model m = ``wait_ratio × compute_infer_us(m) + backlog_wait``, so summed over models
    ``queue_duration / compute_infer_duration`` is below 1 under light load and grows with the backlog.
    """
    total_share = sum(max(0.0, m.share) for m in models)
    rates: dict[tuple[str, str], ModelRates] = {}
    rho = min(1.0, queue.utilisation)
    for model in models:
        w = max(0.0, model.share) / total_share if total_share > 0 else 0.0
        served = queue.served_rps * w
        wait_us = queue.wait_ratio * model.compute_infer_us + queue.backlog_wait_s * 1e6
        batch = 1.0 + (model.max_batch_size - 1) * rho**1.5 if model.max_batch_size > 1 else 1.0
        compute_us = model.input_us + model.compute_infer_us + model.output_us
        rejected = queue.rejected_rps * w
        rates[(model.name, str(model.version))] = ModelRates(
            success=served,
            inference_count=served,
            exec_count=served / batch,
            request_duration_us=served * (wait_us + compute_us),
            queue_duration_us=served * wait_us,
            compute_input_duration_us=served * model.input_us,
            compute_infer_duration_us=served * model.compute_infer_us,
            compute_output_duration_us=served * model.output_us,
            rejected=rejected,
            canceled=0.02 * rejected,
            pending=queue.offered_rps * w * queue.wait_ratio * model.compute_infer_us / 1e6 + w * queue.backlog,
        )
    return rates
