"""`helm install` of deploy/charts/gpuscale into the real control plane, the adapter answering through the
aggregator with what the chart installed, `helm upgrade` keeping the certificate, `helm uninstall` cleaning up.

The release is installed with the chart's defaults except the data source: the embedded scraper (no Prometheus
here) pointed at a test dcgm-exporter through ``adapter.extraArgs``, and a free Service port. No kubelet runs
containers, so the test plays the kubelet for the adapter's pod: it reads the installed Deployment, materialises
the pod's volumes from the installed ConfigMap and Secret (the catalogue, the chart's generated serving
certificate) and starts ``gpuscale adapter`` with the Deployment's own args and the ServiceAccount's token on the
Service's ClusterIP. The aggregator then checks that certificate against the caBundle the chart wrote.

NB: a control plane of its own (about 4 s to start). The shared one carries what other tests apply from deploy/
(the same APIServices, ClusterRoles and PriorityClass), which helm rightly refuses to take over.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.cluster.controlplane import ControlPlane, free_port, start_for_tests
from tests.cluster.kubelet import FakeKubelet, make_node
from tests.cluster.metrics_stack import (
    CUSTOM,
    EXTERNAL,
    NODES,
    NS,
    DcgmExporter,
    adapter_process,
    llm_deployment,
    until,
)
from tests.helm import CHART, NAMESPACE, RELEASE, run_helm

pytestmark = pytest.mark.e2e

APISERVICES = ("v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io", "v1beta1.external.metrics.k8s.io")


@pytest.fixture(scope="module")
def plane():
    plane = start_for_tests()
    yield plane
    plane.stop()
    shutil.rmtree(plane.workdir, ignore_errors=True)


def _helm(helm: str, plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return run_helm(helm, *args, "--kubeconfig", str(plane.admin), "--namespace", NAMESPACE)


@pytest.fixture(scope="module")
def exporter(plane):
    rest = plane.rest()
    rest.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}).expect(201)
    for node in NODES:
        make_node(rest, node, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    rest.post(f"/apis/apps/v1/namespaces/{NS}/deployments", llm_deployment()).expect(201)
    exporter = DcgmExporter(plane)
    exporter.util = 42.0
    with FakeKubelet(rest, namespaces=[NS], nodes=NODES):
        yield exporter
    exporter.stop()


@pytest.fixture(scope="module")
def release(helm, plane, exporter, tmp_path_factory):
    work = tmp_path_factory.mktemp("helm-release")
    values = {
        "metricsSource": {"type": "embedded"},
        "adapter": {
            "service": {"port": free_port()},
            "refreshInterval": "1s",
            "extraArgs": [f"--scrape-url=gpuscale/dcgm-exporter-test={exporter.url}"],
        },
    }
    (work / "values.yaml").write_text(yaml.safe_dump(values))
    done = _helm(
        helm, plane, "install", RELEASE, str(CHART), "--create-namespace", "--values", str(work / "values.yaml")
    )
    assert done.returncode == 0, done.stderr
    assert "kubectl get apiservices | grep metrics" in done.stdout, f"NOTES.txt, what to check next:\n{done.stdout}"
    assert "The controller runs in DRY-RUN" in done.stdout and "--set controller.dryRun=false" in done.stdout, (
        f"NOTES.txt says the controller only looks, and how to let it act:\n{done.stdout}"
    )
    manifest = _helm(helm, plane, "get", "manifest", RELEASE)
    assert manifest.returncode == 0, manifest.stderr
    yield {
        "work": work,
        "values": work / "values.yaml",
        "objects": [d for d in yaml.safe_load_all(manifest.stdout) if d],
    }
    _helm(helm, plane, "uninstall", RELEASE)  # the last test already did; a failed run still cleans up


def _path(obj: dict) -> str:
    """The object's URL path on the API server (the kinds the chart installs)."""
    group, _, version = obj["apiVersion"].rpartition("/")
    kind = obj["kind"].lower()
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + ("es" if kind.endswith("s") else "s")
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    namespace = obj["metadata"].get("namespace")
    return f"{base}/namespaces/{namespace}/{plural}/{obj['metadata']['name']}" if namespace else f"{base}/{plural}/{obj['metadata']['name']}"  # fmt: skip


