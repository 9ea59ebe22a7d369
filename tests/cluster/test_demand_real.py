"""Demand-driven refresh on the real control plane with a real Prometheus: cost follows the HPAs.

``gpuscale adapter --prometheus-url`` (in this process, so its refresh can be watched) reads a real Prometheus
that scrapes a small dcgm-exporter page: GPUs of pods in two namespaces, ``demand-hot`` and ``demand-cold``, one
with its workload in ``exported_pod`` (a ServiceMonitor without honorLabels), and an idle GPU with no pod label.
An autoscaling/v2 HPA created through kube-apiserver names ``gpu_utilization`` in ``demand-hot``: from then on
every refresh fetches that metric for that namespace — and Prometheus, filtering on the workload labels, sends
no series of ``demand-cold``. ``gpu_sm_active`` in ``demand-cold``, which no HPA names, is fetched on its first
request and answered by it. Discovery lists every catalogue metric throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
import time

import aiohttp
import pytest

from gpuscale.cli.adapter import start_adapter, wait_ready
from gpuscale.metrics.aggregation import queries, term_query
from gpuscale.model import POD, ObjectRef
from gpuscale.settings import AdapterSettings
from gpuscale.sources.prometheus import PrometheusSource
from tests.cluster.controlplane import free_port
from tests.cluster.metrics_stack import llm_deployment
from tests.e2e.backends import Backends, static_job

pytestmark = pytest.mark.e2e

HOT, COLD = "demand-hot", "demand-cold"
C2 = "/apis/custom.metrics.k8s.io/v1beta2"


def _page() -> bytes:
    gpus = [
        ('gpu="0",UUID="GPU-h0",Hostname="n1",namespace="demand-hot",pod="hot-0"', 61, 0.41),
        ('gpu="1",UUID="GPU-h1",Hostname="n1",exported_namespace="demand-hot",exported_pod="hot-1",'
         'namespace="gpu-operator",pod="dcgm-exporter-x"', 63, 0.43),
        ('gpu="2",UUID="GPU-c0",Hostname="n1",namespace="demand-cold",pod="cold-0"', 17, 0.25),
        ('gpu="3",UUID="GPU-idle",Hostname="n1"', 0, 0.0),
    ]  # fmt: skip
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge", "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge"]
    for labels, util, sm in gpus:
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}", f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} {sm}"]
    return ("\n".join(lines) + "\n").encode()


class Exporter:
    def __init__(self) -> None:
        page = _page()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # NB: the client gave up
                    self.wfile.write(page)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _hpa(namespace: str, metric: str) -> dict:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "by-gpu", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {"type": "Pods", "pods": {"metric": {"name": metric}, "target": {"type": "AverageValue", "averageValue": "50"}}}
            ],
        },
    }  # fmt: skip


def _deployment(namespace: str) -> dict:
    """metrics_stack's llm Deployment, in ``namespace``, scaled to 0 (only the object is needed)."""
    deployment = llm_deployment()
    deployment["metadata"]["namespace"] = namespace
    deployment["spec"]["replicas"] = 0
    return deployment


def _forecast_hpa(namespace: str) -> dict:
    described = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "by-forecast", "namespace": namespace},
        "spec": {
            "scaleTargetRef": described,
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {"type": "Object", "object": {"describedObject": described, "metric": {"name": "forecast_desired_replicas"},
                 "target": {"type": "AverageValue", "averageValue": "1"}}}
            ],
        },
    }  # fmt: skip


@contextlib.asynccontextmanager
async def adapter_over_prometheus(tmp_path, kubeconfig: str, **settings: object):
    """The adapter (in this process, ready) reading a real Prometheus that scrapes the Exporter page."""
    exporter = Exporter()
    try:
        async with Backends(tmp_path) as backends:
            prometheus = await backends.prometheus([static_job("dcgm", [exporter.target])])
            await prometheus.wait_ready(targets=1, series="DCGM_FI_DEV_GPU_UTIL")
            adapter = await start_adapter(
                AdapterSettings(
                    prometheus_url=prometheus.url,
                    kubeconfig=kubeconfig,
                    insecure_port=0,
                    refresh_interval=1.0,
                    **settings,
                )
            )
            try:
                await wait_ready(adapter)
                assert adapter.scoped_refresh is not None
                yield adapter
            finally:
                await adapter.stop()
    finally:
        exporter.server.shutdown()


