"""The "util trap" diagnosis: one GPU's (or one pod's) signals → one typed verdict.

``DCGM_FI_DEV_GPU_UTIL`` counts time with *any* kernel running, so one small kernel or an NCCL hang reads
100 % (gpu-metrics.md §4). This module is the single place that reads the profiling fields next to it and
says what the GPU is really doing, for every consumer (``top``, ``report``, the controller):

    signals_from_dcgm(values)  →  GpuSignals  ─┐
    combine([GpuSignals, …])   →  GpuSignals  ─┼→  diagnose(signals, policy)  →  Verdict
    load_policy(policies/)     →  DiagnosisPolicy ┘

Contracts:

- ``diagnose`` is pure: no I/O, no clock, no globals; the same inputs give the same verdict.
- Every threshold comes from ``policies/diagnosis.yaml`` and ``policies/health.yaml``; the code only
  knows the *order* of the rules and the DCGM field definitions (bit names, field names).
- A signal that is not reported is ``None``, never 0. When a missing signal prevents a rule, the verdict
  says so (``missing`` plus the explanation) instead of guessing: e.g. on MIG, where GPU_UTIL is absent,
  GR_ENGINE_ACTIVE stands in (rule 5) and the verdict lists GPU_UTIL as missing.

Verdict priority (the first that applies is the verdict; all that apply are ``findings``):

    unhealthy > throttled > idle / idle-holding-memory > under-filled > memory-bound > precision
    > low-occupancy > compute-bound > moderate;  unknown when nothing could be decided.

Nonfatal health findings (a nonfatal Xid, remapped rows) and temperature warnings never decide the verdict
but raise its ``severity``: a compute-bound GPU with a fresh Xid 13 is ``compute-bound`` at ``warning``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from gpuscale.config import read_yaml, validate
from gpuscale.policy_files import DIAGNOSIS_FILE, HEALTH_FILE, policy_file

_M = TypeVar("_M", bound=BaseModel)


def trusted(model: type[_M]) -> Callable[[dict[str, Any]], _M]:
    """A constructor of ``model`` from values this code computed itself, already of each field's own type
    (float, int, str, an enum member, a model instance, a list or dict of those): what ``model.model_validate``
    would return, fields set and all, without validating again.

    NB: the records of one `gpuscale top` frame (a GpuSignals per GPU, a verdict per GPU or pod, its findings,
    a PodStatus per pod: ~25,000 at 10,000 GPUs) cost 3–6 µs each to validate and ~1.5 µs this way. It is
    ``model_construct`` (pydantic's own path for trusted data: no validation) with the defaults worked out once
    per model instead of per record. Only for models without validators or private attributes; tests compare
    it with ``model_validate`` (tests/metrics/test_trusted.py).
    """
    if model.__pydantic_decorators__.model_validators or model.__pydantic_decorators__.field_validators:
        raise TypeError(f"{model.__name__} has validators: construct it with model_validate")
    if model.__private_attributes__:
        raise TypeError(f"{model.__name__} has private attributes: construct it with model_validate")
    template: dict[str, Any] = {}
    factories: list[tuple[str, Callable[[], Any]]] = []
    for name, info in model.model_fields.items():
        template[name] = None if info.is_required() or info.default_factory is not None else info.default
        if info.default_factory is not None:
            factories.append((name, info.default_factory))  # type: ignore[arg-type]
    new, assign = object.__new__, object.__setattr__

    def construct(values: dict[str, Any]) -> _M:
        fields = template.copy()  # NB: every field, in declaration order, as validation leaves __dict__
        fields.update(values)
        for name, factory in factories:
            if name not in values:
                fields[name] = factory()
        record = new(model)
        assign(record, "__dict__", fields)
        assign(record, "__pydantic_fields_set__", set(values))
        assign(record, "__pydantic_extra__", None)
        assign(record, "__pydantic_private__", None)
        return record

    return construct


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


# --- codes -----------------------------------------------------------------------------------------


class Severity(StrEnum):
    """How urgent a verdict or finding is, in increasing order."""

    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {s: i for i, s in enumerate(Severity)}


class VerdictCode(StrEnum):
    """Stable verdict codes, in priority order (the first that applies wins)."""

    UNHEALTHY = "unhealthy"
    THROTTLED = "throttled"
    IDLE = "idle"
    IDLE_HOLDING_MEMORY = "idle-holding-memory"
    UNDER_FILLED = "under-filled"
    MEMORY_BOUND = "memory-bound"
    PRECISION = "precision"  # SMs busy, tensor cores idle
    LOW_OCCUPANCY = "low-occupancy"
    COMPUTE_BOUND = "compute-bound"  # the healthy, effective case
    MODERATE = "moderate"
    UNKNOWN = "unknown"  # a missing signal prevented a verdict


class FindingCode(StrEnum):
    """Finding codes in priority order: the verdict codes plus findings that never decide a verdict."""

    UNHEALTHY = "unhealthy"  # a fatal health signal (fatal Xid, ECC DBE, row-remap failure)
    XID = "xid"  # a nonfatal (or stale) Xid
    MEMORY_ERRORS = "memory-errors"  # a nonfatal memory-error counter (uncorrectable remapped rows)
    THROTTLED = "throttled"
    TEMPERATURE = "temperature"
    IDLE = "idle"
    IDLE_HOLDING_MEMORY = "idle-holding-memory"
    UNDER_FILLED = "under-filled"
    MEMORY_BOUND = "memory-bound"
    PRECISION = "precision"
    LOW_OCCUPANCY = "low-occupancy"
    COMPUTE_BOUND = "compute-bound"
    MODERATE = "moderate"


_FINDING_RANK = {c: i for i, c in enumerate(FindingCode)}
# The findings that can decide a verdict, and the verdict each decides.
_VERDICT_OF = {f: VerdictCode(f.value) for f in FindingCode if f.value in set(VerdictCode)}


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


# --- policy ----------------------------------------------------------------------------------------

Ratio = Annotated[float, Field(ge=0.0, le=1.0, strict=True)]
Percent = Annotated[float, Field(ge=0.0, le=100.0, strict=True)]
NonNegative = Annotated[float, Field(ge=0.0, strict=True)]
Text = Annotated[str, Field(min_length=1, strict=True)]
HealthSeverity = Literal["fatal", "nonfatal"]
_M = TypeVar("_M", bound=BaseModel)


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SmActiveThresholds(_Section):
    effective: Ratio
    ineffective: Ratio
    gr_engine_upper_bound: StrictBool = True

    @model_validator(mode="after")
    def _ordered(self) -> SmActiveThresholds:
        if self.ineffective > self.effective:
            raise ValueError(f"ineffective ({self.ineffective}) must not exceed effective ({self.effective})")
        return self


class BusyThresholds(_Section):
    gpu_util_percent: Percent


class DramThresholds(_Section):
    bandwidth_bound: Ratio
    practical_peak: Ratio


class LowThreshold(_Section):
    low: Ratio


class IdleThresholds(_Section):
    busy_percent: Percent
    sm_active: Ratio


class MemoryHeldThresholds(_Section):
    fb_used_mib: NonNegative


class ClockEventPolicy(_Section):
    abnormal: list[ClockEventName]
    idle: list[ClockEventName]


class TemperatureThresholds(_Section):
    gpu_c: NonNegative
    memory_c: NonNegative
    severity: Severity = Severity.WARNING
    next_step: Text


class VerdictText(_Section):
    severity: Severity
    next_step: Text


class ServingCode(StrEnum):
    """Verdicts on an inference server's own signals (queue, batch, KV cache), in priority order."""

    KV_CACHE_FULL = "kv-cache-full"  # the KV cache is full and running requests are preempted
    BATCH_LIMITED = "batch-limited"  # requests queue while the SMs are under-filled: the batch cap binds
    SATURATED = "saturated"  # requests queue on a busy GPU: more replicas would help
    KV_CACHE_HIGH = "kv-cache-high"  # nearly full, no preemption yet


class ServingThresholds(_Section):
    """``serving:`` in ``policies/diagnosis.yaml`` (optional: these defaults apply when it is absent)."""

    # ours, after llm-d's saturation scaler (KV-cache usage 0.80, queue length 5): high at 90 %, full at 97 %.
    kv_cache_high_percent: Percent = 90.0
    kv_cache_full_percent: Percent = 97.0
    # A queue of at least this many requests per pod counts as "requests wait".
    queue_depth: NonNegative = 1.0
    verdicts: dict[ServingCode, VerdictText] = Field(
        default_factory=lambda: {
            ServingCode.KV_CACHE_FULL: VerdictText(
                severity=Severity.WARNING,
                next_step="add replicas, or lower max-num-seqs / max-model-len so the batch fits the KV cache",
            ),
            ServingCode.BATCH_LIMITED: VerdictText(
                severity=Severity.WARNING,
                next_step="raise the batch limit (vLLM --max-num-seqs, SGLang --max-running-requests, TGI "
                "--max-batch-size); the GPU has room, more replicas would waste it",
            ),
            ServingCode.SATURATED: VerdictText(
                severity=Severity.INFO,
                next_step="scale out on inference_queue_depth; the GPU is busy and requests wait",
            ),
            ServingCode.KV_CACHE_HIGH: VerdictText(
                severity=Severity.INFO,
                next_step="close to preemption; scale on inference_kv_cache_usage before it fills",
            ),
        }
    )

    @model_validator(mode="after")
    def _ordered(self) -> ServingThresholds:
        if self.kv_cache_high_percent > self.kv_cache_full_percent:
            raise ValueError("kv_cache_high_percent must not exceed kv_cache_full_percent")
        absent = [c.value for c in ServingCode if c not in self.verdicts]
        if absent:
            raise ValueError(f"verdicts: missing {', '.join(absent)}")
        return self


class DiagnosisThresholds(_Section):
    """``policies/diagnosis.yaml``: the numbers behind the workload verdicts."""

    version: Literal[1]
    sm_active: SmActiveThresholds
    busy: BusyThresholds
    dram_active: DramThresholds
    tensor_active: LowThreshold
    sm_occupancy: LowThreshold
    idle: IdleThresholds
    memory_held: MemoryHeldThresholds
    clock_events: ClockEventPolicy
    temperature: TemperatureThresholds
    verdicts: dict[VerdictCode, VerdictText]
    serving: ServingThresholds = Field(default_factory=ServingThresholds)

    @model_validator(mode="after")
    def _every_verdict(self) -> DiagnosisThresholds:
        absent = [c.value for c in VerdictCode if c not in self.verdicts]
        if absent:
            raise ValueError(f"verdicts: missing {', '.join(absent)}")
        return self


class XidInfo(_Section):
    """One row of the Xid table: what it means, what to do (NVS action), fatal or not."""

    code: Annotated[int, Field(ge=1, strict=True)]
    meaning: Text
    action: Text
    severity: HealthSeverity


class UnknownXidRule(_Section):
    action: Text
    severity: HealthSeverity


class FindingSeverities(_Section):
    fatal: Severity
    nonfatal: Severity
    informational_actions: list[Text] = Field(default_factory=list)


class CounterRule(_Section):
    """A health counter that is a finding when its value is above ``above``."""

    above: NonNegative
    severity: HealthSeverity
    action: Text


class HealthPolicy(_Section):
    """``policies/health.yaml``: the Xid table and the memory-error rules."""

    version: Literal[1]
    xids: list[XidInfo]
    unknown_xid: UnknownXidRule
    actions: dict[str, Text]
    finding_severity: FindingSeverities
    stale_last_xid_severity: Severity = Severity.INFO
    ecc_dbe_volatile: CounterRule
    uncorrectable_remapped_rows: CounterRule
    row_remap_failure: CounterRule

    @model_validator(mode="after")
    def _consistent(self) -> HealthPolicy:
        seen: set[int] = set()
        for x in self.xids:
            if x.code in seen:
                raise ValueError(f"xids: code {x.code} is listed twice")
            seen.add(x.code)
        used = {x.action for x in self.xids} | {self.unknown_xid.action}
        used |= {r.action for r in (self.ecc_dbe_volatile, self.uncorrectable_remapped_rows, self.row_remap_failure)}
        used |= set(self.finding_severity.informational_actions)
        undocumented = sorted(used - set(self.actions))
        if undocumented:
            raise ValueError(f"actions: no entry for {', '.join(undocumented)} (documented: {', '.join(self.actions)})")
        return self

    @cached_property
    def by_code(self) -> dict[int, XidInfo]:
        return {x.code: x for x in self.xids}

    def xid_info(self, code: int) -> XidInfo:
        known = self.by_code.get(code)
        if known is not None:
            return known
        return XidInfo(
            code=code,
            meaning=f"Xid {code} (not in the health policy's Xid table)",
            action=self.unknown_xid.action,
            severity=self.unknown_xid.severity,
        )

    def severity_of(self, severity: HealthSeverity, action: str) -> Severity:
        if severity == "fatal":
            return self.finding_severity.fatal
        if action in self.finding_severity.informational_actions:
            return Severity.INFO
        return self.finding_severity.nonfatal

    def xid_rank(self, code: int) -> int:
        """Larger = worse; used to pick one ``last_xid`` when combining GPUs."""
        info = self.xid_info(code)
        return (
            2 if info.severity == "fatal" else (0 if info.action in self.finding_severity.informational_actions else 1)
        )


class DiagnosisPolicy(_Section):
    """Both policy files, validated. Build it with ``load_policy``."""

    diagnosis: DiagnosisThresholds
    health: HealthPolicy


def load_policy(path_dir: str | Path | None = None) -> DiagnosisPolicy:
    """Load ``diagnosis.yaml`` and ``health.yaml``: each from ``path_dir`` when it holds the file, else shipped.

    Raises ConfigError naming the file, the field path (e.g. ``sm_active.effective``, ``xids[3].severity``)
    and the reason; unknown keys are rejected.
    """
    diagnosis_path, health_path = policy_file(DIAGNOSIS_FILE, path_dir), policy_file(HEALTH_FILE, path_dir)
    return DiagnosisPolicy(
        diagnosis=validate(DiagnosisThresholds, read_yaml(diagnosis_path), diagnosis_path),
        health=validate(HealthPolicy, read_yaml(health_path), health_path),
    )


# --- helpers ---------------------------------------------------------------------------------------


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


def xid_info(code: int, *, policy: DiagnosisPolicy) -> XidInfo:
    """Meaning, action and severity of an Xid from the health policy; unknown codes get ``unknown_xid``."""
    return policy.health.xid_info(code)


# --- diagnosis -------------------------------------------------------------------------------------


class Finding(BaseModel):
    """One thing that applies to the GPU. ``code`` is a FindingCode; ``action`` is the NVS action, if any."""

    model_config = ConfigDict(frozen=True)

    code: FindingCode
    severity: Severity
    explanation: str
    next_step: str
    action: str | None = None
    xid: int | None = None


class Verdict(BaseModel):
    """The diagnosis of one GPU or pod.

    ``code`` is the highest-priority decisive finding (or ``unknown``); ``severity`` is the worst of the
    verdict and every finding; ``explanation`` cites the numbers behind ``code``; ``findings`` lists
    everything that applied, in priority order; ``missing`` names the signals (DCGM field without prefix,
    e.g. ``SM_ACTIVE``) that were not reported although a rule needed them — a stand-in was used or the
    rule was skipped.
    """

    model_config = ConfigDict(frozen=True)

    code: VerdictCode
    severity: Severity
    explanation: str
    next_step: str
    findings: list[Finding] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)


