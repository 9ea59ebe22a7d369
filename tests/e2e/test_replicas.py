"""HA: two adapter replicas over the same exporters are stateless and give the same answers."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from gpuscale.cli.adapter import start_adapter, wait_ready
from gpuscale.settings import AdapterSettings
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.exporters import ManualClock

PATHS = [
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton-bert",
    "/apis/custom.metrics.k8s.io/v1beta1/namespaces/nim/pods/*/gpu_sm_active",
    "/apis/custom.metrics.k8s.io/v1beta1/nodes/*/gpu_power_watts",
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml-training/statefulsets.apps/llm-finetune-worker/gpu_tensor_active",
    "/apis/external.metrics.k8s.io/v1beta1/namespaces/inference/inference_queue_depth?labelSelector=model%3Dbert_qa_onnx",
]


def values(body: dict) -> list[tuple[str, str]]:
    return sorted(
        ((i.get("describedObject") or {}).get("name", i.get("metricName")), i["value"]) for i in body["items"]
    )


async def test_two_replicas_agree():
    # The exporters' values are frozen in time so both replicas scrape identical pages.
    async with SimCluster(clock=ManualClock(time.time())) as cluster:
        settings = AdapterSettings(
            discover_exporters=True,
            kubeconfig=cluster.kubeconfig,
            insecure_port=0,
            bind_address="127.0.0.1",
            refresh_interval=0.5,
            log_level="warning",
        )
        replicas = [await start_adapter(settings), await start_adapter(settings)]
        try:
            for r in replicas:
                await wait_ready(r)
            async with aiohttp.ClientSession() as session:
                deadline = time.monotonic() + 20
                while True:
                    answers = []
                    for r in replicas:
                        per_replica = []
                        for path in PATHS:
                            async with session.get(r.url + path) as resp:
                                per_replica.append(
                                    (resp.status, values(await resp.json()) if resp.status == 200 else None)
                                )
                        answers.append(per_replica)
                    if all(status == 200 for status, _ in answers[0]) and answers[0] == answers[1]:
                        break
                    assert time.monotonic() < deadline, answers
                    await asyncio.sleep(0.2)
        finally:
            for r in replicas:
                await r.stop()
