"""gpuscale's monitoring objects through the real prometheus-operator, scraped by the Prometheus 3 it configures.

What runs (one instance per test session, fixture ``operator_stack`` in tests/cluster/conftest.py):

- the real control plane (tests/cluster/controlplane.py) with prometheus-operator's own CRDs of the release built
  (tests/cluster/build-part prometheus-operator copies them beside the binary);
- deploy/monitoring applied as kustomize renders it (namespace gpuscale), and the chart's monitoring objects as helm
  renders them with monitoring enabled (namespace gpuscale-chart, short intervals);
- prometheus-operator outside a pod, and a Prometheus CR selecting every ServiceMonitor, PodMonitor and
  PrometheusRule; the configuration the operator generates (Secret prometheus-k8s), its TLS assets and rule files
  are read back and Prometheus 3 (tests/cluster/build-part prometheus) runs on them, changed only where a pod would
  differ from a process: ``$(SHARD)``/``$(POD_NAME)`` (the config-reloader substitutes them), the pod-mounted paths
  (TLS assets, rule files, the ServiceAccount token) and a kubeconfig for each Kubernetes discovery block; the rule
  groups' own intervals (1m) are cut to the 1 s evaluation interval, so each rule is evaluated many times in seconds;
- a real ``gpuscale adapter`` and ``gpuscale controller`` and a dcgm-exporter serving every field
  deploy/dcgm-exporter enables (tests/operating/enabled_counters.py), each with the pods (and, for the adapter, the
  Service, EndpointSlice and Endpoints) a cluster would hold for it.

Addresses: pods may have loopback IPs, so the controller and the exporter listen on 127.3.0.x and their pods say
so. An EndpointSlice may not hold a loopback address, so the adapter listens on this machine's own non-loopback
address and its EndpointSlices and Endpoints name that.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import shutil
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trustme
import yaml

from tests.cluster.controlplane import ControlPlane, _Process, _spawn
from tests.cluster.kubelet import now_rfc3339
from tests.cluster.metrics_stack import serve_text, until
from tests.cluster.rest import Rest
from tests.helm import run_helm
from tests.operating.enabled_counters import exposition
from tests.ports import free_port

__all__ = ["OperatorStack", "start_operator_stack"]

REPO = Path(__file__).resolve().parents[2]
MONITORING_NS = "monitoring"
CHART_NS = "gpuscale-chart"
EXPORTER_NS = "gpu-operator"
PROMETHEUS = "k8s"  # the Prometheus CR; the operator names what it writes prometheus-k8s…
POD_NAME = f"prometheus-{PROMETHEUS}-0"
CRDS = ("prometheuses", "servicemonitors", "podmonitors", "prometheusrules", "probes")
CONTROLLER_IP, EXPORTER_IP = "127.3.0.2", "127.3.0.3"
EVALUATION_INTERVAL = "1s"
# The chart's monitoring with short intervals, so its targets are scraped within seconds (deploy/monitoring keeps
# its own 30 s / 15 s).
CHART_VALUES = {
    "monitoring": {
        "serviceMonitor": {"enabled": True, "interval": "2s"},
        "podMonitor": {"enabled": True, "interval": "2s"},
        "dcgmExporter": {"enabled": True, "interval": "1s"},
        "prometheusRules": {"enabled": True},
    }
}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# Two GPUs of one node, each held by a pod: what the dcgm-exporter test pod serves.
GPUS = {
    "GPU-4d1c-0000": {"gpu": "0", "Hostname": "gpu-mon-1", "modelName": "NVIDIA H100 80GB HBM3", "namespace": "ml",
                      "pod": "train-0", "container": "main"},
    "GPU-4d1c-0001": {"gpu": "1", "Hostname": "gpu-mon-1", "modelName": "NVIDIA H100 80GB HBM3", "namespace": "ml",
                      "pod": "train-1", "container": "main"},
}  # fmt: skip


def host_address() -> str:
    """This machine's own non-loopback IPv4 address (the source of its default route), for the adapter's
    EndpointSlices; a clear error when there is none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("198.51.100.1", 9))  # NB: UDP connect sends nothing; it only picks the route's source
            address = s.getsockname()[0]
        except OSError as e:
            raise RuntimeError(f"no non-loopback IPv4 address for the adapter's EndpointSlice: {e}") from e
    if address.startswith("127.") or address == "0.0.0.0":
        raise RuntimeError(f"no non-loopback IPv4 address for the adapter's EndpointSlice (got {address})")
    return address


