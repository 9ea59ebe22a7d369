"""The serving verdict: an inference server's own signals (queue, batch, KV cache) beside the GPU's."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gpuscale.metrics.diagnosis.diagnosis_policy import DiagnosisPolicy, ServingCode
from gpuscale.metrics.diagnosis.gpu_signals import GpuSignals
from gpuscale.metrics.diagnosis.verdict_codes import Severity
from gpuscale.metrics.diagnosis.verdicts import percent_text


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
            f"{serving.queue_depth:.0f} requests wait{batch} while SMs are {percent_text(sm)} active",
        )
    if queued and sm is not None and sm >= sm_t.effective:
        return verdict(
            ServingCode.SATURATED, f"{serving.queue_depth:.0f} requests wait on a GPU {percent_text(sm)} SM-active"
        )
    if kv is not None and kv >= t.kv_cache_high_percent:
        return verdict(ServingCode.KV_CACHE_HIGH, f"KV cache {kv:.0f}% full")
    return None
