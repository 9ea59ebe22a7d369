"""One metric's replica proposal, as ``replica_calculator.go`` computes it.

Values are in thousandths (``Quantity.MilliValue()``) and pod averages use integer division, as the
controller does, so a proposal here matches the controller's to the replica. Pods are grouped as
``groupPods`` does for a non-CPU metric: deleted or failed pods are ignored; Pending pods are "unready";
a running pod with no value is "missing"; every other pod with a value counts as ready (readiness gates only
CPU metrics — a Running pod whose readiness probe still fails but reports a value counts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
class PodInfo:
    """What the controller's pod lister knows of one pod selected by the HPA."""

    name: str
    phase: str = "Running"  # Pending | Running | Succeeded | Failed
    ready: bool = True
    deleting: bool = False


def _usage_ratio(values: Mapping[str, int], target_milli: int) -> tuple[float, int]:
    usage = sum(values.values()) // len(values)  # NB: int64 division, as GetMetricUsageRatio
    return usage / target_milli, usage


def pods_metric_replicas(
    current_replicas: int,
    *,
    target_average_milli: int,
    values_milli: Mapping[str, int],
    pods: Sequence[PodInfo],
    tolerances: Tolerances,
) -> tuple[int, int]:
    """(proposed replicas, average usage in milli) for a Pods metric with an AverageValue target
    (``GetMetricReplicas`` → ``calcPlainMetricReplicas``)."""
    if not pods:
        raise NoMetrics("no pods returned by selector while calculating replica count")
    if not values_milli:
        raise NoMetrics("no metrics returned from custom metrics API")
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
        ready += 1
    if not metrics:
        raise NoMetrics("did not receive metrics for targeted pods (pods might be unready)")
    ratio, usage = _usage_ratio(metrics, target_average_milli)
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if tolerances.within(ratio):
            return current_replicas, usage
        return math.ceil(ratio * ready), usage
    # NB: recompute conservatively: missing pods use the target on a scale-down and 0 on a scale-up;
    # unready pods use 0 on a scale-up.
    if ratio != 1.0:  # NB: at exactly 1.0 the controller leaves missing pods out
        for name in missing:
            metrics[name] = target_average_milli if ratio < 1.0 else 0
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0
    new_ratio, _ = _usage_ratio(metrics, target_average_milli)
    if tolerances.within(new_ratio) or (ratio > 1.0 > new_ratio) or (ratio < 1.0 < new_ratio):
        return current_replicas, usage  # the direction flipped or vanished: do nothing
    proposed = math.ceil(new_ratio * len(metrics))
    if (new_ratio < 1.0 and proposed > current_replicas) or (new_ratio > 1.0 and proposed < current_replicas):
        return current_replicas, usage
    return proposed, usage


def ready_pod_count(pods: Sequence[PodInfo]) -> int:
    """``getReadyPodsCount``: Running and Ready pods; an error when the selector matches none."""
    if not pods:
        raise NoMetrics("no pods returned by selector while calculating replica count")
    return sum(1 for p in pods if p.phase == "Running" and p.ready)


def usage_ratio_replicas(
    current_replicas: int, ratio: float, *, pods: Sequence[PodInfo], tolerances: Tolerances
) -> int:
    """``getUsageRatioReplicaCount``: Object/External Value targets scale the ready pods by the ratio."""
    if current_replicas != 0:
        if tolerances.within(ratio):
            return current_replicas
        return math.ceil(ratio * ready_pod_count(pods))
    return math.ceil(ratio)  # scale from zero


def value_replicas(
    current_replicas: int, *, usage_milli: int, target_milli: int, pods: Sequence[PodInfo], tolerances: Tolerances
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