_new_finding = trusted(Finding)
_new_verdict = trusted(Verdict)


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def _num(value: float) -> str:
    return f"{value:g}"


def _busy_percent(s: GpuSignals) -> tuple[float, str] | None:
    """Busy time in percent and how it was measured: GPU_UTIL, else GR_ENGINE_ACTIVE × 100 (rule 5)."""
    if s.gpu_util_percent is not None:
        return s.gpu_util_percent, f"GPU util {s.gpu_util_percent:.0f}%"
    if s.gr_engine_active is not None:
        where = f"MIG {s.mig_profile} instance: " if s.mig_profile else ""
        return s.gr_engine_active * 100, f"GR engine active {_pct(s.gr_engine_active)} ({where}GPU_UTIL not reported)"
    return None


def _busy_and_gr(busy_text: str, s: GpuSignals) -> str:
    """The busy text plus GR_ENGINE_ACTIVE when that was not already the busy measure."""
    if s.gpu_util_percent is not None and s.gr_engine_active is not None:
        return f"{busy_text}, GR engine active {_pct(s.gr_engine_active)}"
    return busy_text


def health_findings(signals: GpuSignals, policy: DiagnosisPolicy) -> list[Finding]:
    """Only the health findings of ``diagnose`` (Xids, memory-error counters): cheap on a healthy GPU, for
    callers that judge health on every GPU of a cluster (the controller) and need no workload verdict."""
    return _health_findings(signals, policy.health)


