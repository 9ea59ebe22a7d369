"""The request side of demand-driven refresh: which (metric, namespace) each URL shape asks for, and that a
request for a scope not yet fetched waits for one refresh — and is answered even when that refresh does not come.

The refresh itself, on the real control plane with a real Prometheus: tests/cluster/test_demand_real.py.
"""

from __future__ import annotations

import pytest

from gpuscale.adapter.app import make_app
from gpuscale.adapter.asked_for import asked_for_middleware
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.metrics.catalogue import load_catalogue
from tests.adapter.test_api import CUSTOM, EXTERNAL, NOW, make_cluster
from tests.adapter.test_api import store as store  # the fixture: the fixture scrapes in a store

SCOPES = [
    (f"{CUSTOM}/v1beta2/namespaces/ml-training/pods/*/gpu_utilization", ("gpu_utilization", "ml-training")),
    (f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/llm-finetune-worker-0/gpu_sm_active", ("gpu_sm_active", "ml-training")),
    (f"{CUSTOM}/v1beta1/namespaces/inference/deployments.apps/triton-inference/gpu_sm_active", ("gpu_sm_active", "inference")),
    (f"{CUSTOM}/v1beta1/namespaces/ml-training/metrics/gpu_memory_used_bytes", ("gpu_memory_used_bytes", "ml-training")),
    (f"{CUSTOM}/v1beta2/namespaces/ml-batch/gpu_power_watts", ("gpu_power_watts", "ml-batch")),  # the namespace by name
    (f"{CUSTOM}/v1beta2/namespaces/*/gpu_power_watts", ("gpu_power_watts", None)),  # every namespace
    (f"{CUSTOM}/v1beta1/nodes/*/gpu_utilization", ("gpu_utilization", None)),  # nodes aggregate every namespace
    (f"{EXTERNAL}/namespaces/inference/inference_queue_depth", ("inference_queue_depth", "inference")),
    (f"{CUSTOM}/v1beta1", None),  # discovery: never waits
    ("/readyz", None),
]  # fmt: skip


def _client_app(store, note, refresh):
    catalogue = load_catalogue()
    provider = MetricsProvider(catalogue, store, make_cluster(), clock=lambda: NOW)
    middleware = asked_for_middleware(note, refresh)
    return make_app(provider, Discovery(catalogue), AdapterMetrics(lambda: []), ready=lambda: (True, ""),
                    middlewares=[middleware])  # fmt: skip


@pytest.mark.parametrize(("path", "scope"), SCOPES)
async def test_the_scope_of_each_url_shape(aiohttp_client, store, path, scope):
    noted = []

    def note(metric, namespace):
        noted.append((metric, namespace))
        return True

    async def refresh():
        raise AssertionError("a covered scope never waits")

    client = await aiohttp_client(_client_app(store, note, refresh))
    await client.get(path)
    assert noted == ([scope] if scope else [])


async def test_a_scope_not_fetched_waits_for_one_refresh_then_is_answered(aiohttp_client, store):
    refreshes = []

    async def refresh():
        refreshes.append(1)

    client = await aiohttp_client(_client_app(store, lambda m, ns: False, refresh))
    resp = await client.get(f"{CUSTOM}/v1beta2/namespaces/ml-training/pods/*/gpu_utilization")
    assert resp.status == 200 and refreshes == [1]


async def test_a_refresh_that_does_not_come_in_time_still_answers_from_the_store(aiohttp_client, store):
    async def refresh():
        raise TimeoutError

    client = await aiohttp_client(_client_app(store, lambda m, ns: False, refresh))
    resp = await client.get(f"{CUSTOM}/v1beta2/namespaces/ml-training/pods/*/gpu_utilization")
    assert resp.status == 200
