"""Right-sizing on histories with known answers: what each workload needed and what it should ask for instead."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.report.build import build_report
from gpuscale.report.policy import load_report_policy
from tests.report.histories import H100, add_pod, constant, history

DOWNSIZING = {"fewer-gpus", "smaller-gpu", "mig-profile", "time-slicing", "scale-to-zero"}


@pytest.fixture(scope="module")
def policy():
    return load_report_policy()


def only(report, name: str):
    (w,) = [w for w in report.workloads if w.name == name]
    return w


def kinds(workload) -> set[str]:
    return {r.kind for r in workload.recommendations}


def test_a_pod_using_one_of_four_gpus_is_told_to_request_one(policy):
    h = history(hours=48)

    def values(g, t):  # GPU 0 works (SM 70 %), the other three sit idle with nothing allocated
        busy = g == 0
        return {
            "gpu_util_percent": np.full(t.shape, 98.0 if busy else 0.0),
            "sm_active": np.full(t.shape, 0.7 if busy else 0.0),
            "fb_used_mib": np.full(t.shape, 30_000.0 if busy else 0.0),
        }

    add_pod(h, pod="train-0", owner=("Deployment", "trainer"), requests=4, gpus=4, values=values)
    w = only(build_report(h, policy=policy, generated_at=0), "trainer")
    (rec,) = [r for r in w.recommendations if r.kind == "fewer-gpus"]
    assert rec.evidence["recommended"] == 1
    assert rec.evidence["gpus_requested"] == 4 and rec.evidence["gpus_busy_max"] == 1
    assert rec.severity == "critical"  # 3 of 4 GPUs freed
    # 3 GPUs × 1 pod × H100 price × 730 h
    assert rec.monthly_saving == pytest.approx(3 * policy.prices.per_gpu_hour(H100) * 730)
    assert rec.evidence["gpu_hours_freed_per_month"] == pytest.approx(3 * 730)
    assert w.signals["gpus_busy"].max == 1 and w.signals["gpus_busy"].p50 == 1


def test_memory_keeps_a_gpu_count_that_activity_alone_would_cut(policy):
    h = history(hours=48)
    # Two GPUs, only one busy, but 100 GiB in use over the pod: one 80 GB GPU cannot hold it.
    add_pod(h, pod="p", requests=2, gpus=2, values=constant(gpu_util_percent=50, sm_active=0.3, fb_used_mib=52_000))
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    assert "fewer-gpus" not in kinds(w)


def test_small_memory_and_low_sm_fit_a_small_mig_profile(policy):
    h = history(hours=72)
    add_pod(h, pod="infer-0", requests=1, values=constant(gpu_util_percent=60, sm_active=0.08, fb_used_mib=7 * 1024))
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    (mig,) = [r for r in w.recommendations if r.kind == "mig-profile"]
    assert mig.evidence["resource"] in ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb")
    assert mig.evidence["fb_peak_mib"] == 7 * 1024
    assert mig.evidence["fb_needed_mib"] == pytest.approx(7 * 1024 * 1.15)
    assert "time-slicing" in kinds(w)


def test_twelve_hours_of_history_give_low_confidence_and_wide_bounds(policy):
    def at(hours):
        h = history(hours=hours)
        add_pod(h, pod="p", requests=1, values=constant(gpu_util_percent=40, sm_active=0.4, fb_used_mib=20_000))
        return only(build_report(h, policy=policy, generated_at=0), "app")

    short, week = at(12), at(24 * 7)
    assert short.confidence == pytest.approx(0.5)
    assert week.confidence == pytest.approx(7.0)
    s, w = short.signals["sm_active_percent"], week.signals["sm_active_percent"]
    # VPA: upper = p95·(1 + margin)·(1 + 1/confidence): ×3 at 12 h, ×1.14 at a week
    assert s.upper_bound == pytest.approx(min(100.0, s.p95 * 1.15 * 3), rel=1e-3)
    assert w.upper_bound == pytest.approx(w.p95 * 1.15 * (1 + 1 / 7), rel=1e-3)
    assert s.upper_bound - s.target > 3 * (w.upper_bound - w.target)
    assert s.lower_bound < w.lower_bound


def test_below_the_minimum_history_nothing_is_recommended(policy):
    h = history(hours=2)
    add_pod(h, pod="p", requests=4, gpus=4, values=constant(gpu_util_percent=0, sm_active=0.0, fb_used_mib=0))
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    assert w.status == "not-enough-data"
    assert kinds(w) == {"not-enough-data"}
    assert "2.0 h" in w.recommendations[0].summary


def test_a_busy_pod_is_never_downsized(policy):
    h = history(hours=48)
    add_pod(
        h,
        pod="busy-0",
        requests=4,
        gpus=4,
        values=constant(gpu_util_percent=99, sm_active=0.92, tensor_active=0.6, fb_used_mib=70_000),
    )
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    assert w.busy
    assert not kinds(w) & DOWNSIZING
    assert "keep" in kinds(w)


def test_an_inference_deployment_idle_for_hours_is_a_scale_to_zero_candidate(policy):
    h = history(hours=24)

    def values(g, t):  # busy in the first 6 hours, idle for the next 18
        busy = t < 6 * 3600
        return {"gpu_util_percent": np.where(busy, 90.0, 0.0), "sm_active": np.where(busy, 0.9, 0.0)}

    add_pod(h, pod="p", requests=1, values=values)
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    (rec,) = [r for r in w.recommendations if r.kind == "scale-to-zero"]
    assert rec.evidence["longest_idle_hours"] == pytest.approx(18.0)
    assert w.longest_idle_seconds == 18 * 3600


def test_tensor_cores_idle_on_busy_sms_is_a_precision_finding(policy):
    h = history(hours=24)
    add_pod(h, pod="p", requests=1, values=constant(gpu_util_percent=99, sm_active=0.9, tensor_active=0.02))
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    (rec,) = [r for r in w.recommendations if r.kind == "diagnosis"]
    assert rec.evidence["verdict"] == "precision" and rec.evidence["share"] == 1.0
    assert rec.summary.startswith("tensor cores idle: check precision")


def test_a_deployment_is_the_union_of_its_pods_over_time(policy):
    h = history(hours=24)
    half = h.steps // 2
    add_pod(h, pod="app-a", requests=1, held=slice(0, half), values=constant(gpu_util_percent=50, sm_active=0.2))
    add_pod(h, pod="app-b", requests=1, held=slice(half, None), values=constant(gpu_util_percent=50, sm_active=0.6))
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    assert w.pods == 2 and w.samples == h.steps and w.history_seconds == 24 * 3600
    assert w.signals["sm_active_percent"].max == 60.0
    assert w.signals["sm_active_percent"].p50 == 40.0  # exact over both pods' samples: half 20 %, half 60 %


def test_a_pod_without_owner_is_a_bare_pod_and_the_gap_says_so(policy):
    h = history(hours=6)
    add_pod(h, pod="lonely", owner=None, values=constant(gpu_util_percent=50, sm_active=0.5))
    report = build_report(h, policy=policy, generated_at=0)
    w = only(report, "lonely")
    assert (w.kind, w.owner_source, w.requests_source) == ("Pod", "none", "observed")
    assert any("without a known owner" in g and "ml/lonely" in g for g in report.gaps)


def _bursty(n: int, *, base: float, p95: float, p99: float, seed: int = 7) -> np.ndarray:
    """Activity samples (0–1) whose exact p95 and p99 are ``p95`` and ``p99``: rare peaks in a low baseline, in
    bursts (as production inference looks), not a textbook distribution."""
    top, next_ = int(n * 0.02), int(n * 0.04)
    values = np.full(n, base)
    values[:top], values[top : top + next_] = p99, p95
    rng = np.random.default_rng(seed)
    blocks = values.reshape(-1, 8)  # bursts of 8 minutes move together
    return blocks[rng.permutation(len(blocks))].reshape(-1)


def _one_bursty_pod(policy, name: str, *, base: float, p95: float, p99: float, util: float, fb_mib: float):
    """48 h of one pod of Deployment ``name`` with bursty SM activity; returns (the samples, its workload)."""
    h = history(hours=48)
    activity = _bursty(h.steps, base=base, p95=p95, p99=p99)

    def values(g, t):
        return {
            "gpu_util_percent": np.full(t.shape, util),
            "sm_active": activity,
            "fb_used_mib": np.full(t.shape, fb_mib),
        }

    add_pod(h, pod=f"{name}-0", owner=("Deployment", name), requests=1, values=values)
    return activity, only(build_report(h, policy=policy, generated_at=0), name)


def test_rare_peaks_keep_the_gpu_p95_65_p99_93_gets_no_downsizing(policy):
    """The production case: p95 65 %, p99 93 %, idle-looking on average. The recency-weighted p90 (about 30 %)
    would fit a MIG slice; the exact p99 does not, so nothing is downsized."""
    activity, w = _one_bursty_pod(policy, "chat", base=0.3, p95=0.65, p99=0.93, util=100.0, fb_mib=20_000.0)
    assert np.quantile(activity, 0.95, method="higher") == pytest.approx(0.65)  # the independent computation
    assert np.quantile(activity, 0.99, method="higher") == pytest.approx(0.93)
    assert w.signals["activity_percent"].trend_p90 <= 31, "the weighted p90 alone looks idle"
    assert w.busy
    assert not kinds(w) & DOWNSIZING, [r.short for r in w.recommendations]
    (keep,) = [r for r in w.recommendations if r.kind == "keep"]
    assert keep.evidence["activity_p99_percent"] == pytest.approx(93.0, abs=0.01)


def test_a_downsizing_fits_the_exact_p99_plus_margin(policy):
    activity, w = _one_bursty_pod(policy, "embed", base=0.05, p95=0.1, p99=0.2, util=60.0, fb_mib=8_000.0)
    (mig,) = [r for r in w.recommendations if r.kind == "mig-profile"]
    p99 = float(np.quantile(activity, 0.99, method="higher"))
    assert mig.evidence["activity_p99"] == pytest.approx(p99, abs=1e-4)
    assert mig.evidence["profile_compute_share"] >= p99 * (1 + policy.rightsizing.margin_fraction)
    assert mig.evidence["resource"] == "nvidia.com/mig-2g.20gb"  # 0.2 × 1.15 = 0.23 > 1/7: not 1g
    (ts,) = [r for r in w.recommendations if r.kind == "time-slicing"]
    assert ts.evidence["pods_per_gpu"] == 4 and ts.monthly_saving > 0  # int(1 / 0.23)


def test_the_whole_gpu_as_a_mig_profile_is_not_a_recommendation(policy):
    h = history(hours=48)
    # little compute, but 70 GB of memory: only the 7g.80gb profile holds it — that is the whole GPU, no saving
    add_pod(
        h,
        pod="kv-0",
        owner=("Deployment", "kv"),
        requests=1,
        values=constant(gpu_util_percent=40, sm_active=0.1, fb_used_mib=70_000),
    )
    w = only(build_report(h, policy=policy, generated_at=0), "kv")
    assert "mig-profile" not in kinds(w), [r.short for r in w.recommendations]
    assert all(r.monthly_saving is None or r.monthly_saving > 0 for r in w.recommendations)


def test_hours_the_diagnosis_calls_busy_make_the_workload_busy(policy):
    h = history(hours=48)

    # 47 quiet hours, then one compute-bound hour: one story — the verdict says busy, so no downsizing
    def values(g, t):
        sm = np.where(t >= 47 * 3600, 0.95, 0.05)
        return {
            "gpu_util_percent": np.full(t.shape, 100.0),
            "sm_active": sm,
            "tensor_active": np.where(t >= 47 * 3600, 0.7, 0.0),
            "fb_used_mib": np.full(t.shape, 9_000.0),
        }

    add_pod(h, pod="batch-0", owner=("Deployment", "nightly"), requests=1, values=values)
    w = only(build_report(h, policy=policy, generated_at=0), "nightly")
    assert any(v.code == "compute-bound" for v in w.verdicts), w.verdicts
    assert w.busy and not kinds(w) & DOWNSIZING, [r.short for r in w.recommendations]


def test_a_pooled_deployment_of_a_hundred_pods_is_told_how_many_carry_its_demand(policy):
    """~100 one-GPU pods (some come and go), each busy in rare bursts: together about 8 GPUs' worth of work.
    The replica count is the exact p99 of the summed demand, +margin, at the target utilisation."""
    h = history(hours=24)
    rng = np.random.default_rng(3)
    demand = np.zeros(h.steps)
    for i in range(100):
        activity = np.where(rng.random(h.steps) < 0.08, rng.uniform(0.6, 1.0, h.steps), 0.02)
        held = slice(0, h.steps) if i < 90 else slice(h.steps // 2, h.steps)  # ten pods only in the second half
        alive = np.zeros(h.steps, dtype=bool)
        alive[held] = True
        demand += np.where(alive, activity, 0.0)

        def values(g, t, a=activity):
            return {
                "gpu_util_percent": np.full(t.shape, 100.0),
                "sm_active": a,
                "fb_used_mib": np.full(t.shape, 9_000.0),
            }

        add_pod(
            h,
            pod=f"llm-{i}",
            owner=("Deployment", "llm"),
            requests=1,
            node=f"node-{i // 8}",
            first_gpu=i % 8,
            values=values,
            held=held,
        )
    w = only(build_report(h, policy=policy, generated_at=0), "llm")
    (rec,) = [r for r in w.recommendations if r.kind == "replicas"]
    rule, rs = policy.rightsizing.replicas, policy.rightsizing
    p99 = float(np.quantile(demand, rs.safety_percentile, method="higher"))  # the independent computation
    expected = int(np.ceil(p99 * (1 + rs.margin_fraction) / rule.target_utilisation))
    assert rec.evidence["demand_p99_gpus"] == pytest.approx(p99, abs=1e-3)
    assert rec.evidence["recommended"] == expected and 10 < expected < 40, rec.evidence
    assert rec.evidence["current_pods_mean"] == pytest.approx(95.0, abs=0.1)  # 90 all day, 100 half of it
    assert rec.evidence["current_pods_peak"] == 100
    price = policy.prices.per_gpu_hour(H100)
    assert rec.monthly_saving == pytest.approx((95.0 - expected) * price * 730, rel=1e-3)


def test_a_few_pods_or_a_busy_pool_get_no_replica_advice(policy):
    h = history(hours=24)
    for i in range(2):  # two pods: below min_pods
        add_pod(
            h,
            pod=f"small-{i}",
            owner=("Deployment", "small"),
            requests=1,
            first_gpu=i,
            values=constant(gpu_util_percent=30, sm_active=0.05, fb_used_mib=1000),
        )
    for i in range(4):  # four pods, each compute-bound all day: they need all four
        add_pod(
            h,
            pod=f"hot-{i}",
            owner=("Deployment", "hot"),
            requests=1,
            node="node-b",
            first_gpu=i,
            values=constant(gpu_util_percent=100, sm_active=0.9, tensor_active=0.6, fb_used_mib=9000),
        )
    report = build_report(h, policy=policy, generated_at=0)
    assert "replicas" not in kinds(only(report, "small")) and "replicas" not in kinds(only(report, "hot"))


def _sporadic_pod(policy, name: str, *, bursts_per_day: int):
    """A Deployment pod over 48 h: busy 10 minutes ``bursts_per_day`` times a day, idle in between."""
    h = history(hours=48)

    def values(g, t):
        period = 86400 / bursts_per_day
        busy = (t % period) < 600
        return {"gpu_util_percent": np.where(busy, 90.0, 0.0), "sm_active": np.where(busy, 0.8, 0.0)}

    add_pod(h, pod=f"{name}-0", owner=("Deployment", name), requests=1, values=values)
    return only(build_report(h, policy=policy, generated_at=0), name)


def test_scale_to_zero_only_when_its_wake_ups_fit_the_latency_budget(policy):
    stz = policy.rightsizing.scale_to_zero
    rare = _sporadic_pod(policy, "nightly", bursts_per_day=2)  # idle ~11.8 h between bursts
    (rec,) = [r for r in rare.recommendations if r.kind == "scale-to-zero"]
    # 2 bursts a day over 48 h: the first is at t=0 (no wake-up), then 3 wake-ups in 2 days
    assert rec.evidence["wakeups_per_day"] == pytest.approx(1.5)
    assert rec.evidence["added_latency_seconds_per_day"] == pytest.approx(1.5 * stz.cold_start)
    assert rec.monthly_saving > 0 and "wake" in rec.summary
    busy = _sporadic_pod(policy, "chatty", bursts_per_day=8)  # idle 2.8 h stretches, woken 8 times a day
    assert "scale-to-zero" not in kinds(busy)
    (warm,) = [r for r in busy.recommendations if r.short == "keep 1 warm"]
    assert warm.evidence["wakeups_per_day"] * stz.cold_start > stz.latency_budget_per_day


def test_end_takes_rfc_3339_or_epoch_seconds_and_a_missing_file_is_one_line(capsys):
    from gpuscale.cli.main import main
    from gpuscale.cli.report import ReportSettings

    base = {"prometheus_url": "http://prometheus:9090"}
    assert ReportSettings(**base, end="2026-12-01T00:00:00Z").end == 1796083200.0
    assert ReportSettings(**base, end="2026-12-01T02:00:00+02:00").end == 1796083200.0
    assert ReportSettings(**base, end="1796083200").end == 1796083200.0
    for bad in ("2026-12-01T00:00:00", "tomorrow"):
        assert main(["report", "--prometheus-url", "http://127.0.0.1:9", "--end", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--end" in err and ("RFC 3339" in err or "time zone" in err), err
    assert main(["report", "--from", "/nonexistent/history.npz"]) == 2
    assert capsys.readouterr().err == "gpuscale report: --from /nonexistent/history.npz: no such file\n"


def test_every_downsizing_says_what_it_frees_in_gpu_hours_and_money(policy):
    h = history(hours=72)
    add_pod(h, pod="infer-0", requests=1, values=constant(gpu_util_percent=60, sm_active=0.08, fb_used_mib=7 * 1024))
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    shrinking = [r for r in w.recommendations if r.kind in {"fewer-gpus", "mig-profile", "time-slicing", "replicas"}]
    assert shrinking
    for r in shrinking:
        assert r.evidence["gpu_hours_freed_per_month"] > 0 and r.monthly_saving > 0, r


def test_one_action_is_recommended_its_alternatives_follow_with_their_savings_and_the_rule_is_stated(policy):
    """A small, idle-ish inference pod fits a MIG slice, time-slicing and perhaps a smaller GPU: one of them is the
    action (the largest monthly saving), the others are alternatives listed under it, largest saving first."""
    from gpuscale.report.formatters import formatter

    h = history(hours=72)
    add_pod(h, pod="infer-0", requests=1, values=constant(gpu_util_percent=60, sm_active=0.08, fb_used_mib=7 * 1024))
    report = build_report(h, policy=policy, generated_at=0)
    w = only(report, "app")
    roles = [r.role for r in w.recommendations]
    assert roles.count("recommended") == 1 and roles[0] == "recommended", roles
    chosen, *rest = w.recommendations
    alternatives = [r for r in rest if r.role == "alternative"]
    assert len(alternatives) >= 1 and {chosen.kind, *(r.kind for r in alternatives)} >= {"mig-profile", "time-slicing"}
    savings = [r.monthly_saving for r in [chosen, *alternatives]]
    assert savings == sorted(savings, reverse=True) and all(s is not None for s in savings)
    assert "saves the most a month" in w.rule
    text, markdown, page = (formatter(f)(report) for f in ("table", "markdown", "html"))
    assert f"app: RECOMMENDED [{chosen.severity}]" in text and "chosen as the downsizing that saves" in text
    assert text.index("RECOMMENDED") < text.index("alternative")
    assert "- RECOMMENDED" in markdown and "  - alternative" in markdown
    assert "role-recommended" in page and "chosen as" in page


def test_a_busy_workload_is_told_to_keep_and_why(policy):
    h = history(hours=24)
    add_pod(h, pod="train-0", requests=1, values=constant(gpu_util_percent=100, sm_active=0.9, fb_used_mib=60_000))
    w = only(build_report(h, policy=policy, generated_at=0), "app")
    assert (w.recommendations[0].kind, w.recommendations[0].role) == ("keep", "recommended")
    assert w.rule.startswith("busy")
