"""Manifests: the shipped examples parse; what the Kubernetes API server rejects is a clear error naming the
file and the field (pkg/apis/autoscaling/validation/validation.go); defaults as pkg/apis/autoscaling/v2/defaults.go."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscale.errors import ConfigError
from gpuscale.hpa.spec import effective_rules, parse_manifests

EXAMPLES = Path(__file__).parents[2] / "deploy" / "examples"

GOOD = """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: llm}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm}
  minReplicas: 1
  maxReplicas: 8
  metrics:
    - type: Pods
      pods:
        metric: {name: inference_queue_depth}
        target: {type: AverageValue, averageValue: "4"}
"""


@pytest.mark.parametrize("name", ["llm-hpa.yaml", "triton-hpa.yaml", "batch-consumer-hpa.yaml"])
def test_shipped_examples_parse(name):
    [hpa] = parse_manifests((EXAMPLES / name).read_text(), source=name)
    assert hpa.spec.max_replicas >= hpa.min_replicas


def test_defaults_when_behavior_is_partly_given():
    """defaults.go: scale up 4 pods / 100 % per 15 s (Max), no window; scale down 100 % per 15 s, 300 s."""
    [hpa] = parse_manifests(GOOD + "  behavior:\n    scaleDown: {selectPolicy: Min}\n", source="x.yaml")
    up, down = effective_rules(hpa)
    assert (up.stabilization_window_seconds, up.select_policy) == (0, "Max")
    assert [(p.type, p.value, p.period_seconds) for p in up.policies] == [("Pods", 4, 15), ("Percent", 100, 15)]
    assert (down.stabilization_window_seconds, down.select_policy) == (300, "Min")
    assert [(p.type, p.value, p.period_seconds) for p in down.policies] == [("Percent", 100, 15)]
    assert up.tolerance == down.tolerance == 0.1


def test_tolerance_field_is_read_per_direction():
    [hpa] = parse_manifests(GOOD + "  behavior:\n    scaleUp: {tolerance: 50m}\n", source="x.yaml")
    up, down = effective_rules(hpa)
    assert (up.tolerance, down.tolerance) == (0.05, 0.1)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("type: Pods", "type: Cpu"), "metrics[0].type: Input should be 'Object', 'Pods', 'Resource'"),
        (("minReplicas: 1", "minReplicas: 9"), "spec: maxReplicas (8) must be greater than or equal to minReplicas"),
        (
            ("minReplicas: 1", "minReplicas: 0"),
            "must specify at least one Object or External metric to support scaling to zero replicas",
        ),
        (('averageValue: "4"', 'averageValue: "-4"'), "averageValue must be positive"),
        (('averageValue: "4"', 'averageValue: "four"'), "not a quantity: 'four'"),
        (
            ('{type: AverageValue, averageValue: "4"}', '{type: Value, value: "4"}'),
            "spec.metrics[0].pods: target.averageValue: must specify a positive",
        ),
        (("    - type: Pods\n      pods:", "    - type: External\n      pods:"), "external: must populate information"),
        (("maxReplicas: 8", "maxReplicas: 8\n  replicas: 3"), "spec.replicas: unknown key (allowed: scaleTargetRef"),
    ],
)
def test_what_the_api_server_rejects(edit, message):
    text = GOOD.replace(*edit)
    with pytest.raises(ConfigError) as err:
        parse_manifests(text, source="hpa.yaml")
    assert str(err.value).startswith("hpa.yaml: ")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("behavior", "message"),
    [
        (
            "{scaleDown: {policies: [{type: Pods, value: 1, periodSeconds: 1801}]}}",
            "spec.behavior.scaleDown.policies[0].periodSeconds: Input should be less than or equal to 1800",
        ),
        (
            "{scaleUp: {policies: [{type: Pods, value: 0, periodSeconds: 60}]}}",
            "policies[0].value: Input should be greater than 0",
        ),
        ("{scaleUp: {policies: []}}", "must specify at least one Policy"),
        ("{scaleUp: {selectPolicy: Largest}}", "scaleUp.selectPolicy: Input should be 'Max', 'Min' or 'Disabled'"),
        (
            "{scaleDown: {stabilizationWindowSeconds: 3601}}",
            "stabilizationWindowSeconds: Input should be less than or equal to 3600",
        ),
    ],
)
def test_behavior_limits(behavior, message):
    with pytest.raises(ConfigError) as err:
        parse_manifests(GOOD + f"  behavior: {behavior}\n", source="hpa.yaml")
    assert message in str(err.value)


def _with_metric(metric: str) -> str:
    return GOOD.replace(
        '    - type: Pods\n      pods:\n        metric: {name: inference_queue_depth}\n        target: {type: AverageValue, averageValue: "4"}\n',
        metric,
    )


def test_resource_metrics_are_validated_as_the_api_server_does():
    (cpu,) = parse_manifests(
        _with_metric(
            "    - type: Resource\n      resource: {name: cpu, target: {type: Utilization, averageUtilization: 80}}\n"
        ),
        source="hpa.yaml",
    )
    assert cpu.spec.metrics[0].resource.target.average_utilization == 80
    assert cpu.spec.metrics[0].metric_name == "cpu"
    (memory,) = parse_manifests(
        _with_metric(
            "    - type: Resource\n      resource: {name: memory, target: {type: AverageValue, averageValue: 2Gi}}\n"
        ),
        source="hpa.yaml",
    )
    assert memory.spec.metrics[0].resource.target.average_value == 2 * 1024**3 * 1000
    for target, message in [
        ("{type: Utilization}", "must set either a target raw value or a target utilization"),
        ("{type: Utilization, averageUtilization: 80, averageValue: 1}", "may not set both"),
        ("{type: Utilization, averageUtilization: 0}", "averageUtilization must be greater than 0"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_manifests(
                _with_metric(f"    - type: Resource\n      resource: {{name: cpu, target: {target}}}\n"), source="h"
            )


def test_container_resource_metrics_and_empty_files_are_refused_with_the_reason():
    container = _with_metric(
        "    - type: ContainerResource\n      containerResource:\n        name: cpu\n        container: app\n"
        "        target: {type: Utilization, averageUtilization: 80}\n"
    )
    with pytest.raises(ConfigError, match="does not model per-container usage"):
        parse_manifests(container, source="hpa.yaml")
    with pytest.raises(ConfigError, match=r"hpa\.yaml: no autoscaling/v2 HorizontalPodAutoscaler"):
        parse_manifests("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", source="hpa.yaml")
    with pytest.raises(ConfigError, match="apiVersion: expected autoscaling/v2"):
        parse_manifests(GOOD.replace("autoscaling/v2", "autoscaling/v1"), source="hpa.yaml")
    with pytest.raises(ConfigError, match=r"hpa.yaml \(document 2\)"):
        parse_manifests(GOOD + "---\n" + GOOD.replace("maxReplicas: 8", "maxReplicas: 0"), source="hpa.yaml")