def _health_findings(s: GpuSignals, h: HealthPolicy) -> list[Finding]:
    out: list[Finding] = []
    ecc, rows, failure = s.ecc_dbe_volatile, s.uncorrectable_remapped_rows, s.row_remap_failure
    if (
        not s.xid_counts
        and not s.last_xid
        and (ecc is None or ecc <= h.ecc_dbe_volatile.above)
        and (rows is None or rows <= h.uncorrectable_remapped_rows.above)
        and (failure is None or failure <= h.row_remap_failure.above)
    ):
        return out  # NB: the healthy case, decided without building the tables below (runs per GPU)
    # Xids: the windowed counts when reported, plus the sticky last-Xid gauge.
    seen: dict[int, tuple[int | None, bool]] = {}  # code → (count in window, stale)
    for xid, n in sorted((s.xid_counts or {}).items()):
        if xid and n > 0:
            seen[xid] = (n, False)
    if s.last_xid and s.last_xid not in seen:
        seen[s.last_xid] = (None, s.xid_counts is not None)
    for xid, (count, stale) in seen.items():
        info = h.xid_info(xid)
        if stale:
            severity = h.stale_last_xid_severity
            when = "is the last Xid but not in the current Xid window: it happened earlier"
        else:
            severity = h.severity_of(info.severity, info.action)
            when = f"×{count} in the current window" if count is not None else "is the last Xid reported"
        fatal = info.severity == "fatal" and not stale
        out.append(
            Finding(
                code=FindingCode.UNHEALTHY if fatal else FindingCode.XID,
                severity=severity,
                explanation=f"Xid {xid} ({info.meaning}) {when}: {info.severity}, action {info.action}",
                next_step=h.actions[info.action],
                action=info.action,
                xid=xid,
            )
        )
    counters = (
        (s.ecc_dbe_volatile, h.ecc_dbe_volatile, "volatile ECC double-bit errors (since the last driver reload)"),
        (s.uncorrectable_remapped_rows, h.uncorrectable_remapped_rows, "uncorrectable remapped rows"),
        (s.row_remap_failure, h.row_remap_failure, "row-remap failure flag (Xid 64 class)"),
    )
    for value, rule, what in counters:
        if value is not None and value > rule.above:
            out.append(
                Finding(
                    code=FindingCode.UNHEALTHY if rule.severity == "fatal" else FindingCode.MEMORY_ERRORS,
                    severity=h.severity_of(rule.severity, rule.action),
                    explanation=f"{what} {value} (> {_num(rule.above)}): {rule.severity}, action {rule.action}",
                    next_step=h.actions[rule.action],
                    action=rule.action,
                )
            )
    return out


