"""One HorizontalPodAutoscaler over time, as ``horizontal.go``'s ``reconcileAutoscaler`` runs it each sync.

State kept between syncs is what the controller keeps in memory per HPA: the recommendations of the last
stabilization window and the scale events of the longest policy period. Time is passed in (seconds on any
monotonic clock), never read, so the same object serves an hour-long replay and a live demo loop.

Per sync: each metric proposes a replica count (replicas.py); the largest wins; if every metric is invalid,
or some are and the winner would scale down, nothing changes. Then min/max, and either the legacy
normalization (no ``behavior``: 300 s scale-down window, at most max(2×current, 4) up) or the behavior
path (scale-up/scale-down stabilization windows, Pods/Percent policies over periodSeconds, selectPolicy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

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
from gpuscale.hpa.spec import (
    DEFAULT_DOWNSCALE_STABILIZATION_SECONDS,
    DEFAULT_TOLERANCE,
    CrossVersionObjectReference,
    HorizontalPodAutoscaler,
    MetricIdentifier,
    MetricSpec,
    effective_rules,
)

__all__ = [
    "Autoscaler",
    "Decision",
    "MetricUnavailable",
    "Proposal",
    "Readiness",
    "Readings",
    "ResourceSample",
    "SelectedPod",
]


class MetricUnavailable(Exception):
    """The metrics API gave no usable answer for a metric (404, 503, empty list)."""


class Readings(Protocol):
    """What the controller's metrics client returns, in thousandths (MilliValue). Raise MetricUnavailable
    when the metrics API has no answer."""

    def pods(self, metric: MetricIdentifier) -> Mapping[str, int]:
        """Per-pod values of the HPA's pods (pod name → milli)."""
        ...

    def object(self, described: CrossVersionObjectReference, metric: MetricIdentifier) -> int: ...

    def external(self, metric: MetricIdentifier) -> int:
        """The sum over the external metric's items."""
        ...

    def resource(self, name: str) -> Mapping[str, ResourceSample]:
        """Per-pod usage of a resource (cpu, memory) from metrics.k8s.io: pod name → sample."""
        ...


@dataclass(frozen=True, slots=True)
class Proposal:
    metric: str
    replicas: int | None  # None: invalid metric
    usage_milli: int | None = None
    error: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    time: float
    current_replicas: int
    desired_replicas: int
    proposals: tuple[Proposal, ...]
    reason: str

    @property
    def rescale(self) -> bool:
        return self.desired_replicas != self.current_replicas


@dataclass(slots=True)
class _Event:
    time: float
    change: int
    outdated: bool = False


