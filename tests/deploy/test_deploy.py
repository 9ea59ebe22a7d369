"""deploy/: what `kubectl apply -k` would send to a cluster, and the promises deploy/README.md makes about it.

Every kustomization under deploy/ (the base, the overlays, the dcgm-exporter ConfigMap, the examples)
and every overlay combined with each component is rendered by the real `kubectl kustomize`. Each rendered
object is validated against the Kubernetes OpenAPI schemas shipped with kubernetes-validate (strict: an
unknown field fails). Objects of CRDs it has no schema for (cert-manager) are checked by hand, and only
the kinds listed in ``NO_SCHEMA`` with their reason may take that path.

Then the promises: two replicas spread over nodes, a PodDisruptionBudget, HTTPS probes on /livez and
/readyz, the three APIServices (or the ones a coexistence component leaves) with the right priorities
and TLS handling, the RBAC the aggregated API server and the HPA controller need, container args the
adapter's own argument parser accepts, example HPAs that only name catalogue metrics, and a dcgm-exporter
counters CSV that enables every field the catalogue reads.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuscale.adapter.forecasts import METRICS as FORECAST_METRICS
from gpuscale.settings import AdapterSettings, add_arguments, from_arguments
from tests.deploy.kube_schemas import validate

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CATALOGUE = ROOT / "policies" / "metrics.yaml"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

KUBECTL = shutil.which("kubectl")
if KUBECTL is None:  # NB: .ci/setup --test installs it; a missing kubectl is a broken setup, not a skip
    raise RuntimeError("kubectl is required to render deploy/ (run: bash .ci/setup --test)")

# The oldest Kubernetes we claim to support and the kubectl/kustomize the tests run with.
KUBERNETES_VERSIONS = ("1.30", "1.32")

# Every directory under deploy/ holding a kustomization.yaml (test_every_kustomization_is_rendered
# fails when one is added without being listed here).
ADAPTER_OVERLAYS = ("base", "overlays/prometheus", "overlays/embedded-scrape", "overlays/dev")
OTHER_KUSTOMIZATIONS = (
    "dcgm-exporter",
    "examples",
    "report/base",
    "report/with-configmap",
    # the operating picture (tests/operating): prometheus-operator objects, rules, Grafana dashboards
    "monitoring",
    "alerts/prometheusrules",
    "dashboards",
)
COMPONENTS = ("components/cert-manager", "components/custom-only", "components/external-only")

# Overlay + component, rendered through a temporary overlay that references both. The overlays that
# already include cert-manager are not combined with it again; dev (insecureSkipTLSVerify) must not be
# combined with it (the API server rejects an APIService with both caBundle and insecureSkipTLSVerify).
COMBINED = (
    ("base", "components/cert-manager"),
    *((overlay, component) for overlay in ADAPTER_OVERLAYS for component in COMPONENTS[1:]),
)
ADAPTER_VARIANTS = (*ADAPTER_OVERLAYS, *(f"{o}+{c}" for o, c in COMBINED))
ALL_VARIANTS = (*ADAPTER_VARIANTS, *OTHER_KUSTOMIZATIONS)

# Flags the manifests pass that `gpuscale adapter` is gaining in issue 3 (TLS serving, data sources,
# coexistence). Listed so a failure says "not implemented yet" rather than "typo in deploy/"; the test
# fails until every one of them is in `gpuscale adapter --help`.
FLAGS_BEING_ADDED = frozenset(
    {
        "--secure-port",
        "--tls-cert-file",
        "--tls-private-key-file",
        "--cert-dir",
        "--prometheus-url",
        "--prometheus-timeout",
        "--apis",
        "--discover-exporters",
        "--dcgm-exporter-selector",
        "--triton-selector",
    }
)

PROMETHEUS_OPERATOR_CRD = "prometheus-operator CRD: kubernetes-validate ships built-in kinds only"

# CRD kinds kubernetes-validate has no schema for, why we accept them, and the hand check they get instead.
NO_SCHEMA = {
    ("cert-manager.io/v1", "Certificate"): "cert-manager CRD: kubernetes-validate ships built-in kinds only",
    ("cert-manager.io/v1", "Issuer"): "cert-manager CRD: kubernetes-validate ships built-in kinds only",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): PROMETHEUS_OPERATOR_CRD,
    ("monitoring.coreos.com/v1", "PodMonitor"): PROMETHEUS_OPERATOR_CRD,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_OPERATOR_CRD,
}

NAMESPACE = "gpuscale"
APP = "gpuscale-adapter"
POD_LABELS = {"app.kubernetes.io/name": "gpuscale", "app.kubernetes.io/component": "adapter"}
SECURE_PORT = 6443
APISERVICES = {  # name → (group, version, versionPriority)
    "v1beta1.custom.metrics.k8s.io": ("custom.metrics.k8s.io", "v1beta1", 100),
    "v1beta2.custom.metrics.k8s.io": ("custom.metrics.k8s.io", "v1beta2", 200),
    "v1beta1.external.metrics.k8s.io": ("external.metrics.k8s.io", "v1beta1", 100),
}
CUSTOM, EXTERNAL = "custom.metrics.k8s.io", "external.metrics.k8s.io"


# --- rendering --------------------------------------------------------------------------------------


def _kustomize(directory: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "KUBECONFIG": "/dev/null"}
    proc = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="session")
def render(tmp_path_factory):
    """variant ("overlays/prometheus" or "base+components/custom-only") → the rendered objects."""

    @cache
    def _render(variant: str) -> tuple[dict[str, Any], ...]:
        overlay, _, component = variant.partition("+")
        if not component:
            return tuple(_kustomize(DEPLOY / overlay))
        # NB: kustomize refuses absolute paths in resources/components; relative ones may leave the root.
        root = tmp_path_factory.mktemp(variant.replace("/", "_").replace("+", "__"))
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / overlay, root)],
            "components": [os.path.relpath(DEPLOY / component, root)],
        }
        (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return tuple(_kustomize(root))

    return _render


def find(objects, kind: str, name: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
    return [
        o
        for o in objects
        if o["kind"] == kind
        and (name is None or o["metadata"]["name"] == name)
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]


def one(objects, kind: str, name: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    found = find(objects, kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {namespace or ''}/{name or '*'}, found {len(found)}"
    return found[0]


def adapter_container(objects) -> dict[str, Any]:
    deployment = one(objects, "Deployment", APP, NAMESPACE)
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "adapter"]
    return container


def served_groups(variant: str) -> set[str]:
    if "custom-only" in variant:
        return {CUSTOM}
    if "external-only" in variant:
        return {EXTERNAL}
    return {CUSTOM, EXTERNAL}


def uses_cert_manager(variant: str) -> bool:
    return variant.startswith(("overlays/prometheus", "overlays/embedded-scrape")) or "cert-manager" in variant


# --- every kustomization renders, every object is valid ----------------------------------------------


def test_every_kustomization_is_rendered():
    found = {str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob("kustomization.yaml")}
    # deploy/controller and its components are rendered and checked by tests/deploy/test_deploy_controller.py.
    controller = {
        "controller",
        *(
            f"controller/components/{c}"
            for c in ("act", "drain", "safe-to-evict", "dry-run", "embedded-scrape", "karpenter-weights")
        ),
    }
    # components/monitoring (deploy/monitoring as a component) is rendered by tests/operating/test_monitoring.py.
    assert found == {*ADAPTER_OVERLAYS, *OTHER_KUSTOMIZATIONS, *COMPONENTS, *controller, "components/monitoring"}


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_are_kustomize_components(component):
    kustomization = yaml.safe_load((DEPLOY / component / "kustomization.yaml").read_text())
    assert (kustomization["apiVersion"], kustomization["kind"]) == ("kustomize.config.k8s.io/v1alpha1", "Component")


CERTIFICATE_FIELDS = frozenset(
    {"secretName", "issuerRef", "commonName", "dnsNames", "duration", "renewBefore", "privateKey", "usages", "isCA"}
)


def _check_certificate(obj: dict[str, Any]) -> None:
    spec = obj["spec"]
    assert isinstance(spec.get("secretName"), str) and spec["secretName"], "Certificate: spec.secretName"
    issuer = spec.get("issuerRef", {})
    assert issuer.get("name") and issuer.get("kind") in {"Issuer", "ClusterIssuer"}, "Certificate: spec.issuerRef"
    assert issuer.get("group", "cert-manager.io") == "cert-manager.io", "Certificate: spec.issuerRef.group"
    assert spec.get("commonName") or spec.get("dnsNames"), "Certificate: commonName or dnsNames"
    for key in ("duration", "renewBefore"):
        if key in spec:
            assert re.fullmatch(r"(\d+h)?(\d+m)?(\d+s)?", spec[key]) and spec[key], f"Certificate: {key} {spec[key]!r}"
    assert set(spec) <= CERTIFICATE_FIELDS, f"Certificate: unexpected spec fields {set(spec) - CERTIFICATE_FIELDS}"
    if "privateKey" in spec:
        assert spec["privateKey"].get("algorithm") in {"RSA", "ECDSA", "Ed25519"}, "Certificate: privateKey.algorithm"


def _check_issuer(obj: dict[str, Any]) -> None:
    kinds = set(obj["spec"]) & {"selfSigned", "ca", "acme", "vault", "venafi"}
    assert len(kinds) == 1 and set(obj["spec"]) == kinds, f"Issuer: exactly one issuer type, got {set(obj['spec'])}"
    if "ca" in kinds:
        assert obj["spec"]["ca"].get("secretName"), "Issuer: ca.secretName"


MONITOR_FIELDS = frozenset({"selector", "namespaceSelector", "endpoints", "podMetricsEndpoints", "jobLabel"})
ENDPOINT_FIELDS = frozenset(
    {"port", "scheme", "path", "interval", "bearerTokenFile", "tlsConfig", "relabelings", "honorLabels"}
)


def _check_monitor(obj: dict[str, Any]) -> None:
    spec = obj["spec"]
    assert set(spec) <= MONITOR_FIELDS, f"{obj['kind']}: unexpected spec fields {set(spec) - MONITOR_FIELDS}"
    assert spec["selector"].get("matchLabels"), f"{obj['kind']}: spec.selector.matchLabels"
    endpoints = spec.get("endpoints") or spec.get("podMetricsEndpoints")
    assert endpoints, f"{obj['kind']}: no endpoints"
    for e in endpoints:
        assert set(e) <= ENDPOINT_FIELDS and e.get("port"), f"{obj['kind']}: endpoint {e}"
        assert re.fullmatch(r"\d+s", e.get("interval", "30s")), f"{obj['kind']}: interval {e.get('interval')}"


def _check_prometheusrule(obj: dict[str, Any]) -> None:
    # promtool checks the rules themselves (tests/operating/test_alerts.py); here only the object's shape.
    assert set(obj["spec"]) == {"groups"} and obj["spec"]["groups"], "PrometheusRule: spec.groups"
    for group in obj["spec"]["groups"]:
        assert group["name"] and group["rules"], "PrometheusRule: a group without name or rules"


HAND_CHECKS = {
    ("cert-manager.io/v1", "Certificate"): _check_certificate,
    ("cert-manager.io/v1", "Issuer"): _check_issuer,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _check_monitor,
    ("monitoring.coreos.com/v1", "PodMonitor"): _check_monitor,
    ("monitoring.coreos.com/v1", "PrometheusRule"): _check_prometheusrule,
}


def validation_problems(objects) -> tuple[list[str], set[str]]:
    """Each object against the Kubernetes schemas (strict), CRD kinds by hand: (problems, kinds checked by hand)."""
    problems, hand_checked = [], set()
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        where = f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
        for version in KUBERNETES_VERSIONS:
            try:
                validate(obj, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                assert key in NO_SCHEMA, f"{where}: no schema in kubernetes-validate and no reason to accept it"
                HAND_CHECKS[key](obj)
                hand_checked.add(f"{key[0]} {key[1]}: {NO_SCHEMA[key]}")
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{where} (Kubernetes {version}) at {'.'.join(map(str, e.absolute_path))}: {e.message}")
    return problems, hand_checked


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_rendered_objects_are_valid_kubernetes(render, variant):
    problems, hand_checked = validation_problems(render(variant))
    assert not problems, "\n".join(problems)
    # Visible in `pytest -rA` / on failure: which kinds were checked by hand rather than by schema.
    print("checked by hand, not by schema:", sorted(hand_checked) or "none")


def test_no_schema_list_names_exactly_the_crds_deploy_uses(render):
    """A kind may skip schema validation only while deploy/ renders it (the list cannot silently grow stale)."""
    rendered = {(o["apiVersion"], o["kind"]) for v in ALL_VARIANTS for o in render(v)}
    without_schema = set()
    for key in rendered:
        try:
            validate({"apiVersion": key[0], "kind": key[1], "metadata": {"name": "x"}}, "1.30", strict=False)
        except kubernetes_validate.SchemaNotFoundError:
            without_schema.add(key)
        except kubernetes_validate.ValidationError:
            pass
    assert without_schema == NO_SCHEMA.keys() == HAND_CHECKS.keys()


def test_apiservice_is_validated_by_schema_not_by_hand():
    """kubernetes-validate ships apiregistration.k8s.io/v1 APIService: it must not need the hand-check path."""
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": "v1beta1.custom.metrics.k8s.io"},
        "spec": {"group": CUSTOM, "version": "v1beta1", "versionPriority": "100"},
    }
    for version in KUBERNETES_VERSIONS:
        with pytest.raises(kubernetes_validate.ValidationError):
            validate(apiservice, version, strict=True)  # versionPriority must be an integer
    assert ("apiregistration.k8s.io/v1", "APIService") not in NO_SCHEMA


# --- the adapter Deployment ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ADAPTER_VARIANTS)
def test_deployment_is_highly_available_and_locked_down(render, variant):
    objects = render(variant)
    deployment = one(objects, "Deployment", APP, NAMESPACE)
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] == 2
    assert spec["selector"]["matchLabels"] == POD_LABELS
    assert POD_LABELS.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()

    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == POD_LABELS

    assert pod["serviceAccountName"] == APP
    one(objects, "ServiceAccount", APP, NAMESPACE)
    # The HPA depends on it: a priority above ordinary pods, from a class the same kustomization creates.
    priority = one(objects, "PriorityClass", pod["priorityClassName"])
    assert 0 < priority["value"] < 1_000_000_000 and priority.get("globalDefault") is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    container = adapter_container(objects)
    # The base names the image by its logical name and the release's version; every overlay says where it is.
    expected = f"gpuscale:{VERSION}" if variant.startswith("base") else f"localhost/gpuscale:{VERSION}"
    assert container["image"] == expected
    assert container["command"] == ["gpuscale", "adapter"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["runAsNonRoot"] is True

    assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
    assert {"cpu", "memory"} <= container["resources"]["limits"].keys()


@pytest.mark.parametrize("overlay", ["overlays/prometheus", "overlays/embedded-scrape", "overlays/dev"])
def test_a_user_sets_their_registry_in_one_line(tmp_path, overlay):
    """What a user does: copy deploy/, change the overlay's `newName:` line, render."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy)
    path = copy / overlay / "kustomization.yaml"
    text = path.read_text()
    assert text.count("newName: localhost/gpuscale\n") == 1
    path.write_text(text.replace("newName: localhost/gpuscale\n", "newName: registry.example.com/platform/gpuscale\n"))
    objects = _kustomize(copy / overlay)
    assert adapter_container(objects)["image"] == f"registry.example.com/platform/gpuscale:{VERSION}"
    images = {
        c["image"] for o in objects if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"registry.example.com/platform/gpuscale:{VERSION}"}


