"""End to end: deploy/examples/vllm-hpa.yaml scales a simulated vLLM Deployment through the real adapter.

A vLLM Deployment (1 replica, offered three times its capacity) runs in the simulated cluster; the adapter
discovers its metrics endpoint by annotation, as it does Triton's. The HPA controller loop (gpuscale.hpa,
reading the metrics APIs over HTTP exactly as kube-controller-manager does) syncs the example manifest: the
queue depth is far above 4 per pod, so it scales up — by 2 pods, the manifest's scale-up policy — and the
adapter then answers for all three pods.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import yaml

from gpuscale.cli.adapter import start_adapter
from gpuscale.cli.hpa_loop import HpaLoop
from gpuscale.hpa import parse_manifests
from gpuscale.model import parse_quantity
from gpuscale.settings import AdapterSettings
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.exporters.llm import LlmServer
from gpuscale.sim.gpu_nodes import SimNode
from gpuscale.sim.load import ConstantLoad
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.workloads import SimWorkload
from tests.e2e.test_discovery import wait_for

EXAMPLE = Path(__file__).parents[2] / "deploy" / "examples" / "vllm-hpa.yaml"
C2 = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*"


async def test_the_vllm_example_hpa_scales_on_queue_depth():
    scenario = Scenario(
        nodes=(SimNode.build("gpu-node-1", seed=11, instance_type="p5.48xlarge"),),
        workloads=(SimWorkload("inference", "vllm", replicas=1, capacity_rps=10, load=ConstantLoad(30)),),
        seed=11,
    )
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["namespace"] = "inference"
    (hpa,) = parse_manifests(yaml.safe_dump(manifest), source=str(EXAMPLE))
    async with SimCluster(scenario, llm={"inference/vllm": LlmServer(max_num_seqs=64)}) as cluster:
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
                queue = f"{adapter.url}{C2}/inference_queue_depth?labelSelector=app%3Dvllm"
                await wait_for(session, queue, lambda b: len(b["items"]) == 1 and b["items"][0]["value"] != "0")
                kv = await wait_for(session, f"{adapter.url}{C2}/inference_kv_cache_usage", lambda b: b["items"])
                assert 0 < parse_quantity(kv["items"][0]["value"]) < 80  # percent: the queue, not the cache, binds
                loop = HpaLoop(hpa, session=session, adapter_url=adapter.url, kube_url=cluster.api.url)
                result = await loop.sync(now=cluster.clock())
                by_metric = {p.metric: p for p in result.decision.proposals}
                assert by_metric["inference_queue_depth"].replicas > 3  # far above 4 waiting per pod
                assert (result.decision.current_replicas, result.decision.desired_replicas) == (1, 3)  # +2 per minute
                assert await cluster.follow_scale() == [("inference/vllm", 1, 3)]
                body = await wait_for(session, queue, lambda b: len(b["items"]) == 3)
                assert {i["describedObject"]["name"] for i in body["items"]} == {
                    name for (ns, name) in cluster.exporters.llm_urls if ns == "inference"
                }
        finally:
            await adapter.stop()