def _conditions(s: GpuSignals) -> str:
    parts = []
    if s.sm_clock_mhz is not None:
        parts.append(f"SM clock {s.sm_clock_mhz:.0f} MHz")
    if s.gpu_temp_c is not None:
        parts.append(f"GPU {s.gpu_temp_c:.0f} °C")
    if s.memory_temp_c:
        parts.append(f"memory {s.memory_temp_c:.0f} °C")
    if s.power_watts is not None:
        limit = f" of {s.power_limit_watts:.0f} W" if s.power_limit_watts else ""
        parts.append(f"{s.power_watts:.0f} W{limit}")
    return "; " + ", ".join(parts) if parts else ""


def _thermal_findings(s: GpuSignals, d: DiagnosisThresholds) -> list[Finding]:
    out: list[Finding] = []
    if s.clock_event_reasons is not None:
        names = decode_clock_events(s.clock_event_reasons)
        bad = [n for n in names if n in d.clock_events.abnormal]
        if bad:
            normal = [n for n in names if n not in bad]
            also = f" (also {', '.join(normal)}, normal)" if normal else ""
            text = d.verdicts[VerdictCode.THROTTLED]
            out.append(
                Finding(
                    code=FindingCode.THROTTLED,
                    severity=text.severity,
                    explanation=(
                        f"clock-event reasons 0x{s.clock_event_reasons:X}: {', '.join(bad)}{also}{_conditions(s)}"
                    ),
                    next_step=text.next_step,
                )
            )
    t = d.temperature
    hot = []
    if s.gpu_temp_c is not None and s.gpu_temp_c >= t.gpu_c:
        hot.append(f"GPU {s.gpu_temp_c:.0f} °C (≥ {_num(t.gpu_c)} °C)")
    # NB: MEMORY_TEMP is 0 on GPUs without a memory sensor (DE #460): 0 means "not reported".
    if s.memory_temp_c and s.memory_temp_c >= t.memory_c:
        hot.append(f"memory {s.memory_temp_c:.0f} °C (≥ {_num(t.memory_c)} °C)")
    if hot:
        out.append(
            Finding(
                code=FindingCode.TEMPERATURE,
                severity=t.severity,
                explanation=f"running hot: {', '.join(hot)}",
                next_step=t.next_step,
            )
        )
    return out