@pytest.mark.parametrize("variant", ADAPTER_VARIANTS)
def test_probes_are_https_on_livez_and_readyz(render, variant):
    container = adapter_container(render(variant))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"https": SECURE_PORT}
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz"), ("startupProbe", "/livez")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["scheme"], ports.get(get["port"], get["port"])) == (path, "HTTPS", SECURE_PORT), probe


@pytest.mark.parametrize("variant", ADAPTER_VARIANTS)
def test_catalogue_and_cert_dir_are_mounted(render, variant):
    objects = render(variant)
    pod = one(objects, "Deployment", APP, NAMESPACE)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in adapter_container(objects)["volumeMounts"]}

    assert "emptyDir" in volumes[mounts["/var/run/serving-cert"]]
    config_map = one(objects, "ConfigMap", volumes[mounts["/etc/gpuscale"]]["configMap"]["name"], NAMESPACE)
    assert config_map["metadata"]["name"].startswith("gpuscale-metrics-"), "hash suffix rolls the pods on change"
    assert config_map["data"]["metrics.yaml"] == CATALOGUE.read_text()


def test_the_controller_has_the_same_priority_class_as_the_adapter():
    base, controller = (DEPLOY / d / "priorityclass.yaml" for d in ("base", "controller"))
    assert base.read_text() == controller.read_text()
    objects = _kustomize(DEPLOY / "controller")
    pod = one(objects, "Deployment", "gpuscale-controller")["spec"]["template"]["spec"]
    assert one(objects, "PriorityClass", pod["priorityClassName"]) == yaml.safe_load(base.read_text()) | {
        "metadata": {"name": "gpuscale-critical", "labels": {"app.kubernetes.io/part-of": "gpuscale"}}
    }


