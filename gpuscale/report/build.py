"""``build_report(history, policy=…)`` → ``Report``: the one entry point of the report core. Pure.

The order: per-GPU activity and per-workload accumulators in one pass (``usage.collect``), then per workload its
statistics and recommendations (``recommend``), then costs per pool and namespace, idle nodes, incidents and a
timeline (``costs``). Gaps recorded by the source are carried to the report unchanged, plus what this step finds
(values outside their field's physical range, taken out first; pods without an owner, GPUs without any sample).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuscale.metrics.history import History, Owner, PodRef
from gpuscale.report.costs import fleet_costs, incidents, workload_cost
from gpuscale.report.policy import ReportPolicy
from gpuscale.report.ranges import gap_line, out_of_range, screen
from gpuscale.report.recommend import workload_report
from gpuscale.report.schema import Report, Window, Workload
from gpuscale.report.usage import WorkloadKey, WorkloadUsage, collect

EXACT_RAW = [
    "GPU-hours (allocated, active, idle, unallocated) and their cost, on the sampled grid",
    "maxima (GPU util, SM/tensor/DRAM activity, FB used, GPUs busy at once)",
    "incidents (Xid changes, ECC DBE increases, minutes throttled)",
    "the safety share every downsizing must fit: the p99 of activity over every sample, unweighted",
]
APPROXIMATE_RAW = [
    "p50/p90/p95 and targets: to one histogram bucket (0.5 percentage point; 5 % for memory), "
    "recency-weighted (half-life) as VPA's",
    "verdicts over time: diagnosis of hourly means, not of every sample",
]


def build_report(history: History, *, policy: ReportPolicy, generated_at: float) -> Report:
    rs = policy.rightsizing
    idle = policy.diagnosis.diagnosis.idle
    rejected = screen(history)  # NB: before anything is counted: an impossible value is no sample
    usages, activities = collect(
        history,
        half_life_seconds=rs.half_life,
        idle_busy_percent=idle.busy_percent,
        idle_sm_active=idle.sm_active,
    )
    gaps = list(history.gaps) + [gap_line(name, r) for name, r in rejected.items()]
    silent = [g.key for g, a in zip(history.gpus, activities, strict=True) if not a.sampled.any()]
    if silent:
        shown = ", ".join(silent[:5]) + (f" and {len(silent) - 5} more" if len(silent) > 5 else "")
        gaps.append(f"{len(silent)} GPU(s) without any activity sample in the window: {shown}")
    for gpu, act in zip(history.gpus, activities, strict=True):
        coverage = act.sampled.mean() if history.steps else 1.0
        if act.sampled.any() and coverage < 0.9:
            gaps.append(f"GPU {gpu.key} on {gpu.node}: samples in {coverage:.0%} of the window (gaps are not idle)")
    gaps += unowned_gap(history.pods, history.owners)

    workloads = workloads_of(
        usages,
        pods=history.pods,
        requests=history.requests,
        startups=history.startups,
        policy=policy,
        steps=history.steps,
        step_seconds=history.step_seconds,
    )
    pools, namespaces, total, idle_nodes, timeline = fleet_costs(history, activities, policy)
    return Report(
        generated_at=generated_at,
        source=history.source,
        mode="raw",
        exact=EXACT_RAW,
        approximate=APPROXIMATE_RAW,
        window=Window(start=history.start, end=history.end, step_seconds=history.step_seconds),
        currency=policy.prices.currency,
        gaps=gaps,
        out_of_range=out_of_range(rejected),
        workloads=workloads,
        pools=pools,
        namespaces=namespaces,
        total=total,
        idle_nodes=idle_nodes,
        incidents=incidents(history, policy),
        timeline=timeline,
    )


def unowned_gap(pods: Iterable[PodRef], owners: Mapping[PodRef, Owner]) -> list[str]:
    """The gap line naming the pods neither kube-state-metrics nor the Kubernetes API gave an owner (raw and
    summary mode alike)."""
    unowned = sorted({f"{p.namespace}/{p.name}" for p in pods if p not in owners})
    if not unowned:
        return []
    shown = ", ".join(unowned[:5]) + (f" and {len(unowned) - 5} more" if len(unowned) > 5 else "")
    return [f"{len(unowned)} pod(s) without a known owner, reported as bare pods: {shown}"]


def workloads_of(
    usages: dict[WorkloadKey, WorkloadUsage],
    *,
    pods: list[PodRef],
    requests: dict[PodRef, float],
    policy: ReportPolicy,
    steps: int,
    step_seconds: float,
    cost_step_seconds: float | None = None,
    startups: dict[PodRef, float] | None = None,
) -> list[Workload]:
    """Each workload's report, worst idle first. ``steps``/``step_seconds`` describe the pod arrays (grid steps in
    raw mode, chunks in summary mode); ``cost_step_seconds`` what one allocated step is worth (the grid step)."""
    out: list[Workload] = []
    for usage in usages.values():
        ids = usage.pod_ids or list(usage.pods)
        asked = [requests[pods[p]] for p in ids if pods[p] in requests]
        measured = [startups[pods[p]] for p in ids if startups and pods[p] in startups]
        cost = workload_cost(
            usage.allocated_steps_by_product,
            usage.active_steps_by_product,
            step_seconds=cost_step_seconds or step_seconds,
            policy=policy,
        ).model_copy(update={"gpus": len(usage.gpus)})
        out.append(
            workload_report(
                usage,
                policy=policy,
                steps=steps,
                step_seconds=step_seconds,
                requested_per_pod=max(asked) if asked else None,
                pod_count=len(ids),
                cost=cost,
                cold_starts=measured,
            )
        )
    out.sort(key=lambda w: (-(w.cost.idle_hours), w.namespace, w.kind, w.name))
    return out
