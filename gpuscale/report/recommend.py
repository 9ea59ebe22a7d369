"""Per-workload right-sizing: the statistics of one workload → a typed ``Workload`` with its recommendations.

Pure. Each recommendation carries the numbers it rests on (``evidence``) and a severity. The rules, in the
order they are tried (docs/report.md has the table):

* **not enough data** below ``min_history`` or ``min_samples``: the numbers are shown, nothing is recommended.
* **fewer GPUs per pod**: GPUs needed = max(the most GPUs of one pod busy at once, the GPUs its peak memory
  needs: ceil(peak FB of the pod × (1 + margin) / one GPU's memory)); recommended when below the request.
  A count is a peak, not a p90: a pod cannot borrow a GPU for the minute it needs a second one.
* **busy** (target compute share ≥ ``busy_share``): no smaller GPU, MIG slice or time-slicing — never a
  downsizing for a busy workload.
* **MIG profile**: for a 1-GPU need on a product with MIG profiles, the smallest profile whose memory holds
  peak FB × (1 + margin) and whose compute share holds the target compute share (p90 + margin).
* **smaller GPU**: the cheapest priced product whose memory holds the peak (+ margin) and whose throughput
  (``tflops``) holds the target compute share × this product's throughput.
* **time-slicing**: when 1 / target compute share leaves room for ``time_slicing_min_pods`` pods on one GPU.
* **scale to zero**: a Deployment/StatefulSet whose GPUs were all idle for ``min_idle_stretch`` in one stretch.
* **diagnosis**: a verdict other than idle/compute-bound/moderate that holds in ≥ 25 % of the workload's hours
  ("tensor cores idle: check precision", under-filled, memory-bound, …), with the diagnosis' explanation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuscale.report.one_gpu import HOURS_PER_MONTH, OneGpuShape, one_gpu_alternatives, rounded
from gpuscale.report.policy import Product, ReportPolicy
from gpuscale.report.schema import CostFigures, Recommendation, SignalStats, VerdictShare, Workload
from gpuscale.report.stats import confidence, estimate
from gpuscale.report.usage import SIGNALS, WorkloadUsage, longest_run
from gpuscale.report.verdict_hours import BUSY_VERDICTS, diagnosis_recommendations, verdicts_over_time

DAY_SECONDS = 86400.0
_UNITS = {"fb_used_mib": "mib", "gpus_busy": "gpus"}


def workload_report(
    usage: WorkloadUsage,
    *,
    policy: ReportPolicy,
    steps: int,
    step_seconds: float,
    requested_per_pod: float | None,
    pod_count: int,
    cost: CostFigures,
    cold_starts: list[float] | None = None,
) -> Workload:
    rs = policy.rightsizing
    held_any = usage.held_any(steps)
    idx, samples, history_seconds = _history_span(usage, held_any, step_seconds)
    conf = confidence(
        history_seconds=history_seconds, samples=samples, step_seconds=usage.sample_seconds or step_seconds
    )
    product = policy.gpus.product(usage.product)
    signals = _signal_stats(usage, policy=policy, product=product, conf=conf)

    # Observed requests when kube-state-metrics gave none: the most GPUs one pod held at once.
    held_peak = max((held for held, _, _ in usage.peaks()), default=0.0)
    requests_source = "kube-state-metrics" if requested_per_pod is not None else "observed"
    requested = requested_per_pod if requested_per_pod is not None else held_peak

    busy_total = usage.busy_total(steps)
    idle_steps = held_any & (busy_total == 0)
    longest_idle = longest_run(idle_steps) * step_seconds
    # NB: safety decisions read the exact, unweighted high quantile (never the recency-weighted target), and one
    # story per workload: hours the diagnosis calls busy make the workload busy too.
    safe_share = usage.safety_share(rs.safety_percentile)
    verdicts = verdicts_over_time(usage, policy)
    busy_hours = sum(v.hours for v in verdicts if v.code in BUSY_VERDICTS)
    busy = (safe_share is not None and safe_share >= rs.busy_share) or busy_hours > 0
    status = "ok" if history_seconds >= rs.min_history and samples >= rs.min_samples else "not-enough-data"
    if status == "not-enough-data":
        recs = [_not_enough_data(policy, history_seconds=history_seconds, samples=samples, conf=conf)]
    else:
        recs = _recommend(usage, policy=policy, product=product, signals=signals, requested=requested,
                          share_target=safe_share, busy=busy, longest_idle=longest_idle, pod_count=pod_count,
                          conf=conf, verdicts=verdicts, busy_hours=busy_hours, steps=steps,
                          step_seconds=step_seconds, cold_starts=cold_starts or [])  # fmt: skip
    recs, rule = choose_action(recs)
    return Workload(
        namespace=usage.key.namespace,
        kind=usage.key.kind,
        name=usage.key.name,
        owner_source=usage.owner_source,
        pods=pod_count,
        product=usage.product,
        pools=sorted(usage.pools),
        gpus_requested_per_pod=rounded(requested) if requested else None,
        requests_source=requests_source,  # type: ignore[arg-type]
        history_seconds=history_seconds,
        samples=samples,
        coverage=rounded(idx.size / (idx[-1] - idx[0] + 1), 4) if idx.size else 1.0,
        confidence=rounded(conf, 3),
        status=status,  # type: ignore[arg-type]
        busy=busy,
        activity_signal=usage.activity_source,
        signals=signals,
        activity_histogram=_activity_bands(usage),
        cost=cost,
        longest_idle_seconds=longest_idle,
        verdicts=verdicts,
        recommendations=recs,
        rule=rule,
    )


# What one action is taken per workload: the safe downsizing that frees the most money a month; on a tie (or with no
# price), the one that changes least, in this order. A workload told nothing else keeps its request.
ACTIONS = ("fewer-gpus", "replicas", "scale-to-zero", "mig-profile", "time-slicing", "smaller-gpu")
ACTION_RULE = (
    "the downsizing that saves the most a month (on a tie or without a price: fewer GPUs, replicas, "
    "scale-to-zero, MIG profile, time-slicing, smaller GPU, in that order); every one listed fits the exact p99 "
    "and the peak memory"
)


def choose_action(recs: list[Recommendation]) -> tuple[list[Recommendation], str]:
    """The recommendations in the order they are read: the one recommended, its alternatives (largest saving first)
    and the notes (diagnoses); and the rule that chose it."""
    actions = [r for r in recs if r.kind in ACTIONS]
    notes = [r for r in recs if r.kind not in ACTIONS]

    def rank(r: Recommendation) -> tuple[float, int]:
        return (-(r.monthly_saving or 0.0), ACTIONS.index(r.kind))

    if actions:
        ordered = sorted(actions, key=rank)
        chosen = [ordered[0].model_copy(update={"role": "recommended"})]
        chosen += [r.model_copy(update={"role": "alternative"}) for r in ordered[1:]]
        rule = ACTION_RULE
        notes = [r for r in notes if r.kind != "keep" or r.short == "keep 1 warm"]
    else:
        first = next((r for r in notes if r.kind in ("not-enough-data", "keep")), None)
        if first is None:
            return recs, ""
        chosen = [first.model_copy(update={"role": "recommended"})]
        notes = [r for r in notes if r is not first]
        if first.kind == "not-enough-data":
            rule = "too little history to recommend a change"
        elif "busy" in first.short:
            rule = "busy (its p99 or its hourly diagnosis): a busy workload is never downsized"
        elif first.short == "keep 1 warm":
            rule = "scale-to-zero's cold starts would exceed the latency budget"
        else:
            rule = "no downsizing fits the exact p99 and the peak memory"
    return chosen + [r.model_copy(update={"role": "note"}) for r in notes], rule


def _history_span(usage: WorkloadUsage, held_any: np.ndarray, step_seconds: float) -> tuple[np.ndarray, int, float]:
    """The steps the workload held GPUs, its sample count, and the seconds from its first to its last."""
    idx = np.flatnonzero(held_any)
    samples = int(idx.size) if usage.samples is None else usage.samples
    history_seconds = float((idx[-1] - idx[0] + 1) * step_seconds) if idx.size else 0.0
    return idx, samples, history_seconds


def _signal_stats(
    usage: WorkloadUsage, *, policy: ReportPolicy, product: Product | None, conf: float
) -> dict[str, SignalStats]:
    """Each signal's percentiles and recommendation bounds, from its recency-weighted histogram."""
    rs = policy.rightsizing
    margin = rs.margin_fraction
    percentiles = {
        "target_p": rs.target_percentile,
        "lower_p": rs.lower_bound_percentile,
        "upper_p": rs.upper_bound_percentile,
    }
    signals: dict[str, SignalStats] = {}
    for name, hist in usage.histograms.items():
        cap = 100.0 if name in SIGNALS and SIGNALS[name][2].ratio is None else None
        if name == "fb_used_mib" and product is not None:
            cap = product.memory_mib
        est = estimate(hist, conf=conf, margin=margin, cap=cap, **percentiles)
        if est is None:
            continue
        exact = {q: usage.quantile(name, q) for q in (0.5, 0.95, 0.99)}
        signals[name] = SignalStats(
            unit=_UNITS.get(name, "percent"),  # type: ignore[arg-type]
            p50=rounded(exact[0.5]) if exact[0.5] is not None else None,
            p95=rounded(exact[0.95]) if exact[0.95] is not None else None,
            p99=rounded(exact[0.99]) if exact[0.99] is not None else None,
            max=rounded(est.maximum),
            trend_p50=rounded(est.p50),
            trend_p90=rounded(est.p90),
            trend_p95=rounded(est.p95),
            target=rounded(est.target),
            lower_bound=rounded(est.lower),
            upper_bound=rounded(est.upper) if math.isfinite(est.upper) else 1e300,
            samples=est.samples,
        )
    return signals