def test_base_catalogue_is_a_copy_of_policies():
    assert (DEPLOY / "base" / "metrics.yaml").read_bytes() == CATALOGUE.read_bytes(), (
        "deploy/base/metrics.yaml differs from policies/metrics.yaml: cp policies/metrics.yaml deploy/base/"
    )


# --- the adapter's flags ---------------------------------------------------------------------------


def _args(objects) -> list[str]:
    return list(adapter_container(objects)["args"])


def _flags(args: list[str]) -> set[str]:
    return {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}


@cache
def _help_flags() -> frozenset[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuscale.cli.main", "adapter", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return frozenset(re.findall(r"--[a-z][a-z0-9-]*", proc.stdout))


def test_every_flag_in_deploy_is_in_adapter_help(render):
    used = set().union(*(_flags(_args(render(v))) for v in ADAPTER_VARIANTS))
    assert used >= FLAGS_BEING_ADDED, f"listed as being added but not used in deploy/: {FLAGS_BEING_ADDED - used}"
    missing = used - _help_flags()
    unknown = missing - FLAGS_BEING_ADDED
    assert not unknown, f"deploy/ passes flags `gpuscale adapter` does not have: {sorted(unknown)}"
    pending = missing & FLAGS_BEING_ADDED
    assert not pending, f"flags being added in issue 3, not in `gpuscale adapter --help` yet: {sorted(pending)}"


def _settings(args: list[str]) -> AdapterSettings:
    parser = argparse.ArgumentParser(prog="gpuscale adapter")
    add_arguments(parser, AdapterSettings)
    try:
        namespace, extra = parser.parse_known_args(args)
    except SystemExit:
        pytest.fail(f"`gpuscale adapter` rejects the manifest's args: {args}")
    assert not extra, f"`gpuscale adapter` does not know: {extra}"
    return from_arguments(AdapterSettings, namespace)


@pytest.mark.parametrize("variant", ADAPTER_VARIANTS)
def test_args_are_accepted_by_the_adapter_and_match_the_pod(render, variant):
    """The args parse with the adapter's own settings, and what they say agrees with ports, mounts and APIServices."""
    objects = render(variant)
    settings = _settings(_args(objects))
    container = adapter_container(objects)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}

    assert settings.https_port == SECURE_PORT
    assert settings.insecure_port is None, "no plain-HTTP port in a cluster"
    assert settings.bind_address not in {"127.0.0.1", "localhost", "::1"}, (
        "the kubelet and the Service connect from outside"
    )
    assert settings.config == "/etc/gpuscale/metrics.yaml" and "/etc/gpuscale" in mounts
    assert settings.cert_dir in mounts
    assert {
        g for g, on in ((CUSTOM, settings.serve_custom), (EXTERNAL, settings.serve_external)) if on
    } == served_groups(variant)
    if uses_cert_manager(variant):
        assert settings.tls_cert_file and settings.tls_private_key_file
        for path in (settings.tls_cert_file, settings.tls_private_key_file):
            assert os.path.dirname(path) in mounts, f"{path} is not on a mounted volume"
    else:
        assert settings.tls_cert_file is None, "without cert-manager the adapter self-signs into --cert-dir"

    sources = (
        variant.startswith("overlays/prometheus"),
        variant.startswith(("overlays/embedded-scrape", "overlays/dev")),
    )
    assert (bool(settings.prometheus.url), settings.discover_exporters) == sources
    if settings.prometheus.url:
        assert settings.prometheus.url == "http://prometheus-operated.monitoring.svc:9090"
    if settings.discover_exporters:
        assert settings.dcgm_exporter_selector == "app=nvidia-dcgm-exporter"
        assert settings.triton_selector == "gpuscale.io/scrape=triton"