async def _until(check, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        await asyncio.sleep(0.1)
    return result


async def test_an_hpa_makes_its_metric_refreshed_and_an_unreferenced_one_is_served_on_first_request(
    control_plane, tmp_path, catalogue
):
    rest = control_plane.rest()
    for namespace, pods in ((HOT, ("hot-0", "hot-1")), (COLD, ("cold-0",))):
        rest.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for name in pods:
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                   "labels": {"app": "llm"}}, "spec": {"containers": [{"name": "main", "image": "llm:1"}]}}  # fmt: skip
            rest.post(f"/api/v1/namespaces/{namespace}/pods", pod).expect(201, 409)
    try:
        # NB: forecasts on (the default): their rate metric is fetched only where a forecast is named
        async with adapter_over_prometheus(
            tmp_path, str(control_plane.admin), keep_warm=300.0, log_level="warning"
        ) as adapter:
            demand, source, pipeline = adapter.scoped_refresh.scope, adapter.scoped_refresh.source, adapter.pipeline
            await _until(lambda: adapter.scoped_refresh.hpas.synced, timeout=30, what="the HPA list")
            util = catalogue.get("gpu_utilization")
            util_query = term_query(util.terms[0], window_seconds=catalogue.window(util))

            # No HPA here yet: once a refresh has run with the HPA list, nothing of these namespaces is fetched.
            # NB: the session's control plane may hold other tests' HPAs (gpu-apps): what they name is fetched.
            start = pipeline.refreshes
            await _until(lambda: pipeline.refreshes >= start + 2, timeout=20, what="two refreshes")
            assert not {ns for _, ns in demand.fetched} & {HOT, COLD}, demand.fetched
            assert not [q for q in source.promql if HOT in q or COLD in q]
            elsewhere = set(source.promql)

            rest.post(f"/apis/autoscaling/v2/namespaces/{HOT}/horizontalpodautoscalers", _hpa(HOT, "gpu_utilization")).expect(201)  # fmt: skip
            await _until(
                lambda: ("gpu_utilization", HOT) in demand.fetched, timeout=20, what="the HPA's metric fetched"
            )
            # Refreshed at the full rate: every following refresh fetches it again, with no request asking.
            taken = []
            for _ in range(3):
                before = pipeline.refreshes
                await _until(lambda b=before: pipeline.refreshes > b, timeout=10, what="the next refresh")
                assert ("gpu_utilization", HOT) in demand.fetched
                taken.append(adapter.store.snapshot.taken_at)
            assert taken == sorted(taken) and len(set(taken)) == 3
            # Prometheus filtered on the workload labels: the hot pods' GPUs (one of them through exported_pod)
            # and the idle GPU without a pod label; none of demand-cold's.
            workloads = {
                (v.labels.get("exported_pod") or v.labels.get("pod"), v.labels.get("Hostname"))
                for v in source.read(util_query)
            }
            assert workloads == {("hot-0", "n1"), ("hot-1", "n1"), (None, "n1")}
            ours = [q for q in source.promql if q not in elsewhere]
            assert all(HOT in q for q in ours) and len(ours) == len(util.terms[0].series), source.promql
            assert adapter.store.point("gpu_utilization", ObjectRef(POD, "hot-0", HOT)).value == 61
            assert adapter.store.point("gpu_utilization", ObjectRef(POD, "cold-0", COLD)) is None

            # gpu_sm_active in demand-cold: no HPA names it, so it is not fetched — until it is asked for.
            cold = ObjectRef(POD, "cold-0", COLD)
            assert not demand.covers("gpu_sm_active", COLD) and adapter.store.point("gpu_sm_active", cold) is None
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{adapter.url}{C2}/namespaces/{COLD}/pods/cold-0/gpu_sm_active") as answer:
                    assert answer.status == 200, await answer.text()
                    (item,) = (await answer.json())["items"]
                assert item["describedObject"]["name"] == "cold-0" and item["value"] in ("25", "25000m")
                assert demand.covers("gpu_sm_active", COLD)
                assert ("gpu_sm_active", COLD) in demand.wanted(now=time.time())  # kept warm from now on
                # A namespace that does not exist is answered 404 at once and never joins a query.
                async with http.get(f"{adapter.url}{C2}/namespaces/no-such-ns/pods/*/gpu_sm_active") as answer:
                    assert answer.status == 404
                assert not any(ns == "no-such-ns" for _, ns in demand.wanted(now=time.time()))
                # Discovery lists every catalogue metric, fetched or not.
                async with http.get(f"{adapter.url}{C2}") as answer:
                    listed = {r["name"].split("/", 1)[1] for r in (await answer.json())["resources"]}
                assert listed >= {m.name for m in catalogue if m.resources} and "gpu_memory_used_bytes" in listed

            # A forecast an HPA names in demand-cold: the forecasts' rate metric is fetched there, and only
            # there, and only demand-cold's workloads are forecast (the others cost nothing).
            rate = "inference_requests_per_second"
            assert not [ns for m, ns in demand.fetched if m == rate]
            for namespace in (HOT, COLD):
                rest.post(f"/apis/apps/v1/namespaces/{namespace}/deployments", _deployment(namespace)).expect(201)
            rest.post(f"/apis/autoscaling/v2/namespaces/{COLD}/horizontalpodautoscalers", _forecast_hpa(COLD)).expect(201)  # fmt: skip
            await _until(lambda: (rate, COLD) in demand.fetched, timeout=20, what="the forecast's rate fetched")
            assert [ns for m, ns in demand.fetched if m == rate] == [COLD]
            assert any("vllm:request_success_total" in q and COLD in q for q in source.promql), source.promql
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{adapter.url}/metrics") as answer:
                    exposition = await answer.text()
                assert (
                    f'gpuscale_forecast_available{{kind="Deployment",name="llm",namespace="{COLD}"}} 0.0' in exposition
                )
                assert f'namespace="{HOT}"' not in exposition.split("gpuscale_forecast_available", 1)[1]
                # Asked for in demand-hot: answered at once (no history to wait for), saying why; its rate is
                # fetched from then on, and the forecast starts from nothing (10 minutes absent).
                url = f"{adapter.url}{C2}/namespaces/{HOT}/deployments.apps/llm/forecast_requests_per_second"
                started = time.monotonic()
                async with http.get(url) as answer:
                    assert answer.status == 404, await answer.text()
                    message = (await answer.json())["message"]
                assert time.monotonic() - started < 1.0  # NB: a refresh every 1 s: it did not wait for one
                assert f"the rate is read in namespace {HOT} only once an HPA or a request asks" in message
                await _until(lambda: (rate, HOT) in demand.fetched, timeout=20, what="the asked-for rate fetched")
                async with http.get(url) as answer:
                    message = (await answer.json())["message"]
                # NB: the page has no request counter: read there, the rate is a gap; never a made-up value
                assert answer.status == 404 and "no request-rate history; a forecast needs 600 s" in message, message
    finally:
        rest.delete(f"/apis/autoscaling/v2/namespaces/{HOT}/horizontalpodautoscalers/by-gpu")
        rest.delete(f"/apis/autoscaling/v2/namespaces/{COLD}/horizontalpodautoscalers/by-forecast")
        for namespace in (HOT, COLD):
            rest.delete(f"/api/v1/namespaces/{namespace}")


