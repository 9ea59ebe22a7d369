"""The HPA loop over HTTP asks the metrics APIs what the controller's metrics client asks (paths, selectors) and
reads the answers in thousandths; a missing metric is invalid, not zero. The adapter here is a recording fake;
tests/e2e/test_demo_autoscales.py runs the loop against the real adapter."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuscale.cli.hpa_loop import HpaLoop
from gpuscale.hpa import MetricUnavailable, parse_manifests
from gpuscale.hpa.spec import MetricIdentifier

HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: llm, namespace: ai}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm}
  maxReplicas: 10
  metrics:
    - type: Pods
      pods:
        metric: {name: inference_queue_depth, selector: {matchLabels: {model: m1}}}
        target: {type: AverageValue, averageValue: "4"}
    - type: Object
      object:
        describedObject: {apiVersion: apps/v1, kind: Deployment, name: llm}
        metric: {name: inference_queue_compute_ratio}
        target: {type: Value, value: "1"}
    - type: External
      external:
        metric: {name: inference_requests_per_second, selector: {matchExpressions: [{key: model, operator: In, values: [m1, m2]}]}}
        target: {type: AverageValue, averageValue: "30"}
    - type: Pods
      pods:
        metric: {name: gpu_sm_active}
        target: {type: AverageValue, averageValue: "60"}
"""


async def test_fetch_asks_like_the_controller_and_reads_milli():
    seen: list[tuple[str, dict[str, str]]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append((request.path, dict(request.query)))
        path = request.path
        if path.endswith("/pods/*/inference_queue_depth"):
            items = [
                {"describedObject": {"name": "llm-a"}, "value": "3500m"},
                {"describedObject": {"name": "llm-b"}, "value": "6"},
            ]
        elif path.endswith("/deployments.apps/llm/inference_queue_compute_ratio"):
            items = [{"describedObject": {"name": "llm"}, "value": "1250m"}]
        elif path.endswith("/inference_requests_per_second"):
            items = [
                {"metricName": "inference_requests_per_second", "value": "40"},
                {"metricName": "x", "value": "2500m"},
            ]
        else:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response({"items": items})

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    async with TestServer(app) as server, aiohttp.ClientSession() as session:
        hpa = parse_manifests(HPA, source="hpa.yaml")[0]
        loop = HpaLoop(hpa, session=session, adapter_url=str(server.make_url("")), kube_url="http://127.0.0.1:1")
        fetched = await loop.fetch("app=llm")
    base = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai"
    assert seen == [
        (f"{base}/pods/*/inference_queue_depth", {"labelSelector": "app=llm", "metricLabelSelector": "model=m1"}),
        (f"{base}/deployments.apps/llm/inference_queue_compute_ratio", {}),
        (
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/ai/inference_requests_per_second",
            {"labelSelector": "model in (m1,m2)"},
        ),
        (f"{base}/pods/*/gpu_sm_active", {"labelSelector": "app=llm"}),
    ]
    metric = hpa.spec.metrics
    assert fetched.pods(metric[0].pods.metric) == {"llm-a": 3500, "llm-b": 6000}
    assert fetched.object(metric[1].object.described_object, metric[1].object.metric) == 1250
    assert fetched.external(metric[2].external.metric) == 42500  # the sum of the items, as the controller takes it
    with pytest.raises(MetricUnavailable):  # a 404 is an invalid metric, not zero
        fetched.pods(MetricIdentifier(name="gpu_sm_active"))
