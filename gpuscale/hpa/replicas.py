"""One metric's replica proposal, as ``replica_calculator.go`` computes it.

Values are in thousandths (``Quantity.MilliValue()``) and pod averages use integer division, as the
controller does, so a proposal here matches the controller's to the replica. Pods are grouped as
``groupPods`` does: deleted or failed pods are ignored; Pending pods are "unready"; a running pod with no
value is "missing"; every other pod with a value counts as ready — except for the **cpu** Resource metric,
the only one readiness gates (kube-controller-manager v1.37 ``replica_calculator.go``):

- within ``--horizontal-pod-autoscaler-cpu-initialization-period`` (5 min) of the pod's start, its sample is
  unready if the pod is not Ready, or if the sample was taken less than one metric window after the Ready
  condition last changed (a sample that still covers start-up CPU);
- after that period, only a pod that is not Ready and has never been ready is unready: its Ready condition
  last changed within ``--horizontal-pod-autoscaler-initial-readiness-delay`` (30 s) of its start;
- a pod with no Ready condition or no start time is unready.

So neither flag changes anything for Pods, Object or External metrics, nor for a memory Resource metric: a
loading replica that reports a GPU metric counts with that value. Unready pods' values are left out; on a
scale-up they are put back as 0, and missing pods as 0 on a scale-up and as the target on a scale-down
(for a Utilization target: their request × max(100 %, target)), and the direction must survive that.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

CPU_INITIALIZATION_PERIOD_SECONDS = 300.0  # --horizontal-pod-autoscaler-cpu-initialization-period
INITIAL_READINESS_DELAY_SECONDS = 30.0  # --horizontal-pod-autoscaler-initial-readiness-delay


class NoMetrics(Exception):
    """The controller could not compute a proposal from this metric (it counts as an invalid metric)."""


@dataclass(frozen=True, slots=True)
class Tolerances:
    """``(1 - down) ≤ ratio ≤ (1 + up)`` keeps the current count (horizontal.go ``Tolerances.isWithin``)."""

    down: float = 0.1
    up: float = 0.1

    def within(self, ratio: float) -> bool:
        return (1.0 - self.down) <= ratio <= (1.0 + self.up)


@dataclass(frozen=True, slots=True)
class SelectedPod:
    """What the controller's pod lister knows of one pod selected by the HPA (times in seconds on the
    caller's clock, the one ``reconcile`` gets ``now`` on; only a cpu Resource metric reads them)."""

    name: str
    phase: str = "Running"  # Pending | Running | Succeeded | Failed
    ready: bool = True  # the Ready condition's status
    deleting: bool = False
    started: float | None = None  # status.startTime; None: not set yet
    ready_changed: float | None = None  # the Ready condition's lastTransitionTime; None: no Ready condition
    requests_milli: Mapping[str, int] = field(default_factory=dict)  # resource → Σ containers' requests


@dataclass(frozen=True, slots=True)
class ResourceSample:
    """One pod's resource usage as metrics.k8s.io serves it: the value (milli-cores, or bytes × 1000 for
    memory), when it was taken and over which window (seconds)."""

    value_milli: int
    timestamp: float
    window_s: float = 30.0


@dataclass(frozen=True, slots=True)
class Readiness:
    """The controller's two readiness flags (seconds), which gate only a cpu Resource metric."""

    cpu_initialization_period_s: float = CPU_INITIALIZATION_PERIOD_SECONDS
    initial_readiness_delay_s: float = INITIAL_READINESS_DELAY_SECONDS

    def unready_cpu_sample(self, pod: SelectedPod, sample: ResourceSample, now: float) -> bool:
        """``groupPods``' rule for a cpu sample of a Running pod that reported one."""
        if pod.ready_changed is None or pod.started is None:
            return True
        if pod.started + self.cpu_initialization_period_s > now:
            return not pod.ready or sample.timestamp < pod.ready_changed + sample.window_s
        return not pod.ready and pod.started + self.initial_readiness_delay_s > pod.ready_changed


