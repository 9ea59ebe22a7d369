"""From a History to what each workload used: per-workload accumulators in one pass over the GPUs.

Pure. For every GPU, every pod that held it in the window contributes the steps it held it: its samples
go into the workload's decaying histograms (one per signal), its busy/held flags into per-pod step arrays
(how many of a pod's GPUs were busy at once), and its activity into GPU-hours. Nothing keeps the samples
themselves: memory is the histograms plus two float32 arrays per pod.

Definitions (docs/report.md says the same):

* **activity** of a GPU-step, 0–1: SM_ACTIVE when reported, else GR_ENGINE_ACTIVE, else GPU_UTIL / 100.
  The fallbacks are upper bounds of SM activity (a resident kernel is not a busy SM), so a downsizing
  read from them is never optimistic.
* **busy** GPU-step: above the diagnosis policy's idle thresholds (GPU_UTIL > ``idle.busy_percent`` or
  SM_ACTIVE > ``idle.sm_active`` or GR_ENGINE_ACTIVE > ``idle.busy_percent`` / 100).
* **held** GPU-step: a pod label was on the GPU's series at that step and some signal was sampled.
  Steps without any sample (gaps, DCGM blanks, NaN) count nowhere; the report states the coverage.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from gpuscale.metrics.history import GpuHistory, History, Owner, PodRef
from gpuscale.report.stats import COUNT, MEMORY_MIB, PERCENT, Buckets, DecayingHistogram

# Report signal → (history field, scale to the histogram's unit, buckets).
SIGNALS: dict[str, tuple[str, float, Buckets]] = {
    "gpu_util_percent": ("gpu_util_percent", 1.0, PERCENT),
    "sm_active_percent": ("sm_active", 100.0, PERCENT),
    "tensor_active_percent": ("tensor_active", 100.0, PERCENT),
    "dram_active_percent": ("dram_active", 100.0, PERCENT),
    "activity_percent": ("", 100.0, PERCENT),  # the activity as defined above
    "fb_used_mib": ("fb_used_mib", 1.0, MEMORY_MIB),
}


# summary mode: the activity's sample at or above the safety percentile, bounded (``WorkloadUsage.quantiles`` key)
SAFETY = "activity_percent:at_or_above"


@dataclass(frozen=True, slots=True)
class WorkloadKey:
    namespace: str
    kind: str
    name: str


@dataclass(slots=True)
class GpuActivity:
    """One GPU's derived per-step arrays."""

    activity: np.ndarray  # float32, 0–1, NaN = no sample
    busy: np.ndarray  # bool
    sampled: np.ndarray  # bool: some activity signal present
    source: str  # which field the activity mostly came from
    clean: bool = False  # every step sampled (no NaN): the fast paths need no masks
    maximum: float | None = None


def activity_of(gpu: GpuHistory, *, idle_busy_percent: float, idle_sm_active: float) -> GpuActivity:
    steps = len(gpu.pod)
    sm = gpu.values.get("sm_active")
    gr = gpu.values.get("gr_engine_active")
    util = gpu.values.get("gpu_util_percent")
    sm_nan = np.isnan(sm) if sm is not None else np.ones(steps, dtype=bool)
    clean = sm is not None and not sm_nan.any()
    maximum = float(sm.max()) if clean and sm is not None else None
    if clean and sm is not None and maximum is not None and sm.min() >= 0.0 and maximum <= 1.0:
        activity = sm  # NB: the same array: its histogram is counted once (``_add_gpu``)
    else:
        clean, maximum = False, None
        nan = np.full(steps, np.nan, dtype=np.float32)
        from_util = util / np.float32(100.0) if util is not None else nan
        fallback = np.where(~np.isnan(gr), gr, from_util) if gr is not None else from_util
        activity = np.where(~sm_nan, sm, fallback) if sm is not None else fallback
        activity = np.clip(activity, 0.0, 1.0).astype(np.float32)
    # busy: above any idle threshold, for the signals present (NaN compares False)
    busy = np.zeros(steps, dtype=bool)
    with np.errstate(invalid="ignore"):
        for values, threshold in ((util, idle_busy_percent), (sm, idle_sm_active), (gr, idle_busy_percent / 100.0)):
            if values is not None:
                busy |= values > threshold
    sampled = ~sm_nan if clean else ~np.isnan(activity)
    counts = {
        "SM_ACTIVE": int(steps - sm_nan.sum()),
        "GR_ENGINE_ACTIVE": int((~np.isnan(gr)).sum()) if gr is not None else 0,
    }
    counts["GPU_UTIL"] = int(sampled.sum()) - counts["SM_ACTIVE"] - counts["GR_ENGINE_ACTIVE"]
    source = max(counts, key=lambda k: counts[k]) if sampled.any() else "none"
    return GpuActivity(activity, busy if clean else busy & sampled, sampled, source, clean, maximum)


