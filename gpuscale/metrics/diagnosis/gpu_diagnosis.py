"""``diagnose``: one GPU's (or pod's) signals → one verdict, from the health, thermal and workload findings."""

from __future__ import annotations

from gpuscale.metrics.diagnosis.diagnosis_policy import DiagnosisPolicy
from gpuscale.metrics.diagnosis.gpu_signals import SM_ACTIVE, GpuSignals
from gpuscale.metrics.diagnosis.health_rules import _health_findings, _thermal_findings
from gpuscale.metrics.diagnosis.verdict_codes import _FINDING_RANK, _SEVERITY_RANK, _VERDICT_OF, VerdictCode
from gpuscale.metrics.diagnosis.verdicts import Verdict, _new_finding, _new_verdict
from gpuscale.metrics.diagnosis.workload_rules import _workload


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
