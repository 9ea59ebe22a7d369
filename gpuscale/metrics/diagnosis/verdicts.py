"""The diagnosis' records (``Finding``, ``Verdict``) and the text helpers every rule cites its numbers with."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.metrics.diagnosis.gpu_signals import GpuSignals
from gpuscale.metrics.diagnosis.trusted_records import trusted
from gpuscale.metrics.diagnosis.verdict_codes import FindingCode, Severity, VerdictCode


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


new_finding = trusted(Finding)
new_verdict = trusted(Verdict)


def percent_text(ratio: float) -> str:
    return f"{ratio * 100:.0f}%"


def number_text(value: float) -> str:
    return f"{value:g}"


def busy_reading(s: GpuSignals) -> tuple[float, str] | None:
    """Busy time in percent and how it was measured: GPU_UTIL, else GR_ENGINE_ACTIVE × 100 (rule 5)."""
    if s.gpu_util_percent is not None:
        return s.gpu_util_percent, f"GPU util {s.gpu_util_percent:.0f}%"
    if s.gr_engine_active is not None:
        where = f"MIG {s.mig_profile} instance: " if s.mig_profile else ""
        return (
            s.gr_engine_active * 100,
            f"GR engine active {percent_text(s.gr_engine_active)} ({where}GPU_UTIL not reported)",
        )
    return None


def busy_and_gr_text(busy_text: str, s: GpuSignals) -> str:
    """The busy text plus GR_ENGINE_ACTIVE when that was not already the busy measure."""
    if s.gpu_util_percent is not None and s.gr_engine_active is not None:
        return f"{busy_text}, GR engine active {percent_text(s.gr_engine_active)}"
    return busy_text
