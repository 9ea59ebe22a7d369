"""The adapter as users run it: deploy/ applied server-side to the real control plane, `gpuscale adapter` with
its ServiceAccount's token behind the real kube-aggregator (front-proxy client certificate, TokenReview,
SubjectAccessReview), and the real HPA controller scaling a Deployment on gpuscale's GPU metrics.

The GPU telemetry comes from a test-owned dcgm-exporter: it renders DCGM series (upstream's labels) for the
pods the real ReplicaSet created, with values the test moves. Nothing of ours is in the scaling decision: the
HPA controller of kube-controller-manager v1.37 reads the metrics through the aggregator and scales through
the Deployment's scale subresource.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.metrics_stack import CUSTOM, EXTERNAL, NS, until

pytestmark = pytest.mark.e2e


@pytest.fixture
def adapter(metrics_stack):
    return metrics_stack


def _raw(plane: ControlPlane, path: str, kubeconfig: Path | None = None) -> tuple[int, dict | str]:
    done = plane.kubectl("get", "--raw", path, kubeconfig=kubeconfig)
    if done.returncode != 0:
        return done.returncode, done.stderr
    return 0, json.loads(done.stdout)


def test_kubectl_reads_every_api_version_through_the_real_aggregator(adapter):
    plane = adapter["plane"]

    def pod_values() -> dict | None:
        code, body = _raw(plane, f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_utilization?labelSelector=app%3Dllm")
        return body if code == 0 and body.get("items") else None

    body = until(pod_values, timeout=30, what="gpu_utilization of the llm pods through the aggregator")
    assert body["kind"] == "MetricValueList" and body["apiVersion"] == "custom.metrics.k8s.io/v1beta2"
    pods = {p["metadata"]["name"] for p in plane.rest().get(f"/api/v1/namespaces/{NS}/pods").body["items"]}
    assert {i["describedObject"]["name"] for i in body["items"]} <= pods
    assert all(i["metric"]["name"] == "gpu_utilization" for i in body["items"])

    code, v1 = _raw(plane, f"{CUSTOM}/v1beta1/namespaces/{NS}/pods/*/gpu_sm_active")
    assert code == 0, v1
    assert v1["apiVersion"] == "custom.metrics.k8s.io/v1beta1" and v1["items"][0]["metricName"] == "gpu_sm_active"

    code, ns = _raw(plane, f"{CUSTOM}/v1beta2/namespaces/{NS}/metrics/gpu_utilization")
    assert code == 0, ns
    assert ns["items"][0]["describedObject"]["kind"] == "Namespace"

    code, external = _raw(plane, f"{EXTERNAL}/v1beta1")
    assert code == 0, external
    assert external["kind"] == "APIResourceList" and external["resources"], external
    adapter["nim"].waiting = 7

    def queue() -> dict | None:
        code, body = _raw(plane, f"{EXTERNAL}/v1beta1/namespaces/{NS}/inference_queue_depth")
        return body if code == 0 and body.get("items") and body["items"][0]["value"] != "0" else None

    # The NIM server's queue, scraped from the pod's own IP, summed over the namespace's pods.
    items = until(queue, timeout=30, what="inference_queue_depth through external.metrics")["items"]
    pods = len(plane.rest().get(f"/api/v1/namespaces/{NS}/pods", labelSelector="app=llm").body["items"])
    assert items[0]["metricName"] == "inference_queue_depth" and items[0]["value"] == str(7 * pods), items
    code, listing = _raw(plane, f"{CUSTOM}/v1beta2")
    assert code == 0 and any(r["name"] == "pods/gpu_utilization" for r in listing["resources"]), listing


def test_an_unknown_metric_is_a_404_status_through_the_aggregator(adapter):
    code, err = _raw(adapter["plane"], f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/no_such_metric")
    assert (code != 0 and "NotFound" in err) or "not found" in err.lower(), err


def test_a_user_without_rbac_gets_403_from_the_real_authorizer(adapter):
    plane = adapter["plane"]
    nobody = plane.kubeconfig_for("nobody")
    code, err = _raw(plane, f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_utilization", kubeconfig=nobody)
    assert code != 0 and "Forbidden" in err and "custom.metrics.k8s.io" in err, err


def test_the_hpa_controller_is_allowed_by_deploys_rbac_and_served(adapter):
    plane = adapter["plane"]
    hpa = plane.service_account_kubeconfig("kube-system", "horizontal-pod-autoscaler")

    def served() -> dict | None:
        code, body = _raw(
            plane, f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_utilization?labelSelector=app%3Dllm", hpa
        )
        return body if code == 0 else None

    assert until(served, timeout=20, what="the HPA's ServiceAccount reading custom metrics")["items"]


def test_the_adapters_own_rights_are_what_deploy_grants_and_no_more(adapter):
    plane = adapter["plane"]
    sa = plane.service_account_kubeconfig("gpuscale", "gpuscale-adapter")
    allowed = {
        ("list", "pods"), ("watch", "pods"), ("list", "nodes"), ("list", "deployments.apps"),
        ("create", "tokenreviews.authentication.k8s.io"), ("create", "subjectaccessreviews.authorization.k8s.io"),
    }  # fmt: skip
    denied = {("create", "pods"), ("patch", "nodes"), ("list", "secrets"), ("delete", "deployments.apps")}
    for verb, resource in allowed | denied:
        done = plane.kubectl("auth", "can-i", verb, resource, "-A", kubeconfig=sa)
        assert (done.stdout.strip() == "yes") == ((verb, resource) in allowed), (
            verb,
            resource,
            done.stdout,
            done.stderr,
        )


def test_the_real_hpa_controller_scales_up_and_back_down_on_gpu_metrics(adapter):
    """SM activity drives the Deployment: up one pod per period (behavior policy), down once it falls."""
    plane, exporter = adapter["plane"], adapter["exporter"]
    rest = plane.rest()
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "gpu_sm_active"},
                        "target": {"type": "AverageValue", "averageValue": "40"},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 4}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 2,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}],
                },
            },
        },
    }
    rest.post(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers", hpa).expect(201)
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/llm/scale"
    exporter.sm_active = 0.9  # 90 % against a 40 % target: wants 3 replicas (the max)
    seen: list[tuple[float, int]] = []

    def replicas() -> int:
        value = rest.get(scale).body["spec"]["replicas"]
        if not seen or seen[-1][1] != value:
            seen.append((time.monotonic(), value))
        return value

    until(lambda: replicas() == 3, timeout=40, what="scale up to 3", interval=0.1)
    # The Pods policy (1 pod per 4 s) is honoured: one pod at a time, and no two within one period (seen[0] is
    # the state before the load rose, not a scaling).
    assert [b - a for (_, a), (_, b) in itertools.pairwise(seen)] == [1, 1], seen
    assert seen[2][0] - seen[1][0] >= 3.5, seen
    status = rest.get(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/llm").body["status"]
    current = status["currentMetrics"][0]["pods"]
    assert current["metric"]["name"] == "gpu_sm_active" and current["current"]["averageValue"] == "90"

    exporter.sm_active = 0.05  # 5 %: one replica is enough
    until(lambda: replicas() == 1, timeout=40, what="scale back down to 1", interval=0.1)
    events = rest.get(f"/api/v1/namespaces/{NS}/events", fieldSelector="involvedObject.name=llm").body["items"]
    reasons = [e["message"] for e in events if e["reason"] == "SuccessfulRescale"]
    assert any("above target" in m for m in reasons) and any("below target" in m for m in reasons), reasons


def test_the_real_hpa_controller_scales_on_the_inference_servers_queue(adapter):
    """The same HPA switched to an inference metric: NIM's waiting requests per pod, scraped at each pod's IP."""
    plane, nim = adapter["plane"], adapter["nim"]
    rest = plane.rest()
    path = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/llm"
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/llm/scale"
    until(lambda: rest.get(scale).body["spec"]["replicas"] == 1, timeout=30, what="the previous test's scale-down")
    metric = {
        "type": "Pods",
        "pods": {"metric": {"name": "inference_queue_depth"}, "target": {"type": "AverageValue", "averageValue": "4"}},
    }
    rest.patch(path, {"spec": {"metrics": [metric]}}).expect(200)
    nim.waiting = 12  # 12 waiting per pod against 4: three replicas wanted, capped at maxReplicas 3
    until(lambda: rest.get(scale).body["spec"]["replicas"] == 3, timeout=40, what="scale up on the queue")
    current = rest.get(path).body["status"]["currentMetrics"][0]["pods"]
    assert current["metric"]["name"] == "inference_queue_depth", current
    nim.waiting = 0
    until(lambda: rest.get(scale).body["spec"]["replicas"] == 1, timeout=40, what="scale down once the queue drained")