class FullExporter:
    """dcgm-exporter's /metrics for GPUS on EXPORTER_IP: every enabled field, healthy unless ``values`` says."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], float] = {}
        self.server = serve_text(EXPORTER_IP, lambda _: exposition(GPUS, values=dict(self.values)))
        self.port = self.server.server_address[1]
        self.url = f"http://{EXPORTER_IP}:{self.port}/metrics"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class OperatorStack:
    plane: ControlPlane
    prometheus_url: str
    exporter: FullExporter
    adapter: str  # host:port the adapter's EndpointSlices name
    controller: str  # host:port of the controller's pods
    config: dict  # the Prometheus configuration as the operator generated it
    rule_files: list[Path]
    processes: dict[str, _Process] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def api(self, path: str, **params: str) -> object:
        query = "&".join(f"{k}={urllib.request.quote(v)}" for k, v in params.items())
        with urllib.request.urlopen(f"{self.prometheus_url}{path}{'?' + query if query else ''}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def self_metrics(self) -> str:
        with urllib.request.urlopen(f"{self.prometheus_url}/metrics", timeout=10) as r:
            return r.read().decode()

    def tail(self, name: str, lines: int = 30) -> str:
        return self.processes[name].tail(lines)


def _apply(plane: ControlPlane, docs: list[dict] | Path, *, what: str) -> None:
    if isinstance(docs, Path):
        done = plane.kubectl("apply", "--server-side", "--field-manager=gpuscale-test", "-f", str(docs), timeout=120)
    else:
        text = yaml.safe_dump_all(docs)
        done = plane.kubectl("apply", "--server-side", "--field-manager=gpuscale-test", "-f", "-", input=text)
    assert done.returncode == 0, f"{what}: {done.stderr}"


def _namespace(rest: Rest, name: str) -> None:
    rest.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}).expect(
        201, 409
    )


def _running_pod(rest: Rest, namespace: str, name: str, labels: dict, ports: list[dict], ip: str) -> None:
    """A pod as a kubelet would report it: bound, Running and Ready with ``ip`` (no kubelet runs here)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": "gpu-mon-1",
            # NB: deploy/base's Namespace enforces the restricted Pod Security Standard
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "main",
                    "image": "localhost/gpuscale:test",
                    "ports": ports,
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    rest.post(f"/api/v1/namespaces/{namespace}/pods", pod).expect(201, 409)
    status = {
        "status": {
            "phase": "Running",
            "hostIP": ip,
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now_rfc3339()}],
        }
    }
    rest.patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status", status, "strategic").expect(200)


