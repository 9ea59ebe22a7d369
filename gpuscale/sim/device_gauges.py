"""Device signal synthesis: from what runs on a GPU to the values dcgm-exporter reports for it, pure.

``device_signals(hardware, activity)`` turns a ``gpu_activity.Activity`` into a ``SimGpuGauges``;
``gpu_signals(profile, offered_rps=…, replicas=…, capacity_rps=…)`` does both steps from an offered rate. Units
follow ``reference/gpu-metrics.md``: ``*_pct`` are percent (GPU_UTIL), PROF fields are ratios 0–1, framebuffer
is MiB, power W, clocks MHz, PCIe/NVLink B/s, energy mJ, violations ns. A GPU without a pod reports FB_USED 0
and clock-event mask 0x1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuscale.sim.gpu_activity import H100_SXM, NO_POD, Activity, GpuModel, Profile, activity, clip

__all__ = [
    "InstanceLoad",
    "InstanceSignals",
    "SimGpuGauges",
    "device_signals",
    "gpu_signals",
    "utilisation",
]

# Clock-event reason bits (DCGM_CLOCKS_EVENT_REASON_*), see reference/gpu-metrics.md §3.
CLOCK_EVENT_GPU_IDLE = 0x1
CLOCK_EVENT_SW_POWER_CAP = 0x4


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
    var = clip(variation, -1.0, 1.0)
    act = act or NO_POD
    instance_signals: dict[int, InstanceSignals] = {}
    if instances:
        power = sum(inst.slice_fraction * (inst.activity or NO_POD).power for inst in instances.values())
        busy = max(((inst.activity or NO_POD).busy for inst in instances.values()), default=0.0)
        instance_signals = _instance_signals(instances)
        capped = False
        pcie_tx = sum((inst.activity or NO_POD).pcie_tx_bps * inst.slice_fraction for inst in instances.values())
        pcie_rx = sum((inst.activity or NO_POD).pcie_rx_bps * inst.slice_fraction for inst in instances.values())
        nvlink = 0.0
        fb_used = sum(s.fb_used_mib for s in instance_signals.values())
    else:
        power = act.power
        busy = act.busy
        capped = act.power_capped
        pcie_tx, pcie_rx, nvlink = act.pcie_tx_bps, act.pcie_rx_bps, act.nvlink_bps
        fb_used = round(hardware.fb_usable_mib * act.fb)

    span = hardware.power_limit_w - hardware.idle_power_w
    power_w = hardware.idle_power_w * (1.0 + 0.01 * var) + span * clip(power)
    if capped:
        # NB: a power-capped GPU hovers just under its limit (fixture: 691–699 W at 700 W).
        power_w = hardware.power_limit_w - 1.0 - 4.0 * (1.0 + var)
    power_w = round(min(power_w, hardware.power_limit_w), 3)
    heat = clip((power_w - hardware.idle_power_w) / span) if span > 0 else 0.0
    gpu_temp = round(31 + 36 * heat**0.6 + var)
    mask = 0
    if busy <= 0.0 and not instances:
        mask |= CLOCK_EVENT_GPU_IDLE
    if capped:
        mask |= CLOCK_EVENT_SW_POWER_CAP
    idle_clock = busy <= 0.0 and not instances
    fb_used = min(fb_used, hardware.fb_usable_mib)
    return SimGpuGauges(
        gpu_util_pct=0 if instances else round(100 * clip(busy)),
        mem_copy_util_pct=0 if instances else round(100 * clip(act.mem_copy)),
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


def _instance_signals(instances: Mapping[int, InstanceLoad]) -> dict[int, InstanceSignals]:
    """Per-MIG-instance values: each instance's own activity, and its framebuffer out of its slice."""
    out: dict[int, InstanceSignals] = {}
    for gi_id, inst in instances.items():
        a = inst.activity or NO_POD
        used = round(13 + (inst.fb_total_mib - 13) * a.fb)  # 13 MiB: an empty instance's context
        out[gi_id] = InstanceSignals(
            gr_engine_active=a.gr_engine,
            sm_active=a.sm_active,
            sm_occupancy=a.sm_occupancy,
            tensor_active=a.tensor,
            dram_active=a.dram,
            fb_used_mib=used,
            fb_free_mib=inst.fb_total_mib - used,
        )
    return out


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
