"""``build_summary_report``: the report from per-series summaries the TSDB computed (``--mode summary``). Pure.

Each (GPU, pod) series brings, per chunk, the count of grid samples, their mean, maximum and p25/p50/p75/p90/p95, per
field; each pod its peaks (GPUs held and busy at once, memory summed over its GPUs). Combined here:

Exact (the same numbers raw mode gives on the same grid, up to float rounding):
  GPU-hours allocated / active / idle / unallocated and their cost (Σ count, Σ mean × count), per pool,
  namespace and workload; maxima of every signal; GPUs busy and held at once per pod (peaks); peak memory;
  so "fewer GPUs per pod" and the MIG profile's memory fit.
Approximate:
  p50/p90/p95 across chunks and GPUs: each chunk's distribution stands in as six points (its p25, p50 and p75
  with weight 0.25 each, p90 0.15, p95 0.05, max 0.05): exact at p50/p90/p95 within one series-chunk, and each
  chunk's mass only ever moved up to the next point, so the combined percentiles bound raw mode's from above;
  the target compute share and the MIG/smaller-GPU/time-slicing fits that rest on it; history length,
  confidence and idle stretches to a chunk (scale-to-zero sees only whole idle chunks); verdicts over time
  from chunk means (not hourly); the activity bands (from the same four points); Xid incidents per chunk
  (a change within the chunk); ECC DBE from ``increase()`` (which extrapolates at the window's edges); throttling
  minutes exact, but which abnormal bit it was is not told apart and first/last seen are to a chunk.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from gpuscale.metrics.history import SUMMARY_STATS, PodRef, SeriesSummary, SummaryHistory
from gpuscale.report.build import workloads_of
from gpuscale.report.costs import CostAccumulator, find_idle_nodes, price_lookup
from gpuscale.report.policy import ReportPolicy
from gpuscale.report.schema import Group, Incident, Report, TimelinePoint, Window
from gpuscale.report.usage import SIGNALS, PodSteps, WorkloadKey, WorkloadUsage, new_usage, owner_of

EXACT_SUMMARY = [
    "GPU-hours (allocated, active, idle, unallocated) and their cost",
    "maxima of every signal; GPUs held and busy at once per pod; peak memory per pod",
    "the safety share every downsizing must fit: the maximum activity (no samples are kept for a p99)",
]
APPROXIMATE_SUMMARY = [
    "p50/p90/p95 and targets: each chunk's distribution as its p25/p50/p75/p90/p95/max (an upper bound)",
    "history length, confidence, idle stretches and verdicts to a chunk; Xid per chunk; ECC from increase()",
    "throttling: minutes exact; first/last seen to a chunk, the abnormal bit not told apart",
]
_QUANTILE_WEIGHTS = (("p25", 0.25), ("p50", 0.25), ("p75", 0.25), ("p90", 0.15), ("p95", 0.05), ("max", 0.05))
_ACTIVITY_ORDER = ("sm_active", "gr_engine_active", "gpu_util_percent")
_SIGNAL_NAMES = {"sm_active": "SM_ACTIVE", "gr_engine_active": "GR_ENGINE_ACTIVE", "gpu_util_percent": "GPU_UTIL"}


def _activity(fields: dict[str, SeriesSummary], chunks: int) -> dict[str, np.ndarray]:
    """Per chunk, the activity's stats (0–1) from SM_ACTIVE, else GR_ENGINE_ACTIVE, else GPU_UTIL / 100."""
    out = {k: np.full(chunks, np.nan) for k in SUMMARY_STATS}
    chosen = np.zeros(chunks, dtype=bool)
    for name in _ACTIVITY_ORDER:
        s = fields.get(name)
        if s is None:
            continue
        take = ~chosen & (np.nan_to_num(s.stats["count"]) > 0)
        scale = 0.01 if name == "gpu_util_percent" else 1.0
        for k in out:
            v = s.stats[k] if k == "count" else np.clip(s.stats[k] * scale, 0.0, 1.0)
            out[k] = np.where(take, v, out[k])
        chosen |= take
    return out


