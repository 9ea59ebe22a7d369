"""One metric's proposal: the cases of kubernetes/kubernetes pkg/controller/podautoscaler/replica_calculator_test.go.

Each case names the upstream test it reproduces. Upstream values are MilliValues ("levels"), the target is
``targetUtilization`` (a milli AverageValue/Value) and ``currentReplicas`` pods exist, Running and Ready
unless a readiness/phase list says otherwise. The CPU-only cases (hot CPU, requests) are left out: gpuscale
has no CPU metrics; the missing-metric cases are run on a Pods metric with the same arithmetic.
"""

from __future__ import annotations

import pytest

from gpuscale.hpa.replicas import (
    NoMetrics,
    PodInfo,
    Tolerances,
    average_value_replicas,
    pods_metric_replicas,
    value_replicas,
)

T = Tolerances()


def _pods(n: int, ready: list[bool] | None = None, phase: list[str] | None = None) -> list[PodInfo]:
    return [
        PodInfo(f"test-pod-{i}", phase=(phase or ["Running"] * n)[i], ready=(ready or [True] * n)[i]) for i in range(n)
    ]


@pytest.mark.parametrize(
    ("upstream", "current", "levels", "target", "ready", "expected", "usage"),
    [
        ("TestReplicaCalcScaleUpCM", 3, [20000, 10000, 30000], 15000, None, 4, 20000),
        (
            "TestReplicaCalcScaleUpCMUnreadyHotCpuNoLessScale",
            3,
            [50000, 10000, 30000],
            15000,
            [True, True, False],
            6,
            30000,
        ),
        (
            "TestReplicaCalcScaleUpCMUnreadyHotCpuScaleWouldScaleDown",
            3,
            [50000, 15000, 30000],
            15000,
            [False, True, False],
            7,
            31666,
        ),
        ("TestReplicaCalcScaleDownCM", 5, [12000] * 5, 20000, None, 3, 12000),
        ("TestReplicaCalcToleranceCM", 3, [20000, 21000, 21000], 20000, None, 3, 20666),
        ("TestReplicaCalcScaleUpCMExternalNoLabels (a Pods metric upstream)", 1, [8600], 4400, None, 2, 8600),
    ],
)
def test_pods_metric_matches_upstream(upstream, current, levels, target, ready, expected, usage):
    values = {f"test-pod-{i}": v for i, v in enumerate(levels)}
    got = pods_metric_replicas(
        current, target_average_milli=target, values_milli=values, pods=_pods(current, ready), tolerances=T
    )
    assert got == (expected, usage), upstream


@pytest.mark.parametrize(
    ("upstream", "pods", "levels", "expected"),
    [
        # scale-up: the missing pod counts as 0, the new ratio 0.95 is within tolerance → no change
        ("TestReplicaCalcMissingMetricsNoChangeGt", 2, [1900], 2),
        # exactly at the target the missing pod is left out (the controller's "else if usageRatio > 1.0")
        ("TestReplicaCalcMissingMetricsNoChangeEq", 2, [1000], 2),
        # scale-down: the missing pod counts as the target, ratio 0.8 → ceil(0.8 × 2) = 2
        ("TestReplicaCalcMissingMetricsNoChangeLt", 2, [600], 2),
        # scale-down with two missing pods: (400 + 95 + 1000 + 1000) // 4 = 623 → ceil(0.623 × 4) = 3
        ("TestReplicaCalcMissingMetrics", 4, [400, 95], 3),
    ],
)
def test_missing_metrics_on_a_pods_metric(upstream, pods, levels, expected):
    values = {f"test-pod-{i}": v for i, v in enumerate(levels)}
    got, _ = pods_metric_replicas(pods, target_average_milli=1000, values_milli=values, pods=_pods(pods), tolerances=T)
    assert got == expected, upstream


def test_pending_pods_count_zero_on_scale_up_only():
    """TestReplicaCalcScaleDownExcludeUnscheduledPods (on a Pods metric): Pending pods are left out of a
    scale-down; TestReplicaCalcScaleUpUnreadyNoScale's rule: on a scale-up they count as 0."""
    pods = _pods(5, phase=["Running", "Pending", "Pending", "Pending", "Pending"])
    assert pods_metric_replicas(
        5, target_average_milli=500, values_milli={"test-pod-0": 100}, pods=pods, tolerances=T
    ) == (1, 100)
    pods = _pods(3, phase=["Running", "Pending", "Pending"])
    # ratio 1.5 → with pending at 0: 600 // 3 = 200 → 0.5: the direction flips → no change
    assert pods_metric_replicas(
        3, target_average_milli=400, values_milli={"test-pod-0": 600}, pods=pods, tolerances=T
    ) == (3, 600)


