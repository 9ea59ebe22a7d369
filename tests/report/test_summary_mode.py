"""Summary mode's combination, checked against raw mode on the same history without a TSDB: what the PromQL of
sources/summary_fetch.py returns (per series and chunk: counts, sums, maxima, quantiles at its levels; per owner and
step: GPUs held and busy, activity summed, pods alive; per owner and block: sums and counts) is computed here with
numpy, then both reports are compared: the exact figures are equal, every shown percentile is at or above raw mode's
exact one and within 2 points of it, and the verdicts agree."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.metrics.history import History, Owner, OwnerSteps, PodRef, SeriesSummary, SummaryHistory
from gpuscale.report.build import build_report
from gpuscale.report.policy import load_report_policy
from gpuscale.report.summary import build_summary_report
from gpuscale.report.usage import block_seconds, owner_of
from gpuscale.sources.summary_fetch import ACTIVITY_FIELDS, SUMMARY_FIELDS, levels_of
from tests.report.histories import add_pod, history


def summarise(
    h: History, *, idle_busy_percent: float, idle_sm_active: float, chunk_steps: int | None = None
) -> SummaryHistory:
    chunk_steps = chunk_steps or h.steps
    chunks = h.steps // chunk_steps
    block = block_seconds(h.steps * h.step_seconds)
    per_block = int(block / h.step_seconds)
    blocks = -(-h.steps // per_block)
    s = SummaryHistory(
        start=h.start,
        step_seconds=h.step_seconds,
        chunk_seconds=chunk_steps * h.step_seconds,
        chunks=chunks,
        block_seconds=block,
        interval_seconds=h.step_seconds,
        owners=dict(h.owners),
        requests=dict(h.requests),
        node_pools=dict(h.node_pools),
        source="numpy",
    )
    alive: dict = {}
    for gpu in h.gpus:
        for p in set(gpu.pod.tolist()):
            pod = h.pods[p] if p >= 0 else None
            mask = gpu.pod == p
            for fld in SUMMARY_FIELDS:
                values = gpu.values.get(fld)
                if values is None:
                    continue
                levels = levels_of(fld)
                out = SeriesSummary(
                    gpu.key,
                    gpu.node,
                    gpu.product,
                    pod,
                    fld,
                    *(np.full(chunks, np.nan) for _ in range(3)),
                    levels=levels,
                    quantiles=np.full((len(levels), chunks), np.nan),
                )
                for c in range(chunks):
                    sl = slice(c * chunk_steps, (c + 1) * chunk_steps)
                    v = values[sl][mask[sl]].astype(np.float64)
                    v = v[~np.isnan(v)]
                    if v.size:
                        out.count[c], out.total[c], out.maximum[c] = v.size, v.sum(), v.max()
                        out.quantiles[:, c] = np.quantile(v, levels)  # Prometheus' definition
                if np.nansum(out.count):
                    s.series.append(out)
            if pod is None:
                continue
            # per owner where kube-state-metrics names one (as the TSDB's join), else per pod (its complement)
            owner = owner_of(h, pod)
            table, key = (
                (s.owner_steps, (pod.namespace, owner.kind, owner.name))
                if owner.source == "kube-state-metrics"
                else (s.pod_steps, pod)
            )
            o = table.get(key) or table.setdefault(key, OwnerSteps(*(np.zeros(h.steps) for _ in range(4))))
            nan = np.full(h.steps, np.nan, np.float32)
            sm, gr, util = (gpu.values.get(f, nan) for f in ACTIVITY_FIELDS)
            sampled = mask & ~(np.isnan(sm) & np.isnan(gr) & np.isnan(util))
            with np.errstate(invalid="ignore"):
                busy = sampled & ((util > idle_busy_percent) | (sm > idle_sm_active) | (gr > idle_busy_percent / 100))
            act = np.where(~np.isnan(sm), sm, np.where(~np.isnan(gr), gr, util / 100))
            o.held += sampled
            o.busy += busy
            o.demand += np.where(sampled, np.clip(np.nan_to_num(act), 0, 1), 0)
            alive[(id(table), key, pod)] = alive.get((id(table), key, pod), 0) | sampled
            for fld in SUMMARY_FIELDS:
                values = gpu.values.get(fld)
                if values is None:
                    continue
                v = np.where(mask, values, np.nan)
                ok = ~np.isnan(v)
                idx = np.arange(h.steps) // per_block
                o.block_sums.setdefault(fld, np.zeros(blocks))
                o.block_counts.setdefault(fld, np.zeros(blocks))
                o.block_sums[fld] += np.bincount(idx[ok], weights=v[ok], minlength=blocks)
                o.block_counts[fld] += np.bincount(idx[ok], minlength=blocks)
    for (table_id, key, _), sampled in alive.items():
        (s.owner_steps if table_id == id(s.owner_steps) else s.pod_steps)[key].alive += sampled
    return s


def bursty(rng):
    def values(g, t):
        busy = rng.random(t.shape) < 0.1
        return {
            "sm_active": np.round(np.where(busy, rng.uniform(0.6, 1, t.shape), 0.02), 4),
            "fb_used_mib": np.full(t.shape, 9000.0),
        }

    return values


@pytest.fixture(scope="module")
def both():
    policy = load_report_policy()
    h = history(hours=24)
    h.node_pools = {"node-a": "ondemand", "node-b": "spot"}
    rng = np.random.default_rng(3)

    def noisy(level, fb_mib, gpu=0):
        return lambda g, t: {
            "sm_active": np.clip(rng.normal(level, 0.02, t.shape), 0, 1) if g == gpu else np.zeros(t.shape),
            "fb_used_mib": np.full(t.shape, fb_mib if g == gpu else 0.0),
        }

    add_pod(h, pod="train-0", owner=("Deployment", "train"), requests=4, gpus=4, values=noisy(0.7, 30_000))
    add_pod(h, pod="infer-0", node="node-b", owner=("StatefulSet", "infer"), requests=1, values=noisy(0.06, 7000))
    half = slice(0, h.steps // 2)
    add_pod(h, pod="batch-0", node="node-b", first_gpu=1, owner=("Job", "batch"), held=half, values=noisy(0.4, 9000))
    for i in range(12):  # a pooled Deployment: bursty pods
        add_pod(
            h,
            pod=f"gen-{i}",
            node=f"node-g{i // 8}",
            first_gpu=i % 8,
            owner=("Deployment", "gen"),
            requests=1,
            values=bursty(rng),
        )
    # pods kube_pod_owner does not name: a bare pod, and two of a Deployment only the Kubernetes API knows
    add_pod(h, pod="notebook-0", node="node-n", owner=None, values=noisy(0.25, 5000))
    for i in range(2):
        add_pod(
            h, pod=f"etl-{i}", node="node-e", first_gpu=i, owner=None, held=slice(i * 300, None), values=bursty(rng)
        )
        h.owners[PodRef("ml", f"etl-{i}")] = Owner("Deployment", "etl", "kubernetes")
    idle = policy.diagnosis.diagnosis.idle
    raw = build_report(h, policy=policy, generated_at=0)
    summaries = {
        chunk: build_summary_report(
            summarise(h, idle_busy_percent=idle.busy_percent, idle_sm_active=idle.sm_active, chunk_steps=chunk),
            policy=policy,
            generated_at=0,
        )
        for chunk in (None, 360)  # one chunk (the default) and 6-hour chunks
    }
    return raw, summaries


@pytest.mark.parametrize("chunk", [None, 360])
def test_the_exact_figures_are_equal(both, chunk):
    raw, summary = both[0], both[1][chunk]
    assert summary.total.model_dump() == pytest.approx(raw.total.model_dump(), abs=0.011)
    for a, b in zip(raw.pools + raw.namespaces, summary.pools + summary.namespaces, strict=True):
        assert (a.name, a.cost.model_dump()) == (b.name, pytest.approx(b.cost.model_dump(), abs=0.011))
    by_name = {w.name: w for w in summary.workloads}
    for w in raw.workloads:
        s = by_name[w.name]
        assert s.cost.model_dump() == pytest.approx(w.cost.model_dump(), abs=0.011)
        assert (s.history_seconds, s.samples, s.longest_idle_seconds) == (
            w.history_seconds,
            w.samples,
            w.longest_idle_seconds,
        )
        assert [(v.code, v.hours) for v in s.verdicts] == [(v.code, v.hours) for v in w.verdicts]
        for k, sig in w.signals.items():
            assert s.signals[k].max == pytest.approx(sig.max, abs=0.011), (w.name, k)


@pytest.mark.parametrize("chunk", [None, 360])
def test_shown_percentiles_are_at_or_above_the_exact_ones_and_within_two_points(both, chunk):
    raw, summary = both[0], both[1][chunk]
    by_name = {w.name: w for w in summary.workloads}
    for w in raw.workloads:
        for k in ("activity_percent", "sm_active_percent"):
            for q in ("p50", "p95", "p99"):
                exact, shown = getattr(w.signals[k], q), getattr(by_name[w.name].signals[k], q)
                assert exact - 0.005 <= shown <= exact + 2.0, (w.name, k, q, exact, shown)
    if chunk is None:  # one series in one chunk: the TSDB's quantile is the exact one
        (infer,) = [w for w in raw.workloads if w.name == "infer"]
        for q in ("p50", "p95", "p99"):
            assert getattr(by_name["infer"].signals["activity_percent"], q) == getattr(
                infer.signals["activity_percent"], q
            )


@pytest.mark.parametrize("chunk", [None, 360])
def test_the_same_verdicts_as_raw_mode(both, chunk):
    raw, summary = both[0], both[1][chunk]

    def story(r):
        return {
            w.name: (
                w.busy,
                sorted({x.kind for x in w.recommendations}),
                [x.evidence.get("recommended") for x in w.recommendations if x.kind == "fewer-gpus"],
            )
            for w in r.workloads
        }

    assert story(summary) == story(raw)
    assert (
        [g for g in summary.gaps if "bare pods" in g]
        == [g for g in raw.gaps if "bare pods" in g]
        == ["1 pod(s) without a known owner, reported as bare pods: ml/notebook-0"]
    )
    kinds = {w.name: (w.kind, w.owner_source, w.pods) for w in summary.workloads}
    assert (kinds["notebook-0"], kinds["etl"]) == (("Pod", "none", 1), ("Deployment", "kubernetes", 2))
    (gen,) = [w for w in summary.workloads if w.name == "gen"]
    assert "replicas" in {x.kind for x in gen.recommendations}
