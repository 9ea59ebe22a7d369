"""The metrics API over HTTP: every URL shape, per-version JSON, selectors, errors and health.

The app runs on fixture data (the 8×H100 DCGM scrape and two Triton scrapes 60 s apart) with an
in-memory cluster whose pods carry the labels an HPA would select on. Responses are read the way the
HPA controller reads them (tests/adapter/hpa.py).
"""

from __future__ import annotations

import pytest

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.metrics.attribution import Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.selectors import LabelSelector
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects, WorkloadInfo
from tests.adapter import hpa
from tests.helpers import H100, H100_NODE, T0, TRITON, TRITON_POD, TRITON_T0, fixture_store

NOW = T0 + 61
TRITON_URL = "http://10.0.0.5:8002/metrics"

CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"


def _pod(ns, name, labels, owner=None):
    return PodInfo(
        namespace=ns,
        name=name,
        labels=labels,
        node_name=H100_NODE,
        pod_ip="10.0.0.5",
        container_ports=(),
        phase="Running",
        owner=owner,
    )


def make_cluster() -> StaticClusterObjects:
    pods = [
        _pod(
            "inference", TRITON_POD.name, {"app": "triton", "tier": "gpu"}, ("ReplicaSet", "triton-inference-7d9f8b6c5")
        ),
        _pod("inference", "triton-inference-7d9f8b6c5-cpu01", {"app": "triton", "tier": "cpu"}),
        _pod("nim", "llama3-8b-instruct-5c6b9d8f47-qz7mh", {"app": "llama3"}),
        _pod("ml-training", "llm-finetune-worker-0", {"app": "finetune"}, ("StatefulSet", "llm-finetune-worker")),
        _pod("ml-batch", "embeddings-batch-28471-8xk2p", {"app": "embeddings"}),
    ]
    workloads = [
        WorkloadInfo(
            "Deployment", "inference", "triton-inference", LabelSelector.parse("app=triton,tier=gpu"), {"app": "triton"}
        ),
        WorkloadInfo(
            "StatefulSet",
            "ml-training",
            "llm-finetune-worker",
            LabelSelector.parse("app=finetune"),
            {"app": "finetune"},
        ),
    ]
    return StaticClusterObjects(
        pods=pods,
        workloads=workloads,
        nodes={H100_NODE: {"nvidia.com/gpu.product": "H100"}},
        namespaces=["inference", "nim", "ml-training", "ml-batch", "empty"],
    )


@pytest.fixture
def store():
    return fixture_store(
        [("http://dcgm:9400/metrics", H100, T0 + 60), (TRITON_URL, TRITON_T0, T0), (TRITON_URL, TRITON, T0 + 60)],
        targets={TRITON_URL: Target(TRITON_URL, TRITON_POD, H100_NODE)},
        now=T0 + 60,
    )


@pytest.fixture
async def client(aiohttp_client, store):
    catalogue = load_catalogue()
    clock = {"now": NOW}
    provider = MetricsProvider(catalogue, store, make_cluster(), clock=lambda: clock["now"])
    app = make_app(provider, Discovery(catalogue), AdapterMetrics(lambda: []), ready=lambda: (True, ""))
    c = await aiohttp_client(app)
    c.clock = clock
    return c


async def get(client, path, status=200):
    resp = await client.get(path)
    body = await resp.json(content_type=None)
    assert resp.status == status, (path, resp.status, body)
    return body


# --- every URL shape: (path, status, items) ---------------------------------------------------------------