def _adapter_service(rest: Rest, namespace: str, host: str, port: int) -> None:
    """A Service the adapter's ServiceMonitor selects, its pod, and the EndpointSlice and Endpoints the
    endpointslice and endpoints controllers (not run here) would write, naming the pod and the adapter's address."""
    labels = {"app.kubernetes.io/name": "gpuscale", "app.kubernetes.io/component": "adapter"}
    _running_pod(rest, namespace, "gpuscale-adapter-0", labels, [{"name": "https", "containerPort": port}], host)
    # NB: its own name: deploy/base's Service gpuscale-adapter belongs to other tests' server-side applies.
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "gpuscale-adapter-scraped", "namespace": namespace, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "https", "port": 443, "targetPort": "https"}]},
    }
    rest.post(f"/api/v1/namespaces/{namespace}/services", service).expect(201, 409)
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "gpuscale-adapter-scraped-1", "namespace": namespace,
                     "labels": {"kubernetes.io/service-name": "gpuscale-adapter-scraped", **labels}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host], "conditions": {"ready": True},
                       "targetRef": {"kind": "Pod", "namespace": namespace, "name": "gpuscale-adapter-0"}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }  # fmt: skip
    rest.post(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices", slice_).expect(201, 409)
    # NB: and the Endpoints the endpoints controller would write: the operator generates role: endpoints when the
    # API server's version is below 1.21, which an unstamped build (v0.0.0-master, as here) reports.
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "gpuscale-adapter-scraped", "namespace": namespace, "labels": labels},
        "subsets": [{"addresses": [{"ip": host, "targetRef": {"kind": "Pod", "namespace": namespace,
                                                               "name": "gpuscale-adapter-0"}}],
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    }  # fmt: skip
    rest.post(f"/api/v1/namespaces/{namespace}/endpoints", endpoints).expect(201, 409)


def _prometheus_rbac(rest: Rest) -> None:
    """Prometheus' ServiceAccount with what kube-prometheus' prometheus-k8s role grants: discovery reads and
    ``get /metrics`` (the adapter authorizes every scrape)."""
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus", "namespace": MONITORING_NS}}
    rest.post(f"/api/v1/namespaces/{MONITORING_NS}/serviceaccounts", sa).expect(201, 409)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "gpuscale-test-prometheus"},
        "rules": [
            {"apiGroups": [""], "resources": ["services", "endpoints", "pods", "nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
        ],
    }  # fmt: skip
    rest.post("/apis/rbac.authorization.k8s.io/v1/clusterroles", role).expect(201, 409)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpuscale-test-prometheus"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpuscale-test-prometheus"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": MONITORING_NS}],
    }
    rest.post("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding).expect(201, 409)


def prometheus_cr() -> dict:
    everything: dict = {}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "Prometheus",
        "metadata": {"name": PROMETHEUS, "namespace": MONITORING_NS},
        "spec": {
            "version": "v3.5.0",
            "replicas": 1,
            "serviceAccountName": "prometheus",
            "serviceDiscoveryRole": "EndpointSlice",
            "evaluationInterval": EVALUATION_INTERVAL,
            "serviceMonitorSelector": everything,
            "serviceMonitorNamespaceSelector": everything,
            "podMonitorSelector": everything,
            "podMonitorNamespaceSelector": everything,
            "ruleSelector": everything,
            "ruleNamespaceSelector": everything,
        },
    }


def chart_monitoring(helm: str, work: Path) -> list[dict]:
    """The chart's ServiceMonitor, PodMonitors and PrometheusRules as `helm template` renders them."""
    values = work / "values.json"
    values.write_text(json.dumps(CHART_VALUES))
    done = run_helm(
        helm, "template", "gpuscale", str(REPO / "deploy/charts/gpuscale"), "--namespace", CHART_NS,
        "--kube-version", "1.30.0", "--values", str(values),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] in MONITORING_KINDS]


def _secret_data(rest: Rest, namespace: str, name: str) -> dict[str, bytes]:
    answer = rest.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    if not answer.ok:
        return {}
    return {k: base64.b64decode(v) for k, v in (answer.body.get("data") or {}).items()}


def _generated(rest: Rest, jobs: int) -> dict | None:
    """The operator's configuration once it holds ``jobs`` scrape jobs, else None."""
    data = _secret_data(rest, MONITORING_NS, f"prometheus-{PROMETHEUS}")
    if "prometheus.yaml.gz" not in data:
        return None
    config = yaml.safe_load(gzip.decompress(data["prometheus.yaml.gz"]))
    return config if len(config.get("scrape_configs") or []) >= jobs else None


def _for_a_process(config: dict, *, certs: Path, rules: Path, token: Path, kubeconfig: Path) -> str:
    """The generated configuration as this process (not the pod) must read it."""
    text = yaml.safe_dump(config)
    for pod_path, here in (
        ("/etc/prometheus/certs/", f"{certs}/"),
        ("/etc/prometheus/rules/", f"{rules}/"),
        ("/var/run/secrets/kubernetes.io/serviceaccount/token", str(token)),
        ("$(SHARD)", "0"),
        ("$(POD_NAME)", POD_NAME),
    ):
        text = text.replace(pod_path, here)
    local = yaml.safe_load(text)
    for job in local["scrape_configs"]:
        for sd in job.get("kubernetes_sd_configs", []):
            sd["kubeconfig_file"] = str(kubeconfig)  # NB: in a pod, client-go's in-cluster config
    return yaml.safe_dump(local)


