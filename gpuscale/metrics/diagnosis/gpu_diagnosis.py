"""``diagnose``: one GPU's (or pod's) signals → one verdict, from the health, thermal and workload findings."""

from __future__ import annotations

from gpuscale.metrics.diagnosis.diagnosis_policy import DiagnosisPolicy
from gpuscale.metrics.diagnosis.gpu_signals import SM_ACTIVE, GpuSignals
from gpuscale.metrics.diagnosis.health_rules import health_policy_findings, thermal_findings
from gpuscale.metrics.diagnosis.verdict_codes import FINDING_RANK, SEVERITY_RANK, VERDICT_OF_FINDING, VerdictCode
from gpuscale.metrics.diagnosis.verdicts import Verdict, new_finding, new_verdict
from gpuscale.metrics.diagnosis.workload_rules import workload_findings


def diagnose(signals: GpuSignals, policy: DiagnosisPolicy) -> Verdict:
    """Classify one GPU (or a pod's combined GPUs). Pure: same inputs, same verdict."""
    d = policy.diagnosis
    findings = health_policy_findings(signals, policy.health) + thermal_findings(signals, d)
    workload, missing, undecided = workload_findings(signals, d)
    verdicts = d.verdicts
    # NB: records built as trusted (codes, the policy's own severities and texts): this runs per GPU and per
    # pod (15,000 times for a 10,000-GPU `top pods`).
    for finding_code, text_ in workload:
        text = verdicts[VERDICT_OF_FINDING[finding_code]]
        findings.append(
            new_finding(
                {"code": finding_code, "severity": text.severity, "explanation": text_, "next_step": text.next_step}
            )
        )
    if len(findings) > 1:
        # Priority order; within one code the worst first (e.g. Xid 94 "warning" before Xid 63 "info").
        findings.sort(key=lambda f: (FINDING_RANK[f.code], -SEVERITY_RANK[f.severity]))

    decisive = None
    for finding in findings:
        if finding.code in VERDICT_OF_FINDING:
            decisive = finding
            break
    code: VerdictCode
    if decisive is None:
        code = VerdictCode.UNKNOWN
        explanation = undecided or "no rule applied"
        next_step = verdicts[code].next_step
        severity = verdicts[code].severity
    else:
        code = VERDICT_OF_FINDING[decisive.code]
        explanation, next_step, severity = decisive.explanation, decisive.next_step, decisive.severity
        if SM_ACTIVE in missing and any(c == decisive.code for c, _ in workload) and SM_ACTIVE not in explanation:
            explanation += " (SM_ACTIVE not reported: the under-filled and effective-use checks were skipped)"
    rank = SEVERITY_RANK[severity]
    for finding in findings:
        if SEVERITY_RANK[finding.severity] > rank:
            severity, rank = finding.severity, SEVERITY_RANK[finding.severity]
    return new_verdict(
        {
            "code": code,
            "severity": severity,
            "explanation": explanation,
            "next_step": next_step,
            "findings": findings,
            "missing": list(dict.fromkeys(missing)) if len(missing) > 1 else missing,
        }
    )
