"""One HPA over time: the examples of the Kubernetes HPA documentation
(https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/, "Algorithm details",
"Configurable scaling behavior") and cases of kubernetes/kubernetes
pkg/controller/podautoscaler/horizontal_test.go, each citing its source."""

from __future__ import annotations

import itertools

import pytest

from gpuscale.hpa import Autoscaler, MetricUnavailable, SelectedPod, parse_manifests
from gpuscale.hpa.autoscaler import _Event

HEAD = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
"""


def hpa(body: str):
    return parse_manifests(HEAD + body, source="test.yaml")[0]


QUEUE = """
  metrics:
    - type: Pods
      pods:
        metric: {name: inference_queue_depth}
        target: {type: AverageValue, averageValue: 100m}
"""


class Values:
    """Readings where every pod reports the same value (milli); ``missing`` metrics raise."""

    def __init__(self, per_pod: dict[str, int] | None = None, *, each: int | None = None, pods: int = 0, missing=()):
        self.per_pod = per_pod if per_pod is not None else {f"p{i}": each for i in range(pods)}
        self.missing = set(missing)
        self.objects: dict[str, int] = {}

    def pods(self, metric):
        if metric.name in self.missing:
            raise MetricUnavailable("404")
        return self.per_pod

    def object(self, described, metric):
        if metric.name in self.missing:
            raise MetricUnavailable("404")
        return self.objects[metric.name]

    def external(self, metric):
        return self.object(None, metric)


def pods(n: int) -> list[SelectedPod]:
    return [SelectedPod(f"p{i}") for i in range(n)]


def sync(auto: Autoscaler, now: float, current: int, value_milli: int) -> int:
    return auto.reconcile(
        now, spec_replicas=current, pods=pods(current), readings=Values(each=value_milli, pods=current)
    ).desired_replicas


def test_docs_ratio_doubles_and_halves():
    """Docs, "Algorithm details": current 200m with desired 100m doubles the replicas; 50m halves them."""
    up = Autoscaler(hpa("  minReplicas: 1\n  maxReplicas: 100\n" + QUEUE))
    assert sync(up, 0, 4, 200) == 8
    down = Autoscaler(
        hpa(
            "  minReplicas: 1\n  maxReplicas: 100\n"
            + QUEUE
            + "  behavior:\n    scaleDown: {stabilizationWindowSeconds: 0}\n"
        )
    )
    assert sync(down, 0, 4, 50) == 2


def test_docs_tolerance_skips_small_changes():
    """Docs: the control plane skips scaling when the ratio is within 0.1 of 1.0."""
    auto = Autoscaler(hpa("  maxReplicas: 100\n" + QUEUE))
    assert sync(auto, 0, 10, 109) == 10
    assert sync(auto, 15, 10, 111) == 12


def test_docs_largest_proposal_of_several_metrics():
    """Docs, "Scaling on multiple metrics": each metric proposes a count; the largest is used."""
    two = (
        QUEUE
        + """    - type: Object
      object:
        describedObject: {apiVersion: apps/v1, kind: Deployment, name: web}
        metric: {name: inference_queue_compute_ratio}
        target: {type: Value, value: "1"}
"""
    )
    auto = Autoscaler(hpa("  maxReplicas: 100\n" + two))
    readings = Values(each=150, pods=4)
    readings.objects["inference_queue_compute_ratio"] = 2500
    d = auto.reconcile(0, spec_replicas=4, pods=pods(4), readings=readings)
    assert [p.replicas for p in d.proposals] == [6, 10]
    assert d.desired_replicas == 8  # then the no-behavior scale-up limit max(2 × 4, 4)


def test_invalid_metric_blocks_scale_down_not_scale_up():
    """Docs: if a metric cannot be computed and the others would scale down, nothing changes; a scale-up
    proceeds (horizontal.go: "invalid metrics (x invalid out of y)")."""
    two = (
        QUEUE
        + """    - type: Pods
      pods:
        metric: {name: gpu_sm_active}
        target: {type: AverageValue, averageValue: "60"}
