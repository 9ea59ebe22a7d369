"""The diagnosis' codes: severities, verdict codes and finding codes, each in priority order."""

from __future__ import annotations

from enum import StrEnum


class Severity(StrEnum):
    """How urgent a verdict or finding is, in increasing order."""

    OK = "ok"
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return SEVERITY_RANK[self]


SEVERITY_RANK = {s: i for i, s in enumerate(Severity)}


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


FINDING_RANK = {c: i for i, c in enumerate(FindingCode)}
# The findings that can decide a verdict, and the verdict each decides.
VERDICT_OF_FINDING = {f: VerdictCode(f.value) for f in FindingCode if f.value in set(VerdictCode)}
