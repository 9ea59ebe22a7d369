"""How ``gpuscale top`` writes one value in a table cell: percentages, memory, power, verdict codes; "-" for a
value not reported. Cells are ASCII (plus "…"), so one ``len()`` measures them (table.py)."""

from __future__ import annotations

from gpuscale.metrics.diagnosis import DiagnosisPolicy, GpuSignals, Severity, Verdict, VerdictCode
from gpuscale.metrics.rollups import NodeStatus

NONE = "-"


def ratio_pct(ratio: float | None) -> str:
    return NONE if ratio is None else f"{ratio * 100:.0f}%"


def pct(percent: float | None) -> str:
    return NONE if percent is None else f"{percent:.0f}%"


def mib(value: float | None) -> str:
    if value is None:
        return NONE
    if value < 1024:
        return f"{value:.0f}Mi"
    gib = value / 1024
    return f"{gib:.1f}Gi" if gib < 10 else f"{gib:.0f}Gi"


def watts(value: float | None) -> str:
    if value is None:
        return NONE
    return f"{value:.0f}W" if value < 10_000 else f"{value / 1000:.1f}kW"


def celsius(c: float | None) -> str:
    return NONE if c is None else f"{c:.0f}C"


def number(value: float | None, digits: int = 0) -> str:
    return NONE if value is None else f"{value:.{digits}f}"


def mem_share(s: GpuSignals) -> str:
    if s.fb_used_mib is None or s.fb_free_mib is None or s.fb_used_mib + s.fb_free_mib <= 0:
        return NONE
    return f"{100 * s.fb_used_mib / (s.fb_used_mib + s.fb_free_mib):.0f}%"


def throttle(clock_events: list[str], policy: DiagnosisPolicy) -> str:
    shown = [n for n in clock_events if n not in policy.diagnosis.clock_events.idle]
    return ",".join(shown) or NONE


def xids(s: GpuSignals) -> str:
    codes = sorted(s.xid_counts or {})
    if s.last_xid and s.last_xid not in codes:
        codes.insert(0, s.last_xid)
    return ",".join(str(c) for c in codes) or NONE


def findings(v: Verdict) -> str:
    others = [f.code.value for f in v.findings if f.code.value != v.code.value]
    return ",".join(dict.fromkeys(others)) or NONE


SHORT_CODES: dict[VerdictCode, str] = {
    VerdictCode.UNHEALTHY: "UH",
    VerdictCode.THROTTLED: "TH",
    VerdictCode.IDLE: "ID",
    VerdictCode.IDLE_HOLDING_MEMORY: "IM",
    VerdictCode.UNDER_FILLED: "UF",
    VerdictCode.MEMORY_BOUND: "MB",
    VerdictCode.PRECISION: "PR",
    VerdictCode.LOW_OCCUPANCY: "LO",
    VerdictCode.COMPUTE_BOUND: "CB",
    VerdictCode.MODERATE: "MO",
    VerdictCode.UNKNOWN: "UK",
}

SEVERITY_STYLES: dict[Severity, str | None] = {
    Severity.CRITICAL: "bold red",
    Severity.WARNING: "yellow",
    Severity.INFO: None,
    Severity.OK: "green",
}


def seconds(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}s"


def verdict_counts(n: NodeStatus) -> str:
    return " ".join(f"{SHORT_CODES[code]}{count}" for code, count in n.verdict_counts.items()) or NONE
