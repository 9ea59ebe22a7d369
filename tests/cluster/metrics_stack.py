"""gpuscale's adapter on the real control plane, with GPU and inference telemetry the tests move.

``metrics_stack`` (a session fixture in tests/cluster/conftest.py): deploy/base applied with
``kubectl apply --server-side``, ``gpuscale adapter`` running as its ServiceAccount (a TokenRequest token) on the
Service's loopback ClusterIP behind the real kube-aggregator, a Deployment ``llm`` whose pods the test kubelet
runs on two GPU nodes, a dcgm-exporter for them and each pod's NIM container on the pod's own IP.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import trustme

from tests.cluster.controlplane import ControlPlane, free_port
from tests.cluster.kubelet import FakeKubelet, make_node

REPO = Path(__file__).resolve().parents[2]
NS = "gpu-apps"
NODES = ("gpu-node-1", "gpu-node-2")
CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io"


def serve_text(
    address: str, render: Callable[[str], str], *, port: int | None = None
) -> http.server.ThreadingHTTPServer:
    """An exporter's /metrics on ``address`` (``port``, else a free one), answering every GET with
    ``render(address)``, in a thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render(address).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # NB: a scraper that timed out has closed the connection and counts that failure itself; the
            # exporter need not print a BrokenPipeError traceback into a green run
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, port or free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class DcgmExporter:
    """dcgm-exporter's /metrics for every pod of ``app=llm`` in NS: one GPU each, GPU_UTIL and SM_ACTIVE set by
    the test (``util`` percent, ``sm_active`` ratio), labelled as dcgm-exporter labels a pod's GPU."""

    def __init__(self, plane: ControlPlane) -> None:
        self.rest = plane.rest()
        self.util = 30.0
        self.sm_active = 0.2
        self.sm_active_of: dict[str, float] = {}
        """SM activity of the pods of other apps (label ``app``) in NS, e.g. the HPA parity cases' Deployments."""
        self.waiting = 0.0
        self.server = serve_text("127.0.0.1", lambda _: self.render())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def render(self) -> str:
        apps = ",".join(["llm", *self.sm_active_of])
        pods = self.rest.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"app in ({apps})").body.get("items", [])
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
            app = pod["metadata"]["labels"].get("app", "")
            active = self.sm_active_of.get(app, self.sm_active)
            # NB: the parity cases' series carry their pod's app label, so an External metric can select one app
            own = f',app="{app}"' if app in self.sm_active_of else ""
            sm.append(f"DCGM_FI_PROF_SM_ACTIVE{{{labels}{own}}} {active:g}")
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
        self.waiting_of: dict[str, float] = {}
        """The queue of the pods of other apps (label ``app``; their series carry it, for External selectors)."""
        self._app_of: dict[str, str] = {}  # pod IP → app
        self._servers: dict[str, http.server.ThreadingHTTPServer] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _body(self, ip: str) -> str:
        app = self._app_of.get(ip, "llm")
        waiting, own = self.waiting, ""
        if app in self.waiting_of:
            waiting, own = self.waiting_of[app], f',app="{app}"'
        return (
            "# HELP num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE num_requests_waiting gauge\n"
            f'num_requests_waiting{{model_name="meta/llama-3.1-8b-instruct"{own}}} {waiting:g}\n'
        )

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            apps = ",".join(["llm", *self.waiting_of])
            pods = self.rest.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"app in ({apps})").body
            for pod in pods.get("items", []):
                ip = (pod.get("status") or {}).get("podIP")
                if ip:
                    self._app_of[ip] = pod["metadata"]["labels"].get("app", "")
                if ip and ip not in self._servers:
                    self._servers[ip] = serve_text(ip, self._body, port=8000)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for server in self._servers.values():
            server.shutdown()
            server.server_close()


@contextlib.contextmanager
def adapter_process(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    """`gpuscale adapter ARGS` as a child process (output in ``log``, run from its directory), stopped at exit:
    SIGTERM, then SIGKILL after 10 s."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuscale.cli.main", "adapter", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
        )
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def until(check: Callable[[], object], *, timeout: float, what: str, interval: float = 0.25) -> object:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def llm_deployment() -> dict:
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


@dataclass
class MetricsStack:
    plane: ControlPlane
    exporter: DcgmExporter
    nim: NimContainers
    proc: subprocess.Popen
    log: Path

    def __getitem__(self, name: str):  # the tests read it like the dict it was
        return getattr(self, name)


APISERVICES = ("v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io", "v1beta1.external.metrics.k8s.io")


def start_metrics_stack(plane: ControlPlane, work: Path) -> Iterator[MetricsStack]:
    """deploy/base applied server-side, the adapter running as its ServiceAccount on the Service's ClusterIP."""
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
        for name in APISERVICES:
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
    for name in APISERVICES:
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
    rest.post(f"/apis/apps/v1/namespaces/{NS}/deployments", llm_deployment()).expect(201)
    exporter = DcgmExporter(plane)
    nim = NimContainers(plane)
    kubeconfig = plane.service_account_kubeconfig("gpuscale", "gpuscale-adapter")
    args = [
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
    adapter = adapter_process(args, work / "adapter.log")
    proc = adapter.__enter__()
    kubelet = FakeKubelet(rest, namespaces=[NS], nodes=NODES).__enter__()
    try:

        def available() -> bool | str:  # True, or why not (truthy; the loop below reads it)
            # NB: every APIService, each checked by the aggregator on its own: a test read v1beta1 right after a
            # v1beta2 answer and got 503 ServiceUnavailable while only v1beta2 was known to be Available.
            assert proc.poll() is None, (work / "adapter.log").read_text()
            for name in APISERVICES:
                item = rest.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}").body
                conditions = {c["type"]: c for c in item["status"].get("conditions", [])}
                ready = conditions.get("Available", {})
                if ready.get("status") != "True":
                    return f"{name} not available: {ready.get('reason')}: {ready.get('message')}"
            return True

        try:
            until(lambda: available() is True, timeout=60, what="every APIService of the adapter Available")
        except AssertionError as e:
            raise AssertionError(
                f"{e}\n{available() or ''}\nadapter log: {(work / 'adapter.log').read_text()[-1500:]}"
            ) from None
        yield MetricsStack(plane, exporter, nim, proc, work / "adapter.log")
    finally:
        kubelet.__exit__(None, None, None)
        adapter.__exit__(None, None, None)
        exporter.stop()
        nim.stop()