# --- Service, PodDisruptionBudget, APIServices ------------------------------------------------------


@pytest.mark.parametrize("variant", ADAPTER_VARIANTS)
def test_service_and_disruption_budget(render, variant):
    objects = render(variant)
    service = one(objects, "Service", APP, NAMESPACE)
    assert service["spec"]["selector"] == POD_LABELS
    (port,) = service["spec"]["ports"]
    assert (port["port"], port["targetPort"]) == (443, "https")

    budget = one(objects, "PodDisruptionBudget", namespace=NAMESPACE)
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == POD_LABELS


@pytest.mark.parametrize("variant", ADAPTER_VARIANTS)
def test_apiservices_ownership_priorities_and_tls(render, variant):
    objects = render(variant)
    apiservices = {o["metadata"]["name"]: o for o in find(objects, "APIService")}
    expected = {name for name, (group, _, _) in APISERVICES.items() if group in served_groups(variant)}
    assert set(apiservices) == expected, "a coexistence component must not register the other backend's API"

    certificates = {c["metadata"]["name"]: c for c in find(objects, "Certificate", namespace=NAMESPACE)}
    for name, apiservice in apiservices.items():
        group, version, priority = APISERVICES[name]
        spec = apiservice["spec"]
        # NB: the schema requires only the two priorities; the aggregator needs all of these.
        assert (spec["group"], spec["version"], spec["versionPriority"]) == (group, version, priority), name
        assert spec["groupPriorityMinimum"] == 100, name
        assert spec["service"] == {"name": APP, "namespace": NAMESPACE, "port": 443}, name
        assert "caBundle" not in spec, f"{name}: the caBundle is injected, never committed"

        annotation = apiservice["metadata"].get("annotations", {}).get("cert-manager.io/inject-ca-from")
        assert spec.get("insecureSkipTLSVerify", False) is variant.startswith("overlays/dev"), (
            f"{name}: insecureSkipTLSVerify only in overlays/dev"
        )
        if uses_cert_manager(variant):
            assert annotation, f"{name}: no cert-manager.io/inject-ca-from annotation"
            namespace, _, certificate = annotation.partition("/")
            assert namespace == NAMESPACE and certificate in certificates, f"{name}: inject-ca-from {annotation}"
            assert f"{APP}.{NAMESPACE}.svc" in certificates[certificate]["spec"]["dnsNames"]
        else:
            assert annotation is None, name


