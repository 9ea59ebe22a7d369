"""The workload rules: what the GPU is really doing (idle, under-filled, memory-bound, precision, low
occupancy, compute-bound, moderate), as (code, explanation) pairs, plus the signals a rule needed but lacked.
"""

from __future__ import annotations

from gpuscale.metrics.diagnosis.diagnosis_policy import DiagnosisThresholds
from gpuscale.metrics.diagnosis.gpu_signals import (
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    GpuSignals,
    decode_clock_events,
)
from gpuscale.metrics.diagnosis.verdict_codes import FindingCode
from gpuscale.metrics.diagnosis.verdicts import busy_and_gr_text, busy_reading, number_text, percent_text

_Found = list[tuple[FindingCode, str]]
_NO_SM = "SM_ACTIVE not reported (profiling metrics disabled)"


def workload_findings(s: GpuSignals, d: DiagnosisThresholds) -> tuple[list[tuple[FindingCode, str]], list[str], str]:
    """Workload findings as (code, explanation), the missing signals, and the explanation if undecided."""
    missing: list[str] = []
    if s.gpu_util_percent is None:
        missing.append(GPU_UTIL)
    busy = busy_reading(s)
    sm = s.sm_active
    if busy is None and sm is None:
        missing += [GR_ENGINE_ACTIVE, SM_ACTIVE]
        return (
            [],
            missing,
            "no activity signal reported (GPU_UTIL, GR_ENGINE_ACTIVE, SM_ACTIVE): cannot tell idle from busy",
        )

    # idle / idle-holding-memory (rule 4)
    if (busy is None or busy[0] <= d.idle.busy_percent) and (sm is None or sm <= d.idle.sm_active):
        return _idle(s, d, busy, sm, missing)

    found: _Found = []
    # NB: SMs hold warps only while the compute engine is busy, so SM_ACTIVE ≤ GR_ENGINE_ACTIVE: without
    # SM_ACTIVE, GR_ENGINE_ACTIVE is an upper bound that can still rule verdicts out (policy switch).
    bound = None
    if sm is None:
        missing.append(SM_ACTIVE)
        if d.sm_active.gr_engine_upper_bound and s.gr_engine_active is not None:
            bound = s.gr_engine_active

    undecided = _under_filled(found, s, d, busy, bound)
    _memory_bound(found, missing, s, d)
    if sm is not None:
        _by_sm_activity(found, missing, s, d, busy, sm)
    elif bound is not None and busy is not None and bound < d.sm_active.effective and not undecided and not found:
        found.append(
            (
                FindingCode.MODERATE,
                f"{busy_and_gr_text(busy[1], s)}; "
                f"{_NO_SM}, but SM activity cannot exceed GR engine activity "
                f"(< {percent_text(d.sm_active.effective)}): "
                "not compute-bound, headroom left",
            )
        )

    undecided_text = ""
    if not found:
        shown = busy[1] if busy else "activity unknown"
        if busy:
            shown = busy_and_gr_text(shown, s)
        undecided_text = f"{shown}; {_NO_SM}: cannot tell busy from effective"
    return found, missing, undecided_text


def _idle(
    s: GpuSignals, d: DiagnosisThresholds, busy: tuple[float, str] | None, sm: float | None, missing: list[str]
) -> tuple[_Found, list[str], str]:
    """Rule 4 on a GPU below the idle thresholds: idle, or idle-holding-memory when it holds memory."""
    activity = ", ".join(([busy[1]] if busy else []) + ([f"SM active {percent_text(sm)}"] if sm is not None else []))
    mask = s.clock_event_reasons
    if mask is not None and any(n in d.clock_events.idle for n in decode_clock_events(mask)):
        activity += f", clock-event 0x{mask:X} ({', '.join(d.clock_events.idle)})"
    if s.fb_used_mib is None:
        missing.append(FB_USED)
        return [(FindingCode.IDLE, f"{activity}: nothing is running (FB_USED not reported)")], missing, ""
    held = d.memory_held.fb_used_mib
    if s.fb_used_mib >= held:
        return (
            [
                (
                    FindingCode.IDLE_HOLDING_MEMORY,
                    f"{activity} but {s.fb_used_mib:.0f} MiB of GPU memory held (≥ {number_text(held)} MiB): "
                    "memory is allocated while nothing runs",
                )
            ],
            missing,
            "",
        )
    return [(FindingCode.IDLE, f"{activity}, {s.fb_used_mib:.0f} MiB used: nothing is running")], missing, ""