ROUTES = [
    # pods by selector and by name
    (f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization", 200, 1),
    (f"{CUSTOM}/v1beta2/namespaces/ml-training/pods/*/gpu_utilization", 200, 1),
    (f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton", 200, 1),
    (f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/llm-finetune-worker-0/gpu_sm_active", 200, 1),
    (f"{CUSTOM}/v1beta2/namespaces/ml-training/pods/llm-finetune-worker-0/gpu_power_watts", 200, 1),
    # the namespace itself
    (f"{CUSTOM}/v1beta1/namespaces/ml-training/metrics/gpu_memory_used_bytes", 200, 1),
    (f"{CUSTOM}/v1beta2/namespaces/inference/metrics/inference_queue_depth", 200, 1),
    # root-scoped nodes
    (f"{CUSTOM}/v1beta1/nodes/*/gpu_utilization", 200, 1),
    (f"{CUSTOM}/v1beta2/nodes/{H100_NODE}/gpu_power_watts", 200, 1),
    # object metrics for workloads (mean over their pods)
    (f"{CUSTOM}/v1beta1/namespaces/inference/deployments.apps/triton-inference/inference_queue_compute_ratio", 200, 1),
    (f"{CUSTOM}/v1beta2/namespaces/ml-training/statefulsets.apps/llm-finetune-worker/gpu_sm_active", 200, 1),
    # external
    (f"{EXTERNAL}/namespaces/inference/inference_queue_depth", 200, 1),
    (f"{EXTERNAL}/namespaces/inference/inference_queue_depth?labelSelector=model%3Dbert_qa_onnx", 200, 1),
    # errors
    (f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/no_such_metric", 404, None),
    (f"{CUSTOM}/v1beta1/namespaces/inference/pods/no-such-pod/gpu_utilization", 404, None),
    (f"{CUSTOM}/v1beta1/namespaces/nowhere/pods/*/gpu_utilization", 404, None),
    (f"{CUSTOM}/v1beta1/namespaces/empty/pods/*/gpu_utilization", 404, None),
    (f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3D%3D%3D", 400, None),
    (f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?metricLabelSelector=in%20(", 400, None),
    (f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dnobody", 404, None),
    (f"{CUSTOM}/v1beta1/nodes/no-such-node/gpu_utilization", 404, None),
    (f"{CUSTOM}/v1beta1/nodes/{H100_NODE}", 404, None),
    (f"{CUSTOM}/v1beta1/namespaces/inference/pods/{TRITON_POD.name}", 404, None),
    (f"{CUSTOM}/v1beta3/namespaces/inference/pods/*/gpu_utilization", 404, None),
    (f"{CUSTOM}/v1beta1/namespaces/inference/services/*/gpu_utilization", 404, None),
    (f"{CUSTOM}/v1beta1/pods/*/gpu_utilization", 404, None),
    (f"{CUSTOM}/v1beta1/namespaces/inference/deployments.apps/ghost/gpu_utilization", 404, None),
    (f"{EXTERNAL}/namespaces/inference/gpu_utilization", 404, None),  # not an external metric
    (f"{EXTERNAL}/namespaces/inference/inference_queue_depth/extra", 404, None),
    (f"{EXTERNAL}/namespaces/inference/inference_queue_depth?labelSelector=model%3Dnone", 404, None),
]


@pytest.mark.parametrize(("path", "status", "items"), ROUTES)
async def test_routes(client, path, status, items):
    body = await get(client, path, status)
    if items is None:
        assert body["kind"] == "Status" and body["code"] == status and body["status"] == "Failure"
        assert body["message"]
    else:
        assert len(body["items"]) == items


# --- exact JSON per version -----------------------------------------------------------------------------


async def test_v1beta1_item_shape(client):
    body = await get(client, f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/llm-finetune-worker-0/gpu_sm_active")
    assert body["kind"] == "MetricValueList"
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta1"
    item = body["items"][0]
    assert list(item) == ["describedObject", "metricName", "timestamp", "value", "selector"]
    assert item["describedObject"] == {
        "kind": "Pod",
        "namespace": "ml-training",
        "name": "llm-finetune-worker-0",
        "apiVersion": "/v1",
    }
    assert item["metricName"] == "gpu_sm_active"
    assert item["selector"] is None
    assert item["value"] == "84312m"  # mean SM_ACTIVE of GPUs 2-5 = 84.31145 %, rounded up to milli
    assert item["timestamp"].endswith("Z") and "T" in item["timestamp"]


async def test_v1beta2_item_shape_with_window(client):
    body = await get(
        client, f"{CUSTOM}/v1beta2/namespaces/inference/pods/{TRITON_POD.name}/inference_queue_compute_ratio"
    )
    item = body["items"][0]
    assert list(item) == ["describedObject", "metric", "timestamp", "windowSeconds", "value"]
    assert item["metric"] == {"name": "inference_queue_compute_ratio", "selector": None}
    assert item["windowSeconds"] == 60
    assert item["value"] == "1683m"


async def test_v1beta1_window_field(client):
    body = await get(
        client, f"{CUSTOM}/v1beta1/namespaces/inference/pods/{TRITON_POD.name}/inference_requests_per_second"
    )
    item = body["items"][0]
    assert item["window"] == 60 and "windowSeconds" not in item
    assert item["value"] == "371"


async def test_external_item_shape(client):
    body = await get(
        client, f"{EXTERNAL}/namespaces/inference/inference_queue_compute_ratio?labelSelector=model%3Dbert_qa_onnx"
    )
    assert body["kind"] == "ExternalMetricValueList"
    assert body["apiVersion"] == "external.metrics.k8s.io/v1beta1"
    item = body["items"][0]
    assert list(item) == ["metricName", "metricLabels", "timestamp", "window", "value"]
    assert item["metricLabels"] == {"model": "bert_qa_onnx"}
    assert item["value"] == "3418m"  # 86.1e6 / 25.1904e6 = 3.41796…


async def test_metric_label_selector_is_honoured_and_echoed(client):
    path = (
        f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/inference_queue_depth?metricLabelSelector=model%3Dbert_qa_onnx"
    )
    item = (await get(client, path))["items"][0]
    assert item["selector"] == {"matchLabels": {"model": "bert_qa_onnx"}}
    assert item["value"] == "118"
    path = path.replace("v1beta1", "v1beta2")
    item = (await get(client, path))["items"][0]
    assert item["metric"]["selector"] == {"matchLabels": {"model": "bert_qa_onnx"}}


# --- the HPA's reading ----------------------------------------------------------------------------------


async def test_hpa_reads_pod_metrics_keyed_by_name_for_exactly_the_selected_pods(client):
    body = await get(client, f"{CUSTOM}/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton")
    metrics = hpa.pod_metrics(body)
    # The cpu-only triton pod is selected but has no GPU: it is left out, never reported as 0.
    assert metrics == {TRITON_POD.name: 63000}
    assert hpa.usage_ratio(metrics, 50000) == pytest.approx(1.26)


async def test_hpa_reads_selector_with_set_based_requirements(client):
    sel = "app%20in%20(triton,llama3),tier!%3Dcpu"
    body = await get(client, f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector={sel}")
    assert set(hpa.pod_metrics(body)) == {TRITON_POD.name}


async def test_hpa_reads_object_metric_exactly_one(client):
    body = await get(
        client, f"{CUSTOM}/v1beta2/namespaces/ml-training/statefulsets.apps/llm-finetune-worker/gpu_utilization"
    )
    assert hpa.object_metric(body) == 100000
    body = await get(client, f"{CUSTOM}/v1beta1/namespaces/ml-training/metrics/gpu_power_watts")
    assert hpa.object_metric(body) == 2695399


async def test_hpa_reads_external_metric_sum(client):
    body = await get(client, f"{EXTERNAL}/namespaces/inference/inference_queue_depth")
    assert hpa.external_metric(body) == 121000
    body = await get(
        client, f"{EXTERNAL}/namespaces/inference/inference_queue_depth?labelSelector=model%3Dresnet50_trt"
    )
    assert hpa.external_metric(body) == 3000


# --- freshness ------------------------------------------------------------------------------------------


async def test_stale_values_are_503_not_served(client):
    client.clock["now"] = T0 + 60 + 61  # max-age is 60 s
    resp = await client.get(f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization")
    body = await resp.json()
    assert resp.status == 503
    assert body["reason"] == "ServiceUnavailable" and "max-age" in body["message"]
    assert int(resp.headers["Retry-After"]) >= 1


# --- discovery, health, openapi, /metrics ---------------------------------------------------------------


async def test_discovery(client):
    groups = await get(client, "/apis")
    names = {g["name"]: g for g in groups["groups"]}
    assert set(names) == {"custom.metrics.k8s.io", "external.metrics.k8s.io"}
    assert [v["version"] for v in names["custom.metrics.k8s.io"]["versions"]] == ["v1beta1", "v1beta2"]
    for version in ("v1beta1", "v1beta2"):
        rl = await get(client, f"{CUSTOM}/{version}")
        assert rl["kind"] == "APIResourceList" and rl["groupVersion"] == f"custom.metrics.k8s.io/{version}"
        names_ = {r["name"] for r in rl["resources"]}
        assert {
            "pods/gpu_utilization",
            "nodes/gpu_power_watts",
            "namespaces/inference_queue_depth",
            "deployments.apps/inference_queue_compute_ratio",
        } <= names_
        pods = next(r for r in rl["resources"] if r["name"] == "pods/gpu_utilization")
        assert pods == {
            "name": "pods/gpu_utilization",
            "singularName": "",
            "namespaced": True,
            "kind": "MetricValueList",
            "verbs": ["get"],
        }
    ext = await get(client, EXTERNAL)
    assert {r["name"] for r in ext["resources"]} == {
        "inference_queue_depth",
        "inference_requests_per_second",
        "inference_queue_time_seconds",
        "inference_queue_compute_ratio",
        "inference_batch_size",
        "inference_kv_cache_usage",
        "inference_ttft_p50_seconds",
        "inference_ttft_p95_seconds",
        "inference_itl_p95_seconds",
        "inference_prompt_tokens_per_second",
        "inference_generation_tokens_per_second",
        "inference_preemptions_per_second",
    }
    assert (await get(client, "/apis/custom.metrics.k8s.io"))["preferredVersion"]["version"] == "v1beta2"


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/readyz"])
async def test_health(client, path):
    resp = await client.get(path)
    assert resp.status == 200


@pytest.mark.parametrize("path", ["/openapi/v2", "/openapi/v3"])
async def test_openapi_is_a_clean_404(client, path):
    body = await get(client, path, 404)
    assert body["kind"] == "Status"


async def test_own_metrics_count_requests(client):
    await get(client, f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization")
    await get(client, f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/nope", 404)
    resp = await client.get("/metrics")
    text = await resp.text()
    assert 'gpuscale_adapter_requests_total{code="200",group="custom.metrics.k8s.io",resource="pods"} 1.0' in text
    assert 'gpuscale_adapter_requests_total{code="404",group="custom.metrics.k8s.io",resource="pods"} 1.0' in text
    assert "gpuscale_adapter_request_duration_seconds_bucket" in text


async def test_made_up_names_in_urls_do_not_grow_the_request_counter(client):
    """A client choosing resource types or external metric names must not add a series per name to /metrics."""
    for i in range(50):
        await get(client, f"{CUSTOM}/v1beta1/namespaces/ml/made-up-{i}/*/gpu_utilization", 404)
        await get(client, f"/apis/external.metrics.k8s.io/v1beta1/namespaces/ml/made-up-{i}", 404)
    text = await (await client.get("/metrics")).text()
    assert "made-up" not in text
    assert 'gpuscale_adapter_requests_total{code="404",group="custom.metrics.k8s.io",resource="unknown"} 50.0' in text
    assert 'gpuscale_adapter_requests_total{code="404",group="external.metrics.k8s.io",resource="unknown"} 50.0' in text


async def test_a_cached_answer_never_outlives_its_values(client):
    path = f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization"
    first = await get(client, path)
    assert await get(client, path) == first  # served again from the response cache
    client.clock["now"] = T0 + 60 + 60.5  # the values reach max-age: the cached body must not be served
    resp = await client.get(path)
    assert resp.status == 503


async def test_a_new_store_version_is_never_answered_from_the_cache(client, store):
    path = f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization"
    assert (await get(client, path))["items"][0]["value"] == "100"
    # NB: the same Snapshot object, updated in place: an id()-based cache key could not tell the two apart
    # (CPython reuses a freed snapshot's address for a later one).
    snapshot = store.snapshot
    pod_ref = next(o for o in snapshot.values["gpu_utilization"] if o.name == "llm-finetune-worker-0")
    snapshot.values["gpu_utilization"][pod_ref] = snapshot.values["gpu_utilization"][pod_ref]._replace(value=42.0)
    store.update(snapshot)
    assert (await get(client, path))["items"][0]["value"] == "42"
