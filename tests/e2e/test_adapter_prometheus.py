"""End to end: `gpuscale adapter --prometheus-url` over a real Prometheus that scrapes the simulated
exporters (ServiceMonitor-style target labels, so DCGM pod labels arrive as exported_pod), read by kubectl."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from gpuscale.sim.cluster import SimCluster
from tests.adapter import hpa
from tests.e2e.backends import Backends, host_port, pod_target_labels, static_job
from tests.e2e.test_kubectl import KUBECTL, free_port, run

pytestmark = pytest.mark.e2e

C2 = "/apis/custom.metrics.k8s.io/v1beta2"


async def test_adapter_reads_prometheus_and_kubectl_sees_the_workload_pods(tmp_path):
    async with SimCluster() as cluster, Backends(tmp_path / "backends") as backends:
        labels = pod_target_labels(cluster.exporters.kube_objects())
        prometheus = await backends.prometheus(
            [
                static_job("dcgm-exporter", {u: labels[host_port(u)] for u in cluster.exporters.dcgm_urls.values()}),
                static_job("triton", {u: labels[host_port(u)] for u in cluster.exporters.triton_urls.values()}),
            ]
        )
        await prometheus.wait_ready(targets=len(cluster.scrape_urls))
        port = free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuscale.cli.main",
            "adapter",
            "--prometheus-url",
            prometheus.url,
            "--kubeconfig",
            cluster.kubeconfig,
            "--insecure-port",
            str(port),
            "--bind-address",
            "127.0.0.1",
            "--refresh-interval",
            "1s",
            "--log-level",
            "warning",
            stderr=asyncio.subprocess.PIPE,
        )
        server = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 40
            while True:
                assert proc.returncode is None, (await proc.stderr.read()).decode()
                code, out, _ = await run(
                    KUBECTL, f"--server={server}", "get", "--raw", f"{C2}/namespaces/nim/pods/*/gpu_utilization"
                )
                if code == 0:
                    break
                assert time.monotonic() < deadline, "adapter over Prometheus did not serve in time"
                await asyncio.sleep(0.5)
            # The DCGM series carry the exporter pod as `pod` (a Prometheus target label) and the workload
            # as `exported_pod`: the HPA must see the LLM pods, never the dcgm-exporter pod.
            util = hpa.pod_metrics(json.loads(out))
            llm_pods = {
                name
                for (ns, name) in (
                    (p["metadata"]["namespace"], p["metadata"]["name"])
                    for p in cluster.exporters.kube_objects()
                    if p["kind"] == "Pod"
                )
                if ns == "nim"
            }
            assert set(util) == llm_pods and all(v >= 90_000 for v in util.values())
            code, out, err = await run(
                KUBECTL,
                f"--server={server}",
                "get",
                "--raw",
                f"{C2}/namespaces/inference/pods/*/inference_queue_depth?labelSelector=app%3Dtriton-bert",
            )
            assert code == 0, err
            assert len(hpa.pod_metrics(json.loads(out))) == 3
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
