"""``build_summary_report``: the report from what the TSDB computed over raw samples (``--mode summary``). Pure.

In: per (GPU, pod) series and chunk, each signal's sample count, sum, maximum and quantiles at a set of levels; per
pod owner and grid step, GPUs held and busy, activity summed and pods alive; per owner and verdict block, each
field's sum and count (sources/summary_fetch.py). Combined here:

Exact (the same numbers raw mode gives, sample for sample):
  GPU-hours allocated / active / idle / unallocated and their cost (samples × the scrape interval, Σ sum),
  per pool, namespace and workload; maxima; the quantiles of a workload held by one series in one chunk (the
  default ``--chunk`` is the window); replica counts (the demand summed per step by the TSDB); idle stretches,
  wake-ups and history spans (per step); verdicts over time (the same hourly means).
Bounded from above (never below the exact figure):
  a quantile pooled over several series or chunks (report/quantile_bounds.py: within about a point with the dense
  levels asked for the activity); GPUs held and busy at once per pod (each of its GPUs counted once if it was
  busy at all in a chunk) and its peak memory (the sum of its GPUs' peaks).
Approximate:
  the recency-weighted trend (each chunk's distribution from its quantile levels); Xid incidents per chunk.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from gpuscale.metrics.history import PodRef, SeriesSummary, SummaryHistory
from gpuscale.report.build import unowned_gap, workloads_of
from gpuscale.report.costs import CostAccumulator, find_idle_nodes, price_lookup
from gpuscale.report.policy import ReportPolicy
from gpuscale.report.quantile_bounds import Part, pooled_quantile_bound
from gpuscale.report.schema import Group, Incident, Report, TimelinePoint, Window
from gpuscale.report.usage import SAFETY, SIGNALS, WorkloadKey, WorkloadUsage, new_usage, owner_of

EXACT_SUMMARY = [
    "GPU-hours (allocated, active, idle, unallocated) and their cost: samples present × the scrape interval",
    "maxima of every signal; p50/p95/p99 of a workload with one series in one chunk (the TSDB's, over raw samples)",
    "replica counts, idle stretches, wake-ups and verdicts over time: the TSDB's sums per step and hour",
]
APPROXIMATE_SUMMARY = [
    "p50/p95/p99 pooled over several series or chunks: a bound from above (never below the exact quantile)",
    "GPUs held and busy at once per pod and its peak memory: bounds from above (per chunk, per GPU)",
    "the recency-weighted trend and target: from each chunk's quantile levels; Xid incidents to a chunk",
]
_ACTIVITY_ORDER = ("sm_active", "gr_engine_active", "gpu_util_percent")
_ACTIVITY_SCALE = {"sm_active": 100.0, "gr_engine_active": 100.0, "gpu_util_percent": 1.0}  # → percent
_SOURCE_NAMES = {"sm_active": "SM_ACTIVE", "gr_engine_active": "GR_ENGINE_ACTIVE", "gpu_util_percent": "GPU_UTIL"}
SHOWN_QUANTILES = (0.5, 0.95, 0.99)


@dataclass(slots=True)
class _Fold:
    total: CostAccumulator
    pods: list[PodRef] = field(default_factory=list)
    pod_ids: dict[PodRef, int] = field(default_factory=dict)
    usages: dict[WorkloadKey, WorkloadUsage] = field(default_factory=dict)
    parts: dict[WorkloadKey, dict[str, list[Part]]] = field(default_factory=dict)
    peaks: dict[PodRef, list[float]] = field(default_factory=dict)  # held, busy, FB MiB
    pools: dict[str, CostAccumulator] = field(default_factory=dict)
    namespaces: dict[str, CostAccumulator] = field(default_factory=dict)
    nodes: dict[str, CostAccumulator] = field(default_factory=dict)


def build_summary_report(h: SummaryHistory, *, policy: ReportPolicy, generated_at: float) -> Report:
    rs = policy.rightsizing
    decay = np.exp2((h.start + (np.arange(h.chunks) + 0.5) * h.chunk_seconds - h.end) / rs.half_life)
    fold = _fold_series(h, policy=policy, decay=decay)
    gaps = list(h.gaps)
    _add_owner_steps(h, fold, gaps)
    workloads = workloads_of(
        fold.usages,
        pods=fold.pods,
        requests=h.requests,
        startups=h.startups,
        policy=policy,
        steps=h.steps,
        step_seconds=h.step_seconds,
        cost_step_seconds=h.sample_seconds,
    )
    price_of = price_lookup(policy)
    return Report(
        generated_at=generated_at,
        source=h.source,
        mode="summary",
        exact=EXACT_SUMMARY,
        approximate=APPROXIMATE_SUMMARY,
        window=Window(start=h.start, end=h.end, step_seconds=h.step_seconds),
        currency=policy.prices.currency,
        gaps=gaps,
        workloads=workloads,
        pools=[Group(name=k, cost=v.figures(price_of)) for k, v in sorted(fold.pools.items())],
        namespaces=[Group(name=k, cost=v.figures(price_of)) for k, v in sorted(fold.namespaces.items())],
        total=fold.total.figures(price_of),
        idle_nodes=find_idle_nodes(fold.nodes, node_pools=h.node_pools, policy=policy),
        incidents=sorted(_incidents(h, policy), key=lambda i: (i.first_seen, i.node, i.gpu)),
        timeline=_timeline(h),
    )


def _activity(fields: dict[str, SeriesSummary]) -> list[tuple[str, SeriesSummary, np.ndarray]]:
    """Per chunk, which field the activity comes from (SM_ACTIVE, else GR_ENGINE_ACTIVE, else GPU_UTIL / 100):
    (field, its summary, the chunks it is chosen for)."""
    out = []
    chosen: np.ndarray | None = None
    for name in _ACTIVITY_ORDER:
        s = fields.get(name)
        if s is None:
            continue
        has = np.nan_to_num(s.count) > 0
        take = has if chosen is None else has & ~chosen
        chosen = take if chosen is None else chosen | take
        if take.any():
            out.append((name, s, take))
    return out


def _parts(s: SeriesSummary, take: np.ndarray, scale: float) -> list[Part]:
    assert s.quantiles is not None
    levels = np.asarray(s.levels)
    return [
        Part(int(s.count[k]), levels, s.quantiles[:, k] * scale, float(s.maximum[k]) * scale)
        for k in np.flatnonzero(take & (np.nan_to_num(s.count) > 0))
    ]


def _trend(usage: WorkloadUsage, signal: str, parts: list[Part], weights: list[float]):
    """Each part's distribution into the trend histogram: the mass between two levels at the upper level's value,
    above the last at the maximum (an upper bound of the distribution, weighted by the chunk's recency)."""
    for p, w in zip(parts, weights, strict=True):
        mass = np.diff(np.concatenate(([0.0], p.levels, [1.0])))
        values = np.append(p.quantiles, p.maximum)
        ok = ~np.isnan(values)
        usage.histograms[signal].add(values[ok], weights=(mass * p.count * w)[ok])


def _fold_series(h: SummaryHistory, *, policy: ReportPolicy, decay: np.ndarray) -> _Fold:
    """Two passes over the series grouped per GPU and pod: the fleet's costs in the series' order, then workload by
    workload everything else, each workload's quantiles bounded as soon as its last GPU is in and its parts dropped:
    the parts (a few hundred bytes per GPU and signal) of one workload are held at a time, never the fleet's."""
    # NB: a list per GPU, its fields' dict only while the GPU is folded: a dict each is ~0.3 KB more per GPU
    groups: dict[tuple[str, str, PodRef | None], list[SeriesSummary]] = defaultdict(list)
    for s in h.series:
        groups[(s.gpu, s.node, s.pod)].append(s)
    fold = _Fold(CostAccumulator(h.sample_seconds))
    held: dict[WorkloadKey, list[tuple[tuple[str, str, PodRef], float, float]]] = {}
    for (gpu, node, pod), series in groups.items():
        fields = {s.field: s for s in series}
        product = next(iter(fields.values())).product
        samples, active = _samples_and_active(_activity(fields))
        pool = h.node_pools.get(node, node)
        fig = {
            "allocated": samples if pod is not None else 0.0,
            "active": active if pod is not None else 0.0,
            "unallocated": 0.0 if pod is not None else samples,
        }
        for acc in (fold.pools.setdefault(pool, CostAccumulator(h.sample_seconds)), fold.total):
            acc.add(gpu, product, **fig)
        fold.nodes.setdefault(node, CostAccumulator(h.sample_seconds)).add(gpu, product, **fig)
        if pod is None or not samples:
            continue
        fold.namespaces.setdefault(pod.namespace, CostAccumulator(h.sample_seconds)).add(gpu, product, **fig)
        owner = owner_of(h, pod)
        held.setdefault(WorkloadKey(pod.namespace, owner.kind, owner.name), []).append(
            ((gpu, node, pod), samples, active)
        )
    for key, gpus in held.items():
        for (gpu, node, pod), samples, active in gpus:
            _add_gpu(
                fold,
                h,
                {s.field: s for s in groups.pop((gpu, node, pod))},
                gpu,
                node,
                pod,
                samples,
                active,
                policy,
                decay,
            )
        _bound_quantiles(fold, key, policy)
    return fold


def _samples_and_active(chosen: list[tuple[str, SeriesSummary, np.ndarray]]) -> tuple[float, float]:
    samples = sum(float(np.nansum(s.count[take])) for _, s, take in chosen)
    active = sum(
        float(np.nansum(np.clip(s.total[take] * _ACTIVITY_SCALE[f] / 100.0, 0.0, s.count[take])))
        for f, s, take in chosen
    )
    return samples, active


def _add_gpu(
    fold: _Fold,
    h: SummaryHistory,
    fields: dict[str, SeriesSummary],
    gpu: str,
    node: str,
    pod: PodRef,
    samples: float,
    active: float,
    policy: ReportPolicy,
    decay: np.ndarray,
) -> None:
    """One GPU held by one pod (with samples) into its workload's accumulators."""
    idle = policy.diagnosis.diagnosis.idle
    product = next(iter(fields.values())).product
    pool = h.node_pools.get(node, node)
    usage, key = _usage_of(fold, h, pod, policy=policy)
    _add_series(fold, usage, key, fields, _activity(fields), decay, product or "unknown", pool, gpu)
    usage.allocated_steps_by_product[product or "unknown"] += samples
    usage.active_steps_by_product[product or "unknown"] += active
    # NB: GPUs held / busy at once: each of the pod's GPUs with a sample (busy: over an idle threshold) in the
    # window; a bound from above (two GPUs held one after the other count as two)
    busy = any(
        f in fields and np.nanmax(np.append(fields[f].maximum, -np.inf)) > threshold
        for f, threshold in (
            ("gpu_util_percent", idle.busy_percent),
            ("sm_active", idle.sm_active),
            ("gr_engine_active", idle.busy_percent / 100.0),
        )
    )
    fb = fields.get("fb_used_mib")
    peak = fold.peaks.setdefault(pod, [0.0, 0.0, 0.0])
    peak[0] += 1.0
    peak[1] += 1.0 if busy else 0.0
    peak[2] += float(np.nanmax(np.append(fb.maximum, 0.0))) if fb is not None else 0.0


def _bound_quantiles(fold: _Fold, key: WorkloadKey, policy: ReportPolicy) -> None:
    """A workload's pods' peaks and its pooled quantile bounds, once every one of its GPUs is in; its parts go."""
    rs = policy.rightsizing
    usage = fold.usages[key]
    usage.pod_peaks = [tuple(fold.peaks[fold.pods[i]]) for i in usage.pod_ids]  # type: ignore[misc]
    hist = usage.histograms["gpus_busy"]
    busy = np.array([b for _, b, _ in usage.pod_peaks])
    if busy.size:
        hist.add(busy, weights=np.ones(busy.size))
    qs = {*SHOWN_QUANTILES, rs.safety_percentile}
    for signal, parts in fold.parts.pop(key).items():
        usage.quantiles[signal] = {q: v for q in qs if (v := pooled_quantile_bound(q, parts)) is not None}
        if signal == "activity_percent":  # NB: safety decisions read the sample at or above, as raw mode's
            safety = pooled_quantile_bound(rs.safety_percentile, parts, at_or_above=True)
            usage.quantiles[SAFETY] = {rs.safety_percentile: safety} if safety is not None else {}


def _usage_of(fold: _Fold, h: SummaryHistory, pod: PodRef, *, policy: ReportPolicy):
    owner = owner_of(h, pod)
    key = WorkloadKey(pod.namespace, owner.kind, owner.name)
    usage = fold.usages.get(key)
    if usage is None:
        rs = policy.rightsizing
        usage = fold.usages[key] = new_usage(key, owner.source, half_life_seconds=rs.half_life, reference=h.end)
        fold.parts[key] = defaultdict(list)
    if pod not in fold.pod_ids:
        fold.pod_ids[pod] = len(fold.pods)
        fold.pods.append(pod)
    if fold.pod_ids[pod] not in usage.pod_ids:
        usage.pod_ids.append(fold.pod_ids[pod])
    return usage, key


def _add_series(
    fold: _Fold,
    usage: WorkloadUsage,
    key: WorkloadKey,
    fields: dict[str, SeriesSummary],
    chosen: list[tuple[str, SeriesSummary, np.ndarray]],
    decay: np.ndarray,
    product: str,
    pool: str,
    gpu: str,
) -> None:
    for f, s, take in chosen:
        parts = _parts(s, take, _ACTIVITY_SCALE[f])
        fold.parts[key]["activity_percent"] += parts
        ks = np.flatnonzero(take & (np.nan_to_num(s.count) > 0))
        _trend(usage, "activity_percent", parts, [float(decay[k]) for k in ks])
        usage.activity_sources[_SOURCE_NAMES[f]] += int(np.nansum(s.count[take]))
    for name, (fld, scale, _) in SIGNALS.items():
        s = fields.get(fld) if fld else None
        if s is None:
            continue
        has = np.nan_to_num(s.count) > 0
        parts = _parts(s, has, scale)
        fold.parts[key][name] += parts
        _trend(usage, name, parts, [float(decay[k]) for k in np.flatnonzero(has)])
    usage.products[product] += int(sum(np.nansum(s.count[take]) for _, s, take in chosen))
    usage.pools.add(pool)
    usage.gpus.add(gpu)


def _add_owner_steps(h: SummaryHistory, fold: _Fold, gaps: list[str]) -> None:
    """The TSDB's per-step sums of each pod owner, into its workload (a ReplicaSet's into its Deployment), and of
    each pod kube_pod_owner did not name, into the owner the report knows for it (owner_of: the Kubernetes API's),
    else the pod itself (a bare pod)."""
    by_key = {k: u for k, u in fold.usages.items()}
    keyed = [(WorkloadKey(ns, *h.parents.get((kind, ns, name), (kind, name))), o)
             for (ns, kind, name), o in h.owner_steps.items()]  # fmt: skip
    for pod, o in h.pod_steps.items():
        owner = owner_of(h, pod)
        keyed.append((WorkloadKey(pod.namespace, owner.kind, owner.name), o))
    gaps += unowned_gap(fold.pods, h.owners)
    for key, o in keyed:
        usage = by_key.get(key)
        if usage is None:
            continue
        for attr, arr in (("held_steps", o.held), ("busy_steps", o.busy), ("alive_steps", o.alive)):
            known = getattr(usage, attr)
            setattr(usage, attr, arr.copy() if known is None else known + arr)
        usage.demand = o.demand.copy() if usage.demand is None else usage.demand + o.demand
        for fld, sums in o.block_sums.items():
            if fld not in usage.block_sums:
                usage.block_sums[fld] = np.zeros_like(sums)
                usage.block_counts[fld] = np.zeros_like(sums)
            usage.block_sums[fld] += sums
            usage.block_counts[fld] += o.block_counts.get(fld, np.zeros_like(sums))
    without = sorted(f"{k.namespace}/{k.name}" for k, u in fold.usages.items() if u.held_steps is None)
    for usage in fold.usages.values():
        if usage.held_steps is None:  # NB: no per-step sums (no kube_pod_owner): history from the samples only
            usage.samples = int(sum(usage.allocated_steps_by_product.values()))
    if without:
        shown = ", ".join(without[:5]) + (f" and {len(without) - 5} more" if len(without) > 5 else "")
        gaps.append(
            f"{len(without)} workload(s) without kube_pod_owner per step (no idle stretches, replicas or "
            f"verdicts): {shown}"
        )


def _timeline(h: SummaryHistory) -> list[TimelinePoint]:
    """GPUs allocated and active per verdict block, from the per-owner step sums."""
    steps = h.steps
    per_block = max(1, round(h.block_seconds / h.step_seconds))
    blocks = int(np.ceil(steps / per_block))
    held, active = np.zeros(steps), np.zeros(steps)
    for o in [*h.owner_steps.values(), *h.pod_steps.values()]:
        held += o.held
        active += o.demand
    pad = blocks * per_block - steps
    out = []
    for k, (a, b) in enumerate(
        zip(
            np.pad(held, (0, pad)).reshape(blocks, per_block).mean(axis=1),
            np.pad(active, (0, pad)).reshape(blocks, per_block).mean(axis=1),
            strict=True,
        )
    ):
        out.append(
            TimelinePoint(
                t=h.start + k * per_block * h.step_seconds,
                allocated_gpus=round(float(a), 3),
                active_gpus=round(float(b), 3),
            )
        )
    return out


def _incidents(h: SummaryHistory, policy: ReportPolicy) -> list[Incident]:
    """Xid changes and ECC double-bit increases per chunk; throttling per GPU with at least
    ``throttle_incident_min`` of abnormal clock-event steps."""
    out: list[Incident] = []
    chunk = h.chunk_seconds
    abnormal = "|".join(policy.diagnosis.diagnosis.clock_events.abnormal)
    for i in h.incidents:
        pod = f"{i.pod.namespace}/{i.pod.name}" if i.pod else None
        if i.kind == "throttle":
            if i.count * h.step_seconds < policy.rightsizing.throttle_incident_min:
                continue
            out.append(
                Incident(
                    kind="throttle",
                    node=i.node,
                    gpu=i.gpu,
                    pod=pod,
                    first_seen=i.first_seen or h.start,
                    last_seen=i.last_seen or h.end,
                    count=i.count,
                    value=f"one of {abnormal}",
                    meaning=f"{i.count * h.step_seconds / 60:.0f} min of abnormal clock-event reasons",
                )
            )
            continue
        if i.kind == "xid":
            info = policy.diagnosis.health.xid_info(int(i.value))
            meaning = f"{info.meaning} ({info.severity}, action {info.action})"
            value = str(int(i.value))
        else:
            meaning, value = "uncorrectable (double-bit) ECC errors (increase over the chunk)", f"+{int(i.value)}"
        out.append(
            Incident(
                kind=i.kind,  # type: ignore[arg-type]
                node=i.node,
                gpu=i.gpu,
                pod=pod,
                first_seen=h.start + i.chunk * chunk,
                last_seen=h.start + (i.chunk + 1) * chunk,
                count=i.count if i.kind == "xid" else int(i.value),
                value=value,
                meaning=meaning,
            )
        )
    return out
