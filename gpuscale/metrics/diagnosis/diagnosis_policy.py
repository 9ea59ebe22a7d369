"""The diagnosis policy: ``policies/diagnosis.yaml`` (workload thresholds and verdict texts) and
``policies/health.yaml`` (the Xid table, memory-error rules) as validated models, and ``load_policy``.

Every threshold of the diagnosis comes from here; the code only knows the order of the rules.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from gpuscale.config import read_yaml, validate
from gpuscale.metrics.diagnosis.gpu_signals import ClockEventName
from gpuscale.metrics.diagnosis.verdict_codes import Severity, VerdictCode
from gpuscale.policy_files import DIAGNOSIS_FILE, HEALTH_FILE, policy_file

Ratio = Annotated[float, Field(ge=0.0, le=1.0, strict=True)]
Percent = Annotated[float, Field(ge=0.0, le=100.0, strict=True)]
NonNegative = Annotated[float, Field(ge=0.0, strict=True)]
Text = Annotated[str, Field(min_length=1, strict=True)]
HealthSeverity = Literal["fatal", "nonfatal"]


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


def xid_info(code: int, *, policy: DiagnosisPolicy) -> XidInfo:
    """Meaning, action and severity of an Xid from the health policy; unknown codes get ``unknown_xid``."""
    return policy.health.xid_info(code)