def _workload(s: GpuSignals, d: DiagnosisThresholds) -> tuple[list[tuple[FindingCode, str]], list[str], str]:
    """Workload findings as (code, explanation), the missing signals, and the explanation if undecided."""
    missing: list[str] = []
    if s.gpu_util_percent is None:
        missing.append(GPU_UTIL)
    busy = _busy_percent(s)
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
        activity = ", ".join(([busy[1]] if busy else []) + ([f"SM active {_pct(sm)}"] if sm is not None else []))
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
                        f"{activity} but {s.fb_used_mib:.0f} MiB of GPU memory held (≥ {_num(held)} MiB): "
                        "memory is allocated while nothing runs",
                    )
                ],
                missing,
                "",
            )
        return [(FindingCode.IDLE, f"{activity}, {s.fb_used_mib:.0f} MiB used: nothing is running")], missing, ""

    found: list[tuple[FindingCode, str]] = []
    effective, ineffective = d.sm_active.effective, d.sm_active.ineffective
    # NB: SMs hold warps only while the compute engine is busy, so SM_ACTIVE ≤ GR_ENGINE_ACTIVE: without
    # SM_ACTIVE, GR_ENGINE_ACTIVE is an upper bound that can still rule verdicts out (policy switch).
    bound = None
    if sm is None:
        missing.append(SM_ACTIVE)
        if d.sm_active.gr_engine_upper_bound and s.gr_engine_active is not None:
            bound = s.gr_engine_active
    no_sm = "SM_ACTIVE not reported (profiling metrics disabled)"

    # under-filled (rule 1)
    undecided = False
    if busy is not None and busy[0] >= d.busy.gpu_util_percent:
        if sm is not None and sm < ineffective:
            found.append(
                (
                    FindingCode.UNDER_FILLED,
                    f"{busy[1]} but SM active {_pct(sm)} (< {_pct(ineffective)}): "
                    "kernels are resident but the SMs are mostly empty",
                )
            )
        elif sm is None and bound is not None and bound < ineffective:
            found.append(
                (
                    FindingCode.UNDER_FILLED,
                    f"{busy[1]} but GR engine active {_pct(bound)} (< {_pct(ineffective)}); {no_sm}, "
                    "and it cannot exceed GR engine activity: the SMs are mostly empty",
                )
            )
        elif sm is None:
            undecided = True

    # memory-bound (rule 3)
    if s.dram_active is None:
        missing.append(DRAM_ACTIVE)
    elif s.dram_active >= d.dram_active.bandwidth_bound:
        peak = d.dram_active.practical_peak
        state = "saturated" if s.dram_active >= peak else "bandwidth-bound"
        found.append(
            (
                FindingCode.MEMORY_BOUND,
                f"DRAM active {_pct(s.dram_active)} (≥ {_pct(d.dram_active.bandwidth_bound)}; about "
                f"{_pct(peak)} is the practical peak): memory interface {state}",
            )
        )

    if sm is not None:
        if sm >= ineffective:
            if s.sm_occupancy is None:
                missing.append(SM_OCCUPANCY)
            elif s.sm_occupancy < d.sm_occupancy.low:
                found.append(
                    (
                        FindingCode.LOW_OCCUPANCY,
                        f"SM active {_pct(sm)} but SM occupancy {_pct(s.sm_occupancy)} "
                        f"(< {_pct(d.sm_occupancy.low)}): few warps resident per SM",
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
                        f"SM active {_pct(sm)} (≥ {_pct(effective)}) but tensor pipe active {_pct(tensor)} "
                        f"(< {_pct(d.tensor_active.low)}): the work runs on CUDA cores, not tensor cores",
                    )
                )
            tensor_text = f", tensor {_pct(tensor)}" if tensor is not None else ""
            found.append(
                (
                    FindingCode.COMPUTE_BOUND,
                    f"SM active {_pct(sm)} (≥ {_pct(effective)}){tensor_text}: the SMs are doing real work",
                )
            )
        elif not found:
            where = f"{busy[1]}, " if busy else ""
            found.append(
                (
                    FindingCode.MODERATE,
                    f"{where}SM active {_pct(sm)} (< {_pct(effective)}): partly loaded, headroom left",
                )
            )
    elif bound is not None and busy is not None and bound < effective and not undecided and not found:
        found.append(
            (
                FindingCode.MODERATE,
                f"{_busy_and_gr(busy[1], s)}; "
                f"{no_sm}, but SM activity cannot exceed GR engine activity (< {_pct(effective)}): "
                "not compute-bound, headroom left",
            )
        )

    undecided_text = ""
    if not found:
        shown = busy[1] if busy else "activity unknown"
        if busy:
            shown = _busy_and_gr(shown, s)
        undecided_text = f"{shown}; {no_sm}: cannot tell busy from effective"
    return found, missing, undecided_text