def _not_enough_data(policy: ReportPolicy, *, history_seconds: float, samples: int, conf: float) -> Recommendation:
    """**not enough data**: the numbers are shown, nothing is recommended."""
    rs = policy.rightsizing
    return Recommendation(
        kind="not-enough-data",
        severity="info",
        short=f"not enough data ({history_seconds / 3600:.1f} h)",
        summary=(
            f"not enough data: {history_seconds / 3600:.1f} h and {samples} samples "
            f"(need {rs.min_history / 3600:g} h and {rs.min_samples})"
        ),
        evidence={"history_hours": rounded(history_seconds / 3600), "samples": samples, "confidence": rounded(conf, 3)},
    )


def _keep(
    policy: ReportPolicy,
    *,
    busy: bool,
    activity: SignalStats | None,
    safe_share: float | None,
    busy_hours: int,
) -> Recommendation:
    """**keep**: no rule but the diagnosis' applied."""
    rs = policy.rightsizing
    return Recommendation(
        kind="keep",
        severity="ok",
        short="keep" + (" (busy)" if busy else ""),
        summary="keep the request: " + ("busy, no downsizing" if busy else "no smaller shape fits the measured use"),
        evidence={
            "activity_target_percent": activity.target if activity else None,
            f"activity_p{rs.safety_percentile * 100:g}_percent": rounded(safe_share * 100)
            if safe_share is not None
            else None,
            "busy_verdict_hours": busy_hours,
            "busy": str(busy),
        },
    )