def test_deleted_and_failed_pods_are_ignored():
    """TestReplicaCalcScaleUpIgnoresFailedPods / ...DeletionPods: 2 live pods at 500 and 700 of 300 → 4."""
    pods = [*_pods(2), PodInfo("failed", phase="Failed"), PodInfo("gone", deleting=True)]
    got = pods_metric_replicas(
        2, target_average_milli=300, values_milli={"test-pod-0": 500, "test-pod-1": 700}, pods=pods, tolerances=T
    )
    assert got == (4, 600)


def test_values_of_pods_not_selected_count_in_the_average():
    """TestReplicaCalcSuperfluousMetrics, on a Pods metric: GetMetricUsageRatio averages every value the
    metrics API returned, while the proposal multiplies by the ready pods listed: 28700 // 6 = 4783 → 4.783 × 4."""
    values = {f"test-pod-{i}": v for i, v in enumerate([4000, 9500, 3000, 7000, 3200, 2000])}
    got = pods_metric_replicas(4, target_average_milli=1000, values_milli=values, pods=_pods(4), tolerances=T)
    assert got == (20, 4783)


def test_no_values_is_an_invalid_metric():
    """TestReplicaCalcEmptyMetrics: an empty answer is an error, not zero."""
    with pytest.raises(NoMetrics):
        pods_metric_replicas(3, target_average_milli=1000, values_milli={}, pods=_pods(3), tolerances=T)


@pytest.mark.parametrize(
    ("upstream", "current", "usage", "target", "ready", "expected"),
    [
        ("TestReplicaCalcScaleUpCMObject", 3, 20000, 15000, None, 4),
        ("TestReplicaCalcScaleUpCMObjectIgnoresUnreadyPods", 3, 50000, 10000, [False, True, False], 5),
        ("TestReplicaCalcScaleDownCMObject", 5, 12000, 20000, None, 3),
        ("TestReplicaCalcToleranceCMObject", 3, 20666, 20000, None, 3),
        ("TestReplicaCalcScaleUpCMExternalIgnoresUnreadyPods", 3, 8600, 4400, [False, True, False], 2),
        ("TestReplicaCalcScaleDownCMExternal", 5, 8600, 14334, None, 3),
        ("TestReplicaCalcToleranceCMExternal", 3, 8600, 8888, None, 3),
    ],
)
def test_value_targets_match_upstream(upstream, current, usage, target, ready, expected):
    got = value_replicas(current, usage_milli=usage, target_milli=target, pods=_pods(current, ready), tolerances=T)
    assert got == (expected, usage), upstream


@pytest.mark.parametrize(
    ("upstream", "current", "usage", "target", "expected", "average"),
    [
        ("TestReplicaCalcScaleUpCMPerPodObject", 3, 20000, 5000, 4, 6667),
        ("TestReplicaCalcScaleDownPerPodCMObject", 5, 6000, 2000, 3, 1200),
        ("TestReplicaCalcTolerancePerPodCMObject", 4, 20166, 5000, 4, 5042),
        ("TestReplicaCalcScaleUpPerPodCMExternal", 3, 8600, 2150, 4, 2867),
        ("TestReplicaCalcScaleDownPerPodCMExternal", 5, 8600, 2867, 3, 1720),
        ("TestReplicaCalcTolerancePerPodCMExternal", 3, 8600, 2900, 3, 2867),
    ],
)
def test_average_value_targets_match_upstream(upstream, current, usage, target, expected, average):
    got = average_value_replicas(current, usage_milli=usage, target_average_milli=target, tolerances=T)
    assert got == (expected, average), upstream


def test_per_direction_tolerance():
    """KEP-4951 (behavior.scaleUp/scaleDown.tolerance): 5 % up, 20 % down."""
    t = Tolerances(down=0.2, up=0.05)
    assert t.within(0.81) and t.within(1.05)
    assert not t.within(0.79) and not t.within(1.06)
    assert value_replicas(10, usage_milli=1060, target_milli=1000, pods=_pods(10), tolerances=t)[0] == 11
    assert value_replicas(10, usage_milli=850, target_milli=1000, pods=_pods(10), tolerances=t)[0] == 10