def diagnose(signals: GpuSignals, policy: DiagnosisPolicy) -> Verdict:
    """Classify one GPU (or a pod's combined GPUs). Pure: same inputs, same verdict."""
    d = policy.diagnosis
    findings = _health_findings(signals, policy.health) + _thermal_findings(signals, d)
    workload, missing, undecided = _workload(signals, d)
    verdicts = d.verdicts
    # NB: records built as trusted (codes, the policy's own severities and texts): this runs per GPU and per
    # pod (15,000 times for a 10,000-GPU `top pods`).
    for finding_code, text_ in workload:
        text = verdicts[_VERDICT_OF[finding_code]]
        findings.append(
            _new_finding(
                {"code": finding_code, "severity": text.severity, "explanation": text_, "next_step": text.next_step}
            )
        )
    if len(findings) > 1:
        # Priority order; within one code the worst first (e.g. Xid 94 "warning" before Xid 63 "info").
        findings.sort(key=lambda f: (_FINDING_RANK[f.code], -_SEVERITY_RANK[f.severity]))

    decisive = None
    for finding in findings:
        if finding.code in _VERDICT_OF:
            decisive = finding
            break
    code: VerdictCode
    if decisive is None:
        code = VerdictCode.UNKNOWN
        explanation = undecided or "no rule applied"
        next_step = verdicts[code].next_step
        severity = verdicts[code].severity
    else:
        code = _VERDICT_OF[decisive.code]
        explanation, next_step, severity = decisive.explanation, decisive.next_step, decisive.severity
        if SM_ACTIVE in missing and any(c == decisive.code for c, _ in workload) and SM_ACTIVE not in explanation:
            explanation += " (SM_ACTIVE not reported: the under-filled and effective-use checks were skipped)"
    rank = _SEVERITY_RANK[severity]
    for finding in findings:
        if _SEVERITY_RANK[finding.severity] > rank:
            severity, rank = finding.severity, _SEVERITY_RANK[finding.severity]
    return _new_verdict(
        {
            "code": code,
            "severity": severity,
            "explanation": explanation,
            "next_step": next_step,
            "findings": findings,
            "missing": list(dict.fromkeys(missing)) if len(missing) > 1 else missing,
        }
    )


