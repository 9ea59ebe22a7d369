"""Which pod an inference server's series count towards: direct, behind a sidecar, and through a router.

A router (the vLLM production-stack router) exports one series per backend with the backend's URL in
``server``: those count towards the backend pods the URLs resolve to, and stay with the router when a URL
resolves to no pod. A server behind a sidecar is scraped on the sidecar's port, a containerPort of the
same pod, so the target itself is the serving pod.
"""

from __future__ import annotations

from gpuscale.metrics.attribution import Target
from gpuscale.model import node, pod
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects
from gpuscale.sources.targets import target_resolver
from tests.helpers import FIXTURES, T0, fixture_store

ROUTER_URL = "http://10.42.0.3:8001/metrics"
ROUTER = pod("inference", "vllm-router-6b8f9c7d5-abcde")
BACKEND_A = pod("inference", "vllm-llama-0")
BACKEND_B = pod("inference", "vllm-llama-1")


def router_store(targets: dict[str, Target]):
    targets = {ROUTER_URL: Target(ROUTER_URL, ROUTER, "node-r"), **targets}
    return fixture_store([(ROUTER_URL, FIXTURES / "llm" / "vllm-router.prom", T0)], targets=targets)


def test_router_series_count_towards_the_backend_pods():
    store = router_store(
        {
            "http://10.42.1.17:8000": Target("http://10.42.1.17:8000", BACKEND_A, "node-a"),
            "http://10.42.2.9:8000": Target("http://10.42.2.9:8000", BACKEND_B, "node-b"),
        }
    )
    assert store.point("inference_queue_depth", BACKEND_A).value == 3
    assert store.point("inference_batch_size", BACKEND_A).value == 12
    assert store.point("inference_batch_size", BACKEND_B).value == 8
    assert store.point("inference_batch_size", node("node-b")).value == 8  # the backend's node, not the router's
    assert store.point("inference_batch_size", ROUTER) is None
    # The backend URL is placement, not a label an external metric selects on.
    assert all("server" not in dict(p.labels) for p in store.parts("inference_batch_size", BACKEND_A))


def test_router_series_whose_backend_is_unknown_stay_with_the_router():
    store = router_store({})
    assert store.point("inference_batch_size", ROUTER).value == 12 + 8


def test_a_server_behind_a_sidecar_is_found_by_the_sidecar_port():
    cluster = StaticClusterObjects(
        pods=[
            # vLLM listens on 8000; KServe's queue-proxy serves the merged metrics on 9091, in the same pod.
            PodInfo(
                "inference", "llm-predictor-00001-x7k2p", {}, "node-a", "10.42.3.4", (8000, 8012, 9091), "Running", None
            )
        ]
    )
    resolve = target_resolver({}, cluster)
    url = "http://10.42.3.4:9091/metrics"
    store = fixture_store([(url, FIXTURES / "llm" / "vllm-v0.8.prom", T0)], targets={url: resolve(url)})
    assert store.point("inference_kv_cache_usage", pod("inference", "llm-predictor-00001-x7k2p")).value == 25.0
    assert store.point("inference_kv_cache_usage", node("node-a")).value == 25.0
