"""The HorizontalPodAutoscaler's algorithm, as a pure module: manifest → replica decisions.

Learned from kubernetes/kubernetes ``pkg/controller/podautoscaler/horizontal.go`` (reconcile, stabilization,
scaling policies) and ``replica_calculator.go`` (per-metric proposals), and from
``pkg/apis/autoscaling/v2/defaults.go`` and ``pkg/apis/autoscaling/validation`` (what the API server fills
in and rejects). No I/O and no clock: the caller passes the time and the metric readings, so replay can run
an hour of syncs in milliseconds and the demo can run the same code against a live adapter.

    spec.py        autoscaling/v2 manifests: parse, validate like the API server, apply the documented defaults
    replicas.py    one metric's proposal (Pods / Object / External; Value / AverageValue), tolerance,
                   missing metrics and not-yet-ready pods as the controller treats them
    controller.py  one HPA over time: several metrics → the largest proposal, invalid metrics, min/max,
                   behavior (stabilization windows, Pods/Percent policies over periodSeconds, selectPolicy)

Feature gates, as Kubernetes 1.37 ships them: ``behavior.scaleUp/scaleDown.tolerance`` (KEP-4951,
HPAConfigurableTolerance) is honoured; so is scale to zero (HPAScaleToZero): minReplicas 0 is accepted when
some metric is Object or External (the API server's rule), the HPA scales from zero on those metrics
(``getUsageRatioReplicaCount``'s ceil(ratio)), and a target scaled to 0 by hand under minReplicas ≥ 1 is left
alone (ScalingDisabled). Resource metrics (cpu, memory) are modelled with the controller's readiness rules for
cpu (``--horizontal-pod-autoscaler-cpu-initialization-period``, ``--horizontal-pod-autoscaler-initial-readiness-delay``:
``Readiness``), which no other metric type is subject to; ContainerResource is not.
"""

from gpuscale.hpa.autoscaler import (
    Autoscaler,
    Decision,
    MetricUnavailable,
    Readiness,
    Readings,
    ResourceSample,
    SelectedPod,
)
from gpuscale.hpa.spec import HorizontalPodAutoscaler, parse_manifests

SYNC_PERIOD_SECONDS = 15.0
"""kube-controller-manager's --horizontal-pod-autoscaler-sync-period default (podautoscaler/config/v1alpha1)."""

__all__ = [
    "SYNC_PERIOD_SECONDS",
    "Autoscaler",
    "Decision",
    "HorizontalPodAutoscaler",
    "MetricUnavailable",
    "Readiness",
    "Readings",
    "ResourceSample",
    "SelectedPod",
    "parse_manifests",
]