def _time_compressed(rule_file: str) -> str:
    """The rule file with every group evaluated each EVALUATION_INTERVAL: the recording groups ask for 1m, and two
    rounds of each would cost the suite minutes. Nothing else changes, so every expression is evaluated as shipped."""
    doc = yaml.safe_load(rule_file)
    for group in doc["groups"]:
        if "interval" in group:
            group["interval"] = EVALUATION_INTERVAL
    return yaml.safe_dump(doc)


def _ready(url: str, context: object = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as r:  # type: ignore[arg-type]
            return r.status == 200
    except OSError:
        return False


def start_operator_stack(
    plane: ControlPlane, helm: str, operator_dir: Path, prometheus_dir: Path, work: Path
) -> Iterator[OperatorStack]:
    started = time.monotonic()
    timings: dict[str, float] = {}
    rest = plane.rest()
    host = host_address()
    for ns in (MONITORING_NS, CHART_NS, EXPORTER_NS, "gpuscale"):
        _namespace(rest, ns)
    for crd in CRDS:
        _apply(plane, operator_dir / "crds" / f"monitoring.coreos.com_{crd}.yaml", what=crd)
    done = plane.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                         *[f"crd/{c}.monitoring.coreos.com" for c in CRDS])  # fmt: skip
    assert done.returncode == 0, done.stderr
    timings["CRDs"] = time.monotonic() - started

    # The objects under test, validated by the API server against the operator's schemas as they are applied.
    kustomized = plane.kubectl("kustomize", str(REPO / "deploy/monitoring"))
    assert kustomized.returncode == 0, kustomized.stderr
    _apply(plane, [d for d in yaml.safe_load_all(kustomized.stdout) if d], what="deploy/monitoring")
    chart = chart_monitoring(helm, work)
    _apply(plane, chart, what="the chart's monitoring objects")
    _prometheus_rbac(rest)

    # TLS as the ServiceMonitors expect it: a CA in Secret gpuscale-ca of each namespace, a serving certificate for
    # both Services' names.
    ca = trustme.CA()
    serving = ca.issue_cert("gpuscale-adapter.gpuscale.svc", f"gpuscale-adapter.{CHART_NS}.svc", host)
    cert, key = work / "tls.crt", work / "tls.key"
    serving.cert_chain_pems[0].write_to_path(str(cert))
    serving.private_key_pem.write_to_path(str(key))
    for ns in ("gpuscale", CHART_NS):
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gpuscale-ca", "namespace": ns},
                  "data": {"ca.crt": base64.b64encode(ca.cert_pem.bytes()).decode()}}  # fmt: skip
        rest.post(f"/api/v1/namespaces/{ns}/secrets", secret).expect(201, 409)

    exporter = FullExporter()
    adapter_port, controller_port = free_port(), free_port()
    procs: dict[str, _Process] = {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        procs["adapter"] = _spawn("adapter", [
            sys.executable, "-m", "gpuscale.cli.main", "adapter", "--kubeconfig", str(plane.admin),
            "--scrape-url", f"{EXPORTER_NS}/nvidia-dcgm-exporter-0={exporter.url}",
            "--bind-address", host, "--secure-port", str(adapter_port),
            "--tls-cert-file", str(cert), "--tls-private-key-file", str(key),
            "--refresh-interval", "1s", "--log-level", "warning",
        ], work, env=env)  # fmt: skip
        procs["controller"] = _spawn("controller", [
            sys.executable, "-m", "gpuscale.cli.main", "controller", "--kubeconfig", str(plane.admin),
            "--scrape-url", exporter.url, "--port", str(controller_port), "--bind-address", CONTROLLER_IP,
            "--interval", "1s", "--dry-run", "--no-leader-elect",
        ], work, env=env)  # fmt: skip
        procs["operator"] = _spawn("operator", [
            str(operator_dir / "operator"),
            f"--web.listen-address=127.0.0.1:{free_port()}", f"--prometheus-instance-namespaces={MONITORING_NS}",
            "--log-level=info",
        ], work, env={**os.environ, "KUBECONFIG": str(plane.admin)})  # fmt: skip

        for ns in ("gpuscale", CHART_NS):
            _adapter_service(rest, ns, host, adapter_port)
            labels = {"app.kubernetes.io/name": "gpuscale", "app.kubernetes.io/component": "controller"}
            port = [{"name": "http", "containerPort": controller_port}]
            _running_pod(rest, ns, "gpuscale-controller-0", labels, port, CONTROLLER_IP)
        _running_pod(rest, EXPORTER_NS, "nvidia-dcgm-exporter-0", {"app": "nvidia-dcgm-exporter"},
                     [{"name": "metrics", "containerPort": exporter.port}], EXPORTER_IP)  # fmt: skip
        _apply(plane, [prometheus_cr()], what="the Prometheus")

        # Every monitor of both sets as a job (1 ServiceMonitor endpoint + 2 PodMonitors each), both
        # PrometheusRules of each set as a rule file.
        jobs, rule_objects = 6, 4

        def rule_maps() -> list[dict]:
            path = f"/api/v1/namespaces/{MONITORING_NS}/configmaps"
            return rest.get(path, labelSelector=f"prometheus-name={PROMETHEUS}").expect(200)["items"]

        def generated() -> dict | None:
            assert procs["operator"].popen.poll() is None, procs["operator"].tail(40)
            if sum(len(cm.get("data") or {}) for cm in rule_maps()) < rule_objects:
                return None
            return _generated(rest, jobs)

        config = until(
            generated, timeout=60, what=f"the operator's configuration: {jobs} jobs, {rule_objects} rule files"
        )
        timings["operator config"] = time.monotonic() - started
        assert isinstance(config, dict)

        certs, rules = work / "certs", work / "rules"
        certs.mkdir()
        for name, blob in _secret_data(rest, MONITORING_NS, f"prometheus-{PROMETHEUS}-tls-assets-0").items():
            (certs / name).write_bytes(blob)
        rule_files = []
        for cm in rule_maps():
            (rules / cm["metadata"]["name"]).mkdir(parents=True)
            for name, text in (cm.get("data") or {}).items():
                (rules / cm["metadata"]["name"] / name).write_text(_time_compressed(text))
                rule_files.append(rules / cm["metadata"]["name"] / name)
        token = work / "token"
        token.write_text(plane.service_account_token(MONITORING_NS, "prometheus"))
        kubeconfig = plane.service_account_kubeconfig(MONITORING_NS, "prometheus")
        local = work / "prometheus.yaml"
        local.write_text(_for_a_process(config, certs=certs, rules=rules, token=token, kubeconfig=kubeconfig))
        prom_port = free_port()
        procs["prometheus"] = _spawn("prometheus", [
            str(prometheus_dir / "prometheus"), f"--config.file={local}", f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=info",
        ], work)  # fmt: skip
        url = f"http://127.0.0.1:{prom_port}"

        def ready() -> bool:
            for name, proc in procs.items():
                assert proc.popen.poll() is None, f"{name} exited:\n{proc.tail(40)}"
            return _ready(f"{url}/-/ready") and _ready(f"http://{CONTROLLER_IP}:{controller_port}/healthz")

        until(ready, timeout=60, what="Prometheus and the controller ready")
        timings["prometheus ready"] = time.monotonic() - started
        yield OperatorStack(
            plane,
            url,
            exporter,
            f"{host}:{adapter_port}",
            f"{CONTROLLER_IP}:{controller_port}",
            config,
            rule_files,
            procs,
            timings,
        )
    finally:
        for proc in reversed(list(procs.values())):
            proc.stop()
        exporter.stop()
        if not os.environ.get("GPUSCALE_KEEP_CLUSTER"):
            shutil.rmtree(work / "tsdb", ignore_errors=True)