def _usage_ratio(values: Mapping[str, int], target_milli: int) -> tuple[float, int]:
    usage = sum(values.values()) // len(values)  # NB: int64 division, as GetMetricUsageRatio
    return usage / target_milli, usage


def pods_metric_replicas(
    current_replicas: int,
    *,
    target_average_milli: int,
    values_milli: Mapping[str, int],
    pods: Sequence[SelectedPod],
    tolerances: Tolerances,
) -> tuple[int, int]:
    """(proposed replicas, average usage in milli) for a Pods metric with an AverageValue target
    (``GetMetricReplicas`` → ``calcPlainMetricReplicas``)."""
    if not values_milli:
        raise NoMetrics("no metrics returned from custom metrics API")
    return _plain_replicas(
        current_replicas,
        target_milli=target_average_milli,
        values_milli=values_milli,
        pods=pods,
        tolerances=tolerances,
        unready_sample=None,
    )


def resource_replicas(
    current_replicas: int,
    *,
    resource: str,
    target_average_milli: int | None = None,
    target_utilization: int | None = None,
    samples: Mapping[str, ResourceSample],
    pods: Sequence[SelectedPod],
    tolerances: Tolerances,
    readiness: Readiness,
    now: float,
) -> tuple[int, int]:
    """(proposed replicas, usage) for a Resource metric: an AverageValue target (``GetRawResourceReplicas``:
    usage = average milli) or a Utilization one (``GetResourceReplicas``: usage = percent of the requests)."""
    if not samples:
        raise NoMetrics(f"unable to get metrics for resource {resource}: no metrics returned from resource metrics API")
    values = {name: s.value_milli for name, s in samples.items()}

    def unready_sample(pod: SelectedPod) -> bool:
        return resource == "cpu" and readiness.unready_cpu_sample(pod, samples[pod.name], now)

    if target_average_milli is not None:
        return _plain_replicas(
            current_replicas,
            target_milli=target_average_milli,
            values_milli=values,
            pods=pods,
            tolerances=tolerances,
            unready_sample=unready_sample,
        )
    assert target_utilization is not None
    requests: dict[str, int] = {}
    for pod in pods:
        if resource not in pod.requests_milli:
            raise NoMetrics(f"missing request for {resource} in Pod {pod.name}")
        requests[pod.name] = pod.requests_milli[resource]

    def utilization_ratio(metrics: Mapping[str, int]) -> tuple[float, int]:
        """``GetResourceUtilizationRatio``: Σ usage × 100 / Σ requests over the pods with a request."""
        known = [name for name in metrics if name in requests]
        total_requests = sum(requests[name] for name in known)
        if total_requests == 0:
            raise NoMetrics("no metrics returned matched known pods")
        utilization = sum(metrics[name] for name in known) * 100 // total_requests
        return utilization / target_utilization, utilization

    fallback = max(100, target_utilization)
    return _plain_replicas(
        current_replicas,
        target_milli=0,
        values_milli=values,
        pods=pods,
        tolerances=tolerances,
        unready_sample=unready_sample,
        ratio_of=utilization_ratio,
        missing_on_scale_down=lambda name: requests[name] * fallback // 100,
    )


