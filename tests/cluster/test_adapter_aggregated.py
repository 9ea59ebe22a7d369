"""The adapter as users run it: deploy/ applied server-side to the real control plane, `gpuscale adapter` with
its ServiceAccount's token behind the real kube-aggregator (front-proxy client certificate, TokenReview,
SubjectAccessReview), and the real HPA controller scaling a Deployment on gpuscale's GPU metrics.

The GPU telemetry comes from a test-owned dcgm-exporter: it renders DCGM series (upstream's labels) for the
pods the real ReplicaSet created, with values the test moves. Nothing of ours is in the scaling decision: the
HPA controller of kube-controller-manager v1.37 reads the metrics through the aggregator and scales through
the Deployment's scale subresource.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme

from tests.cluster.controlplane import ControlPlane, free_port
from tests.cluster.kubelet import FakeKubelet, make_node

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NS = "gpu-apps"
NODES = ("gpu-node-1", "gpu-node-2")
CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io"


class DcgmExporter:
    """dcgm-exporter's /metrics for every pod of ``app=llm`` in NS: one GPU each, GPU_UTIL and SM_ACTIVE set by
    the test (``util`` percent, ``sm_active`` ratio), labelled as dcgm-exporter labels a pod's GPU."""

    def __init__(self, plane: ControlPlane) -> None:
        self.rest = plane.rest()
        self.util = 30.0
        self.sm_active = 0.2
        self.waiting = 0.0
        exporter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def render(self) -> str:
        pods = self.rest.get(f"/api/v1/namespaces/{NS}/pods", labelSelector="app=llm").body.get("items", [])
        lines = [
            "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        ]
        sm = [
            "# HELP DCGM_FI_PROF_SM_ACTIVE Ratio of cycles an SM has at least 1 warp assigned.",
            "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge",
        ]
        for pod in pods:
            name, node = pod["metadata"]["name"], pod["spec"].get("nodeName")
            if not node or pod["metadata"].get("deletionTimestamp"):
                continue
            uuid = "GPU-" + hashlib.sha1(name.encode()).hexdigest()[:8]
            labels = (
                f'gpu="0",UUID="{uuid}",pci_bus_id="00000000:07:00.0",device="nvidia0",'
                f'modelName="NVIDIA A100-SXM4-80GB",Hostname="{node}",container="server",namespace="{NS}",pod="{name}"'
            )
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {self.util:g}")
            sm.append(f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} {self.sm_active:g}")
        return "\n".join(lines + sm) + "\n"

    def stop(self) -> None:
        self.server.shutdown()


class NimContainers:
    """The llm pods' serving containers: for each Running pod, an HTTP server on the pod's (loopback) IP and
    port 8000 that answers NVIDIA NIM's LLM metrics, ``num_requests_waiting`` set by the test. The adapter finds
    them as it does in a cluster: pods annotated ``gpuscale.io/scrape: "true"``, scraped at their IP."""

    def __init__(self, plane: ControlPlane) -> None:
        self.rest = plane.rest()
        self.waiting = 0.0
        self._servers: dict[str, http.server.ThreadingHTTPServer] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        containers = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (
                    "# HELP num_requests_waiting Number of requests waiting to be processed.\n"
                    "# TYPE num_requests_waiting gauge\n"
                    f'num_requests_waiting{{model_name="meta/llama-3.1-8b-instruct"}} {containers.waiting:g}\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            pods = self.rest.get(f"/api/v1/namespaces/{NS}/pods", labelSelector="app=llm").body.get("items", [])
            for pod in pods:
                ip = (pod.get("status") or {}).get("podIP")
                if ip and ip not in self._servers:
                    server = http.server.ThreadingHTTPServer((ip, 8000), self._handler())
                    threading.Thread(target=server.serve_forever, daemon=True).start()
                    self._servers[ip] = server

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for server in self._servers.values():
            server.shutdown()
            server.server_close()


def _until(check: Callable[[], object], *, timeout: float, what: str, interval: float = 0.25) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def _deployment() -> dict:
    labels = {"app": "llm"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"gpuscale.io/scrape": "true", "gpuscale.io/port": "8000"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "nvcr.io/nim/llm:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            },
        },
    }


@pytest.fixture(scope="module")
def adapter(control_plane: ControlPlane, tmp_path_factory) -> Iterator[dict]:
    """deploy/base applied server-side, the adapter running as its ServiceAccount on the Service's ClusterIP."""
    plane = control_plane
    work = tmp_path_factory.mktemp("adapter")
    applied = plane.kubectl("apply", "--server-side", "--field-manager=gpuscale-test", "-k", str(REPO / "deploy/base"))
    assert applied.returncode == 0, applied.stderr
    rest = plane.rest()
    service = rest.get("/api/v1/namespaces/gpuscale/services/gpuscale-adapter").expect(200)
    cluster_ip, port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]
    if port < 1024 and os.geteuid() != 0:
        # NB: deploy/'s Service port (443) needs root to bind here; elsewhere move Service and APIServices to a
        # free unprivileged port — the aggregator dials whatever the APIService names.
        port = free_port()
        patch = [{"op": "replace", "path": "/spec/ports/0/port", "value": port}]
        rest.patch("/api/v1/namespaces/gpuscale/services/gpuscale-adapter", patch, "json").expect(200)
        for name in (
            "v1beta1.custom.metrics.k8s.io",
            "v1beta2.custom.metrics.k8s.io",
            "v1beta1.external.metrics.k8s.io",
        ):
            rest.patch(
                f"/apis/apiregistration.k8s.io/v1/apiservices/{name}", {"spec": {"service": {"port": port}}}
            ).expect(200)
    # What components/cert-manager does in a cluster: a CA issues the serving certificate for the Service's
    # DNS name and cainjector puts the CA into every APIService's caBundle.
    ca = trustme.CA()
    serving = ca.issue_cert("gpuscale-adapter.gpuscale.svc", "gpuscale-adapter.gpuscale.svc.cluster.local", cluster_ip)
    cert, key = work / "tls.crt", work / "tls.key"
    serving.cert_chain_pems[0].write_to_path(str(cert))
    serving.private_key_pem.write_to_path(str(key))
    bundle = base64.b64encode(ca.cert_pem.bytes()).decode()
    for name in ("v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io", "v1beta1.external.metrics.k8s.io"):
        rest.patch(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}", {"spec": {"caBundle": bundle}}).expect(200)

    # NB: the aggregator's availability check wants a ready endpoint behind the Service, which the endpointslice
    # controller would write from the adapter's pod. The test writes it: its address (TEST-NET-1, never dialled)
    # only passes that check, since with aggregator routing off requests go to the ClusterIP, where the adapter
    # listens (tests/cluster/controlplane.py).
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "gpuscale-adapter-test", "namespace": "gpuscale",
                     "labels": {"kubernetes.io/service-name": "gpuscale-adapter"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.10"], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
    }  # fmt: skip
    rest.post("/apis/discovery.k8s.io/v1/namespaces/gpuscale/endpointslices", slice_).expect(201)
    rest.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}).expect(
        201, 409
    )
    for node in NODES:
        make_node(rest, node, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    rest.post(f"/apis/apps/v1/namespaces/{NS}/deployments", _deployment()).expect(201)
    exporter = DcgmExporter(plane)
    nim = NimContainers(plane)
    kubeconfig = plane.service_account_kubeconfig("gpuscale", "gpuscale-adapter")
    args = [
        sys.executable, "-m", "gpuscale.cli.main", "adapter",
        "--kubeconfig", str(kubeconfig),
        "--scrape-url", f"gpuscale/dcgm-exporter-test={exporter.url}",
        "--discover-exporters",
        "--bind-address", cluster_ip,
        "--secure-port", str(port),
        "--tls-cert-file", str(cert),
        "--tls-private-key-file", str(key),
        "--refresh-interval", "1s",
        "--log-level", "warning",
    ]  # fmt: skip
    log = (work / "adapter.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    kubelet = FakeKubelet(rest, namespaces=[NS], nodes=NODES).__enter__()
    try:

        def available() -> bool | str:  # True, or why not (truthy; the loop below reads it)
            assert proc.poll() is None, (work / "adapter.log").read_text()
            item = rest.get("/apis/apiregistration.k8s.io/v1/apiservices/v1beta2.custom.metrics.k8s.io").body
            conditions = {c["type"]: c for c in item["status"].get("conditions", [])}
            ready = conditions.get("Available", {})
            return ready.get("status") == "True" or f"not available: {ready.get('reason')}: {ready.get('message')}"

        try:
            _until(lambda: available() is True, timeout=60, what="APIService v1beta2.custom.metrics.k8s.io Available")
        except AssertionError as e:
            raise AssertionError(
                f"{e}\n{available() or ''}\nadapter log: {(work / 'adapter.log').read_text()[-1500:]}"
            ) from None
        yield {"plane": plane, "exporter": exporter, "nim": nim, "proc": proc, "log": work / "adapter.log"}
    finally:
        kubelet.__exit__(None, None, None)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        exporter.stop()
        nim.stop()
        log.close()


def _raw(plane: ControlPlane, path: str, kubeconfig: Path | None = None) -> tuple[int, dict | str]:
    done = plane.kubectl("get", "--raw", path, kubeconfig=kubeconfig)
    if done.returncode != 0:
        return done.returncode, done.stderr
    return 0, json.loads(done.stdout)


def test_kubectl_reads_every_api_version_through_the_real_aggregator(adapter):
    plane = adapter["plane"]

    def pod_values() -> dict | None:
        code, body = _raw(plane, f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_utilization?labelSelector=app%3Dllm")
        return body if code == 0 and body.get("items") else None

    body = _until(pod_values, timeout=30, what="gpu_utilization of the llm pods through the aggregator")
    assert body["kind"] == "MetricValueList" and body["apiVersion"] == "custom.metrics.k8s.io/v1beta2"
    pods = {p["metadata"]["name"] for p in plane.rest().get(f"/api/v1/namespaces/{NS}/pods").body["items"]}
    assert {i["describedObject"]["name"] for i in body["items"]} <= pods
    assert all(i["metric"]["name"] == "gpu_utilization" for i in body["items"])

    code, v1 = _raw(plane, f"{CUSTOM}/v1beta1/namespaces/{NS}/pods/*/gpu_sm_active")
    assert code == 0, v1
    assert v1["apiVersion"] == "custom.metrics.k8s.io/v1beta1" and v1["items"][0]["metricName"] == "gpu_sm_active"

    code, ns = _raw(plane, f"{CUSTOM}/v1beta2/namespaces/{NS}/metrics/gpu_utilization")
    assert code == 0, ns
    assert ns["items"][0]["describedObject"]["kind"] == "Namespace"

    code, external = _raw(plane, f"{EXTERNAL}/v1beta1")
    assert code == 0, external
    assert external["kind"] == "APIResourceList" and external["resources"], external
    adapter["nim"].waiting = 7

    def queue() -> dict | None:
        code, body = _raw(plane, f"{EXTERNAL}/v1beta1/namespaces/{NS}/inference_queue_depth")
        return body if code == 0 and body.get("items") and body["items"][0]["value"] != "0" else None

    # The NIM server's queue, scraped from the pod's own IP, summed over the namespace's pods.
    items = _until(queue, timeout=30, what="inference_queue_depth through external.metrics")["items"]
    pods = len(plane.rest().get(f"/api/v1/namespaces/{NS}/pods", labelSelector="app=llm").body["items"])
    assert items[0]["metricName"] == "inference_queue_depth" and items[0]["value"] == str(7 * pods), items
    code, listing = _raw(plane, f"{CUSTOM}/v1beta2")
    assert code == 0 and any(r["name"] == "pods/gpu_utilization" for r in listing["resources"]), listing


def test_an_unknown_metric_is_a_404_status_through_the_aggregator(adapter):
    code, err = _raw(adapter["plane"], f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/no_such_metric")
    assert (code != 0 and "NotFound" in err) or "not found" in err.lower(), err


def test_a_user_without_rbac_gets_403_from_the_real_authorizer(adapter):
    plane = adapter["plane"]
    nobody = plane.kubeconfig_for("nobody")
    code, err = _raw(plane, f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_utilization", kubeconfig=nobody)
    assert code != 0 and "Forbidden" in err and "custom.metrics.k8s.io" in err, err


def test_the_hpa_controller_is_allowed_by_deploys_rbac_and_served(adapter):
    plane = adapter["plane"]
    hpa = plane.service_account_kubeconfig("kube-system", "horizontal-pod-autoscaler")

    def served() -> dict | None:
        code, body = _raw(
            plane, f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_utilization?labelSelector=app%3Dllm", hpa
        )
        return body if code == 0 else None

    assert _until(served, timeout=20, what="the HPA's ServiceAccount reading custom metrics")["items"]


def test_the_adapters_own_rights_are_what_deploy_grants_and_no_more(adapter):
    plane = adapter["plane"]
    sa = plane.service_account_kubeconfig("gpuscale", "gpuscale-adapter")
    allowed = {
        ("list", "pods"), ("watch", "pods"), ("list", "nodes"), ("list", "deployments.apps"),
        ("create", "tokenreviews.authentication.k8s.io"), ("create", "subjectaccessreviews.authorization.k8s.io"),
    }  # fmt: skip
    denied = {("create", "pods"), ("patch", "nodes"), ("list", "secrets"), ("delete", "deployments.apps")}
    for verb, resource in allowed | denied:
        done = plane.kubectl("auth", "can-i", verb, resource, "-A", kubeconfig=sa)
        assert (done.stdout.strip() == "yes") == ((verb, resource) in allowed), (
            verb,
            resource,
            done.stdout,
            done.stderr,
        )


def test_the_real_hpa_controller_scales_up_and_back_down_on_gpu_metrics(adapter):
    """SM activity drives the Deployment: up one pod per period (behavior policy), down once it falls."""
    plane, exporter = adapter["plane"], adapter["exporter"]
    rest = plane.rest()
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "gpu_sm_active"},
                        "target": {"type": "AverageValue", "averageValue": "40"},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 4}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 2,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}],
                },
            },
        },
    }
    rest.post(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers", hpa).expect(201)
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/llm/scale"
    exporter.sm_active = 0.9  # 90 % against a 40 % target: wants 3 replicas (the max)
    seen: list[tuple[float, int]] = []

    def replicas() -> int:
        value = rest.get(scale).body["spec"]["replicas"]
        if not seen or seen[-1][1] != value:
            seen.append((time.monotonic(), value))
        return value

    _until(lambda: replicas() == 3, timeout=40, what="scale up to 3", interval=0.1)
    # The Pods policy (1 pod per 4 s) is honoured: one pod at a time, and no two within one period (seen[0] is
    # the state before the load rose, not a scaling).
    assert [b - a for (_, a), (_, b) in itertools.pairwise(seen)] == [1, 1], seen
    assert seen[2][0] - seen[1][0] >= 3.5, seen
    status = rest.get(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/llm").body["status"]
    current = status["currentMetrics"][0]["pods"]
    assert current["metric"]["name"] == "gpu_sm_active" and current["current"]["averageValue"] == "90"

    exporter.sm_active = 0.05  # 5 %: one replica is enough
    _until(lambda: replicas() == 1, timeout=40, what="scale back down to 1", interval=0.1)
    events = rest.get(f"/api/v1/namespaces/{NS}/events", fieldSelector="involvedObject.name=llm").body["items"]
    reasons = [e["message"] for e in events if e["reason"] == "SuccessfulRescale"]
    assert any("above target" in m for m in reasons) and any("below target" in m for m in reasons), reasons


def test_the_real_hpa_controller_scales_on_the_inference_servers_queue(adapter):
    """The same HPA switched to an inference metric: NIM's waiting requests per pod, scraped at each pod's IP."""
    plane, nim = adapter["plane"], adapter["nim"]
    rest = plane.rest()
    path = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/llm"
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/llm/scale"
    _until(lambda: rest.get(scale).body["spec"]["replicas"] == 1, timeout=30, what="the previous test's scale-down")
    metric = {
        "type": "Pods",
        "pods": {"metric": {"name": "inference_queue_depth"}, "target": {"type": "AverageValue", "averageValue": "4"}},
    }
    rest.patch(path, {"spec": {"metrics": [metric]}}).expect(200)
    nim.waiting = 12  # 12 waiting per pod against 4: three replicas wanted, capped at maxReplicas 3
    _until(lambda: rest.get(scale).body["spec"]["replicas"] == 3, timeout=40, what="scale up on the queue")
    current = rest.get(path).body["status"]["currentMetrics"][0]["pods"]
    assert current["metric"]["name"] == "inference_queue_depth", current
    nim.waiting = 0
    _until(lambda: rest.get(scale).body["spec"]["replicas"] == 1, timeout=40, what="scale down once the queue drained")
