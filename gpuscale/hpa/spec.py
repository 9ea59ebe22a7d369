"""autoscaling/v2 HorizontalPodAutoscaler manifests: parsed from YAML text, validated as the API server does,
with the defaults it fills in.

Validation follows kubernetes/kubernetes ``pkg/apis/autoscaling/validation/validation.go`` (minReplicas ≥ 1,
maxReplicas ≥ minReplicas, one metric source per type, positive targets, at most 3600 s of stabilization,
policies with 0 < periodSeconds ≤ 1800 and value > 0, selectPolicy Max/Min/Disabled); defaults follow
``pkg/apis/autoscaling/v2/defaults.go`` (scale up: 4 pods or 100 % per 15 s, the larger, no window; scale
down: 100 % per 15 s, the controller's 300 s window). Every error names the file, the document and the
field path. Resource metrics (cpu, memory: Utilization of the pods' requests or AverageValue) are modelled,
with the controller's readiness rules for cpu (replicas.py); ContainerResource is valid Kubernetes but not
modelled, so it is refused with that reason rather than silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from gpuscale.config import validate
from gpuscale.errors import ConfigError
from gpuscale.model import QuantityError, milli_value, parse_quantity

MAX_PERIOD_SECONDS = 1800  # validation.go MaxPeriodSeconds
MAX_STABILIZATION_WINDOW_SECONDS = 3600  # validation.go MaxStabilizationWindowSeconds
DEFAULT_TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance
DEFAULT_DOWNSCALE_STABILIZATION_SECONDS = 300  # --horizontal-pod-autoscaler-downscale-stabilization


def _milli(value: Any) -> int:
    """A quantity ("500m", 8, "1.5k") → its MilliValue (rounded up, as apimachinery does)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError('must be a quantity such as 8, "500m" or "1.5k"')
    try:
        return milli_value(parse_quantity(str(value)))
    except (ValueError, QuantityError) as e:
        raise ValueError(f"not a quantity: {value!r}") from e


Milli = Annotated[int, BeforeValidator(_milli)]
"""A Kubernetes quantity, held as thousandths (the unit the HPA computes in)."""