def _under_filled(
    found: _Found, s: GpuSignals, d: DiagnosisThresholds, busy: tuple[float, str] | None, bound: float | None
) -> bool:
    """Rule 1: busy but the SMs mostly empty (or, without SM_ACTIVE, its GR-engine bound). True = undecided."""
    sm, ineffective = s.sm_active, d.sm_active.ineffective
    undecided = False
    if busy is not None and busy[0] >= d.busy.gpu_util_percent:
        if sm is not None and sm < ineffective:
            found.append(
                (
                    FindingCode.UNDER_FILLED,
                    f"{busy[1]} but SM active {percent_text(sm)} (< {percent_text(ineffective)}): "
                    "kernels are resident but the SMs are mostly empty",
                )
            )
        elif sm is None and bound is not None and bound < ineffective:
            found.append(
                (
                    FindingCode.UNDER_FILLED,
                    f"{busy[1]} but GR engine active {percent_text(bound)} (< {percent_text(ineffective)}); {_NO_SM}, "
                    "and it cannot exceed GR engine activity: the SMs are mostly empty",
                )
            )
        elif sm is None:
            undecided = True
    return undecided


def _memory_bound(found: _Found, missing: list[str], s: GpuSignals, d: DiagnosisThresholds) -> None:
    """Rule 3: DRAM active at or above the bandwidth-bound threshold."""
    if s.dram_active is None:
        missing.append(DRAM_ACTIVE)
    elif s.dram_active >= d.dram_active.bandwidth_bound:
        peak = d.dram_active.practical_peak
        state = "saturated" if s.dram_active >= peak else "bandwidth-bound"
        found.append(
            (
                FindingCode.MEMORY_BOUND,
                f"DRAM active {percent_text(s.dram_active)} (≥ {percent_text(d.dram_active.bandwidth_bound)}; about "
                f"{percent_text(peak)} is the practical peak): memory interface {state}",
            )
        )


def _by_sm_activity(
    found: _Found,
    missing: list[str],
    s: GpuSignals,
    d: DiagnosisThresholds,
    busy: tuple[float, str] | None,
    sm: float,
) -> None:
    """With SM_ACTIVE: low occupancy, precision and compute-bound above the thresholds, else moderate."""
    effective, ineffective = d.sm_active.effective, d.sm_active.ineffective
    if sm >= ineffective:
        if s.sm_occupancy is None:
            missing.append(SM_OCCUPANCY)
        elif s.sm_occupancy < d.sm_occupancy.low:
            found.append(
                (
                    FindingCode.LOW_OCCUPANCY,
                    f"SM active {percent_text(sm)} but SM occupancy {percent_text(s.sm_occupancy)} "
                    f"(< {percent_text(d.sm_occupancy.low)}): few warps resident per SM",
                )
            )
    if sm >= effective:
        tensor = s.tensor_active
        if tensor is None:
            missing.append(TENSOR_ACTIVE)
        elif tensor < d.tensor_active.low:
            found.append(
                (
                    FindingCode.PRECISION,
                    f"SM active {percent_text(sm)} (≥ {percent_text(effective)}) "
                    f"but tensor pipe active {percent_text(tensor)} "
                    f"(< {percent_text(d.tensor_active.low)}): the work runs on CUDA cores, not tensor cores",
                )
            )
        tensor_text = f", tensor {percent_text(tensor)}" if tensor is not None else ""
        found.append(
            (
                FindingCode.COMPUTE_BOUND,
                f"SM active {percent_text(sm)} (≥ {percent_text(effective)}){tensor_text}: the SMs are doing real work",
            )
        )
    elif not found:
        where = f"{busy[1]}, " if busy else ""
        found.append(
            (
                FindingCode.MODERATE,
                f"{where}SM active {percent_text(sm)} (< {percent_text(effective)}): partly loaded, headroom left",
            )
        )