def build_summary_report(h: SummaryHistory, *, policy: ReportPolicy, generated_at: float) -> Report:
    rs = policy.rightsizing
    chunks, chunk = h.chunks, h.chunk_seconds
    steps_per_chunk = chunk / h.step_seconds
    decay = np.exp2((h.start + (np.arange(chunks) + 0.5) * chunk - h.end) / rs.half_life)
    fold = _fold_series(h, policy=policy, decay=decay)
    for key, usage in fold.usages.items():
        usage.samples = int(fold.workload_samples[key].sum())
        for p in usage.pods.values():
            held = p.held > 0
            # GPUs busy at once: a chunk's peak stands for its samples (an upper bound of the distribution)
            usage.histograms["gpus_busy"].add(p.busy[held], weights=(decay * steps_per_chunk)[held])
    workloads = workloads_of(
        fold.usages,
        pods=fold.pods,
        requests=h.requests,
        startups=h.startups,
        policy=policy,
        steps=chunks,
        step_seconds=chunk,
        cost_step_seconds=h.step_seconds,
    )
    price_of = price_lookup(policy)
    idle_nodes = find_idle_nodes(fold.nodes, node_pools=h.node_pools, policy=policy)
    incidents = _throttle_incidents(h, policy) + _counter_incidents(h, policy)
    return Report(
        generated_at=generated_at,
        source=h.source,
        mode="summary",
        exact=EXACT_SUMMARY,
        approximate=APPROXIMATE_SUMMARY,
        window=Window(start=h.start, end=h.end, step_seconds=h.step_seconds),
        currency=policy.prices.currency,
        gaps=list(h.gaps),
        workloads=workloads,
        pools=[Group(name=k, cost=v.figures(price_of)) for k, v in sorted(fold.pools.items())],
        namespaces=[Group(name=k, cost=v.figures(price_of)) for k, v in sorted(fold.namespaces.items())],
        total=fold.total.figures(price_of),
        idle_nodes=idle_nodes,
        incidents=sorted(incidents, key=lambda i: (i.first_seen, i.node, i.gpu)),
        timeline=[
            TimelinePoint(
                t=h.start + k * chunk,
                allocated_gpus=round(float(fold.alloc_t[k] / steps_per_chunk), 3),
                active_gpus=round(float(fold.active_t[k] / steps_per_chunk), 3),
            )
            for k in range(chunks)
        ],
    )


@dataclass(slots=True)
class _SummaryFold:
    """What the (GPU, node, pod) series groups add up to: GPU-time per pool, namespace, node and in total, the
    timeline's GPUs allocated and active per chunk, and each workload's usage and samples per chunk."""

    total: CostAccumulator
    alloc_t: np.ndarray
    active_t: np.ndarray
    pods: list[PodRef] = field(default_factory=list)
    pod_ids: dict[PodRef, int] = field(default_factory=dict)
    usages: dict[WorkloadKey, WorkloadUsage] = field(default_factory=dict)
    pools: dict[str, CostAccumulator] = field(default_factory=dict)
    namespaces: dict[str, CostAccumulator] = field(default_factory=dict)
    nodes: dict[str, CostAccumulator] = field(default_factory=dict)
    workload_samples: dict[WorkloadKey, np.ndarray] = field(default_factory=dict)


def _fold_series(h: SummaryHistory, *, policy: ReportPolicy, decay: np.ndarray) -> _SummaryFold:
    """Each (GPU, node, pod) group of series into the GPU-time figures and its workload's usage."""
    chunks = h.chunks
    groups: dict[tuple[str, str, PodRef | None], dict[str, SeriesSummary]] = defaultdict(dict)
    for s in h.series:
        groups[(s.gpu, s.node, s.pod)][s.field] = s
    fold = _SummaryFold(CostAccumulator(h.step_seconds), np.zeros(chunks), np.zeros(chunks))
    for (gpu, node, pod), fields in groups.items():
        any_field = next(iter(fields.values()))
        product = any_field.product
        act = _activity(fields, chunks)
        count = np.nan_to_num(act["count"])
        active = np.nan_to_num(act["avg"]) * count
        pool = h.node_pools.get(node, node)
        held = pod is not None
        fig = {"allocated": count.sum() if held else 0.0, "active": active.sum() if held else 0.0}
        fig["unallocated"] = 0.0 if held else count.sum()
        for acc in (fold.pools.setdefault(pool, CostAccumulator(h.step_seconds)), fold.total):
            acc.add(gpu, product, **fig)
        fold.nodes.setdefault(node, CostAccumulator(h.step_seconds)).add(gpu, product, **fig)
        if pod is None:
            continue
        fold.alloc_t += count
        fold.active_t += active
        fold.namespaces.setdefault(pod.namespace, CostAccumulator(h.step_seconds)).add(
            gpu, product, allocated=fig["allocated"], active=fig["active"], unallocated=0.0
        )
        usage = _pod_usage(fold, h, pod, count, policy=policy)
        _add_series(usage, fields, act, count, decay, product or "unknown", pool, gpu)
    return fold