@dataclass(slots=True)
class PodSteps:
    held: np.ndarray  # float32[steps]: GPUs held at each step
    busy: np.ndarray  # float32[steps]: of which busy
    fb_mib: np.ndarray  # float32[steps]: FB used summed over the pod's GPUs (NaN-free)


@dataclass(slots=True)
class WorkloadUsage:
    key: WorkloadKey
    owner_source: str
    histograms: dict[str, DecayingHistogram]
    pods: dict[int, PodSteps] = field(default_factory=dict)
    products: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    pools: set[str] = field(default_factory=set)
    gpus: set[str] = field(default_factory=set)
    activity_sources: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # per hour block: summed signals and their counts, for the diagnosis over time
    block_sums: dict[str, np.ndarray] = field(default_factory=dict)
    block_counts: dict[str, np.ndarray] = field(default_factory=dict)
    allocated_steps_by_product: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    active_steps_by_product: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    # summary mode: what the TSDB counted and summed, where raw mode has samples and per-pod step arrays
    samples: int | None = None
    sample_seconds: float | None = None
    held_steps: np.ndarray | None = None  # GPUs held per step, summed over the workload's pods
    busy_steps: np.ndarray | None = None  # of which busy
    alive_steps: np.ndarray | None = None  # pods alive per step
    pod_peaks: list[tuple[float, float, float]] = field(default_factory=list)  # per pod: GPUs held, busy, FB MiB
    pod_ids: list[int] = field(default_factory=list)  # indices of its pods (raw mode: the keys of ``pods``)
    # the exact (or, pooled in summary mode, bounded from above) quantiles per signal: signal → {level: value}
    quantiles: dict[str, dict[float, float]] = field(default_factory=dict)
    # raw mode: each signal's samples (views where a GPU was held all window), for the exact, unweighted quantiles
    signal_samples: dict[str, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    # raw mode: per step, the activity summed over every GPU the workload held (GPU-equivalents in use)
    demand: np.ndarray | None = None

    @property
    def activity_samples(self) -> list[np.ndarray]:
        return self.signal_samples["activity_percent"]

    def quantile(self, signal: str, q: float) -> float | None:
        """The exact quantile ``q`` of ``signal`` over its samples (numpy's linear definition, as Prometheus'
        ``quantile_over_time``), in the signal's unit; summary mode: what the TSDB gave (a bound when pooled)."""
        known = self.quantiles.get(signal, {}).get(q)
        if known is not None:
            return known
        parts = self.signal_samples.get(signal) if isinstance(self.signal_samples, dict) else None
        if not parts:
            return None
        values = parts[0] if len(parts) == 1 else np.concatenate(parts)
        values = values[~np.isnan(values)] if values.dtype.kind == "f" else values
        if not values.size:
            return None
        scale = SIGNALS[signal][1] if signal in SIGNALS else 1.0
        out = float(np.quantile(values.astype(np.float64), q)) * scale
        self.quantiles.setdefault(signal, {})[q] = out
        return out

    def safety_share(self, q: float) -> float | None:
        """The activity (0–1) a downsizing must leave room for: the exact, unweighted ``q`` quantile of every
        GPU-step sample (the sample at or above it: ``method="higher"``); in summary mode the TSDB's quantile over
        the raw samples (a bound from above when pooled over series or chunks). None without a sample."""
        if self.activity_samples:
            parts = self.activity_samples
            values = parts[0] if len(parts) == 1 else np.concatenate(parts)
            if values.size:
                return float(np.quantile(values, q, method="higher"))
        known = self.quantiles.get(SAFETY, {}).get(q)
        if known is not None:
            return known / 100.0
        hist = self.histograms.get("activity_percent")
        if hist is not None and hist.count:
            return float(hist.maximum) / 100.0
        return None

    @property
    def product(self) -> str | None:
        return max(self.products, key=lambda p: self.products[p]) if self.products else None

    @property
    def activity_source(self) -> str:
        return max(self.activity_sources, key=lambda p: self.activity_sources[p]) if self.activity_sources else "none"

    def held_any(self, steps: int) -> np.ndarray:
        if self.held_steps is not None:
            return self.held_steps > 0
        out = np.zeros(steps, dtype=bool)
        for p in self.pods.values():
            out |= p.held > 0
        return out

    def busy_total(self, steps: int) -> np.ndarray:
        if self.busy_steps is not None:
            return self.busy_steps
        out = np.zeros(steps, dtype=np.float32)
        for p in self.pods.values():
            out += p.busy
        return out

    def alive(self, steps: int) -> np.ndarray:
        """Pods alive (holding a sampled GPU) at each step."""
        if self.alive_steps is not None:
            return self.alive_steps
        if not self.pods:
            return np.zeros(steps)
        return np.sum([p.held > 0 for p in self.pods.values()], axis=0)

    def peaks(self) -> list[tuple[float, float, float]]:
        """Per pod: the most GPUs it held at once, the most busy at once, its peak FB used summed (MiB)."""
        if self.pod_peaks:
            return self.pod_peaks
        return [(float(p.held.max()), float(p.busy.max()), float(p.fb_mib.max())) for p in self.pods.values()]


# Verdicts over time: the diagnosis of each block's mean signals. An hour, or longer for long windows so a
# workload gets at most MAX_BLOCKS diagnoses (a week of hours; 30 days → 5-hour blocks).
BLOCK_SECONDS = 3600.0
MAX_BLOCKS = 168


def block_seconds(window_seconds: float) -> float:
    return BLOCK_SECONDS * max(1.0, float(np.ceil(window_seconds / BLOCK_SECONDS / MAX_BLOCKS)))


DIAGNOSED_FIELDS = ("gpu_util_percent", "sm_active", "tensor_active", "dram_active", "gr_engine_active", "fb_used_mib")


def owner_of(history, pod: PodRef) -> Owner:
    """The owner kube-state-metrics (or the Kubernetes API) gave, else the pod itself (a bare pod)."""
    return history.owners.get(pod) or Owner("Pod", pod.name, "none")


def new_usage(key: WorkloadKey, owner_source: str, *, half_life_seconds: float, reference: float) -> WorkloadUsage:
    return WorkloadUsage(
        key,
        owner_source,
        {
            name: DecayingHistogram(b, half_life_seconds=half_life_seconds, reference=reference)
            for name, (_, _, b) in SIGNALS.items()
        }
        | {"gpus_busy": DecayingHistogram(COUNT, half_life_seconds=half_life_seconds, reference=reference)},
    )


def collect(history: History, *, half_life_seconds: float, idle_busy_percent: float, idle_sm_active: float):
    """Per workload usage, per GPU activity (in ``history.gpus`` order)."""
    steps = history.steps
    reference = history.end
    decay = np.exp2((history.times() + history.step_seconds - reference) / half_life_seconds)
    block = (np.arange(steps) * history.step_seconds // block_seconds(steps * history.step_seconds)).astype(np.int64)
    blocks = int(block[-1]) + 1 if steps else 0
    workloads: dict[WorkloadKey, WorkloadUsage] = {}
    activities: list[GpuActivity] = []
    for gpu in history.gpus:
        act = activity_of(gpu, idle_busy_percent=idle_busy_percent, idle_sm_active=idle_sm_active)
        activities.append(act)
        held = (gpu.pod >= 0) & act.sampled
        if not held.any():
            continue
        for pod_index in pods_of(gpu.pod, held):
            mask = held & (gpu.pod == pod_index)
            pod = history.pods[int(pod_index)]
            owner = owner_of(history, pod)
            key = WorkloadKey(pod.namespace, owner.kind, owner.name)
            usage = workloads.get(key)
            if usage is None:
                usage = workloads[key] = new_usage(
                    key, owner.source, half_life_seconds=half_life_seconds, reference=reference
                )
            _add_gpu(usage, gpu, act, mask, decay, block, blocks, int(pod_index), history)
    for usage in workloads.values():
        hist = usage.histograms["gpus_busy"]
        for p in usage.pods.values():
            # NB: counts are small integers: their bucket is the value itself (one bincount, no bucket arithmetic)
            held = p.held > 0
            full = bool(held.all())
            busy = (p.busy if full else p.busy[held]).astype(np.intp)
            if busy.size:
                usage.signal_samples["gpus_busy"].append(busy.astype(np.uint16))  # NB: 2 bytes a pod-step
                np.clip(busy, 0, hist.buckets.count - 1, out=busy)
                counts = np.bincount(busy, weights=decay if full else decay[held], minlength=hist.buckets.count)
                hist.add_counts(counts, int(busy.size), float(busy.max()))
    return workloads, activities


def _add_gpu(
    usage: WorkloadUsage,
    gpu: GpuHistory,
    act: GpuActivity,
    mask: np.ndarray,
    decay: np.ndarray,
    block: np.ndarray,
    blocks: int,
    pod_index: int,
    history: History,
) -> None:
    steps = len(mask)
    # NB: a GPU held by one pod all window (the common case) is read in place; otherwise the steps of this pod.
    full = bool(mask.all())
    w = decay if full else decay[mask]
    counts_of: dict[int, np.ndarray] = {}  # id(array) → bucket weights: the activity is often SM_ACTIVE itself
    for name, (fld, scale, _) in SIGNALS.items():
        values = act.activity if name == "activity_percent" else gpu.values.get(fld)
        if values is None:
            continue
        hist = usage.histograms[name]
        if name != "activity_percent":  # NB: the activity's own samples are appended below, clipped
            usage.signal_samples[name].append(values if full else values[mask])
        known = counts_of.get(id(values))
        if known is not None and scale == 100.0:
            hist.add_counts(*known)
            continue
        if full and act.clean and values is act.activity:
            counts_of[id(values)] = hist.add(values, weights=w, scale=scale, clean=True, maximum=act.maximum)
        else:
            counts_of[id(values)] = hist.add(values if full else values[mask], weights=w, scale=scale)
    pod = usage.pods.get(pod_index)
    if pod is None:
        pod = usage.pods[pod_index] = PodSteps(
            np.zeros(steps, np.float32), np.zeros(steps, np.float32), np.zeros(steps, np.float32)
        )
    pod.held += mask
    pod.busy += mask & act.busy
    fb = gpu.values.get("fb_used_mib")
    if fb is not None:
        pod.fb_mib += np.where(mask & ~np.isnan(fb), fb, np.float32(0.0))
    product = gpu.product or "unknown"
    held = int(mask.sum())
    usage.products[product] += held
    usage.pools.add(history.node_pools.get(gpu.node, gpu.node))
    usage.gpus.add(gpu.key)
    usage.activity_sources[act.source] += held
    a = act.activity if full else act.activity[mask]
    usage.activity_samples.append(a)
    if usage.demand is None:
        usage.demand = np.zeros(steps, dtype=np.float64)
    if full:
        usage.demand += act.activity
    else:
        usage.demand[mask] += a
    usage.allocated_steps_by_product[product] += float(held)
    usage.active_steps_by_product[product] += float(a.sum(dtype=np.float64))
    # Block sums for the verdicts over time: the steps of each block summed as a reshaped view.
    length = steps // blocks if blocks and steps % blocks == 0 else 0
    for fld in DIAGNOSED_FIELDS:
        values = gpu.values.get(fld)
        if values is None:
            continue
        v = values if full else np.where(mask, values, np.float32(np.nan))
        if fld not in usage.block_sums:
            usage.block_sums[fld] = np.zeros(blocks)
            usage.block_counts[fld] = np.zeros(blocks)
        even = length and block[length - 1] == 0 and (length == steps or block[length] == 1)
        if even and full and act.clean and values is act.activity:  # no NaN: plain sums, full counts
            usage.block_sums[fld] += v.reshape(blocks, length).sum(axis=1, dtype=np.float64)
            usage.block_counts[fld] += length
            continue
        ok = ~np.isnan(v)
        if even:
            usage.block_sums[fld] += np.nansum(v.reshape(blocks, length), axis=1, dtype=np.float64)
            usage.block_counts[fld] += ok.reshape(blocks, length).sum(axis=1)
        else:
            usage.block_sums[fld] += np.bincount(block[ok], weights=v[ok].astype(np.float64), minlength=blocks)
            usage.block_counts[fld] += np.bincount(block[ok], minlength=blocks)


def pods_of(pod: np.ndarray, held: np.ndarray) -> list[int]:
    """The pod indices in ``pod`` where ``held``; most GPUs are held by one pod all window (no sort then)."""
    if held.all():
        first = int(pod[0])
        if (pod == first).all():
            return [first]
        return [int(p) for p in np.unique(pod)]
    if not held.any():
        return []
    first = int(pod[held][0])
    if (np.where(held, pod, first) == first).all():
        return [first]
    return [int(p) for p in np.unique(pod[held])]


def longest_run(flags: np.ndarray) -> int:
    """The length of the longest run of True in ``flags``."""
    if not flags.any():
        return 0
    padded = np.concatenate(([False], flags, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return int((edges[1::2] - edges[::2]).max())