def test_helm_install_creates_every_object_of_the_chart(plane, release):
    rest = plane.rest()
    kinds = {o["kind"] for o in release["objects"]}
    assert kinds >= {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "RoleBinding",
                     "Role", "PodDisruptionBudget", "PriorityClass", "APIService", "ConfigMap", "Secret",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}  # fmt: skip
    for obj in release["objects"]:
        got = rest.get(_path(obj))
        assert got.status == 200, f"{obj['kind']} {obj['metadata']['name']}: {got.status} {got.body}"
        assert got.body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"

    # The HPA controller may read what the adapter serves (the chart's ClusterRoleBinding), and no more; asked as
    # the adapter asks (a SubjectAccessReview), since discovery of the metrics APIs waits for the adapter.
    def allowed(verb: str, group: str, resource: str) -> bool:
        review = {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
                     "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
                     "resourceAttributes": {"verb": verb, "group": group, "resource": resource, "namespace": NS}},
        }  # fmt: skip
        return rest.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", review).expect(201)["status"]["allowed"]

    assert allowed("get", "custom.metrics.k8s.io", "pods") and allowed("list", "external.metrics.k8s.io", "queue")
    assert not allowed("get", "", "secrets")

    # The real deployment controller makes the adapter's and controller's pods from the chart's templates, and
    # admission resolves the chart's PriorityClass.
    def pods() -> list[dict] | None:
        items = rest.get(f"/api/v1/namespaces/{NAMESPACE}/pods").body["items"]
        return items if len(items) == 4 else None

    # A first install looks before it acts (issue 34): the controller's pods are made with --dry-run.
    controller = rest.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gpuscale-controller").expect(200)
    args = controller["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--dry-run" in args and "--no-dry-run" not in args, args

    created = until(pods, timeout=30, what="2 adapter and 2 controller pods")
    assert sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in created) == [
        "adapter", "adapter", "controller", "controller"
    ]  # fmt: skip
    assert {(p["spec"]["priorityClassName"], p["spec"]["priority"]) for p in created} == {
        ("gpuscale-critical", 1000000)
    }


def _materialise(plane: ControlPlane, deployment: dict, root: Path) -> dict[str, Path]:
    """The kubelet's part: each of the pod's volumes as a local directory (mount path → directory)."""
    rest = plane.rest()
    spec = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {}
    for mount in spec["containers"][0]["volumeMounts"]:
        volume, local = volumes[mount["name"]], root / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            data = rest.get(f"/api/v1/namespaces/{NAMESPACE}/configmaps/{volume['configMap']['name']}").expect(200)
            for key, text in data["data"].items():
                (local / key).write_text(text)
        elif "secret" in volume:
            data = rest.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{volume['secret']['secretName']}").expect(200)
            for key, b64 in data["data"].items():
                (local / key).write_bytes(base64.b64decode(b64))
        mounts[mount["mountPath"]] = local
    return mounts


def _local(arg: str, mounts: dict[str, Path]) -> str:
    """``--flag=/mount/path/file`` with the mount's local directory (the longest mount path that holds it)."""
    flag, eq, value = arg.partition("=")
    holding = [p for p in mounts if value == p or value.startswith(p.rstrip("/") + "/")]
    if not eq or not holding:
        return arg
    path = max(holding, key=len)
    return f"{flag}={mounts[path]}{value[len(path) :]}"