def _activity_bands(usage: WorkloadUsage) -> list[float]:
    """Shares of recency-weighted GPU-time per 10 % band, from the activity histogram's 0.5-point buckets."""
    weights = usage.histograms["activity_percent"].weights
    bands = np.array([weights[20 * k : 20 * k + 20].sum() for k in range(9)] + [weights[180:].sum()])
    return [rounded(b / bands.sum(), 4) for b in bands] if bands.sum() else [0.0] * 10


def _recommend(
    usage: WorkloadUsage,
    *,
    policy: ReportPolicy,
    product: Product | None,
    signals: dict[str, SignalStats],
    requested: float,
    share_target: float | None,
    busy: bool,
    longest_idle: float,
    pod_count: int,
    conf: float,
    verdicts: list[VerdictShare],
    busy_hours: int = 0,
    steps: int = 0,
    step_seconds: float = 0.0,
    cold_starts: list[float] | None = None,
) -> list[Recommendation]:
    """The rules of the module docstring, in its order; each rule is one function below. **keep** when no rule
    but the diagnosis' applied."""
    price = policy.prices.per_gpu_hour(product.name if product else usage.product) or policy.prices.per_gpu_hour(
        usage.product
    )
    margin = policy.rightsizing.margin_fraction
    avg_pods = _average_pods(usage, steps)
    need = _gpus_needed(usage, product=product, margin=margin)
    out: list[Recommendation] = []
    if requested and need.gpus < requested:
        out.append(
            _fewer_gpus(need, policy=policy, signals=signals, requested=requested, price=price, avg_pods=avg_pods)
        )
    fb = signals.get("fb_used_mib")
    # NB: a busy workload is never downsized; a smaller shape only replaces one whole GPU.
    if not busy and share_target is not None and fb is not None and need.gpus == 1:
        shape = OneGpuShape(
            product=product,
            price=price,
            requested=requested,
            avg_pods=avg_pods,
            margin=margin,
            peak_gpu_fb=fb.max,
            fit_fb=fb.max * (1 + margin),
            share_safe=share_target,  # the exact safety-percentile share (see workload_report)
            share_target=min(1.0, share_target * (1 + margin)),  # what a smaller shape must hold: that plus margin
        )
        out += one_gpu_alternatives(shape, policy=policy)
    out += _replicas(usage, policy=policy, requested=requested, price=price, busy_hours=busy_hours, steps=steps)
    out += _scale_to_zero(usage, policy=policy, steps=steps, step_seconds=step_seconds, price=price,
                          requested=requested, longest_idle=longest_idle, cold_starts=cold_starts or [])  # fmt: skip
    out += diagnosis_recommendations(verdicts, policy)
    if not any(r.kind != "diagnosis" for r in out):
        activity = signals.get("activity_percent")
        out.append(_keep(policy, busy=busy, activity=activity, safe_share=share_target, busy_hours=busy_hours))
    return out


