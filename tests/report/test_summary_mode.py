"""Summary mode's combination, checked against raw mode on the same history without a TSDB: the per-series,
per-chunk summaries are computed here with numpy (what the PromQL of sources/summary_fetch.py returns), then both
reports are compared — the figures docs/report.md calls exact are equal, the percentiles bound raw mode's from
above (to a histogram bucket), and the recommendations that rest on exact figures agree."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.metrics.history import History, PodPeaks, SeriesSummary, SummaryHistory
from gpuscale.report.build import build_report
from gpuscale.report.policy import load_report_policy
from gpuscale.report.summary import build_summary_report
from gpuscale.sources.summary_fetch import SUMMARY_FIELDS
from tests.report.histories import add_pod, history

CHUNK_STEPS = 60  # one-hour chunks of 1-minute steps


def summarise(h: History, *, idle_busy_percent: float, idle_sm_active: float) -> SummaryHistory:
    chunks = h.steps // CHUNK_STEPS
    s = SummaryHistory(
        start=h.start,
        step_seconds=h.step_seconds,
        chunk_seconds=CHUNK_STEPS * h.step_seconds,
        chunks=chunks,
        owners=dict(h.owners),
        requests=dict(h.requests),
        node_pools=dict(h.node_pools),
        source="numpy",
    )
    held = {}
    busy = {}
    fb = {}
    for gpu in h.gpus:
        for p in set(gpu.pod.tolist()):
            pod = h.pods[p] if p >= 0 else None
            mask = gpu.pod == p
            for fld in SUMMARY_FIELDS:
                values = gpu.values.get(fld)
                if values is None:
                    continue
                stats = {k: np.full(chunks, np.nan) for k in ("count", "avg", "max", "p25", "p50", "p75", "p90", "p95")}
                for c in range(chunks):
                    sl = slice(c * CHUNK_STEPS, (c + 1) * CHUNK_STEPS)
                    v = values[sl][mask[sl]].astype(np.float64)
                    v = v[~np.isnan(v)]
                    if v.size:
                        stats["count"][c], stats["avg"][c], stats["max"][c] = v.size, v.mean(), v.max()
                        for q, name in ((0.25, "p25"), (0.5, "p50"), (0.75, "p75"), (0.9, "p90"), (0.95, "p95")):
                            stats[name][c] = np.quantile(v, q)
                s.series.append(SeriesSummary(gpu.key, gpu.node, gpu.product, pod, fld, stats))
            if pod is None:
                continue
            sampled = mask & ~np.isnan(gpu.values["sm_active"])
            is_busy = sampled & (gpu.values["sm_active"] > idle_sm_active)
            held[pod] = held.get(pod, 0) + sampled
            busy[pod] = busy.get(pod, 0) + is_busy
            fb[pod] = fb.get(pod, 0) + np.where(sampled, np.nan_to_num(gpu.values.get("fb_used_mib", 0 * sampled)), 0)
    for pod in held:
        per = lambda a: a.reshape(chunks, CHUNK_STEPS).max(axis=1).astype(np.float64)  # noqa: E731
        s.pods[pod] = PodPeaks(per(held[pod]), per(busy[pod]), per(fb[pod]))
    return s


@pytest.fixture(scope="module")
def both():
    policy = load_report_policy()
    h = history(hours=24)
    h.node_pools = {"node-a": "ondemand", "node-b": "spot"}
    rng = np.random.default_rng(3)

    def noisy(level, fb_mib):
        return lambda g, t: {
            "sm_active": np.clip(rng.normal(level, 0.02, t.shape), 0, 1) if g == 0 else np.zeros(t.shape),
            "fb_used_mib": np.full(t.shape, fb_mib if g == 0 else 0.0),
        }

    add_pod(h, pod="train-0", owner=("Deployment", "train"), requests=4, gpus=4, values=noisy(0.7, 30_000))
    add_pod(h, pod="infer-0", node="node-b", owner=("StatefulSet", "infer"), requests=1, values=noisy(0.06, 7000))
    half = slice(0, h.steps // 2)
    add_pod(h, pod="batch-0", node="node-b", first_gpu=1, owner=("Job", "batch"), held=half, values=noisy(0.4, 9000))
    idle = policy.diagnosis.diagnosis.idle
    raw = build_report(h, policy=policy, generated_at=0)
    summary = build_summary_report(
        summarise(h, idle_busy_percent=idle.busy_percent, idle_sm_active=idle.sm_active), policy=policy, generated_at=0
    )
    return raw, summary


def test_the_exact_figures_are_equal(both):
    raw, summary = both
    assert summary.total.model_dump() == pytest.approx(raw.total.model_dump(), abs=0.011)
    for a, b in zip(raw.pools + raw.namespaces, summary.pools + summary.namespaces, strict=True):
        assert (a.name, a.cost.model_dump()) == (b.name, pytest.approx(b.cost.model_dump(), abs=0.011))
    by_name = {w.name: w for w in summary.workloads}
    for w in raw.workloads:
        s = by_name[w.name]
        assert s.cost.model_dump() == pytest.approx(w.cost.model_dump(), abs=0.011)
        for k, sig in w.signals.items():
            assert s.signals[k].max == pytest.approx(sig.max, abs=0.011), (w.name, k)


def test_percentiles_bound_raw_modes_from_above(both):
    raw, summary = both
    by_name = {w.name: w for w in summary.workloads}
    for w in raw.workloads:
        for k in ("activity_percent", "sm_active_percent"):
            for q in ("p50", "p90", "p95"):
                assert getattr(by_name[w.name].signals[k], q) >= getattr(w.signals[k], q) - 0.5, (w.name, k, q)


def test_the_recommendations_that_rest_on_exact_figures_agree(both):
    raw, summary = both

    def kinds(r, kind):
        return {
            (w.name, x.kind, x.evidence.get("recommended"), x.evidence.get("resource"))
            for w in r.workloads
            for x in w.recommendations
            if x.kind == kind
        }

    assert kinds(raw, "fewer-gpus") == kinds(summary, "fewer-gpus")
    assert ("train", "fewer-gpus", 1, None) in kinds(raw, "fewer-gpus")
    assert ("infer", "mig-profile", None, "nvidia.com/mig-1g.10gb") in kinds(raw, "mig-profile")

    # summary mode keeps no samples: its safety figure is the exact maximum, never below raw mode's p99
    def safety(r):
        (w,) = [w for w in r.workloads if w.name == "infer"]
        (rec,) = [x for x in w.recommendations if x.kind == "mig-profile"]
        return rec.evidence["activity_p99"]

    assert safety(summary) >= safety(raw)