"""
    )
    spec = hpa("  maxReplicas: 100\n" + two + "  behavior:\n    scaleDown: {stabilizationWindowSeconds: 0}\n")
    auto = Autoscaler(spec)
    down = auto.reconcile(0, spec_replicas=4, pods=pods(4), readings=Values(each=10, pods=4, missing={"gpu_sm_active"}))
    assert down.desired_replicas == 4 and "1 invalid out of 2" in down.reason
    up = auto.reconcile(15, spec_replicas=4, pods=pods(4), readings=Values(each=300, pods=4, missing={"gpu_sm_active"}))
    assert up.desired_replicas == 8
    none = auto.reconcile(
        30,
        spec_replicas=4,
        pods=pods(4),
        readings=Values(each=300, pods=4, missing={"gpu_sm_active", "inference_queue_depth"}),
    )
    assert none.desired_replicas == 4 and "2 invalid out of 2" in none.reason


def test_min_and_max_replicas():
    """horizontal.go reconcileAutoscaler: above max → max, below min → min, before any metric is read;
    a target at 0 replicas with minReplicas ≥ 1 is not autoscaled."""
    auto = Autoscaler(hpa("  minReplicas: 2\n  maxReplicas: 5\n" + QUEUE))
    assert (
        auto.reconcile(
            0, spec_replicas=7, pods=pods(7), readings=Values(pods=0, missing={"inference_queue_depth"})
        ).desired_replicas
        == 5
    )
    assert (
        auto.reconcile(
            15, spec_replicas=1, pods=pods(1), readings=Values(pods=0, missing={"inference_queue_depth"})
        ).desired_replicas
        == 2
    )
    assert auto.reconcile(30, spec_replicas=0, pods=[], readings=Values(each=1000, pods=0)).desired_replicas == 0
    assert sync(auto, 45, 4, 10_000) == 5


@pytest.mark.parametrize(
    ("name", "history", "proposed", "expected", "log_length"),
    [
        ("empty log", [], 5, 5, 1),
        ("stabilize", [(4, -120), (5, -60)], 3, 5, 3),
        ("no stabilize", [(1, -120), (2, -60)], 3, 3, 3),
        ("no stabilize - old recommendations", [(10, -600), (9, -540)], 3, 3, 2),
        ("stabilize - old recommendations", [(10, -600), (4, -60), (5, -120), (9, -540)], 3, 5, 4),
    ],
)
def test_legacy_downscale_stabilization(name, history, proposed, expected, log_length):
    """horizontal_test.go TestNormalizeDesiredReplicas (no behavior: the 5-minute downscale window)."""
    auto = Autoscaler(hpa("  maxReplicas: 1000\n" + QUEUE))
    now = 10_000.0
    auto._recommendations[:] = [(now + ago, rec) for rec, ago in history]
    assert auto._normalize_legacy(now, 10, proposed)[0] == expected, name
    assert len(auto._recommendations) == log_length, name


def test_legacy_scale_up_limit():
    """horizontal_test.go TestConvertDesiredReplicasWithRules: scale-up limited to max(2 × current, 4), then
    maxReplicas; below minReplicas → minReplicas."""
    assert Autoscaler(hpa("  minReplicas: 3\n  maxReplicas: 8\n" + QUEUE))._normalize_legacy(0, 5, 7) == (
        7,
        "ReadyForNewScale",
    )
    assert Autoscaler(hpa("  minReplicas: 2\n  maxReplicas: 8\n" + QUEUE))._normalize_legacy(0, 3, 1) == (
        2,
        "TooFewReplicas",
    )
    assert Autoscaler(hpa("  maxReplicas: 10\n" + QUEUE))._normalize_legacy(0, 20, 1000) == (10, "TooManyReplicas")
    assert Autoscaler(hpa("  maxReplicas: 2000\n" + QUEUE))._normalize_legacy(0, 3, 1000) == (6, "ScaleUpLimit")


def test_docs_scale_down_policies_80_to_10():
    """Docs, "Scaling policies": Pods 4 / Percent 10 per 60 s (Max). From 80 replicas the first step removes
    8 (10 %); the next step, a period later, removes 8 again (10 % of 72 = 7.2, the change rounded up);
    at 40 replicas and below the Pods policy (4 per period) allows the larger change."""
    auto = Autoscaler(
        hpa(
            """  maxReplicas: 100