@dataclass
class Autoscaler:
    """The controller's view of one HPA; call ``reconcile`` once per sync period."""

    hpa: HorizontalPodAutoscaler
    tolerance: float = DEFAULT_TOLERANCE
    downscale_stabilization_seconds: float = DEFAULT_DOWNSCALE_STABILIZATION_SECONDS
    readiness: Readiness = field(default_factory=Readiness)  # gates a cpu Resource metric only
    _recommendations: list[tuple[float, int]] = field(default_factory=list)
    _up_events: list[_Event] = field(default_factory=list)
    _down_events: list[_Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.scale_up, self.scale_down = effective_rules(self.hpa, tolerance=self.tolerance)
        self.tolerances = Tolerances(down=self.scale_down.tolerance, up=self.scale_up.tolerance)

    def reconcile(
        self,
        now: float,
        *,
        spec_replicas: int,
        pods: Sequence[SelectedPod],
        readings: Readings,
        status_replicas: int | None = None,
    ) -> Decision:
        """The sync at ``now``: the replica count to write (equal to ``spec_replicas`` for no change).

        A rescale is recorded as a scale event, as the controller does after a successful update.
        """
        if status_replicas is None:
            status_replicas = sum(1 for p in pods if not p.deleting)
        current = spec_replicas
        minimum, maximum = self.hpa.min_replicas, self.hpa.spec.max_replicas
        proposals: tuple[Proposal, ...] = ()
        if current == 0 and minimum != 0:
            return Decision(now, current, 0, (), "ScalingDisabled: scale target has 0 replicas")
        if current > maximum:
            desired, reason = maximum, "Current number of replicas above Spec.MaxReplicas"
        elif current < minimum:
            desired, reason = minimum, "Current number of replicas below Spec.MinReplicas"
        else:
            proposals = tuple(
                self._propose(m, now, current, status_replicas, pods, readings) for m in self.hpa.spec.metrics
            )
            valid = [p for p in proposals if p.replicas is not None]
            proposed = max((p.replicas for p in valid if p.replicas is not None), default=0)
            invalid = len(proposals) - len(valid)
            if invalid == len(proposals) or (invalid and proposed < current):
                first = next(p for p in proposals if p.replicas is None)
                return Decision(
                    now,
                    current,
                    current,
                    proposals,
                    f"invalid metrics ({invalid} invalid out of {len(proposals)}), first error is: {first.error}",
                )
            if self.hpa.spec.behavior is None:
                desired, reason = self._normalize_legacy(now, current, proposed)
            else:
                desired, reason = self._normalize_with_behavior(now, current, proposed)
        if desired != current:
            self._store_event(now, current, desired)
        return Decision(now, current, desired, proposals, reason)

    # --- one metric ------------------------------------------------------------------------------------

    def _propose(
        self,
        spec: MetricSpec,
        now: float,
        current: int,
        status_replicas: int,
        pods: Sequence[SelectedPod],
        readings: Readings,
    ) -> Proposal:
        name = spec.metric_name
        try:
            if spec.resource is not None:
                wanted = spec.resource.target
                replicas, usage = resource_replicas(
                    current,
                    resource=spec.resource.name,
                    target_average_milli=wanted.average_value,
                    target_utilization=wanted.average_utilization,
                    samples=readings.resource(spec.resource.name),
                    pods=pods,
                    tolerances=self.tolerances,
                    readiness=self.readiness,
                    now=now,
                )
            elif spec.pods is not None:
                target = spec.pods.target.average_value
                assert target is not None
                replicas, usage = pods_metric_replicas(
                    current,
                    target_average_milli=target,
                    values_milli=readings.pods(spec.pods.metric),
                    pods=pods,
                    tolerances=self.tolerances,
                )
            else:
                source = spec.object or spec.external
                assert source is not None
                if spec.object is not None:
                    usage = readings.object(spec.object.described_object, spec.object.metric)
                else:
                    usage = readings.external(source.metric)
                target = source.target
                # NB: the Object source prefers Value when type says so; External prefers AverageValue when set.
                use_average = (
                    target.type == "AverageValue" and target.average_value is not None
                    if spec.object is not None
                    else target.average_value is not None
                )
                if use_average:
                    assert target.average_value is not None
                    replicas, usage = average_value_replicas(
                        status_replicas,
                        usage_milli=usage,
                        target_average_milli=target.average_value,
                        tolerances=self.tolerances,
                    )
                elif target.value is not None:
                    replicas, usage = value_replicas(
                        current, usage_milli=usage, target_milli=target.value, pods=pods, tolerances=self.tolerances
                    )
                else:
                    raise NoMetrics("neither a value target nor an average value target was set")
        except (MetricUnavailable, NoMetrics) as e:
            return Proposal(name, None, error=f"{name}: {e}")
        return Proposal(name, replicas, usage)

    # --- normalization ---------------------------------------------------------------------------------

    def _normalize_legacy(self, now: float, current: int, proposed: int) -> tuple[int, str]:
        """``normalizeDesiredReplicas``: the highest recommendation of the downscale window, then the
        scale-up limit max(2 × current, 4) and min/max."""
        cutoff = now - self.downscale_stabilization_seconds
        stabilized = proposed
        old = None
        for i, (t, rec) in enumerate(self._recommendations):
            if t < cutoff:
                old = i
            elif rec > stabilized:
                stabilized = rec
        self._remember(old, now, proposed)
        reason = "ScaleDownStabilized" if stabilized != proposed else "ReadyForNewScale"
        limit = max(2 * current, 4)
        maximum = min(self.hpa.spec.max_replicas, limit)
        if stabilized < self.hpa.min_replicas:
            return self.hpa.min_replicas, "TooFewReplicas"
        if stabilized > maximum:
            return maximum, "ScaleUpLimit" if maximum == limit else "TooManyReplicas"
        return stabilized, reason

    def _normalize_with_behavior(self, now: float, current: int, proposed: int) -> tuple[int, str]:
        stabilized, reason = self._stabilize(now, current, proposed)
        if stabilized > current:
            limit = max(self._scale_up_limit(now, current), current)
            maximum = min(self.hpa.spec.max_replicas, limit)
            if stabilized > maximum:
                return maximum, "ScaleUpLimit" if maximum == limit else "TooManyReplicas"
        elif stabilized < current:
            limit = min(self._scale_down_limit(now, current), current)
            minimum = max(self.hpa.min_replicas, limit)
            if stabilized < minimum:
                return minimum, "ScaleDownLimit" if minimum == limit else "TooFewReplicas"
        return stabilized, reason

    def _stabilize(self, now: float, current: int, proposed: int) -> tuple[int, str]:
        """``stabilizeRecommendationWithBehaviors``: up to the lowest recommendation of the scale-up window,
        down to the highest of the scale-down window, never past the current count."""
        up_cutoff = now - self.scale_up.stabilization_window_seconds
        down_cutoff = now - self.scale_down.stabilization_window_seconds
        up, down = proposed, proposed
        old = None
        for i, (t, rec) in enumerate(self._recommendations):
            if t > up_cutoff:
                up = min(up, rec)
            if t > down_cutoff:
                down = max(down, rec)
            if t < up_cutoff and t < down_cutoff:
                old = i
        self._remember(old, now, proposed)
        recommendation = max(current, up)
        recommendation = min(recommendation, down)
        if recommendation == proposed:
            return recommendation, "ReadyForNewScale"
        return recommendation, "ScaleUpStabilized" if recommendation < proposed else "ScaleDownStabilized"

    def _remember(self, old: int | None, now: float, proposed: int) -> None:
        if old is None:
            self._recommendations.append((now, proposed))
        else:
            self._recommendations[old] = (now, proposed)

    def _scale_up_limit(self, now: float, current: int) -> int:
        """``calculateScaleUpLimitWithScalingRules``."""
        rules = self.scale_up
        if rules.select_policy == "Disabled":
            return current
        pick = min if rules.select_policy == "Min" else max
        result: int | None = None
        for policy in rules.policies:
            start = current - _change_in_period(self._up_events, now, policy.period_seconds)
            # NB: Percent is rounded up, or a small target could never grow
            proposed = start + policy.value if policy.type == "Pods" else math.ceil(start * (1 + policy.value / 100))
            result = proposed if result is None else pick(result, proposed)
        return current if result is None else result

    def _scale_down_limit(self, now: float, current: int) -> int:
        """``calculateScaleDownLimitWithBehaviors``; selectPolicy Min picks the smallest change, i.e. the
        largest replica count."""
        rules = self.scale_down
        if rules.select_policy == "Disabled":
            return current
        pick = max if rules.select_policy == "Min" else min
        result: int | None = None
        for policy in rules.policies:
            start = current + _change_in_period(self._down_events, now, policy.period_seconds)
            # NB: Percent truncates (int32())
            proposed = start - policy.value if policy.type == "Pods" else int(start * (1 - policy.value / 100))
            result = proposed if result is None else pick(result, proposed)
        return current if result is None else result

    def _store_event(self, now: float, previous: int, new: int) -> None:
        """``storeScaleEvent``: only with a behavior; an outdated slot is reused."""
        if self.hpa.spec.behavior is None:
            return
        events, rules = (self._up_events, self.scale_up) if new > previous else (self._down_events, self.scale_down)
        cutoff = now - rules.longest_period_seconds
        slot = None
        for i, event in enumerate(events):
            if event.time < cutoff:
                event.outdated = True
            if event.outdated:
                slot = i
        fresh = _Event(now, abs(new - previous))
        if slot is None:
            events.append(fresh)
        else:
            events[slot] = fresh

    def state_size(self) -> int:
        return len(self._recommendations) + len(self._up_events) + len(self._down_events)


def _change_in_period(events: list[_Event], now: float, period_seconds: int) -> int:
    """``getReplicasChangePerPeriod``: replicas added (or removed) by events after now − period."""
    cutoff = now - period_seconds
    return sum(e.change for e in events if e.time > cutoff)