async def test_without_rights_on_hpas_every_metric_is_refreshed_and_readyz_says_why(control_plane, tmp_path, catalogue):
    """An adapter whose RBAC predates demand-driven refresh (no list/watch on HPAs) refreshes every metric,
    as it did, and /readyz names the refused watch."""
    rest = control_plane.rest()
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "demand-no-hpas"},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "nodes", "namespaces"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": ["get", "list", "watch"]},
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "demand-no-hpas"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "demand-no-hpas"},
        "subjects": [{"kind": "User", "name": "demand-no-hpas", "apiGroup": "rbac.authorization.k8s.io"}],
    }
    rest.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", role).expect(201, 409)
    rest.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding).expect(201, 409)
    try:
        async with adapter_over_prometheus(
            tmp_path, str(control_plane.kubeconfig_for("demand-no-hpas")), log_level="error"
        ) as adapter:
            hpas = adapter.scoped_refresh.hpas
            await _until(lambda: hpas.last_errors, timeout=20, what="the refusal")
            before = adapter.pipeline.refreshes
            await _until(lambda: adapter.pipeline.refreshes > before, timeout=10, what="a refresh after it")
            assert not hpas.synced and "forbidden" in next(iter(hpas.last_errors.values())).lower()
            # Every catalogue query, unfiltered: what the adapter did before demand-driven refresh.
            every = PrometheusSource("http://prometheus:9090", queries=queries(catalogue)).promql
            sent = adapter.scoped_refresh.source.promql
            assert len(sent) == len(every) and not any("namespace" in q for q in sent)
            assert adapter.scoped_refresh.scope.covers("gpu_utilization", COLD)
            async with aiohttp.ClientSession() as http, http.get(f"{adapter.url}/readyz") as answer:
                text = await answer.text()
            assert answer.status == 200, text
            assert "HorizontalPodAutoscaler list/watch failing, refreshing every metric" in text, text
    finally:
        rest.delete("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/demand-no-hpas")
        rest.delete("/apis/rbac.authorization.k8s.io/v1/clusterroles/demand-no-hpas")
