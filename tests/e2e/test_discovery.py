"""Embedded scrape with target discovery: the adapter finds dcgm-exporter and Triton pods through the
Kubernetes API and follows the Triton Deployment as it scales, with no scrape URL given."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from gpuscale.cli.adapter import start_adapter
from gpuscale.settings import AdapterSettings
from gpuscale.sim.cluster import SimCluster
from tests.adapter import hpa

PODS = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton-bert"
QUEUE = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/inference_queue_depth?labelSelector=app%3Dtriton-bert"


async def wait_for(session, url, predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        async with session.get(url) as resp:
            last = (resp.status, await resp.json())
            if resp.status == 200 and predicate(last[1]):
                return last[1]
        await asyncio.sleep(0.2)
    raise AssertionError(f"condition not met for {url}: {last}")


async def test_discovered_targets_follow_a_scaling_deployment():
    async with SimCluster() as cluster:
        adapter = await start_adapter(
            AdapterSettings(
                discover_exporters=True,
                kubeconfig=cluster.kubeconfig,
                insecure_port=0,
                bind_address="127.0.0.1",
                refresh_interval=0.5,
                log_level="warning",
            )
        )
        try:
            async with aiohttp.ClientSession() as session:
                body = await wait_for(session, adapter.url + QUEUE, lambda b: len(b["items"]) == 3)
                assert len(hpa.pod_metrics(body)) == 3  # Triton endpoints discovered by annotation
                body = await wait_for(session, adapter.url + PODS, lambda b: len(b["items"]) == 3)
                assert len(hpa.pod_metrics(body)) == 3  # GPU series from the discovered dcgm-exporters
                await cluster.exporters.set_replicas("inference/triton-bert", 5)
                body = await wait_for(session, adapter.url + QUEUE, lambda b: len(b["items"]) == 5)
                names = set(hpa.pod_metrics(body))
                assert names == {name for (ns, name) in cluster.exporters.triton_urls if ns == "inference"}
                await cluster.exporters.set_replicas("inference/triton-bert", 2)
                await wait_for(session, adapter.url + QUEUE, lambda b: len(b["items"]) == 2)
        finally:
            await adapter.stop()