def _pod_usage(
    fold: _SummaryFold, h: SummaryHistory, pod: PodRef, count: np.ndarray, *, policy: ReportPolicy
) -> WorkloadUsage:
    """The usage of the pod's workload (new on its first pod), with the pod's peaks added on its first series."""
    chunks = h.chunks
    owner = owner_of(h, pod)
    key = WorkloadKey(pod.namespace, owner.kind, owner.name)
    usage = fold.usages.get(key)
    if usage is None:
        rs = policy.rightsizing
        usage = fold.usages[key] = new_usage(key, owner.source, half_life_seconds=rs.half_life, reference=h.end)
        usage.sample_seconds = h.step_seconds
        fold.workload_samples[key] = np.zeros(chunks)
    fold.workload_samples[key] = np.maximum(fold.workload_samples[key], count)
    if pod not in fold.pod_ids:
        fold.pod_ids[pod] = len(fold.pods)
        fold.pods.append(pod)
        peaks = h.pods.get(pod)
        zeros = np.zeros(chunks, np.float32)
        usage.pods[fold.pod_ids[pod]] = PodSteps(
            (peaks.held_max if peaks else zeros).astype(np.float32),
            (peaks.busy_max if peaks else zeros).astype(np.float32),
            (peaks.fb_max_mib if peaks else zeros).astype(np.float32),
        )
    return usage


def _counter_incidents(h: SummaryHistory, policy: ReportPolicy) -> list[Incident]:
    """One incident per chunk an Xid changed or ECC double-bit errors increased in, in ``h.incidents`` order."""
    incidents: list[Incident] = []
    chunk = h.chunk_seconds
    for i in h.incidents:
        if i.kind == "throttle":
            continue
        if i.kind == "xid":
            info = policy.diagnosis.health.xid_info(int(i.value))
            meaning = f"{info.meaning} ({info.severity}, action {info.action})"
            value = str(int(i.value))
        else:
            meaning, value = "uncorrectable (double-bit) ECC errors (increase over the chunk)", f"+{int(i.value)}"
        incidents.append(
            Incident(
                kind=i.kind,  # type: ignore[arg-type]
                node=i.node,
                gpu=i.gpu,
                pod=f"{i.pod.namespace}/{i.pod.name}" if i.pod else None,
                first_seen=h.start + i.chunk * chunk,
                last_seen=h.start + (i.chunk + 1) * chunk,
                count=i.count if i.kind == "xid" else int(i.value),
                value=value,
                meaning=meaning,
            )
        )
    return incidents


def _throttle_incidents(h: SummaryHistory, policy: ReportPolicy) -> list[Incident]:
    """One incident per GPU with at least ``throttle_incident_min`` of abnormal clock-event steps in total."""
    steps: dict[tuple[str, str], list] = defaultdict(list)
    for i in h.incidents:
        if i.kind == "throttle":
            steps[(i.node, i.gpu)].append(i)
    abnormal = "|".join(policy.diagnosis.diagnosis.clock_events.abnormal)
    out = []
    for (node, gpu), found in steps.items():
        total = sum(i.count for i in found)
        if total * h.step_seconds < policy.rightsizing.throttle_incident_min:
            continue
        first, last = min(i.chunk for i in found), max(i.chunk for i in found)
        pod = found[0].pod
        out.append(
            Incident(
                kind="throttle",
                node=node,
                gpu=gpu,
                pod=f"{pod.namespace}/{pod.name}" if pod else None,
                first_seen=h.start + first * h.chunk_seconds,
                last_seen=h.start + (last + 1) * h.chunk_seconds,
                count=total,
                value=f"one of {abnormal}",
                meaning=f"{total * h.step_seconds / 60:.0f} min of abnormal clock-event reasons",
            )
        )
    return out


def _add_series(
    usage: WorkloadUsage,
    fields: dict[str, SeriesSummary],
    act: dict[str, np.ndarray],
    count: np.ndarray,
    decay: np.ndarray,
    product: str,
    pool: str,
    gpu: str,
) -> None:
    for name, (fld, scale, _) in SIGNALS.items():
        stats = act if name == "activity_percent" else (fields[fld].stats if fld in fields else None)
        if stats is None:
            continue
        c = count if name == "activity_percent" else np.nan_to_num(stats["count"])
        values = np.stack([stats[q] * scale for q, _ in _QUANTILE_WEIGHTS])
        weights = np.stack([c * w * decay for _, w in _QUANTILE_WEIGHTS])
        usage.histograms[name].add(values, weights=weights)
    usage.products[product] += int(count.sum())
    usage.pools.add(pool)
    usage.gpus.add(gpu)
    source = next((f for f in _ACTIVITY_ORDER if f in fields), "none")
    usage.activity_sources[
        {"sm_active": "SM_ACTIVE", "gr_engine_active": "GR_ENGINE_ACTIVE"}.get(source, "GPU_UTIL")
    ] += 1
    usage.allocated_steps_by_product[product] += float(count.sum())
    usage.active_steps_by_product[product] += float((np.nan_to_num(act["avg"]) * count).sum())
    for fld in fields:
        s = fields[fld].stats
        c = np.nan_to_num(s["count"])
        if fld not in usage.block_sums:
            usage.block_sums[fld] = np.zeros(len(count))
            usage.block_counts[fld] = np.zeros(len(count))
        usage.block_sums[fld] += np.nan_to_num(s["avg"]) * c
        usage.block_counts[fld] += c