@dataclass(frozen=True, slots=True)
class _GpusNeeded:
    """GPUs one pod needs: the most busy at once, or what its peak memory (+ margin) takes, at least 1."""

    gpus: int
    peak_busy: float
    peak_pod_fb_mib: float
    gpu_memory_mib: float | None
    for_memory: int


def _gpus_needed(usage: WorkloadUsage, *, product: Product | None, margin: float) -> _GpusNeeded:
    peak_busy = max((busy for _, busy, _ in usage.peaks()), default=0.0)
    peak_pod_fb = max((fb for _, _, fb in usage.peaks()), default=0.0)
    gpu_memory = product.memory_mib if product else None
    for_memory = math.ceil(peak_pod_fb * (1 + margin) / gpu_memory) if gpu_memory else 1
    return _GpusNeeded(max(1, math.ceil(peak_busy), for_memory), peak_busy, peak_pod_fb, gpu_memory, for_memory)


def _fewer_gpus(
    need: _GpusNeeded,
    *,
    policy: ReportPolicy,
    signals: dict[str, SignalStats],
    requested: float,
    price: float | None,
    avg_pods: float,
) -> Recommendation:
    """**fewer GPUs per pod**, for a need below the request."""
    rs = policy.rightsizing
    needed = need.gpus
    freed = requested - needed
    saving = freed * avg_pods * price * HOURS_PER_MONTH if price is not None else None
    return Recommendation(
        kind="fewer-gpus",
        severity="critical" if freed / requested >= rs.fewer_gpus_critical_share else "warning",
        short=f"fewer-gpus {requested:g}→{needed}",
        summary=f"request {needed} GPU{'s' if needed > 1 else ''} per pod instead of {requested:g}: "
        f"at most {need.peak_busy:g} busy at once, peak memory {need.peak_pod_fb_mib / 1024:.1f} GiB per pod",
        evidence={
            "gpus_requested": requested,
            "gpus_busy_max": need.peak_busy,
            "gpus_busy_p95": signals["gpus_busy"].p95 if "gpus_busy" in signals else None,
            "pod_fb_peak_mib": rounded(need.peak_pod_fb_mib),
            "gpu_memory_mib": need.gpu_memory_mib,
            "gpus_for_memory": need.for_memory,
            "margin": rs.margin_fraction,
            "recommended": needed,
            "average_pods": rounded(avg_pods),
            "gpu_hours_freed_per_month": rounded(freed * avg_pods * HOURS_PER_MONTH),
        },
        monthly_saving=rounded(saving) if saving is not None else None,
    )