"""
            + QUEUE
            + """  behavior:
    scaleDown:
      stabilizationWindowSeconds: 0
      policies:
        - {type: Pods, value: 4, periodSeconds: 60}
        - {type: Percent, value: 10, periodSeconds: 60}
"""
        )
    )
    current, steps = 80, []
    for t in range(0, 60 * 30, 15):
        new = sync(auto, t, current, 1000 // current)  # a load worth 10 replicas
        if new != current:
            steps.append((t, current - new))
        current = new
    assert steps[:2] == [(0, 8), (60, 8)]
    assert all(t2 - t1 >= 60 for (t1, _), (t2, _) in itertools.pairwise(steps))
    assert [change for _, change in steps] == [8, 8, 7, 6, 6, 5, 4, 4, 4, 4, 4, 4, 4, 2]
    assert current == 10


def test_docs_default_scale_up_is_4_pods_or_100_percent_per_15s():
    """Docs, "Default Behavior": scale up by the larger of 4 pods and 100 % every 15 s, no window."""
    auto = Autoscaler(
        hpa("  maxReplicas: 1000\n" + QUEUE + "  behavior:\n    scaleDown: {stabilizationWindowSeconds: 0}\n")
    )
    assert sync(auto, 0, 1, 10_000) == 5
    assert sync(auto, 1, 5, 10_000) == 5  # same period: 4 already added from 1
    assert sync(auto, 15, 5, 10_000) == 10
    assert sync(auto, 30, 10, 10_000) == 20


def test_docs_scale_up_stabilization_window_uses_the_lowest_recommendation():
    """Docs, "Stabilization window": with a scale-up window the lowest recommendation of the window wins."""
    auto = Autoscaler(
        hpa("  maxReplicas: 100\n" + QUEUE + "  behavior:\n    scaleUp: {stabilizationWindowSeconds: 60}\n")
    )
    assert sync(auto, 0, 2, 100) == 2  # recommendation 2
    assert sync(auto, 15, 2, 400) == 2  # 8 proposed, but 2 was recommended within 60 s
    assert sync(auto, 75, 2, 400) == 6  # the 2 has aged out; 8 proposed → 2 + max(4 pods, 100 %)


def test_docs_scale_down_stabilization_window_uses_the_highest_recommendation():
    auto = Autoscaler(
        hpa("  maxReplicas: 100\n" + QUEUE + "  behavior:\n    scaleDown: {stabilizationWindowSeconds: 120}\n")
    )
    assert sync(auto, 0, 8, 100) == 8
    assert sync(auto, 15, 8, 25) == 8  # 2 proposed, 8 recommended within 120 s
    assert sync(auto, 135, 8, 25) == 2


def test_docs_select_policy_disabled_and_min():
    """Docs: selectPolicy Disabled turns a direction off; Min picks the policy with the smallest change."""
    off = Autoscaler(
        hpa(
            "  maxReplicas: 100\n"
            + QUEUE
            + "  behavior:\n    scaleDown: {selectPolicy: Disabled, stabilizationWindowSeconds: 0}\n"
        )
    )
    assert sync(off, 0, 8, 10) == 8
    least = Autoscaler(
        hpa(
            "  maxReplicas: 100\n"
            + QUEUE
            + """  behavior:
    scaleUp:
      selectPolicy: Min
      policies:
        - {type: Pods, value: 1, periodSeconds: 60}
        - {type: Percent, value: 50, periodSeconds: 60}
"""
        )
    )
    assert sync(least, 0, 4, 1000) == 5


def test_not_yet_ready_replicas_are_counted_as_the_controller_counts_them():
    """Docs: pods without metrics count as 0 on a scale-up, so loading replicas damp the next scale-up."""
    auto = Autoscaler(hpa("  maxReplicas: 100\n" + QUEUE))
    fleet = [*pods(2), SelectedPod("new-0", ready=False), SelectedPod("new-1", phase="Pending", ready=False)]
    readings = Values({"p0": 300, "p1": 300})
    d = auto.reconcile(0, spec_replicas=4, pods=fleet, readings=readings)
    # ratio 3 over 2 reporting pods; with new-0 missing (0) and new-1 pending (0): 600 // 4 → 1.5 → ceil(6)
    assert d.proposals[0].replicas == 6 and d.desired_replicas == 6


def test_external_and_object_average_value_divide_by_the_pods_that_exist():
    """horizontal.go computeReplicasForMetric: External AverageValue → GetExternalPerPodMetricReplicas and
    Object AverageValue → GetObjectPerPodMetricReplicas, both against status replicas (all pods, ready or not)."""
    external = """
  metrics:
    - type: External
      external:
        metric: {name: inference_queue_depth, selector: {matchLabels: {model: bert}}}
        target: {type: AverageValue, averageValue: "20"}