@pytest.mark.parametrize("variant", [v for v in ADAPTER_VARIANTS if uses_cert_manager(v)])
def test_cert_manager_serving_certificate_is_mounted(render, variant):
    objects = render(variant)
    serving = one(objects, "Certificate", "gpuscale-adapter-serving", NAMESPACE)
    issuers = {i["metadata"]["name"]: i for i in find(objects, "Issuer", namespace=NAMESPACE)}
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    ca_cert = one(
        [c for c in find(objects, "Certificate", namespace=NAMESPACE) if c["spec"].get("isCA")], "Certificate"
    )
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    assert "selfSigned" in issuers[ca_cert["spec"]["issuerRef"]["name"]]["spec"]

    pod = one(objects, "Deployment", APP, NAMESPACE)["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounted = {m["name"] for m in adapter_container(objects)["volumeMounts"]}
    assert serving["spec"]["secretName"] in {secrets[name] for name in mounted if name in secrets}


# --- RBAC ------------------------------------------------------------------------------------------


def _grants(rules, group: str, resource: str, verbs: set[str]) -> bool:
    return any(
        group in r.get("apiGroups", [])
        and (resource in r.get("resources", []) or "*" in r.get("resources", []))
        and (verbs <= set(r.get("verbs", [])) or "*" in r.get("verbs", []))
        for r in rules
    )


def _bound(objects, kind: str, role_kind: str, role: str, subject: tuple[str, str], namespace: str | None = None):
    return [
        b
        for b in find(objects, kind, namespace=namespace)
        if (b["roleRef"]["kind"], b["roleRef"]["name"]) == (role_kind, role)
        and any(
            (s["kind"], s.get("namespace"), s["name"]) == ("ServiceAccount", *subject) for s in b.get("subjects", [])
        )
    ]


@pytest.mark.parametrize("variant", ADAPTER_VARIANTS)
def test_rbac_for_the_aggregated_api_server(render, variant):
    objects = render(variant)
    adapter = (NAMESPACE, APP)
    assert _bound(objects, "ClusterRoleBinding", "ClusterRole", "system:auth-delegator", adapter)
    assert _bound(
        objects, "RoleBinding", "Role", "extension-apiserver-authentication-reader", adapter, namespace="kube-system"
    )

    readers = [
        r
        for r in find(objects, "ClusterRole")
        if _grants(r["rules"], "", "pods", {"get", "list", "watch"})
        and _bound(objects, "ClusterRoleBinding", "ClusterRole", r["metadata"]["name"], adapter)
    ]
    assert readers, "no ClusterRole bound to the adapter lets it list+watch pods"
    rules = [rule for r in readers for rule in r["rules"]]
    for group, resource in (
        ("", "pods"),
        ("", "nodes"),
        ("", "namespaces"),
        ("apps", "deployments"),
        ("apps", "statefulsets"),
    ):
        assert _grants(rules, group, resource, {"get", "list", "watch"}), (
            f"adapter cannot list+watch {group}/{resource}"
        )


@pytest.mark.parametrize("variant", ADAPTER_VARIANTS)
def test_rbac_lets_the_hpa_controller_read_the_served_apis(render, variant):
    objects = render(variant)
    name = "gpuscale-external-metrics-reader" if "external-only" in variant else "custom-metrics-server-resources"
    role = one(objects, "ClusterRole", name)
    groups = {g for rule in role["rules"] for g in rule["apiGroups"]}
    assert groups == served_groups(variant), "grant exactly the groups this adapter serves"
    for group in groups:
        assert _grants(role["rules"], group, "*", {"get", "list", "watch"})
    assert _bound(objects, "ClusterRoleBinding", "ClusterRole", name, ("kube-system", "horizontal-pod-autoscaler"))
    if "external-only" in variant:
        assert not find(objects, "ClusterRole", "custom-metrics-server-resources"), (
            "external-only must not touch prometheus-adapter's custom-metrics-server-resources"
        )


# --- example HPAs ----------------------------------------------------------------------------------


@cache
def _catalogue() -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in yaml.safe_load(CATALOGUE.read_text())["metrics"]}


