"""A workload's verdicts over time: each hour's mean signals diagnosed, the share of hours per verdict, and the
diagnosis recommendations a verdict holding in enough of those hours makes. Pure.

The hours diagnosed busy (``BUSY_VERDICTS``) also make a workload busy in ``recommend``: never told to shrink.
"""

from __future__ import annotations

from collections import Counter

from gpuscale.metrics.diagnosis import GpuSignals, VerdictCode, diagnose
from gpuscale.report.policy import ReportPolicy
from gpuscale.report.schema import Recommendation, VerdictShare
from gpuscale.report.usage import WorkloadUsage

_DIAGNOSIS_MIN_SHARE = 0.25
_NOT_RECOMMENDED = {VerdictCode.IDLE, VerdictCode.COMPUTE_BOUND, VerdictCode.MODERATE, VerdictCode.UNKNOWN}

# Hours whose diagnosis says the SMs are doing real work: a workload with any is busy, never told to shrink.
BUSY_VERDICTS = frozenset(
    v.value
    for v in (
        VerdictCode.COMPUTE_BOUND,
        VerdictCode.MEMORY_BOUND,
        VerdictCode.PRECISION,
        VerdictCode.LOW_OCCUPANCY,
        VerdictCode.THROTTLED,
    )
)


def verdicts_over_time(usage: WorkloadUsage, policy: ReportPolicy) -> list[VerdictShare]:
    """Diagnose each hour's mean signals; the share of hours per verdict, with one hour's explanation."""
    if not usage.block_counts:
        return []
    blocks = len(next(iter(usage.block_counts.values())))
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for b in range(blocks):
        values = {
            f: usage.block_sums[f][b] / usage.block_counts[f][b]
            for f in usage.block_counts
            if usage.block_counts[f][b] > 0
        }
        if not values:
            continue
        code, explanation = _diagnose_rounded(tuple(sorted((f, round(float(v), 3)) for f, v in values.items())), policy)
        counts[code] += 1
        examples.setdefault(code, explanation)
    total = sum(counts.values())
    return [
        VerdictShare(code=code, share=round(float(n / total), 3), hours=n, example=examples[code])
        for code, n in counts.most_common()
    ]


_MEMO: dict[tuple[int, tuple[tuple[str, float], ...]], tuple[str, str]] = {}
_POLICIES: dict[int, object] = {}  # NB: holds each policy the memo is keyed by, so its id is never reused
# NB: an entry is ~0.3 KB (its key and the verdict's code and explanation, never the Verdict with its findings:
# ~2 KB, 200 MB at the old 100,000 entries); a workload's near-identical blocks still hit
_MEMO_ENTRIES = 20_000


def _diagnose_rounded(values: tuple[tuple[str, float], ...], policy: ReportPolicy) -> tuple[str, str]:
    """(code, explanation) of ``diagnose`` of block means rounded to 0.001 (well inside every threshold's
    precision), memoised per policy: a long window gives a workload hundreds of near-identical blocks."""
    key = (id(policy.diagnosis), values)
    verdict = _MEMO.get(key)
    if verdict is None:
        if len(_MEMO) >= _MEMO_ENTRIES:
            _MEMO.clear()
            _POLICIES.clear()
        _POLICIES[id(policy.diagnosis)] = policy.diagnosis
        found = diagnose(GpuSignals.model_validate(dict(values)), policy.diagnosis)
        verdict = _MEMO[key] = (found.code.value, found.explanation)
    return verdict


def diagnosis_recommendations(verdicts: list[VerdictShare], policy: ReportPolicy) -> list[Recommendation]:
    out = []
    texts = policy.diagnosis.diagnosis.verdicts
    for v in verdicts:
        code = VerdictCode(v.code)
        if code in _NOT_RECOMMENDED or v.share < _DIAGNOSIS_MIN_SHARE:
            continue
        text = texts[code]
        severity = text.severity.value if text.severity.value != "ok" else "info"
        title = "tensor cores idle: check precision" if code is VerdictCode.PRECISION else code.value
        out.append(
            Recommendation(
                kind="diagnosis",
                severity=severity,  # type: ignore[arg-type]
                short=f"{v.code} {v.share:.0%}",
                summary=f"{title} in {v.share:.0%} of hours: {text.next_step}",
                evidence={"verdict": v.code, "share": v.share, "hours": v.hours, "example": v.example},
            )
        )
    return out
