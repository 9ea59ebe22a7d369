"""Which exporter endpoints the embedded scrape source reads, found through the Kubernetes API.

Two kinds of pods are scraped (both must be Running and have a pod IP):

* dcgm-exporter pods, selected by label (``--dcgm-exporter-selector``, default
  ``app=nvidia-dcgm-exporter`` as the GPU Operator labels them), on the port named ``metrics``
  (else 9400);
* inference pods (Triton) selected by label (``--triton-selector``, default ``gpuscale.io/scrape=triton``)
  or annotated ``gpuscale.io/scrape: "true"``, on ``gpuscale.io/port`` (else the port named
  ``metrics``, else 8002) and ``gpuscale.io/path`` (else ``/metrics``).

Pure: computed from the watch cache on every refresh, so pods that come and go (an HPA scaling a
Triton Deployment) are picked up within one refresh interval, with no extra API calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from gpuscale.model import ObjectRef, pod
from gpuscale.selectors import LabelSelector
from gpuscale.sources.cluster_index import ClusterObjects, PodInfo

SCRAPE_ANNOTATION = "gpuscale.io/scrape"
PORT_ANNOTATION = "gpuscale.io/port"
PATH_ANNOTATION = "gpuscale.io/path"


@dataclass(frozen=True, slots=True)
class DiscoveryRules:
    dcgm_selector: LabelSelector
    triton_selector: LabelSelector
    dcgm_default_port: int = 9400
    triton_default_port: int = 8002


def _port(info: PodInfo, default: int) -> int:
    annotated = info.annotations.get(PORT_ANNOTATION, "")
    if annotated.isdigit():
        return int(annotated)
    return info.named_ports.get("metrics", default)


def _url(info: PodInfo, port: int, path: str) -> str:
    host = f"[{info.pod_ip}]" if info.pod_ip and ":" in info.pod_ip else info.pod_ip
    return f"http://{host}:{port}{path if path.startswith('/') else '/' + path}"


def discover(cluster: ClusterObjects, rules: DiscoveryRules) -> dict[str, ObjectRef]:
    """URL → the pod that serves it, for every pod the rules select."""
    out: dict[str, ObjectRef] = {}
    for info in cluster.pods():
        if info.phase != "Running" or not info.pod_ip:
            continue
        annotated = info.annotations.get(SCRAPE_ANNOTATION, "").lower() == "true"
        if rules.dcgm_selector.matches(info.labels):
            url = _url(info, _port(info, rules.dcgm_default_port), info.annotations.get(PATH_ANNOTATION, "/metrics"))
        elif annotated or rules.triton_selector.matches(info.labels):
            url = _url(info, _port(info, rules.triton_default_port), info.annotations.get(PATH_ANNOTATION, "/metrics"))
        else:
            continue
        out[url] = pod(info.namespace, info.name)
    return out


def through_pod_proxy(found: dict[str, ObjectRef], api_host: str) -> dict[str, ObjectRef]:
    """The same targets reached through the API server's pod proxy
    (``/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy{path}``): from outside the cluster, where pod IPs do
    not route, the API server can still reach every pod. URL → the pod, as ``discover`` gives it."""
    out: dict[str, ObjectRef] = {}
    for url, owner in found.items():
        parts = urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        name = f"{quote(owner.name)}:{parts.port}" if parts.port else quote(owner.name)
        out[f"{api_host.rstrip('/')}/api/v1/namespaces/{quote(owner.namespace or '')}/pods/{name}/proxy{path}"] = owner
    return out