def _hpa_metrics(hpa) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for metric in hpa["spec"]["metrics"]:
        kind = metric["type"]
        source = metric[{"Pods": "pods", "Object": "object", "External": "external"}[kind]]
        out.append((kind, source["metric"]["name"], source))
    return out


def test_example_hpas_name_only_catalogue_metrics(render):
    hpas = find(render("examples"), "HorizontalPodAutoscaler")
    assert len(hpas) == 5
    catalogue = _catalogue()
    for hpa in hpas:
        assert hpa["apiVersion"] == "autoscaling/v2"
        for kind, name, source in _hpa_metrics(hpa):
            if name in FORECAST_METRICS:  # served by the adapter for Deployments/StatefulSets and as External
                assert kind == "External" or source["describedObject"]["kind"] in ("Deployment", "StatefulSet")
                continue
            assert name in catalogue, f"{hpa['metadata']['name']}: {name} is not in policies/metrics.yaml"
            entry = catalogue[name]
            if kind == "External":
                assert entry.get("external") is True, f"{name} is used as External but has no `external: true`"
            else:
                resource = "pods" if kind == "Pods" else source["describedObject"]["kind"].lower() + "s"
                assert resource in entry.get("resources", [resource]), f"{name} is not served for {resource}"


def test_example_hpas_scale_on_the_documented_signals(render):
    hpas = {h["metadata"]["name"]: h for h in find(render("examples"), "HorizontalPodAutoscaler")}
    triton = hpas["triton"]
    # values tuned with `gpuscale simulate` (docs/examples.md; tests/replay/test_examples.py replays them)
    assert [(k, n, s["target"]) for k, n, s in _hpa_metrics(triton)] == [
        ("Pods", "inference_queue_compute_ratio", {"type": "AverageValue", "averageValue": "250m"}),
        ("Pods", "gpu_tensor_active", {"type": "AverageValue", "averageValue": "40"}),
    ]
    assert "scaleUp" in triton["spec"]["behavior"]

    assert [(k, n) for k, n, _ in _hpa_metrics(hpas["llm-server"])] == [
        ("Pods", "inference_queue_depth"),
        ("Pods", "gpu_tensor_active"),
    ]

    vllm = hpas["vllm"]
    assert [(k, n, s["target"]) for k, n, s in _hpa_metrics(vllm)] == [
        ("Pods", "inference_queue_depth", {"type": "AverageValue", "averageValue": "4"}),
        ("Pods", "inference_kv_cache_usage", {"type": "AverageValue", "averageValue": "20"}),
    ]
    assert vllm["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 600  # model loads are slow

    predictive = hpas["llm-predictive"]
    assert [(k, n, s["target"]) for k, n, s in _hpa_metrics(predictive)] == [
        ("Pods", "inference_queue_depth", {"type": "AverageValue", "averageValue": "4"}),
        ("Object", "forecast_desired_replicas", {"type": "AverageValue", "averageValue": "1"}),
    ]
    assert _hpa_metrics(predictive)[1][2]["describedObject"]["name"] == predictive["spec"]["scaleTargetRef"]["name"]

    ((kind, name, external),) = _hpa_metrics(hpas["bert-qa-batch-consumer"])
    assert (kind, name) == ("External", "inference_queue_depth")
    assert external["metric"]["selector"]["matchLabels"] == {"model": "bert_qa_onnx"}
    assert external["target"]["type"] == "AverageValue"


# --- dcgm-exporter counters CSV --------------------------------------------------------------------

COUNTERS = DEPLOY / "dcgm-exporter" / "counters.csv"
# Off (or absent) in upstream's default-counters.csv and needed by gpuscale's catalogue, diagnosis or
# health rules, plus the default fields they read.
REQUIRED_FIELDS = {
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_POWER_VIOLATION",
}


def _enabled_counters(text: str) -> dict[str, tuple[str, str]]:
    """field → (type, help), read the way dcgm-exporter reads the file: '#' lines are comments, 3 fields a line."""
    out: dict[str, tuple[str, str]] = {}
    for number, record in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not record or not "".join(record).strip() or record[0].lstrip().startswith("#"):
            continue
        assert len(record) == 3, f"counters.csv line {number}: expected 'field, type, help', got {record}"
        field, kind, help_text = (part.strip() for part in record)
        assert re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", field), f"line {number}: field {field!r}"
        assert kind in {"gauge", "counter", "label"}, f"line {number}: type {kind!r}"
        assert help_text, f"line {number}: empty help"
        assert field not in out, f"line {number}: {field} enabled twice"
        out[field] = (kind, help_text)
    return out


def _catalogue_series() -> set[str]:
    series: set[str] = set()
    for entry in _catalogue().values():
        for term in (entry, entry.get("numerator", {}), entry.get("denominator", {})):
            series.update(term.get("series", []))
    return series


def test_counters_csv_enables_what_gpuscale_reads():
    text = COUNTERS.read_text()
    assert "# Format" in text and "DCGM FIELD, Prometheus metric type, help message" in text
    enabled = _enabled_counters(text)
    assert not REQUIRED_FIELDS - enabled.keys(), f"not enabled: {sorted(REQUIRED_FIELDS - enabled.keys())}"
    dcgm = {s for s in _catalogue_series() if s.startswith("DCGM_")}
    assert dcgm and not dcgm - enabled.keys(), (
        f"catalogue reads fields the CSV does not enable: {dcgm - enabled.keys()}"
    )
    assert enabled["DCGM_FI_DEV_XID_ERRORS"][0] == "gauge"  # the last Xid, not a count
    assert enabled["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"][0] == "counter"


def test_counters_configmap_is_what_the_gpu_operator_mounts(render):
    config_map = one(render("dcgm-exporter"), "ConfigMap")
    assert config_map["metadata"] == {
        "name": "gpuscale-dcgm-metrics",  # no hash suffix: the ClusterPolicy names it
        "namespace": "gpu-operator",
        "labels": {"app.kubernetes.io/part-of": "gpuscale"},
    }
    assert config_map["data"] == {"dcgm-metrics.csv": COUNTERS.read_text()}  # the key the operator mounts


# --- the README promises -----------------------------------------------------------------------------


def test_readme_shows_the_commands_it_documents():
    readme = (DEPLOY / "README.md").read_text()
    for snippet in (
        "kubectl apply -k deploy/overlays/prometheus",
        "kubectl apply -k deploy/overlays/embedded-scrape",
        "kubectl get apiservices | grep metrics",
        "kubectl get --raw",
        "components/custom-only",
        "components/external-only",
    ):
        assert snippet in readme, snippet
    # Every path the README names under deploy/ exists (tests/deploy/… is the tests' folder, not this one).
    for path in set(re.findall(r"(?<!\w)(?<!tests/)deploy/[A-Za-z0-9_./-]+[A-Za-z0-9_]", readme)):
        assert (ROOT / path).exists(), f"README names {path}, which does not exist"


def _readme_rbac_rows() -> set[tuple[str, str, str, str]]:
    """(where, group, resources, verbs) of deploy/README.md's controller RBAC table, normalised."""
    text = (DEPLOY / "README.md").read_text()
    table = text.split("<!-- controller-rbac -->", 1)[1].split("<!-- /controller-rbac -->", 1)[0]
    rows = set()
    for line in table.strip().splitlines()[2:]:
        where, groups, resources, verbs, _ = (c.strip() for c in line.strip("|").split("|"))
        for group in groups.split(", "):
            rows.add((where, "" if group == "core" else group, resources, ", ".join(sorted(verbs.split(", ")))))
    return rows


def test_the_readme_states_the_controllers_rbac_as_the_manifests_grant_it():
    objects = _kustomize(DEPLOY / "controller")
    granted = set()
    for role in [o for o in objects if o["kind"] in ("ClusterRole", "Role")]:
        where = role["metadata"].get("namespace", "cluster")
        for rule in role["rules"]:
            names = " ".join(f"`{n}`" for n in rule.get("resourceNames", []))
            resources = ", ".join(rule["resources"]) + (f" {names}" if names else "")
            for group in rule["apiGroups"]:
                granted.add((where, group, resources, ", ".join(sorted(rule["verbs"]))))
    assert _readme_rbac_rows() == granted


def test_the_readme_lists_every_example():
    readme = (DEPLOY / "README.md").read_text()
    for example in sorted((DEPLOY / "examples").glob("*.yaml")):
        if example.name != "kustomization.yaml":
            assert f"`{example.name}`" in readme, f"deploy/README.md does not list examples/{example.name}"
