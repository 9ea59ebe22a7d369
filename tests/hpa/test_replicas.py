"""One metric's proposal: the cases of kubernetes/kubernetes pkg/controller/podautoscaler/replica_calculator_test.go.

Each case names the upstream test it reproduces. Upstream values are MilliValues ("levels"), the target is
``targetUtilization`` (a milli AverageValue/Value) and ``currentReplicas`` pods exist, Running and Ready
unless a readiness/phase list says otherwise. The missing-metric cases are run on a Pods metric with the same
arithmetic; the cpu readiness rules (``groupPods``: initialization period, initial readiness delay) are
TestGroupPods' table and GetResourceReplicas' unready and hot-CPU cases.
"""

from __future__ import annotations

import pytest

from gpuscale.hpa.replicas import (
    NoMetrics,
    Readiness,
    ResourceSample,
    SelectedPod,
    Tolerances,
    average_value_replicas,
    pods_metric_replicas,
    resource_replicas,
    value_replicas,
)

T = Tolerances()


def _pods(n: int, ready: list[bool] | None = None, phase: list[str] | None = None) -> list[SelectedPod]:
    return [
        SelectedPod(f"test-pod-{i}", phase=(phase or ["Running"] * n)[i], ready=(ready or [True] * n)[i])
        for i in range(n)
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
    pods = [*_pods(2), SelectedPod("failed", phase="Failed"), SelectedPod("gone", deleting=True)]
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


# --- cpu readiness: TestGroupPods (cpu initialization period 2 min, initial readiness delay 10 s, as upstream's
# defaultTesting… values); times in seconds, now = 0; ZERO stands for Go's zero time (long ago)
UPSTREAM_READINESS = Readiness(cpu_initialization_period_s=120, initial_readiness_delay_s=10)
ZERO = -1e10


@pytest.mark.parametrize(
    ("case", "pod", "sample", "unready"),
    [
        ("unready a pod without ready condition", SelectedPod("p", started=0.0, ready_changed=None), (0, 60), True),
        (
            "count in a ready pod with fresh metrics during initialization period",
            SelectedPod("p", started=-60, ready_changed=-30),
            (0, 30),
            False,
        ),
        (
            "unready a ready pod without fresh metrics during initialization period",
            SelectedPod("p", started=-60, ready_changed=-30),
            (0, 60),
            True,
        ),
        (
            "unready an unready pod during initialization period",
            SelectedPod("p", ready=False, started=-600, ready_changed=-594),
            (ZERO, 0),
            True,
        ),
        (
            "count in a ready pod without fresh metrics after initialization period",
            SelectedPod("p", started=-180, ready_changed=-180),
            (-120, 60),
            False,
        ),
        (
            "count in an unready pod that was ready after initialization period",
            SelectedPod("p", ready=False, started=-600, ready_changed=-540),
            (ZERO, 0),
            False,
        ),
        (
            "unready pod that has never been ready after initialization period (at the delay: counted)",
            SelectedPod("p", ready=False, started=-600, ready_changed=-590),
            (ZERO, 0),
            False,
        ),
        (
            "... and a second inside the delay: unready",
            SelectedPod("p", ready=False, started=-600, ready_changed=-591),
            (ZERO, 0),
            True,
        ),
        ("no start time", SelectedPod("p", started=None, ready_changed=-30), (0, 30), True),
    ],
)
def test_cpu_readiness_matches_upstream_group_pods(case, pod, sample, unready):
    assert (
        UPSTREAM_READINESS.unready_cpu_sample(
            pod, ResourceSample(sample[0], timestamp=sample[0], window_s=sample[1]), 0.0
        )
        is unready
    ), case


def _cpu_pods(levels, *, ready=None, started=None, request=2000):
    """GetResourceReplicas' fixture: two containers of 1 cpu each per pod (request 2000 m), the metric's
    timestamp and the Ready condition's last transition at Go's zero time, a 1 min window."""
    n = len(levels)
    pods = [
        SelectedPod(
            f"p{i}",
            ready=(ready or [True] * n)[i],
            started=(started or [ZERO] * n)[i],
            ready_changed=ZERO,
            requests_milli={"cpu": request, "memory": request},
        )
        for i in range(n)
    ]
    samples = {f"p{i}": ResourceSample(2 * v, timestamp=ZERO, window_s=60) for i, v in enumerate(levels)}
    return pods, samples


HOT, COOL = 0.0, -180.0  # hotCPUCreationTime (now), coolCPUCreationTime (3 min ago)


@pytest.mark.parametrize(
    ("upstream", "levels", "ready", "started", "expected", "utilization"),
    [
        ("scale up: unready pod scales less", [300, 500, 700], [False, True, True], None, 4, 60),
        ("scale up: hot-CPU pod scales less", [300, 500, 700], None, [HOT, COOL, COOL], 4, 60),
        ("no scale: unready pods ignored", [400, 500, 700], [True, False, False], None, 3, 40),
        ("no scale: hot-CPU pods ignored", [400, 500, 700], [True, False, False], [COOL, HOT, HOT], 3, 40),
        ("scale up (every pod ready and cool)", [300, 500, 700], None, None, 5, 50),
    ],
)
def test_cpu_utilization_matches_upstream(upstream, levels, ready, started, expected, utilization):
    pods, samples = _cpu_pods(levels, ready=ready, started=started)
    got = resource_replicas(
        3,
        resource="cpu",
        target_utilization=30,
        samples=samples,
        pods=pods,
        tolerances=T,
        readiness=UPSTREAM_READINESS,
        now=0.0,
    )
    assert got == (expected, utilization), upstream


def test_readiness_gates_cpu_only():
    """The same not-ready pods and values: excluded for cpu, counted for memory and for a Pods metric."""
    pods, samples = _cpu_pods([400, 500, 700], ready=[True, False, False])
    common = dict(samples=samples, pods=pods, tolerances=T, readiness=UPSTREAM_READINESS, now=0.0)
    assert resource_replicas(3, resource="cpu", target_utilization=30, **common) == (3, 40)
    assert resource_replicas(3, resource="memory", target_utilization=30, **common) == (6, 53)
    values = {name: s.value_milli for name, s in samples.items()}
    assert pods_metric_replicas(3, target_average_milli=600, values_milli=values, pods=pods, tolerances=T) == (6, 1066)
    # an AverageValue cpu target (GetRawResourceReplicas) is gated the same way
    assert resource_replicas(3, resource="cpu", target_average_milli=600, **common) == (3, 800)


def test_missing_cpu_on_a_scale_down_counts_as_its_request_times_the_target():
    """GetResourceReplicas: a pod without a sample on a scale-down uses request × max(100, target) %."""
    pods, samples = _cpu_pods([100, 100, 100])
    del samples["p2"]
    got = resource_replicas(
        3,
        resource="cpu",
        target_utilization=50,
        samples=samples,
        pods=pods,
        tolerances=T,
        readiness=Readiness(),
        now=0.0,
    )
    # ratio 10 % / 50 % = 0.2 → with p2 at 100 % of 2000 m: (200 + 200 + 2000) × 100 / 6000 = 40 % → 0.8 → ceil(2.4)
    assert got == (3, 10)
    with pytest.raises(NoMetrics, match="missing request for cpu in Pod p0"):
        resource_replicas(
            3,
            resource="cpu",
            target_utilization=50,
            samples=samples,
            pods=[SelectedPod("p0", started=ZERO, ready_changed=ZERO)],
            tolerances=T,
            readiness=Readiness(),
            now=0.0,
        )
