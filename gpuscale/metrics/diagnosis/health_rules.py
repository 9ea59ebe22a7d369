"""The health and thermal rules: Xids, memory-error counters, abnormal clock events, temperatures → findings.

Fatal health findings decide the verdict (``unhealthy``); the rest only raise its severity.
"""

from __future__ import annotations

from gpuscale.metrics.diagnosis.diagnosis_policy import DiagnosisPolicy, DiagnosisThresholds, HealthPolicy
from gpuscale.metrics.diagnosis.gpu_signals import GpuSignals, decode_clock_events
from gpuscale.metrics.diagnosis.verdict_codes import FindingCode, VerdictCode
from gpuscale.metrics.diagnosis.verdicts import Finding, number_text


def health_findings(signals: GpuSignals, policy: DiagnosisPolicy) -> list[Finding]:
    """Only the health findings of ``diagnose`` (Xids, memory-error counters): cheap on a healthy GPU, for
    callers that judge health on every GPU of a cluster (the controller) and need no workload verdict."""
    return health_policy_findings(signals, policy.health)


def health_policy_findings(s: GpuSignals, h: HealthPolicy) -> list[Finding]:
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
                    explanation=f"{what} {value} (> {number_text(rule.above)}): {rule.severity}, action {rule.action}",
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


def thermal_findings(s: GpuSignals, d: DiagnosisThresholds) -> list[Finding]:
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
        hot.append(f"GPU {s.gpu_temp_c:.0f} °C (≥ {number_text(t.gpu_c)} °C)")
    # NB: MEMORY_TEMP is 0 on GPUs without a memory sensor (DE #460): 0 means "not reported".
    if s.memory_temp_c and s.memory_temp_c >= t.memory_c:
        hot.append(f"memory {s.memory_temp_c:.0f} °C (≥ {number_text(t.memory_c)} °C)")
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
