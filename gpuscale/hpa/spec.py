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

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, model_validator
from pydantic.alias_generators import to_camel

from gpuscale.config import YamlMapping, load_yaml_documents, validate
from gpuscale.errors import ConfigError
from gpuscale.model import QuantityError, milli_value, parse_quantity

MAX_PERIOD_SECONDS = 1800  # validation.go MaxPeriodSeconds
MAX_STABILIZATION_WINDOW_SECONDS = 3600  # validation.go MaxStabilizationWindowSeconds
DEFAULT_TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance
DEFAULT_DOWNSCALE_STABILIZATION_SECONDS = 300  # --horizontal-pod-autoscaler-downscale-stabilization


# What the API server's decoding and validation.go refuse, mirrored here (kube-apiserver v1.37):
# - an int32 field (minReplicas, maxReplicas, averageUtilization, a policy's value and periodSeconds,
#   stabilizationWindowSeconds) takes a JSON integer in int32's range: Go's decoder refuses true, "10", 10.5,
#   10.0 and 1e30 ("cannot unmarshal ... into Go struct field ... of type int32"): Strict + the int32 bounds;
# - a Quantity (value, averageValue, tolerance) is a string in Quantity syntax or a number, never a bool;
# - a key given twice is refused by strict decoding (gpuscale.config's YAML loader refuses it in any file);
# - unknown keys are refused (extra="forbid", strict field validation);
# - names: metadata.name a DNS subdomain, metadata.namespace a DNS label, scaleTargetRef kind/name and metric
#   names valid path segments (ValidateCrossVersionObjectReference, validateMetricIdentifier).
# Beyond the API server: a quantity whose MilliValue leaves int64 (1e400, 1e20) is refused, because the
# controller computes in MilliValue and such a target has no meaning there (apimachinery saturates it).
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _int32(value: int) -> int:
    # NB: a validator, not Field(ge, le): those would override each field's own tighter bounds
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"must fit in an int32 ({INT32_MIN} to {INT32_MAX})")
    return value


Int32 = Annotated[int, Strict(), AfterValidator(_int32)]


def _milli(value: Any) -> int:
    """A quantity ("500m", 8, "1.5k") → its MilliValue (rounded up, as apimachinery does)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError('must be a quantity such as 8, "500m" or "1.5k"')
    try:
        return milli_value(parse_quantity(str(value)))
    except QuantityError as e:
        raise ValueError(f"out of range: the controller computes in int64 thousandths ({e})") from None
    except OverflowError:
        raise ValueError("out of range: the controller computes in int64 thousandths") from None
    except ValueError as e:
        raise ValueError(f"not a quantity: {value!r}") from e


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _path_segment(name: str) -> str:
    """apimachinery's IsValidPathSegmentName: the name goes into a URL path."""
    if name in (".", "..") or "/" in name or "%" in name:
        raise ValueError(f"may not be '.' or '..' and may not contain '/' or '%' (got {name!r})")
    return name


def _dns_subdomain(name: str) -> str:
    if len(name) > 253 or not all(_DNS_LABEL.match(part) for part in name.split(".")):
        raise ValueError(
            f"must be a lowercase RFC 1123 subdomain (a-z, 0-9, '-', '.'; at most 253 characters; got {name!r})"
        )
    return name


def _dns_label(name: str) -> str:
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ValueError(f"must be a lowercase RFC 1123 label (a-z, 0-9, '-'; at most 63 characters; got {name!r})")
    return name


PathSegment = Annotated[str, Strict(), Field(min_length=1), AfterValidator(_path_segment)]


Milli = Annotated[int, BeforeValidator(_milli)]
"""A Kubernetes quantity, held as thousandths (the unit the HPA computes in)."""


class _K8s(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class MetricIdentifier(_K8s):
    name: PathSegment
    selector: dict[str, Any] | None = None


class MetricTarget(_K8s):
    type: Literal["Utilization", "Value", "AverageValue"]
    value: Milli | None = None
    average_value: Milli | None = None
    average_utilization: Int32 | None = None

    @model_validator(mode="after")
    def _positive(self) -> MetricTarget:
        for name, v in (("value", self.value), ("averageValue", self.average_value)):
            if v is not None and v <= 0:
                raise ValueError(f"{name} must be positive")
        if self.average_utilization is not None and self.average_utilization < 1:
            raise ValueError("averageUtilization must be greater than 0")
        return self


class CrossVersionObjectReference(_K8s):
    kind: PathSegment
    name: PathSegment
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
    name: Annotated[str, Strict(), Field(min_length=1)]
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
    value: Int32 = Field(gt=0)
    period_seconds: Int32 = Field(gt=0, le=MAX_PERIOD_SECONDS)


class HPAScalingRules(_K8s):
    stabilization_window_seconds: Int32 | None = Field(None, ge=0, le=MAX_STABILIZATION_WINDOW_SECONDS)
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
    min_replicas: Int32 | None = Field(None, ge=0)
    max_replicas: Int32 = Field(ge=1)
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
    name: Annotated[str, Strict(), AfterValidator(_dns_subdomain)]
    namespace: Annotated[str, Strict(), AfterValidator(_dns_label)] = "default"


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

    ConfigError names ``source``, the document (when there are several), the field path and its line.
    """
    documents = [(d, lines) for d, lines in load_yaml_documents(text, path=source) if d is not None]
    out = []
    for i, (doc, lines) in enumerate(documents):
        where = f"{source} (document {i + 1})" if len(documents) > 1 else source
        if not isinstance(doc, dict):
            raise ConfigError("expected a Kubernetes object (a mapping)", path=where)
        if doc.get("kind") != "HorizontalPodAutoscaler":
            continue
        if doc.get("apiVersion") != "autoscaling/v2":
            raise ConfigError(f"apiVersion: expected autoscaling/v2 (got {doc.get('apiVersion')!r})", path=where)
        located = YamlMapping(doc)
        located.lines = lines
        out.append(validate(HorizontalPodAutoscaler, located, where))
    if not out:
        raise ConfigError("no autoscaling/v2 HorizontalPodAutoscaler in the file", path=source)
    return out