def _scale_to_zero(
    usage: WorkloadUsage,
    *,
    policy: ReportPolicy,
    steps: int,
    step_seconds: float,
    price: float | None,
    requested: float,
    longest_idle: float,
    cold_starts: list[float] | None = None,
) -> list[Recommendation]:
    """Scale-to-zero with its price: the wake-ups it would have caused in the window (idle stretches of at least
    ``scale_down_after`` that ended in work), each costing a cold start. Within the latency budget: recommended,
    with the wake-ups per day, the added latency and the GPU-hours it frees; beyond it: keep one replica warm."""
    stz = policy.rightsizing.scale_to_zero
    if usage.key.kind not in stz.kinds or longest_idle < stz.min_idle_stretch or not steps:
        return []
    held = usage.held_any(steps)
    idle = held & (usage.busy_total(steps) == 0)
    padded = np.concatenate(([False], idle, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    starts, ends = edges[::2], edges[1::2]  # idle runs [start, end)
    after = max(1, math.ceil(stz.scale_down_after / step_seconds))
    long_runs = [(a, b) for a, b in zip(starts, ends, strict=True) if b - a >= after]
    wakeups = sum(1 for _, b in long_runs if b < steps and held[b])
    days = max(float(held.sum()) * step_seconds / DAY_SECONDS, 1e-9)
    per_day = wakeups / days
    # NB: the measured cold start (p95 over the workload's pods, kube-state-metrics) when known, else the policy's
    cold_start = float(np.quantile(cold_starts, 0.95, method="higher")) if cold_starts else stz.cold_start
    cold_source = f"measured (p95 of {len(cold_starts)} pods)" if cold_starts else "rightsizing.yaml"
    latency = per_day * cold_start
    zero_hours = sum(b - a - after for a, b in long_runs) * step_seconds / 3600.0  # scaled to zero this long
    gpus = max(requested, 1.0)
    monthly_hours = zero_hours / days * (HOURS_PER_MONTH / 24.0) * gpus
    evidence: dict[str, float | int | str | None] = {
        "longest_idle_hours": rounded(longest_idle / 3600),
        "min_idle_stretch_hours": stz.min_idle_stretch / 3600,
        "wakeups_per_day": rounded(per_day),
        "cold_start_seconds": rounded(cold_start),
        "cold_start_source": cold_source,
        "added_latency_seconds_per_day": rounded(latency),
        "latency_budget_seconds_per_day": stz.latency_budget_per_day,
        "gpu_hours_freed_per_month": rounded(monthly_hours),
    }
    if latency > stz.latency_budget_per_day:
        return [
            Recommendation(
                kind="keep",
                severity="info",
                short="keep 1 warm",
                summary=f"keep one replica warm: scaling to zero after {stz.scale_down_after / 60:g} min idle would "
                f"wake it {per_day:.1f} times a day, {cold_start:.0f} s each ({latency / 60:.1f} min/day of cold "
                f"start, over the {stz.latency_budget_per_day / 60:g} min budget)",
                evidence=evidence,
            )
        ]
    saving = monthly_hours * price if price is not None else None
    return [
        Recommendation(
            kind="scale-to-zero",
            severity="warning" if longest_idle >= 4 * stz.min_idle_stretch else "info",
            short=f"scale-to-zero ({per_day:.1f} wake-ups/day)",
            summary=f"scale-to-zero: idle up to {longest_idle / 3600:.1f} h in one stretch; after "
            f"{stz.scale_down_after / 60:g} min idle it would wake {per_day:.1f} times a day, adding "
            f"{cold_start:.0f} s each ({latency:.0f} s/day, within the {stz.latency_budget_per_day:g} s budget), "
            f"and free {monthly_hours:.0f} GPU-hours a month",
            evidence=evidence,
            monthly_saving=rounded(saving) if saving is not None else None,
        )
    ]


def _replicas(
    usage: WorkloadUsage, *, policy: ReportPolicy, requested: float, price: float | None, busy_hours: int, steps: int
) -> list[Recommendation]:
    """How many pods carry a pooled workload's demand: the exact p99 over time of its activity summed over all its
    GPUs, plus the margin, at the target utilisation of each pod's GPUs (never for hours diagnosed busy)."""
    rs = policy.rightsizing
    rule = rs.replicas
    if usage.key.kind not in rule.kinds or usage.demand is None or busy_hours or not requested:
        return []
    alive = usage.alive(steps)
    live = alive > 0
    if not live.any():
        return []
    current = float(alive[live].mean())
    if current < rule.min_pods:
        return []
    demand = usage.demand[live]
    p_demand = float(np.quantile(demand, rs.safety_percentile, method="higher"))
    per_pod = requested * rule.target_utilisation
    needed = max(1, math.ceil(p_demand * (1 + rs.margin_fraction) / per_pod - 1e-9))
    if needed >= math.floor(current):
        return []
    freed = (current - needed) * requested
    saving = freed * price * HOURS_PER_MONTH if price is not None else None
    pct = f"p{rs.safety_percentile * 100:g}"
    return [
        Recommendation(
            kind="replicas",
            severity="critical" if needed <= current / 2 else "warning",
            short=f"replicas {current:.0f}→{needed}",
            summary=f"{needed} pods would carry the demand of {current:.1f} on average: its {pct} is "
            f"{p_demand:.2f} GPUs busy (mean {float(demand.mean()):.2f}), +{rs.margin_fraction:.0%} at "
            f"{rule.target_utilisation:.0%} of {requested:g} GPU{'s' if requested != 1 else ''} per pod",
            evidence={
                "current_pods_mean": rounded(current),
                "current_pods_peak": int(alive.max()),
                "recommended": needed,
                f"demand_{pct}_gpus": rounded(p_demand, 3),
                "demand_mean_gpus": rounded(float(demand.mean()), 3),
                "gpus_per_pod": requested,
                "target_utilisation": rule.target_utilisation,
                "margin": rs.margin_fraction,
                "gpu_hours_freed_per_month": rounded(freed * HOURS_PER_MONTH),
            },
            monthly_saving=rounded(saving) if saving is not None else None,
        )
    ]


def _average_pods(usage: WorkloadUsage, steps: int) -> float:
    """Mean number of pods alive while the workload held GPUs (a cost multiplier)."""
    alive = np.asarray(usage.alive(steps))
    return float(alive[alive > 0].mean()) if alive.size and (alive > 0).any() else 0.0