# --- serving verdicts ----------------------------------------------------------------------------------


class ServingSignals(BaseModel):
    """An inference server pod's own signals (catalogue metrics; ``None`` = not reported)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    queue_depth: float | None = None  # requests waiting
    batch_size: float | None = None  # requests running
    kv_cache_usage_percent: float | None = None
    preemptions_per_second: float | None = None


class ServingVerdict(BaseModel):
    """What the server's own signals say, beside the GPU verdict. ``explanation`` cites the numbers."""

    model_config = ConfigDict(frozen=True)

    code: ServingCode
    severity: Severity
    explanation: str
    next_step: str


def diagnose_serving(serving: ServingSignals, gpu: GpuSignals, policy: DiagnosisPolicy) -> ServingVerdict | None:
    """The serving verdict, or None when the signals say nothing wrong (or are not reported). Pure.

    Rules, first that applies: KV cache at or above ``kv_cache_full_percent`` with requests preempted →
    ``kv-cache-full`` (preemption recomputes work: throughput drops before the queue shows it); requests
    waiting while SM_ACTIVE is below ``sm_active.ineffective`` → ``batch-limited`` (the server caps its batch
    below what the GPU could hold); requests waiting on a GPU at or above ``sm_active.effective`` →
    ``saturated``; KV cache at or above ``kv_cache_high_percent`` → ``kv-cache-high``. A queue with the KV cache
    full is not ``batch-limited``: the cache, not the batch cap, holds requests back.
    """
    t = policy.diagnosis.serving
    kv = serving.kv_cache_usage_percent
    preempted = serving.preemptions_per_second
    queued = serving.queue_depth is not None and serving.queue_depth >= t.queue_depth and serving.queue_depth > 0
    sm = gpu.sm_active
    sm_t = policy.diagnosis.sm_active

    def verdict(code: ServingCode, explanation: str) -> ServingVerdict:
        text = t.verdicts[code]
        return ServingVerdict(code=code, severity=text.severity, explanation=explanation, next_step=text.next_step)

    if kv is not None and kv >= t.kv_cache_full_percent and preempted is not None and preempted > 0:
        return verdict(
            ServingCode.KV_CACHE_FULL,
            f"KV cache {kv:.0f}% full: {preempted:.2g} requests/s preempted and recomputed",
        )
    kv_full = kv is not None and kv >= t.kv_cache_full_percent
    if queued and sm is not None and sm < sm_t.ineffective and not kv_full:
        batch = f" at batch {serving.batch_size:.0f}" if serving.batch_size is not None else ""
        return verdict(
            ServingCode.BATCH_LIMITED,
            f"{serving.queue_depth:.0f} requests wait{batch} while SMs are {_pct(sm)} active",
        )
    if queued and sm is not None and sm >= sm_t.effective:
        return verdict(ServingCode.SATURATED, f"{serving.queue_depth:.0f} requests wait on a GPU {_pct(sm)} SM-active")
    if kv is not None and kv >= t.kv_cache_high_percent:
        return verdict(ServingCode.KV_CACHE_HIGH, f"KV cache {kv:.0f}% full")
    return None