"""
    auto = Autoscaler(hpa("  maxReplicas: 20\n" + external))
    readings = Values(pods=0)
    readings.objects["inference_queue_depth"] = 130_000  # 130 waiting over the namespace
    fleet = [*pods(3), SelectedPod("loading", ready=False)]
    d = auto.reconcile(0, spec_replicas=4, pods=fleet, readings=readings)
    assert d.proposals[0].replicas == 7 and d.proposals[0].usage_milli == 32500  # ceil(130 / 20); 130 / 4 pods
    obj = """
  metrics:
    - type: Object
      object:
        describedObject: {apiVersion: apps/v1, kind: Deployment, name: web}
        metric: {name: inference_requests_per_second}
        target: {type: AverageValue, averageValue: "50"}
"""
    auto = Autoscaler(hpa("  maxReplicas: 20\n" + obj))
    readings.objects["inference_requests_per_second"] = 210_000
    # 210 / (50 × 4) = 1.05: within the tolerance, 4 stays
    assert auto.reconcile(0, spec_replicas=4, pods=pods(4), readings=readings).desired_replicas == 4
    readings.objects["inference_requests_per_second"] = 230_000
    assert auto.reconcile(15, spec_replicas=4, pods=pods(4), readings=readings).desired_replicas == 5  # ceil(4.6)


def _rules(pods: int, pods_period: int, percent: int, percent_period: int, window: int) -> str:
    """horizontal_test.go generateScalingRules(pods, podsPeriod, percent, percentPeriod, stabilizationWindow)."""
    policies = []
    if pods:
        policies.append(f"{{type: Pods, value: {pods}, periodSeconds: {pods_period}}}")
    if percent:
        policies.append(f"{{type: Percent, value: {percent}, periodSeconds: {percent_period}}}")
    return f"{{stabilizationWindowSeconds: {window}, selectPolicy: Max, policies: [{', '.join(policies)}]}}"


@pytest.mark.parametrize(
    ("name", "current", "proposed", "low", "high", "up", "down", "events", "expected"),
    [
        ("prenormalized desired replicas within range", 5, 7, 3, 8, None, None, [], 7),
        ("prenormalized desired replicas < minReplicas", 3, 1, 2, 8, None, None, [], 2),
        ("maxReplicas is the limit because maxReplicas < scaleUpLimit", 20, 1000, 1, 10, None, None, [], 10),
        ("desired replica count is more than the maximum replica count", 100, 1000, 100, 150, None, None, [], 150),
        ("scaleUpLimit is the limit ... with user policies", 3, 1000, 1, 2000, (0, 0, 1, 60, 0), None, [], 4),
        (
            "scaleDownLimit is the limit ... with user defined policies",
            1000,
            3,
            3,
            2000,
            None,
            (20, 60, 0, 0, 0),
            [],
            980,
        ),
        ("scaleUp with default behavior", 10, 50, 1, 1000, None, None, [], 20),
        ("scaleUp with pods policy larger than percent policy", 10, 500, 1, 1000, (100, 60, 100, 60, 0), None, [], 110),
        ("scaleUp with percent policy larger than pods policy", 10, 500, 1, 1000, (2, 60, 100, 60, 0), None, [], 20),
        (
            "scaleUp with spec MaxReplicas limitation with large pod policy",
            10,
            50,
            1,
            1000,
            (100, 60, 0, 0, 0),
            None,
            [],
            50,
        ),
        ("scaleUp with pod policy limitation", 10, 50, 1, 1000, (30, 60, 0, 0, 0), None, [], 40),
        ("scaleUp with percent policy limitation", 10, 50, 1, 1000, (0, 0, 200, 60, 0), None, [], 30),
        ("scaleDown with percent policy larger than pod policy", 100, 2, 1, 1000, None, (20, 60, 1, 60, 300), [], 80),
        ("scaleDown with pod policy larger than percent policy", 100, 2, 1, 1000, None, (2, 60, 1, 60, 300), [], 98),
        (
            "scaleDown with spec MinReplicas limitation with large pod policy",
            10,
            0,
            1,
            1000,
            None,
            (100, 60, 0, 0, 300),
            [],
            1,
        ),
        (
            "scaleDown with spec MinReplicas limitation with large percent policy",
            10,
            2,
            5,
            1000,
            None,
            (0, 0, 100, 60, 300),
            [],
            5,
        ),
        ("scaleDown with pod policy limitation", 10, 2, 1, 1000, None, (5, 60, 0, 0, 300), [], 5),
        ("scaleDown with percent policy limitation", 10, 5, 1, 1000, None, (0, 0, 50, 60, 300), [], 5),
        (
            "scaleUp ... MaxReplicas limitation with large pod policy and events",
            100,
            500,
            1,
            200,
            (300, 60, 0, 0, 0),
            None,
            [1, 5, 9],
            200,
        ),
        (
            "scaleUp with currentReplicas limitation ... a lot of recent scale up events",
            100,
            500,
            1,
            1000,
            (5, 120, 0, 0, 0),
            None,
            [1, 5, 9],
            100,
        ),
        (
            "scaleUp with pod policy and previous scale up events",
            100,
            500,
            1,
            1000,
            (150, 120, 0, 0, 0),
            None,
            [1, 5, 9],
            235,
        ),
    ],
)
def test_upstream_scaling_with_rules(name, current, proposed, low, high, up, down, events, expected):
    """horizontal_test.go TestScalingWithRules (kubernetes/kubernetes): the rate limits of the behavior path;
    events as its generateEventsUniformDistribution(events, 120) places them (100, 60 and 20 s ago)."""
    behavior = "  behavior:\n"
    behavior += f"    scaleUp: {_rules(*up)}\n" if up else ""
    behavior += f"    scaleDown: {_rules(*down)}\n" if down else "    scaleDown: {stabilizationWindowSeconds: 300}\n"
    auto = Autoscaler(hpa(f"  minReplicas: {low}\n  maxReplicas: {high}\n" + QUEUE + behavior))
    now = 10_000.0
    for change, ago in zip(events, (100, 60, 20), strict=False):
        auto._up_events.append(_Event(now - ago, change))
    assert auto._normalize_with_behavior(now, current, proposed)[0] == expected, name


def test_scale_to_zero_and_back_from_it_on_an_external_metric():
    """HPAScaleToZero (Kubernetes 1.37): minReplicas 0 with an External metric; the Value target scales the
    ready pods by the ratio, and from zero replicas to ceil(ratio) (getUsageRatioReplicaCount)."""
    external = """
  minReplicas: 0
  maxReplicas: 10
  behavior: {scaleDown: {stabilizationWindowSeconds: 0}}
  metrics:
    - type: External
      external:
        metric: {name: inference_queue_depth}
        target: {type: Value, value: "4"}
"""
    auto = Autoscaler(hpa(external))
    readings = Values(pods=0)
    readings.objects["inference_queue_depth"] = 0
    d = auto.reconcile(0, spec_replicas=2, pods=pods(2), readings=readings)
    assert d.desired_replicas == 0  # ratio 0: ceil(0 × 2 ready)
    assert auto.reconcile(15, spec_replicas=0, pods=[], readings=readings).desired_replicas == 0
    readings.objects["inference_queue_depth"] = 9_000
    assert auto.reconcile(30, spec_replicas=0, pods=[], readings=readings).desired_replicas == 3  # ceil(9 / 4)


def test_a_target_scaled_to_zero_by_hand_is_left_alone_when_min_replicas_is_not_zero():
    auto = Autoscaler(hpa("  minReplicas: 1\n  maxReplicas: 5\n" + QUEUE))
    d = auto.reconcile(0, spec_replicas=0, pods=[], readings=Values(each=900, pods=0))
    assert d.desired_replicas == 0 and not d.rescale and "ScalingDisabled" in d.reason
