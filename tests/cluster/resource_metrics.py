"""The resource metrics API (metrics.k8s.io) on the real control plane, with the pods' cpu set by the test.

What metrics-server does in a cluster, minus the kubelets it would read: an HTTPS server on a Service's
(loopback) ClusterIP registered as the APIService ``v1beta1.metrics.k8s.io`` behind the real kube-aggregator,
answering ``PodMetrics`` lists by namespace and label selector, so kube-controller-manager's HPA reads a
Resource metric exactly as it would from metrics-server. Each pod's usage is one container's cpu, stamped with
the time of the request (or a time the test fixes) over a ``window_s`` window (metrics-server's shape).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.server
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import trustme

from tests.cluster.controlplane import ControlPlane, free_port
from tests.cluster.metrics_stack import until

GROUP_VERSION = "metrics.k8s.io/v1beta1"
SERVICE = ("kube-system", "metrics-server-test")


@dataclass
class PodUsage:
    labels: dict[str, str]
    cpu_milli: int
    timestamp: float | None = None  # when the sample was taken (seconds since the epoch); None: when read


@dataclass
class ResourceMetrics:
    """The usage the API serves: namespace → pod → usage (the test sets it)."""

    window_s: int = 30
    pods: dict[str, dict[str, PodUsage]] = field(default_factory=dict)

    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict]:
        parts = path.strip("/").split("/")
        if parts == ["apis", "metrics.k8s.io", "v1beta1"]:
            return 200, {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": GROUP_VERSION,
                "resources": [
                    {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics", "verbs": ["get", "list"]}
                ],
            }  # fmt: skip
        if len(parts) == 6 and parts[:4] == ["apis", "metrics.k8s.io", "v1beta1", "namespaces"] and parts[5] == "pods":
            wanted = dict(
                pair.split("=", 1) for pair in (query.get("labelSelector") or [""])[0].split(",") if "=" in pair
            )
            now = time.time()
            items = [
                {
                    "metadata": {"name": name, "namespace": parts[4], "labels": usage.labels},
                    "timestamp": dt.datetime.fromtimestamp(usage.timestamp or now, dt.UTC).strftime(
                        "%Y-%m-%dT%H:%M:%SZ"
                    ),
                    "window": f"{self.window_s}s",
                    "containers": [{"name": "server", "usage": {"cpu": f"{usage.cpu_milli}m", "memory": "1Gi"}}],
                }
                for name, usage in sorted(self.pods.get(parts[4], {}).items())
                if all(usage.labels.get(k) == v for k, v in wanted.items())
            ]
            return 200, {"kind": "PodMetricsList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}


@contextmanager
def resource_metrics_api(plane: ControlPlane) -> Iterator[ResourceMetrics]:
    """Serve ``ResourceMetrics`` as metrics.k8s.io until the block ends; waits for the APIService to be Available."""
    rest = plane.rest()
    namespace, name = SERVICE
    port = free_port()
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
    }
    cluster_ip = rest.post(f"/api/v1/namespaces/{namespace}/services", service).expect(201)["spec"]["clusterIP"]
    # NB: the aggregator's availability check wants a ready endpoint; requests go to the ClusterIP (aggregator
    # routing is off), so the address (TEST-NET-1) is never dialled — as for the adapter (metrics_stack.py).
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.11"], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    rest.post(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", slice_).expect(201)
    ca = trustme.CA()
    serving = ca.issue_cert(f"{name}.{namespace}.svc", cluster_ip)
    metrics = ResourceMetrics()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            status, body = metrics.answer(url.path, urllib.parse.parse_qs(url.query))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # NB: the client gave up
                self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((cluster_ip, port), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    serving.configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="metrics.k8s.io", daemon=True).start()
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io"},
        "spec": {
            "group": "metrics.k8s.io",
            "version": "v1beta1",
            "service": {"namespace": namespace, "name": name, "port": port},
            "caBundle": base64.b64encode(ca.cert_pem.bytes()).decode(),
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    rest.post("/apis/apiregistration.k8s.io/v1/apiservices", api_service).expect(201)
    try:

        def available() -> bool:
            item = rest.get("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io").body
            return any(
                c["type"] == "Available" and c["status"] == "True" for c in item.get("status", {}).get("conditions", [])
            )

        until(available, timeout=60, what="APIService v1beta1.metrics.k8s.io Available")
        yield metrics
    finally:
        rest.delete("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io")
        rest.delete(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices/{name}")
        rest.delete(f"/api/v1/namespaces/{namespace}/services/{name}")
        server.shutdown()
        server.server_close()
