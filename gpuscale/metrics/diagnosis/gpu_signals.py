"""One GPU's signals: the DCGM facts (field names, clock-event bits), ``GpuSignals``, reading it from a device's
DCGM values (``signals_from_dcgm``), folding a pod's GPUs into one (``combine``) and decoding clock-event masks.

A signal that is not reported is ``None``, never 0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from gpuscale.metrics.diagnosis.trusted_records import trusted

if TYPE_CHECKING:
    from gpuscale.metrics.diagnosis.diagnosis_policy import DiagnosisPolicy

# --- DCGM facts (not thresholds) -------------------------------------------------------------------

# Clock-event reason bits (DF dcgm_fields.h) with dcgm-exporter's label names
# (DE collector/clock_events_collector.go), in bit order.
CLOCK_EVENT_BITS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "clocks_setting"),
    (0x4, "power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)
ClockEventName = Literal[
    "gpu_idle",
    "clocks_setting",
    "power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
    "display_clocks",
]

# Short signal names used in ``Verdict.missing`` (the DCGM field without its DCGM_FI_{DEV,PROF}_ prefix).
GPU_UTIL = "GPU_UTIL"
SM_ACTIVE = "SM_ACTIVE"
SM_OCCUPANCY = "SM_OCCUPANCY"
TENSOR_ACTIVE = "PIPE_TENSOR_ACTIVE"
DRAM_ACTIVE = "DRAM_ACTIVE"
GR_ENGINE_ACTIVE = "GR_ENGINE_ACTIVE"
FB_USED = "FB_USED"

# NB: both fp64 and int64 DCGM "blank" values leak through old exporters (gpu-metrics.md §6 "Sentinel
# values": drop int64 ≥ 0x7ffffffffffffff0 and fp64 ≥ 1.4e14). No field we map can legitimately be that large.
_DCGM_BLANK_FLOOR = 1.4e14

# --- signals ---------------------------------------------------------------------------------------


class GpuSignals(BaseModel):
    """What one GPU (or MIG instance, or a pod's GPUs combined) reports. ``None`` = not reported.

    Ratios run 0–1 (DCGM PROF fields); ``gpu_util_percent`` runs 0–100. Memory in MiB, power in W,
    temperatures in °C, clocks in MHz. ``last_xid`` is the sticky DCGM_FI_DEV_XID_ERRORS gauge (0 = none);
    ``xid_counts`` the windowed DCGM_EXP_XID_ERRORS_COUNT (Xid → count; ``{}`` = window reported, empty).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_util_percent: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    gr_engine_active: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    gpu_temp_c: float | None = None
    memory_temp_c: float | None = None
    sm_clock_mhz: float | None = None
    clock_event_reasons: int | None = None
    last_xid: int | None = None
    xid_counts: dict[int, int] | None = None
    ecc_dbe_volatile: int | None = None
    uncorrectable_remapped_rows: int | None = None
    row_remap_failure: int | None = None
    mig_profile: str | None = None


# DCGM field → GpuSignals field. Later names in a tuple are older aliases, used only when the newer is absent.
_DCGM_FIELDS: dict[str, tuple[str, ...]] = {
    "gpu_util_percent": ("DCGM_FI_DEV_GPU_UTIL",),
    "sm_active": ("DCGM_FI_PROF_SM_ACTIVE",),
    "sm_occupancy": ("DCGM_FI_PROF_SM_OCCUPANCY",),
    "tensor_active": ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",),
    "dram_active": ("DCGM_FI_PROF_DRAM_ACTIVE",),
    "gr_engine_active": ("DCGM_FI_PROF_GR_ENGINE_ACTIVE",),
    "fb_used_mib": ("DCGM_FI_DEV_FB_USED",),
    "fb_free_mib": ("DCGM_FI_DEV_FB_FREE",),
    "power_watts": ("DCGM_FI_DEV_POWER_USAGE",),
    "power_limit_watts": ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
    "gpu_temp_c": ("DCGM_FI_DEV_GPU_TEMP",),
    "memory_temp_c": ("DCGM_FI_DEV_MEMORY_TEMP",),
    "sm_clock_mhz": ("DCGM_FI_DEV_SM_CLOCK",),
    # Field 112 was renamed from CLOCK_THROTTLE_REASONS (DF; gpu-metrics.md §6).
    "clock_event_reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    "last_xid": ("DCGM_FI_DEV_XID_ERRORS",),
    "ecc_dbe_volatile": ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",),
    "uncorrectable_remapped_rows": ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",),
    "row_remap_failure": ("DCGM_FI_DEV_ROW_REMAP_FAILURE",),
}
_INT_FIELDS = frozenset(
    {"clock_event_reasons", "last_xid", "ecc_dbe_volatile", "uncorrectable_remapped_rows", "row_remap_failure"}
)
_XID_WINDOW = "DCGM_EXP_XID_ERRORS_COUNT"
KNOWN_DCGM_NAMES = frozenset(n for names in _DCGM_FIELDS.values() for n in names) | {_XID_WINDOW}

# GpuSignals field → the DCGM names to try, in order (each name, then prometheus_client's ``_total``
# spelling of it), and whether the field is an integer.
_FIELD_SPELLINGS: tuple[tuple[str, tuple[str, ...], bool], ...] = tuple(
    (field, tuple(spelling for name in names for spelling in (name, f"{name}_total")), field in _INT_FIELDS)
    for field, names in _DCGM_FIELDS.items()
)


def _reported(value: float | None) -> float | None:
    """``value`` as a float, or None for NaN/±Inf and DCGM blank sentinels."""
    if value is None:
        return None
    v = float(value)
    if not math.isfinite(v) or abs(v) >= _DCGM_BLANK_FLOOR:
        return None
    return v


def signals_from_dcgm(
    values: Mapping[str, float],
    *,
    xid_counts: Mapping[int, float] | None = None,
    mig_profile: str | None = None,
) -> GpuSignals:
    """Map one device's DCGM values (field name → latest value) to GpuSignals.

    ``values`` holds one value per DCGM field name, for one GPU or one MIG instance. Names that
    prometheus_client suffixed with ``_total`` are accepted; names this module does not use are ignored.
    The windowed Xid counts carry the Xid in a label, so they come separately as ``xid_counts``
    (Xid → count); a bare ``DCGM_EXP_XID_ERRORS_COUNT`` in ``values`` means "window reported, no Xid".
    ``mig_profile`` is the ``GPU_I_PROFILE`` label of a MIG instance.
    """
    plan = _read_plan(tuple(values))
    # NB: the inline form of _reported: NaN, ±Inf and DCGM blanks are "not reported". Most fields have one
    # spelling in a device's values: those are read in two comprehensions, the rest in order of preference.
    floor = _DCGM_BLANK_FLOOR
    fields: dict[str, Any] = {
        field: float(value) for field, name in plan.floats if -floor < (value := values[name]) < floor
    }
    fields.update((field, int(value)) for field, name in plan.integers if -floor < (value := values[name]) < floor)
    for field, names, integer in plan.aliased:
        for name in names:
            value = values[name]
            if -_DCGM_BLANK_FLOOR < value < _DCGM_BLANK_FLOOR:
                fields[field] = int(value) if integer else float(value)
                break
    if fields.get("last_xid", 0) < 0:
        del fields["last_xid"]  # NB: Xids are positive; a negative gauge is a broken exporter, not an Xid
    window: dict[int, int] | None = None
    if xid_counts is not None:
        window = {int(code): int(n) for code, n in xid_counts.items() if int(code) > 0 and (_reported(n) or 0) > 0}
    elif _XID_WINDOW in values or f"{_XID_WINDOW}_total" in values:
        window = {}
    fields["xid_counts"] = window
    fields["mig_profile"] = mig_profile
    # NB: every value is a float, an int, a dict of ints or the profile's str: trusted, as this runs per GPU.
    return _new_signals(fields)


_new_signals = trusted(GpuSignals)


class _ReadPlan(NamedTuple):
    floats: tuple[tuple[str, str], ...]  # (GpuSignals field, the one spelling present)
    integers: tuple[tuple[str, str], ...]
    aliased: tuple[tuple[str, tuple[str, ...], bool], ...]  # several spellings present: the first reported wins


@functools.lru_cache(maxsize=256)
def _read_plan(names: tuple[str, ...]) -> _ReadPlan:
    """Per GpuSignals field, the spellings ``names`` holds, in the order they are tried.

    NB: cached by the names a device reports: every GPU of a cluster's exporters reports the same few
    sets, so a device costs one lookup per field it has instead of one per spelling it might have.
    """
    present = set(names)
    floats, integers, aliased = [], [], []
    for field, spellings, integer in _FIELD_SPELLINGS:
        held = tuple(name for name in spellings if name in present)
        if len(held) > 1:
            aliased.append((field, held, integer))
        elif held:
            (integers if integer else floats).append((field, held[0]))
    return _ReadPlan(tuple(floats), tuple(integers), tuple(aliased))


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _total(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _worst(values: Iterable[float | None], pick: Any = max) -> Any:
    present = [v for v in values if v is not None]
    return pick(present) if present else None


def combine(signals: Sequence[GpuSignals], *, policy: DiagnosisPolicy | None = None) -> GpuSignals:
    """Fold a pod's GPUs into one GpuSignals so the pod gets one verdict.

    Ratios and GPU_UTIL: mean over the GPUs that report them. Memory and power: sums. Health: the worst
    (highest temperatures, lowest SM clock, OR of the clock-event masks, summed error counters, merged Xid
    windows). Only one ``last_xid`` fits: the most severe one under ``policy`` (fatal > nonfatal >
    informational), else the first non-zero. MIG profiles are joined with ``+``.

    NB: do not combine MIG instances of one physical GPU for power: they repeat the parent's value
    (gpu-metrics.md §6); de-duplicate by UUID first.
    """
    if not signals:
        return GpuSignals()
    xids = [s.last_xid for s in signals if s.last_xid]
    last_xid = _worst(s.last_xid for s in signals)  # None if no GPU reports it, 0 if all report "none"
    if xids:
        last_xid = max(xids, key=policy.health.xid_rank) if policy else xids[0]
    windows = [s.xid_counts for s in signals if s.xid_counts is not None]
    merged: dict[int, int] | None = None
    if windows:
        merged = {}
        for w in windows:
            for code, n in w.items():
                merged[code] = merged.get(code, 0) + n
    masks = [s.clock_event_reasons for s in signals if s.clock_event_reasons is not None]
    mask = None
    if masks:
        mask = 0
        for m in masks:
            mask |= m
    profiles = list(dict.fromkeys(s.mig_profile for s in signals if s.mig_profile))
    averaged = ("gpu_util_percent", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "gr_engine_active")
    summed = ("fb_used_mib", "fb_free_mib", "power_watts", "power_limit_watts")
    summed_counters = ("ecc_dbe_volatile", "uncorrectable_remapped_rows")
    fields: dict[str, Any] = {f: _mean(getattr(s, f) for s in signals) for f in averaged}
    fields |= {f: _total(getattr(s, f) for s in signals) for f in (*summed, *summed_counters)}
    return GpuSignals(
        **fields,
        gpu_temp_c=_worst(s.gpu_temp_c for s in signals),
        memory_temp_c=_worst(s.memory_temp_c for s in signals),
        sm_clock_mhz=_worst((s.sm_clock_mhz for s in signals), min),
        clock_event_reasons=mask,
        last_xid=last_xid,
        xid_counts=merged,
        row_remap_failure=_worst(s.row_remap_failure for s in signals),
        mig_profile="+".join(profiles) if profiles else None,
    )


def decode_clock_events(mask: int) -> list[str]:
    """Names of the bits set in a clock-event mask, in bit order: 0x2C → power_cap, hw_slowdown, sw_thermal.

    Bits DCGM does not define come back as hex (``"0x200"``) rather than being dropped.
    """
    return list(_clock_event_names(mask))


@functools.lru_cache(maxsize=1024)
def _clock_event_names(mask: int) -> tuple[str, ...]:
    # NB: cached: a cluster shows a handful of distinct masks, and every GPU's record and diagnosis decode one.
    names = [name for bit, name in CLOCK_EVENT_BITS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_BITS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest >= bit:
        if rest & bit:
            names.append(f"0x{bit:X}")
        bit <<= 1
    return tuple(names)
