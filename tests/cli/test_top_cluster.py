"""`gpuscale top` against the simulated cluster: the Kubernetes API for pods, nodes and labels; the adapter's API.

The simulated Kubernetes API and exporters (``SimCluster``) run in the test's event loop, ``top`` runs as a
subprocess (asyncio, so the loop keeps serving it). Scope: pod → node and labels through --kubeconfig,
-l on pods and on nodes, MIG devices, Triton values joined to their pods, the namespace errors, and the
pods/nodes views read from a running adapter (--adapter-url).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from gpuscale.cli.adapter import start_adapter
from gpuscale.settings import AdapterSettings
from gpuscale.sim.cluster import SimCluster
from tests.cli.test_top import top


@pytest.fixture
async def cluster():
    sim = await SimCluster().start()
    yield sim
    await sim.stop()


def scrape_args(cluster: SimCluster) -> list[str]:
    return [arg for url in cluster.scrape_urls for arg in ("--scrape-url", url)]


def gpu_pods(cluster: SimCluster) -> set[tuple[str, str]]:
    """(namespace, pod) of every scheduled pod that holds a GPU, from the scenario itself."""
    return {p.key for p in cluster.exporters.sim.placements if p.scheduled and p.slots}


async def test_pods_nodes_and_labels_come_from_the_kubernetes_api(cluster):
    kube = ["--kubeconfig", cluster.kubeconfig, *scrape_args(cluster)]
    everything, selected, nodes, unknown, empty = await asyncio.gather(
        top("pods", "-A", *kube, "-o", "json"),
        top("pods", "-n", "inference", "-l", "app=triton-bert", *kube),
        top("nodes", "-l", "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB", *kube, "-o", "json"),
        top("pods", "-n", "no-such-namespace", *kube),
        top("pods", "-n", "default", *kube),
    )

    assert everything.code == 0, everything.err
    pods = {(p.namespace, p.name): p for p in everything.doc().items}
    assert set(pods) == gpu_pods(cluster)
    placements = {p.key: p for p in cluster.exporters.sim.placements}
    for key, pod in pods.items():
        assert pod.node == placements[key].node  # pod → node
    tritons = set(cluster.exporters.triton_urls)
    for key in tritons:  # Triton series belong to the pod serving them (found by IP:port through the API)
        stats = pods[key].inference
        assert stats is not None and stats.queue_depth is not None and stats.queue_compute_ratio is not None
    for key, pod in pods.items():
        if key[0] == "nim":
            assert pod.verdict.code == "under-filled"  # the LLM decode util trap
    mig = [p for p in pods.values() if p.signals.mig_profile]
    assert mig and all(p.signals.gpu_util_percent is None for p in mig)  # MIG: no GPU_UTIL, a device each

    assert selected.code == 0, selected.err
    assert {row["POD"] for row in selected.table()} == {name for ns, name in tritons if ns == "inference"}

    assert nodes.code == 0, nodes.err
    (a100,) = nodes.doc().items
    assert a100.name == "ip-10-1-22-14.ec2.internal"
    assert a100.gpus == 8 and a100.devices == 6 + 2 * 4  # two GPUs split into 4 MIG instances each

    assert (unknown.code, unknown.err) == (2, 'gpuscale top: namespaces "no-such-namespace" not found\n')
    assert empty.code == 2 and 'no GPU pods found in namespace "default"' in empty.err


async def wait_until_served(url: str, path: str, *, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url + path) as resp:
                if resp.status == 200:
                    return
            assert time.monotonic() < deadline, f"{path} was not served in time"
            await asyncio.sleep(0.1)


async def test_pods_and_nodes_from_a_running_adapter(cluster):
    settings = AdapterSettings(
        scrape_url=cluster.scrape_urls,
        kubeconfig=cluster.kubeconfig,
        insecure_port=0,
        bind_address="127.0.0.1",
        refresh_interval=0.5,
        log_level="warning",
    )
    adapter = await start_adapter(settings)
    try:
        ratio = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/inference_queue_compute_ratio"
        await wait_until_served(adapter.url, ratio)  # rates need two refreshes
        pods, nodes, table = await asyncio.gather(
            top("pods", "-A", "--adapter-url", adapter.url, "-o", "json"),
            top("nodes", "--adapter-url", adapter.url, "-o", "json"),
            top("pods", "-n", "nim", "--adapter-url", adapter.url),
        )
    finally:
        await adapter.stop()

    assert pods.code == 0, pods.err
    doc = pods.doc()
    by_key = {(p.namespace, p.name): p for p in doc.items}
    assert set(by_key) == gpu_pods(cluster)
    assert all(p.gpus is None for p in doc.items)  # the custom metrics API has no per-GPU values
    assert any("not per GPU" in note for note in doc.notes)
    for key in cluster.exporters.triton_urls:
        stats = by_key[key].inference
        assert stats is not None and stats.queue_compute_ratio is not None
    assert nodes.code == 0, nodes.err
    assert {n.name for n in nodes.doc().items} == {n.name for n in cluster.scenario.nodes}
    assert table.code == 0, table.err
    rows = table.table()
    assert rows and all(r["VERDICT"] == "under-filled" and r["GPUS"] == "-" for r in rows)


async def test_discover_exporters_scrapes_every_exporter_pod_through_the_api_servers_proxy(cluster):
    """No Prometheus, no route to pod IPs: the pods the API lists, each scraped via pods/{name}:{port}/proxy."""
    before = len(cluster.api.requests)
    found, direct = await asyncio.gather(
        top("pods", "-A", "--discover-exporters", "--kubeconfig", cluster.kubeconfig, "-o", "json"),
        top("pods", "-A", "--kubeconfig", cluster.kubeconfig, *scrape_args(cluster), "-o", "json"),
    )
    assert found.code == 0, found.err
    assert direct.code == 0, direct.err
    by_pod = {(p.namespace, p.name): p for p in found.doc().items}
    assert set(by_pod) == gpu_pods(cluster) == {(p.namespace, p.name) for p in direct.doc().items}
    for key in cluster.exporters.triton_urls:  # Triton values reached their pods through the proxy too
        assert by_pod[key].inference is not None and by_pod[key].inference.queue_depth is not None
    proxied = {r.path_qs.split("/proxy", 1)[0] for r in list(cluster.api.requests)[before:] if "/proxy/" in r.path_qs}
    exporters = [
        p for p in cluster.api.list("v1", "Pod") if p["metadata"].get("labels", {}).get("app") == "nvidia-dcgm-exporter"
    ]
    assert exporters, "the simulated cluster runs dcgm-exporter pods"
    for pod in exporters:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        assert any(p.startswith(f"/api/v1/namespaces/{ns}/pods/{name}:") for p in proxied), proxied
    for source in found.doc().sources:
        assert source.target.startswith(cluster.api.url + "/api/v1/namespaces/") and "/proxy/" in source.target


async def test_discover_exporters_needs_the_api_and_says_when_it_finds_nothing(cluster):
    no_kubeconfig = await top("gpus", "--discover-exporters")
    assert no_kubeconfig.code == 2
    assert no_kubeconfig.err.strip() == (
        "gpuscale top: --discover-exporters: finds exporter pods through the Kubernetes API: give --kubeconfig"
    )
    for pod in cluster.api.list("v1", "Pod"):  # the exporters lose their label and annotation
        meta = pod["metadata"]
        cluster.api.patch(
            "v1",
            "Pod",
            meta["name"],
            {
                "metadata": {
                    "labels": {"app": None, "gpuscale.io/scrape": None},
                    "annotations": {"gpuscale.io/scrape": None},
                }
            },
            namespace=meta["namespace"],
        )
    nothing = await top("gpus", "--discover-exporters", "--kubeconfig", cluster.kubeconfig)
    assert nothing.code == 2 and nothing.out == ""
    (line,) = nothing.err.strip().splitlines()
    assert line.startswith(f"gpuscale top: {cluster.api.url}: no exporter pods found through the Kubernetes API"), line


async def test_workloads_rate_now_from_a_running_adapter_before_any_forecast(cluster):
    """The forecast wiring on the watch cache: Deployments' pods found by their ReplicaSet and template hash, the
    rate summed per workload, its horizon measured from the pods (Ready − startTime); the forecast itself absent
    (10 minutes of history needed) and /metrics saying so."""
    settings = AdapterSettings(
        scrape_url=cluster.scrape_urls,
        kubeconfig=cluster.kubeconfig,
        insecure_port=0,
        bind_address="127.0.0.1",
        refresh_interval=0.5,
        log_level="warning",
    )
    adapter = await start_adapter(settings)
    try:
        now = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/deployments.apps/*/workload_requests_per_second"
        await wait_until_served(adapter.url, now, timeout=40.0)  # the first finished 15 s step
        listed = await top("workloads", "-A", "--adapter-url", adapter.url, "-o", "json")
        async with aiohttp.ClientSession() as session, session.get(adapter.url + "/metrics") as resp:
            exposition = await resp.text()
    finally:
        await adapter.stop()
    assert listed.code == 0, listed.err
    items = {(w.namespace, w.kind, w.name): w for w in listed.doc().items}
    triton = [w for (ns, kind, _), w in items.items() if ns == "inference" and kind == "Deployment"]
    assert triton and all(w.requests_per_second is not None and w.requests_per_second >= 0 for w in triton)
    assert all(w.forecast_requests_per_second is None for w in items.values())
    name = triton[0].name
    assert f'gpuscale_forecast_available{{kind="Deployment",name="{name}",namespace="inference"}} 0.0' in exposition
    # the simulated pods start and turn Ready at the same instant: a measured start-up of 0 s
    assert (
        f'gpuscale_forecast_horizon_seconds{{kind="Deployment",name="{name}",namespace="inference",source="measured"}} 0.0'
        in exposition
    )