@pytest.fixture(scope="module")
def adapter(plane, release):
    """`gpuscale adapter` as the installed Deployment's pod would run it."""
    rest = plane.rest()
    work = release["work"]
    deployment = rest.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gpuscale-adapter").expect(200)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["gpuscale", "adapter"]
    mounts = _materialise(plane, deployment, work / "pod")
    service = rest.get(f"/api/v1/namespaces/{NAMESPACE}/services/gpuscale-adapter").expect(200)
    cluster_ip, port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]
    # NB: the availability check wants a ready endpoint; no endpointslice controller runs here. Its address is never
    # dialled: with aggregator routing off the aggregator connects to the ClusterIP, where the adapter listens.
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "gpuscale-adapter-test", "namespace": NAMESPACE,
                     "labels": {"kubernetes.io/service-name": "gpuscale-adapter"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.10"], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
    }  # fmt: skip
    rest.post(f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices", slice_).expect(201)
    kubeconfig = plane.service_account_kubeconfig(NAMESPACE, "gpuscale-adapter")
    # The pod's args as installed; then what kube-proxy and the pod's network would provide: the ClusterIP and the
    # Service port to listen on (the last --secure-port wins), the in-cluster identity as a kubeconfig.
    args = [_local(a, mounts) for a in container["args"]]
    args += ["--kubeconfig", str(kubeconfig), "--bind-address", cluster_ip, f"--secure-port={port}"]
    with adapter_process(args, work / "adapter.log") as proc:
        yield {"proc": proc, "args": container["args"], "log": work / "adapter.log"}


def _available(plane: ControlPlane, name: str) -> bool | str:
    item = plane.rest().get(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}").body
    condition = {c["type"]: c for c in item.get("status", {}).get("conditions", [])}.get("Available", {})
    return condition.get("status") == "True" or f"{condition.get('reason')}: {condition.get('message')}"


def test_the_adapter_answers_through_the_aggregator_with_the_charts_certificate(plane, adapter, exporter):
    assert any(a.startswith("--tls-cert-file=") for a in adapter["args"]), "the chart's default mounts its cert"

    def all_available() -> bool:
        assert adapter["proc"].poll() is None, adapter["log"].read_text()
        return all(_available(plane, name) is True for name in APISERVICES)

    try:
        until(all_available, timeout=60, what="the chart's APIServices Available")
    except AssertionError as e:
        why = {name: _available(plane, name) for name in APISERVICES}
        raise AssertionError(f"{e}\n{why}\nadapter log:\n{adapter['log'].read_text()[-1500:]}") from None

    def values() -> dict | None:
        done = plane.kubectl(
            "get", "--raw", f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_utilization?labelSelector=app%3Dllm"
        )
        body = json.loads(done.stdout) if done.returncode == 0 else {}
        return body if body.get("items") else None

    body = until(values, timeout=30, what="gpu_utilization of the llm pods through the aggregator")
    assert {i["value"] for i in body["items"]} == {"42"}, body
    listing = plane.kubectl("get", "--raw", f"{EXTERNAL}/v1beta1")
    assert listing.returncode == 0 and json.loads(listing.stdout)["resources"], listing.stderr


def test_helm_upgrade_keeps_the_generated_certificate(helm, plane, release, adapter):
    rest = plane.rest()

    def tls() -> tuple:
        secret = rest.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/gpuscale-adapter-serving-cert").expect(200)
        bundles = {rest.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{n}").expect(200)["spec"]["caBundle"]
                   for n in APISERVICES}  # fmt: skip
        return secret["data"]["tls.crt"], secret["data"]["ca.crt"], bundles

    before = tls()
    done = _helm(helm, plane, "upgrade", RELEASE, str(CHART), "--values", str(release["values"]))
    assert done.returncode == 0, done.stderr
    assert tls() == before and before[2] == {before[1]}, "an upgrade must not re-issue the CA the replicas serve"
    assert _available(plane, "v1beta2.custom.metrics.k8s.io") is True


def test_helm_uninstall_removes_every_object(helm, plane, release, adapter):
    done = _helm(helm, plane, "uninstall", RELEASE, "--wait", "--timeout", "60s")
    assert done.returncode == 0, done.stderr
    rest = plane.rest()

    def left() -> list[str]:
        return [f"{o['kind']} {o['metadata']['name']}" for o in release["objects"] if rest.get(_path(o)).status != 404]

    until(lambda: not left(), timeout=30, what="every object of the release deleted")
    gone = plane.kubectl("get", "--raw", f"{CUSTOM}/v1beta2")
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout
