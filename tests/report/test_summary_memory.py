"""Summary mode's build holds per-workload figures, not per-GPU ones: at 100,000 GPUs a few KB kept per GPU is
most of a gigabyte. The build's peak of Python allocations (tracemalloc) over the same workloads with 4x the GPUs
each must grow by far less than a pooled-quantile part per GPU and signal (what keeping them for the fleet costs)."""

from __future__ import annotations

import tracemalloc

import numpy as np

from gpuscale.metrics.history import Owner, OwnerSteps, PodRef, SeriesSummary, SummaryHistory
from gpuscale.report.policy import ReportPolicy, load_report_policy
from gpuscale.report.summary import build_summary_report
from gpuscale.sources.summary_fetch import levels_of
from tests.report.histories import H100, START

WORKLOADS = 16
STEPS = 24  # hourly, a day
FIELDS = {"sm_active": 1.0, "fb_used_mib": 60_000.0}


def fleet(gpus_per_workload: int) -> SummaryHistory:
    """``WORKLOADS`` Deployments of ``gpus_per_workload`` GPUs (4 per pod, 8 per node), one chunk, as the TSDB
    summarises them (sources/summary_fetch.py): per GPU and field a count, sum, maximum and quantiles."""
    rng = np.random.default_rng(gpus_per_workload)
    # NB: the same hourly means (per GPU) in every fleet: the verdicts' memo answers them alike in each build
    means = np.random.default_rng(0).uniform(0, 1, (WORKLOADS, len(FIELDS), STEPS))
    h = SummaryHistory(
        start=START,
        step_seconds=3600.0,
        chunk_seconds=STEPS * 3600.0,
        chunks=1,
        block_seconds=3600.0,
        interval_seconds=3600.0,
        source="synthetic",
    )
    for w in range(WORKLOADS):
        deploy, ns = f"app-{w}", f"ns-{w % 3}"
        h.parents[("ReplicaSet", ns, f"{deploy}-rs")] = ("Deployment", deploy)
        h.owner_steps[(ns, "ReplicaSet", f"{deploy}-rs")] = OwnerSteps(
            np.full(STEPS, float(gpus_per_workload)),
            np.full(STEPS, gpus_per_workload / 2),
            means[w, 0] * gpus_per_workload,
            np.full(STEPS, gpus_per_workload / 4),
            {f: means[w, i] * top * gpus_per_workload for i, (f, top) in enumerate(FIELDS.items())},
            {f: np.full(STEPS, float(gpus_per_workload)) for f in FIELDS},
        )
        for g in range(gpus_per_workload):
            node = f"node-{w}-{g // 8}"
            pod = PodRef(ns, f"{deploy}-{g // 4}")
            h.owners[pod] = Owner("Deployment", deploy)
            h.requests[pod] = 4.0
            h.node_pools[node] = "pool"
            level = rng.uniform(0.02, 0.9)
            for fld, top in FIELDS.items():
                levels = levels_of(fld)
                q = np.sort(np.clip(rng.normal(level, 0.08, len(levels)), 0, 1)) * top
                h.series.append(
                    SeriesSummary(
                        f"GPU-{w}-{g}",
                        node,
                        H100,
                        pod,
                        fld,
                        np.array([float(STEPS)]),
                        np.array([level * STEPS * top]),
                        np.array([q[-1]]),
                        levels=levels,
                        quantiles=q[:, None].copy(),
                    )
                )
    return h


def build_peak(h: SummaryHistory, policy: ReportPolicy) -> int:
    tracemalloc.start()
    try:
        report = build_summary_report(h, policy=policy, generated_at=START)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(report.workloads) == WORKLOADS
    return peak


def test_the_build_grows_with_workloads_not_gpus():
    policy = load_report_policy()
    build_summary_report(fleet(1), policy=policy, generated_at=START)  # NB: untraced: what a first build imports
    small, large = 3, 12
    before = build_peak(fleet(small), policy)
    grown = build_peak(fleet(large), policy) - before
    per_gpu = grown / (WORKLOADS * (large - small))
    # NB: kept for the fleet, the pooled-quantile parts (one per GPU and signal: its levels' array and the Part)
    # cost ~3 KB a GPU here; held one workload at a time, with the build's own per-GPU transients (its series
    # grouped per GPU, the sets of GPU names behind the GPU counts), ~0.6 KB
    assert per_gpu < 1500, f"the build keeps {per_gpu:.0f} B per GPU"