def _plain_replicas(
    current_replicas: int,
    *,
    target_milli: int,
    values_milli: Mapping[str, int],
    pods: Sequence[SelectedPod],
    tolerances: Tolerances,
    unready_sample: Callable[[SelectedPod], bool] | None,
    ratio_of: Callable[[Mapping[str, int]], tuple[float, int]] | None = None,
    missing_on_scale_down: Callable[[str], int] | None = None,
) -> tuple[int, int]:
    """``calcPlainMetricReplicas`` (and ``GetResourceReplicas``, with ``ratio_of`` giving the utilization
    ratio and ``missing_on_scale_down`` a missing pod's stand-in value)."""
    if not pods:
        raise NoMetrics("no pods returned by selector while calculating replica count")

    def ratio_and_usage(metrics: Mapping[str, int]) -> tuple[float, int]:
        return ratio_of(metrics) if ratio_of is not None else _usage_ratio(metrics, target_milli)

    ready = 0
    unready: list[str] = []
    missing: list[str] = []
    # NB: values of pods the selector did not list stay in the average, as upstream (prometheus-adapter's
    # "extra items skew the result"); those of ignored and unready pods are removed.
    metrics: dict[str, int] = dict(values_milli)
    for pod in pods:
        if pod.deleting or pod.phase == "Failed":
            metrics.pop(pod.name, None)
            continue
        if pod.phase == "Pending":
            unready.append(pod.name)
            metrics.pop(pod.name, None)
            continue
        if pod.name not in values_milli:
            missing.append(pod.name)
            continue
        if unready_sample is not None and unready_sample(pod):
            unready.append(pod.name)
            metrics.pop(pod.name, None)
            continue
        ready += 1
    if not metrics:
        raise NoMetrics("did not receive metrics for targeted pods (pods might be unready)")
    ratio, usage = ratio_and_usage(metrics)
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if tolerances.within(ratio):
            return current_replicas, usage
        return math.ceil(ratio * ready), usage
    # NB: recompute conservatively: missing pods use the target on a scale-down and 0 on a scale-up;
    # unready pods use 0 on a scale-up.
    if ratio != 1.0:  # NB: at exactly 1.0 the controller leaves missing pods out
        for name in missing:
            if ratio > 1.0:
                metrics[name] = 0
            else:
                metrics[name] = missing_on_scale_down(name) if missing_on_scale_down else target_milli
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0
    new_ratio, _ = ratio_and_usage(metrics)
    if tolerances.within(new_ratio) or (ratio > 1.0 > new_ratio) or (ratio < 1.0 < new_ratio):
        return current_replicas, usage  # the direction flipped or vanished: do nothing
    proposed = math.ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and proposed > current_replicas) or (new_ratio > 1.0 and proposed < current_replicas):
        return current_replicas, usage
    return proposed, usage


def ready_pod_count(pods: Sequence[SelectedPod]) -> int:
    """``getReadyPodsCount``: Running and Ready pods; an error when the selector matches none."""
    if not pods:
        raise NoMetrics("no pods returned by selector while calculating replica count")
    return sum(1 for p in pods if p.phase == "Running" and p.ready)


def usage_ratio_replicas(
    current_replicas: int, ratio: float, *, pods: Sequence[SelectedPod], tolerances: Tolerances
) -> int:
    """``getUsageRatioReplicaCount``: Object/External Value targets scale the ready pods by the ratio."""
    if current_replicas != 0:
        if tolerances.within(ratio):
            return current_replicas
        return math.ceil(ratio * ready_pod_count(pods))
    return math.ceil(ratio)  # scale from zero


def value_replicas(
    current_replicas: int, *, usage_milli: int, target_milli: int, pods: Sequence[SelectedPod], tolerances: Tolerances
) -> tuple[int, int]:
    """Object or External metric with a Value target (``GetObjectMetricReplicas``, ``GetExternalMetricReplicas``)."""
    ratio = usage_milli / target_milli
    return usage_ratio_replicas(current_replicas, ratio, pods=pods, tolerances=tolerances), usage_milli


def average_value_replicas(
    status_replicas: int, *, usage_milli: int, target_average_milli: int, tolerances: Tolerances
) -> tuple[int, int]:
    """Object or External metric with an AverageValue target (``GetObjectPerPodMetricReplicas``,
    ``GetExternalPerPodMetricReplicas``): the total divided by the target, compared against the pods that
    exist now (status replicas, ready or not)."""
    replicas = status_replicas
    ratio = usage_milli / (target_average_milli * replicas) if replicas else math.inf
    if not tolerances.within(ratio):
        replicas = math.ceil(usage_milli / target_average_milli)
    average = math.ceil(usage_milli / status_replicas) if status_replicas else usage_milli
    return replicas, average