class _K8s(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class MetricIdentifier(_K8s):
    name: str = Field(min_length=1)
    selector: dict[str, Any] | None = None


class MetricTarget(_K8s):
    type: Literal["Utilization", "Value", "AverageValue"]
    value: Milli | None = None
    average_value: Milli | None = None
    average_utilization: int | None = None

    @model_validator(mode="after")
    def _positive(self) -> MetricTarget:
        for name, v in (("value", self.value), ("averageValue", self.average_value)):
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be positive")
        if self.average_utilization is not None and self.average_utilization < 1:
            raise ValueError("averageUtilization must be greater than 0")
        return self


class CrossVersionObjectReference(_K8s):
    kind: str = Field(min_length=1)
    name: str = Field(min_length=1)
    api_version: str | None = None


class PodsMetricSource(_K8s):
    metric: MetricIdentifier
    target: MetricTarget

    @model_validator(mode="after")
    def _average(self) -> PodsMetricSource:
        if self.target.average_value is None:
            raise ValueError("target.averageValue: must specify a positive target averageValue")
        return self


class ObjectMetricSource(_K8s):
    described_object: CrossVersionObjectReference
    metric: MetricIdentifier
    target: MetricTarget

    @model_validator(mode="after")
    def _value(self) -> ObjectMetricSource:
        if self.target.value is None and self.target.average_value is None:
            raise ValueError("target: must set either a target value or averageValue")
        return self


class ExternalMetricSource(_K8s):
    metric: MetricIdentifier
    target: MetricTarget

    @model_validator(mode="after")
    def _value(self) -> ExternalMetricSource:
        if self.target.value is None and self.target.average_value is None:
            raise ValueError("target: must set either a target value or averageValue")
        return self


class ResourceMetricSource(_K8s):
    name: str = Field(min_length=1)
    target: MetricTarget

    @model_validator(mode="after")
    def _average(self) -> ResourceMetricSource:
        # NB: validation.go validateResourceSource: exactly one of the two, whatever target.type says
        if self.target.average_utilization is None and self.target.average_value is None:
            raise ValueError("target.averageUtilization: must set either a target raw value or a target utilization")
        if self.target.average_utilization is not None and self.target.average_value is not None:
            raise ValueError("target.averageValue: may not set both a target raw value and a target utilization")
        return self

    @property
    def metric(self) -> MetricIdentifier:
        return MetricIdentifier(name=self.name)


class MetricSpec(_K8s):
    type: Literal["Object", "Pods", "Resource", "ContainerResource", "External"]
    object: ObjectMetricSource | None = None
    pods: PodsMetricSource | None = None
    resource: ResourceMetricSource | None = None
    container_resource: dict[str, Any] | None = None
    external: ExternalMetricSource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> MetricSpec:
        key = {"ContainerResource": "container_resource"}.get(self.type, self.type.lower())
        if self.type == "ContainerResource":
            raise ValueError(
                "type ContainerResource is valid Kubernetes but gpuscale does not model per-container usage; "
                "use a Resource metric (the pod's total)"
            )
        if getattr(self, key) is None:
            raise ValueError(f"{to_camel(key)}: must populate information for the given metric source")
        others = [
            to_camel(k) for k in ("object", "pods", "resource", "external") if k != key and getattr(self, k) is not None
        ]
        if others:
            raise ValueError(f"{others[0]}: must populate the given metric source only")
        return self

    @property
    def source(self) -> PodsMetricSource | ObjectMetricSource | ExternalMetricSource | ResourceMetricSource:
        found = self.pods or self.object or self.external or self.resource
        assert found is not None
        return found

    @property
    def metric_name(self) -> str:
        return self.source.metric.name


class HPAScalingPolicy(_K8s):
    type: Literal["Pods", "Percent"]
    value: int = Field(gt=0)
    period_seconds: int = Field(gt=0, le=MAX_PERIOD_SECONDS)


class HPAScalingRules(_K8s):
    stabilization_window_seconds: int | None = Field(None, ge=0, le=MAX_STABILIZATION_WINDOW_SECONDS)
    select_policy: Literal["Max", "Min", "Disabled"] | None = None
    policies: list[HPAScalingPolicy] | None = None
    tolerance: Milli | None = None

    @model_validator(mode="after")
    def _policies(self) -> HPAScalingRules:
        if self.policies is not None and not self.policies:
            raise ValueError("policies: must specify at least one Policy")
        if self.tolerance is not None and self.tolerance < 0:
            raise ValueError("tolerance must be greater than or equal to 0")
        return self


class HorizontalPodAutoscalerBehavior(_K8s):
    scale_up: HPAScalingRules | None = None
    scale_down: HPAScalingRules | None = None


class HorizontalPodAutoscalerSpec(_K8s):
    scale_target_ref: CrossVersionObjectReference
    min_replicas: int | None = Field(None, ge=0)
    max_replicas: int = Field(ge=1)
    metrics: list[MetricSpec] = Field(default_factory=list)
    behavior: HorizontalPodAutoscalerBehavior | None = None

    @model_validator(mode="after")
    def _bounds(self) -> HorizontalPodAutoscalerSpec:
        if self.min_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(f"maxReplicas ({self.max_replicas}) must be greater than or equal to minReplicas")
        if self.min_replicas == 0 and not any(m.type in ("Object", "External") for m in self.metrics):
            # NB: HPAScaleToZero: with no pods there is no Pods metric to scale back up on
            raise ValueError(
                "metrics: must specify at least one Object or External metric to support scaling to zero replicas"
            )
        if not self.metrics:
            raise ValueError(
                "metrics: empty, so the API server would default to 80 % cpu utilization; "
                "name the metrics to scale on (gpuscale does not fill in that default)"
            )
        return self


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = Field(min_length=1)
    namespace: str = "default"


class HorizontalPodAutoscaler(_K8s):
    api_version: Literal["autoscaling/v2"]
    kind: Literal["HorizontalPodAutoscaler"]
    metadata: ObjectMeta
    spec: HorizontalPodAutoscalerSpec
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def min_replicas(self) -> int:
        return self.spec.min_replicas if self.spec.min_replicas is not None else 1


class ScalingRules(BaseModel):
    """One direction's rules with every default filled in (what the controller reads)."""

    model_config = ConfigDict(frozen=True)
    stabilization_window_seconds: int
    select_policy: Literal["Max", "Min", "Disabled"]
    policies: tuple[HPAScalingPolicy, ...]
    tolerance: float

    @property
    def longest_period_seconds(self) -> int:
        return max((p.period_seconds for p in self.policies), default=0)


_UP_DEFAULT_POLICIES = (
    HPAScalingPolicy(type="Pods", value=4, period_seconds=15),
    HPAScalingPolicy(type="Percent", value=100, period_seconds=15),
)
_DOWN_DEFAULT_POLICIES = (HPAScalingPolicy(type="Percent", value=100, period_seconds=15),)


def effective_rules(
    hpa: HorizontalPodAutoscaler, *, tolerance: float = DEFAULT_TOLERANCE
) -> tuple[ScalingRules, ScalingRules]:
    """(scale up, scale down) rules as defaults.go and the controller fill them in.

    NB: scale down's window defaults to the controller's --horizontal-pod-autoscaler-downscale-stabilization
    (300 s): defaults.go leaves it nil and ``maybeInitScaleDownStabilizationWindow`` fills it in.
    """
    behavior = hpa.spec.behavior or HorizontalPodAutoscalerBehavior()

    def fill(rules: HPAScalingRules | None, window: int, policies: tuple[HPAScalingPolicy, ...]) -> ScalingRules:
        rules = rules or HPAScalingRules()
        return ScalingRules(
            stabilization_window_seconds=window
            if rules.stabilization_window_seconds is None
            else rules.stabilization_window_seconds,
            select_policy=rules.select_policy or "Max",
            policies=tuple(rules.policies) if rules.policies is not None else policies,
            tolerance=tolerance if rules.tolerance is None else rules.tolerance / 1000,
        )

    return (
        fill(behavior.scale_up, 0, _UP_DEFAULT_POLICIES),
        fill(behavior.scale_down, DEFAULT_DOWNSCALE_STABILIZATION_SECONDS, _DOWN_DEFAULT_POLICIES),
    )


def parse_manifests(text: str, *, source: str) -> list[HorizontalPodAutoscaler]:
    """Every autoscaling/v2 HorizontalPodAutoscaler in a (multi-document) YAML text; other kinds are skipped.

    ConfigError names ``source``, the document (when there are several) and the field path.
    """
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(f"{where}invalid YAML: {getattr(e, 'problem', e)}", path=source) from None
    out = []
    for i, doc in enumerate(documents):
        where = f"{source} (document {i + 1})" if len(documents) > 1 else source
        if not isinstance(doc, dict):
            raise ConfigError("expected a Kubernetes object (a mapping)", path=where)
        if doc.get("kind") != "HorizontalPodAutoscaler":
            continue
        if doc.get("apiVersion") != "autoscaling/v2":
            raise ConfigError(f"apiVersion: expected autoscaling/v2 (got {doc.get('apiVersion')!r})", path=where)
        out.append(validate(HorizontalPodAutoscaler, doc, where))
    if not out:
        raise ConfigError("no autoscaling/v2 HorizontalPodAutoscaler in the file", path=source)
    return out
