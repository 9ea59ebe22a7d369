"""deploy/charts/gpuscale: the Helm chart renders what deploy/ renders, and its values do what values.yaml says.

The chart's templates are written by hand, so this is what keeps them from drifting from deploy/: for each
combination of values that deploy/ has a kustomization (or overlay + components) for, the chart's objects, as the
pinned helm renders them, must equal the kustomize render object by object — same names, namespaces, labels,
RBAC rules, args, probes, volumes. The only differences allowed are listed in ``_chart_side`` and
``_kustomize_side``: Helm's own labels, the Namespace (Helm's --create-namespace makes it), kustomize's hash suffix
on the catalogue ConfigMap (the chart rolls pods with a checksum annotation instead) and the order of args.
Dashboards, rule files and the catalogue are not copied into the chart: its files/ links to deploy/dashboards,
deploy/alerts and policies/metrics.yaml.

Then the chart's own: `helm lint --strict`, every object against the Kubernetes OpenAPI schemas, the generated
serving certificate, values that reach the pods, values that must fail with the field named.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import difflib
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpuscale.settings import ControllerSettings, add_arguments, from_arguments
from tests.deploy.test_deploy import DEPLOY, _kustomize, _settings, validation_problems
from tests.helm import CHART, NAMESPACE, RELEASE, run_helm, template

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
HELM_LABELS = {
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/version": VERSION,
    "helm.sh/chart": f"gpuscale-{VERSION}",
}
MONITORING_ON = {
    k: {"enabled": True} for k in ("serviceMonitor", "podMonitor", "dcgmExporter", "prometheusRules", "dashboards")
}
CERT_MANAGER = {"tls": {"mode": "cert-manager"}}
EVERYTHING = {
    **CERT_MANAGER,
    "controller": {"drain": True, "hintSafeToEvict": True, "dryRun": True},
    "report": {"enabled": True, "configMap": True},
    "monitoring": MONITORING_ON,
}
CONTROLLER = ("controller", ())

# chart values → the kustomize renders (directory under deploy/, components) that make the same objects.
EQUIVALENTS: dict[str, tuple[dict[str, Any], tuple[tuple[str, tuple[str, ...]], ...]]] = {
    "prometheus": (CERT_MANAGER, (("overlays/prometheus", ()), CONTROLLER)),
    "acting (controller.dryRun=false)": (
        {**CERT_MANAGER, "controller": {"dryRun": False}},
        (("overlays/prometheus", ()), ("controller", ("controller/components/act",))),
    ),
    "embedded-scrape": (
        {**CERT_MANAGER, "metricsSource": {"type": "embedded"}},
        (("overlays/embedded-scrape", ()), ("controller", ("controller/components/embedded-scrape",))),
    ),
    "dev": (
        {"tls": {"mode": "insecure"}, "metricsSource": {"type": "embedded"}},
        (("overlays/dev", ()), ("controller", ("controller/components/embedded-scrape",))),
    ),
    "custom-only (KEDA keeps external)": (
        {**CERT_MANAGER, "apiServices": {"external": False}},
        (("overlays/prometheus", ("components/custom-only",)), CONTROLLER),
    ),
    "external-only (prometheus-adapter keeps custom)": (
        {**CERT_MANAGER, "apiServices": {"custom": False}},
        (("overlays/prometheus", ("components/external-only",)), CONTROLLER),
    ),
    "report": (
        {**CERT_MANAGER, "report": {"enabled": True}},
        (("overlays/prometheus", ()), CONTROLLER, ("report/base", ())),
    ),
    "everything": (
        EVERYTHING,
        (
            ("overlays/prometheus", ()),
            ("controller", tuple(f"controller/components/{c}" for c in ("drain", "safe-to-evict"))),
            ("report/with-configmap", ()),
            ("monitoring", ()),
            ("dashboards", ()),
        ),
    ),
}

Key = tuple[str, str, str]


def _key(obj: dict[str, Any]) -> Key:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    pod = spec.get("jobTemplate", {}).get("spec", spec).get("template", {}).get("spec", {})
    return pod.get("containers", [])


def _pod_template(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec", {})
    return spec.get("jobTemplate", {}).get("spec", spec).get("template", {})


def _sort_args(obj: dict[str, Any]) -> None:
    # NB: kustomize appends an overlay's and each component's flags in patch order; the order means nothing to
    # the parser (no flag is repeated), so both sides are compared sorted.
    for container in _containers(obj):
        if "args" in container:
            container["args"] = sorted(container["args"])


def _chart_side(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out = {}
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        for name, value in HELM_LABELS.items():
            assert labels.pop(name, None) == value, f"{_key(obj)}: label {name} is not {value!r}"
        annotations = _pod_template(obj).get("metadata", {}).get("annotations", {})
        for name in [a for a in annotations if a.startswith("checksum/")]:
            del annotations[name]
        if not annotations:
            _pod_template(obj).get("metadata", {}).pop("annotations", None)
        _sort_args(obj)
        assert _key(obj) not in out, f"the chart renders {_key(obj)} twice"
        out[_key(obj)] = obj
    return out


HASHED = re.compile(r"^(gpuscale-metrics)-[a-z0-9]{10}$")


def _kustomize_side(objects: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for obj in objects:
        if obj["kind"] == "Namespace":  # helm install --create-namespace (docs/install.md: the PSS labels)
            continue
        if obj["kind"] == "ConfigMap":
            obj["metadata"]["name"] = HASHED.sub(r"\1", obj["metadata"]["name"])
        for volume in _pod_template(obj).get("spec", {}).get("volumes", []):
            if "configMap" in volume:
                volume["configMap"]["name"] = HASHED.sub(r"\1", volume["configMap"]["name"])
        _sort_args(obj)
        # deploy/base and deploy/controller each carry the PriorityClass (each is applied on its own).
        assert out.get(_key(obj), obj) == obj, f"{_key(obj)} differs between deploy/ directories"
        out[_key(obj)] = obj
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("helm")


def _kustomize_parts(parts, work: Path) -> list[dict[str, Any]]:
    objects = []
    for directory, components in parts:
        if not components:
            objects += _kustomize(DEPLOY / directory)
            continue
        # NB: kustomize refuses absolute paths in resources/components; relative ones may leave the root.
        root = work / re.sub(r"\W", "_", f"{directory}+{'+'.join(components)}")
        root.mkdir(exist_ok=True)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / directory, root)],
            "components": [os.path.relpath(DEPLOY / c, root) for c in components],
        }
        (root / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        objects += _kustomize(root)
    return objects


def _diff(chart: dict[Key, dict], kustomize: dict[Key, dict]) -> str:
    lines = []
    for key in sorted(chart.keys() - kustomize.keys()):
        lines.append(f"only the chart renders {key}")
    for key in sorted(kustomize.keys() - chart.keys()):
        lines.append(f"only deploy/ renders {key}")
    for key in sorted(chart.keys() & kustomize.keys()):
        if chart[key] != kustomize[key]:
            a = yaml.safe_dump(kustomize[key], sort_keys=True).splitlines()
            b = yaml.safe_dump(chart[key], sort_keys=True).splitlines()
            diff = difflib.unified_diff(a, b, "deploy/", "chart", lineterm="", n=2)
            lines.append(f"{key} differs:\n" + "\n".join(diff))
    return "\n".join(lines)


@pytest.mark.parametrize("variant", EQUIVALENTS)
def test_the_chart_renders_what_deploy_renders(helm, work, variant):
    values, parts = EQUIVALENTS[variant]
    chart = _chart_side(template(helm, values, work))
    kustomize = _kustomize_side(_kustomize_parts(parts, work))
    assert chart == kustomize, f"{variant}: the chart and deploy/ differ\n{_diff(chart, kustomize)}"


def _without_tls(objects: dict[Key, dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    out = {}
    for key, obj in objects.items():
        if obj["kind"] in {"Issuer", "Certificate"} or key[2] in {"gpuscale-ca", "gpuscale-adapter-serving-cert"}:
            continue
        if obj["kind"] == "APIService":
            obj["metadata"].pop("annotations", None)
            obj["spec"].pop("caBundle", None)
        out[key] = obj
    return out


def test_the_default_differs_from_deploy_only_in_who_issues_the_certificate(helm, work):
    """By default the chart issues the serving certificate itself (no cert-manager needed); everything else is
    what the cert-manager variant renders, which equals deploy/overlays/prometheus + deploy/controller."""
    default = _chart_side(template(helm, {}, work))
    cert_manager = _chart_side(template(helm, CERT_MANAGER, work))
    assert {k for k in default if k[0] in {"Issuer", "Certificate"}} == set()
    assert {k[2] for k in default if k[0] == "Secret"} == {"gpuscale-ca", "gpuscale-adapter-serving-cert"}
    assert _without_tls(default) == _without_tls(cert_manager)


def _pem(data: dict[str, str], key: str) -> bytes:
    return base64.b64decode(data[key])


def test_the_generated_certificate_is_what_the_aggregator_checks(helm, work):
    objects = _chart_side(template(helm, {"tls": {"validityDays": 400}}, work))
    ca_pem = _pem(objects["Secret", NAMESPACE, "gpuscale-ca"]["data"], "ca.crt")
    serving = objects["Secret", NAMESPACE, "gpuscale-adapter-serving-cert"]
    assert serving["type"] == "kubernetes.io/tls" and _pem(serving["data"], "ca.crt") == ca_pem
    assert set(objects["Secret", NAMESPACE, "gpuscale-ca"]["data"]) == {"ca.crt"}, "the CA's key is not kept"
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(_pem(serving["data"], "tls.crt"))
    key = serialization.load_pem_private_key(_pem(serving["data"], "tls.key"), password=None)
    cert.verify_directly_issued_by(ca)
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert set(names) == {f"gpuscale-adapter.{NAMESPACE}.svc", f"gpuscale-adapter.{NAMESPACE}.svc.cluster.local"}
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert abs(lifetime - datetime.timedelta(days=400)) < datetime.timedelta(days=1)
    apiservices = [o for k, o in objects.items() if k[0] == "APIService"]
    assert len(apiservices) == 3
    for apiservice in apiservices:
        assert base64.b64decode(apiservice["spec"]["caBundle"]) == ca_pem
        assert "insecureSkipTLSVerify" not in apiservice["spec"]


# --- the chart on its own ------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["default", "everything"])
def test_helm_lint_strict(helm, work, values):
    from tests.helm import values_file

    done = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(values_file(values, work)))
    assert done.returncode == 0 and "0 chart(s) failed" in done.stdout, done.stdout + done.stderr


# The EQUIVALENTS render what deploy/ renders, which tests/deploy/test_deploy.py validates; these render what only the
# chart does (generated TLS Secrets, VictoriaMetrics, policy files, placement, monitoring with another TLS mode).
VARIANTS_TO_VALIDATE = {
    "default": {},
    "victoriametrics + policies + placement + everything": {
        **EVERYTHING,
        "metricsSource": {
            "type": "victoriametrics",
            "victoriametrics": {"url": "http://vmselect:8481/select/0/prometheus"},
        },
        "policies": {"health.yaml": "xids: {}\n"},
        "report": {"enabled": True, "configMap": True, "tolerations": [{"key": "gpu", "operator": "Exists"}]},
        "adapter": {"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        "tls": {"mode": "insecure"},
    },
}


@pytest.mark.parametrize("variant", VARIANTS_TO_VALIDATE)
def test_rendered_objects_are_valid_kubernetes(helm, work, variant):
    problems, _ = validation_problems(template(helm, VARIANTS_TO_VALIDATE[variant], work))
    assert not problems, "\n".join(problems)


def test_chart_version_is_the_release_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION


def test_the_chart_reads_deploys_files_not_copies():
    files = CHART / "files"
    assert (files / "metrics.yaml").resolve() == ROOT / "policies" / "metrics.yaml"
    assert (files / "dashboards").resolve() == DEPLOY / "dashboards"
    assert (files / "alerts").resolve() == DEPLOY / "alerts"


def test_a_packaged_chart_renders_the_same(helm, work):
    """`helm package` resolves files/'s links: the archive a user installs carries the dashboards and rules."""
    done = run_helm(helm, "package", str(CHART), "--destination", str(work))
    assert done.returncode == 0, done.stderr
    archive = work / f"gpuscale-{VERSION}.tgz"
    assert template(helm, EVERYTHING, work, chart=archive) == template(helm, EVERYTHING, work)


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    return _pod_template(obj)["spec"]


def _workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] in {"Deployment", "CronJob"}}


def test_values_reach_every_pod(helm, work):
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    placement = {"nodeSelector": {"pool": "system"}, "tolerations": tolerations}
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}
    values = {
        "image": {"repository": "registry.example.com/platform/gpuscale", "tag": "9.9.9", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "platform-critical",
        "priorityClass": {"create": False},
        "adapter": {**placement, "resources": resources, "replicas": 3},
        "controller": {**placement, "resources": resources},
        "report": {"enabled": True, **placement, "resources": resources, "priorityClassName": "batch"},
    }
    objects = template(helm, values, work)
    assert not [o for o in objects if o["kind"] == "PriorityClass"], "priorityClass.create: false makes none"
    workloads = _workloads(objects)
    assert set(workloads) == {"gpuscale-adapter", "gpuscale-controller", "gpuscale-report"}
    for name, obj in workloads.items():
        pod = _pod(obj)
        (container,) = pod["containers"]
        assert container["image"] == "registry.example.com/platform/gpuscale:9.9.9", name
        assert container["imagePullPolicy"] == "Always" and container["resources"] == resources, name
        # Helm merges maps into the defaults: the adapter and controller keep kubernetes.io/os (null removes it).
        linux = {} if name == "gpuscale-report" else {"kubernetes.io/os": "linux"}
        assert pod["nodeSelector"] == {**linux, "pool": "system"} and pod["tolerations"] == tolerations, name
        assert pod["imagePullSecrets"] == [{"name": "regcred"}], name
        assert pod["priorityClassName"] == ("batch" if name == "gpuscale-report" else "platform-critical"), name
    assert workloads["gpuscale-adapter"]["spec"]["replicas"] == 3


def _controller_settings(args: list[str]) -> ControllerSettings:
    parser = argparse.ArgumentParser(prog="gpuscale controller")
    add_arguments(parser, ControllerSettings)
    namespace, extra = parser.parse_known_args(args)
    assert not extra, f"`gpuscale controller` does not know: {extra}"
    return from_arguments(ControllerSettings, namespace)


def _controller_args(helm, work: Path, values: dict[str, Any]) -> list[str]:
    (controller,) = [o for o in template(helm, values, work) if o["metadata"]["name"] == "gpuscale-controller"
                     and o["kind"] == "Deployment"]  # fmt: skip
    return _pod(controller)["containers"][0]["args"]


def test_a_first_install_looks_before_it_acts(helm, work):
    """issue 34: with the defaults the controller only validates and logs its writes; one documented value,
    controller.dryRun=false, makes it act — and that value changes nothing else."""
    default = _controller_args(helm, work, {})
    assert _controller_settings(default).dry_run is True
    acting = _controller_args(helm, work, {"controller": {"dryRun": False}})
    assert _controller_settings(acting).dry_run is False and "--no-dry-run" in acting
    assert [a for a in acting if a != "--no-dry-run"] == [a for a in default if a != "--dry-run"]
    values_yaml = (CHART / "values.yaml").read_text()
    assert "--set controller.dryRun=false" in values_yaml, "values.yaml says how to act"


def _notes(helm, work: Path, values: dict[str, Any]) -> str:
    from tests.helm import values_file

    done = run_helm(helm, "install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE,
                    "--values", str(values_file(values, work)))  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.partition("\nNOTES:\n")[2]


def test_the_notes_say_dry_run_and_the_value_that_acts(helm, work):
    notes = _notes(helm, work, {})
    assert "The controller runs in DRY-RUN" in notes and "--set controller.dryRun=false" in notes, notes
    acting = _notes(helm, work, {"controller": {"dryRun": False}})
    assert "The controller ACTS on nodes" in acting and "DRY-RUN" not in acting, acting


def _alert_rules(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule" and o["metadata"]["name"] == "gpuscale-alerts"]
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_the_runbook_links_point_where_the_value_says(helm, work):
    """issue 34: runbook_url = monitoring.prometheusRules.runbookBaseURL + "#<alert>"; nothing else in the rules
    changes, and the default is the page the shipped rule files carry. `$1` and `&` are taken literally."""
    page = "https://wiki.example.com/ops/gpu$1?space=GPU&v=2"
    shipped = {
        r["alert"]: r
        for g in yaml.safe_load((DEPLOY / "alerts" / "gpuscale-alerts.rules.yaml").read_text())["groups"]
        for r in g["rules"]
    }
    default = _alert_rules(template(helm, {"monitoring": MONITORING_ON}, work))
    assert default == shipped
    values = {"monitoring": {**MONITORING_ON, "prometheusRules": {"enabled": True, "runbookBaseURL": page}}}
    custom = _alert_rules(template(helm, values, work))
    assert custom.keys() == shipped.keys() and len(custom) > 20
    for name, rule in custom.items():
        assert rule["annotations"]["runbook_url"] == f"{page}#{name.lower()}"
        rule["annotations"]["runbook_url"] = shipped[name]["annotations"]["runbook_url"]
    assert custom == shipped
    placeholder = yaml.safe_load((CHART / "values.yaml").read_text())["monitoring"]["prometheusRules"]
    assert {r["annotations"]["runbook_url"].split("#")[0] for r in shipped.values()} == {placeholder["runbookBaseURL"]}
    assert "set monitoring.prometheusRules.runbookBaseURL" in _notes(helm, work, {"monitoring": MONITORING_ON})
    assert "runbookBaseURL" not in _notes(helm, work, values)


# Each lands in every alert's annotations, which Prometheus expands as a Go template: refused with the fix.
RUNBOOK_FIX = "value must be 'an http(s) URL of the runbook page without a #fragment"
BAD_RUNBOOK_PAGES = {
    "a fragment": "https://wiki.example.com/ops#gpu",
    "a template action": "https://wiki.example.com/{{ .Release.Name }}",
    "a space and a comment": "https://wiki.example.com/ops #x",
    "a line break": "https://wiki.example.com/ops\n    severity: none",
    "a quote": "https://wiki.example.com/o'ps",
    "no scheme": "wiki.example.com/ops",
    "a repository path": "docs/operating.md",
    "javascript": "javascript:alert(1)",
}


@pytest.mark.parametrize("case", BAD_RUNBOOK_PAGES)
def test_a_runbook_page_that_is_not_a_plain_url_is_refused_with_the_fix(helm, work, case):
    values = {"monitoring": {"prometheusRules": {"enabled": True, "runbookBaseURL": BAD_RUNBOOK_PAGES[case]}}}
    stderr = _fails(helm, work, values)
    assert "at '/monitoring/prometheusRules/runbookBaseURL'" in stderr and RUNBOOK_FIX in stderr, stderr
    # A render that skips the schema is refused by the template, naming the value.
    skipped = _fails(helm, work, values, "--skip-schema-validation")
    assert "monitoring.prometheusRules.runbookBaseURL: " in skipped, skipped


def test_victoriametrics_and_policies_reach_every_component(helm, work):
    catalogue = (ROOT / "policies" / "metrics.yaml").read_text().replace("max_age: 60s", "max_age: 90s")
    health = (ROOT / "policies" / "health.yaml").read_text()
    url = "http://vmselect-vm.monitoring.svc:8481/select/0/prometheus"
    values = {
        "metricsSource": {"type": "victoriametrics", "victoriametrics": {"url": url}},
        "policies": {"metrics.yaml": catalogue, "health.yaml": health},
        "report": {"enabled": True},
    }
    objects = template(helm, values, work)
    configmaps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    assert configmaps["gpuscale-metrics"] == {"metrics.yaml": catalogue}
    assert configmaps["gpuscale-policies"] == {"health.yaml": health}, "the catalogue is not a --policies file"
    workloads = _workloads(objects)
    for name, obj in workloads.items():
        (container,) = _pod(obj)["containers"]
        assert "--policies=/etc/gpuscale-policies" in container["args"], name
        assert f"--prometheus-url={url}" in container["args"], name
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in _pod(obj)["volumes"]}
        assert volumes[mounts["/etc/gpuscale-policies"]]["configMap"]["name"] == "gpuscale-policies", name
    adapter = _settings(_pod(workloads["gpuscale-adapter"])["containers"][0]["args"])
    assert adapter.prometheus_url == url and adapter.policies == "/etc/gpuscale-policies"
    controller = _controller_settings(_pod(workloads["gpuscale-controller"])["containers"][0]["args"])
    assert controller.prometheus_url == url and controller.policies == "/etc/gpuscale-policies"

    # A changed catalogue rolls the adapter's pods (kustomize does it with the ConfigMap's hash suffix).
    def checksum(v) -> str:
        (adapter,) = [o for o in template(helm, v, work) if o["metadata"]["name"] == "gpuscale-adapter"
                      and o["kind"] == "Deployment"]  # fmt: skip
        return adapter["spec"]["template"]["metadata"]["annotations"]["checksum/policies"]

    assert checksum({}) != checksum({"policies": {"metrics.yaml": catalogue}})


def test_monitoring_labels_select_and_insecure_tls_skips_verification(helm, work):
    values = {
        "monitoring": {**MONITORING_ON, "labels": {"release": "kube-prometheus-stack"}},
        "tls": {"mode": "insecure"},
    }
    objects = template(helm, values, work)
    monitoring = [o for o in objects if o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert {o["kind"] for o in monitoring} == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert all(o["metadata"]["labels"]["release"] == "kube-prometheus-stack" for o in monitoring)
    (service_monitor,) = [o for o in monitoring if o["kind"] == "ServiceMonitor"]
    assert service_monitor["spec"]["endpoints"][0]["tlsConfig"] == {"insecureSkipVerify": True}
    dashboards = [o for o in objects if o["metadata"]["name"].startswith("gpuscale-dashboard-")]
    assert len(dashboards) == len(list((DEPLOY / "dashboards").glob("*.json"))) > 0


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and selector.items() <= labels.items()


def test_the_monitors_select_the_charts_service_and_pods(helm, work):
    """issue 24: the ServiceMonitor and PodMonitor select what the chart deploys, on ports it names."""
    objects = template(helm, {"monitoring": MONITORING_ON}, work)
    by_kind = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    service = by_kind["Service", "gpuscale-adapter"]
    service_monitor = by_kind["ServiceMonitor", "gpuscale-adapter"]["spec"]
    assert _selects(service_monitor["selector"]["matchLabels"], service["metadata"]["labels"])
    assert {e["port"] for e in service_monitor["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    controller = _pod_template(by_kind["Deployment", "gpuscale-controller"])
    pod_monitor = by_kind["PodMonitor", "gpuscale-controller"]["spec"]
    assert _selects(pod_monitor["selector"]["matchLabels"], controller["metadata"]["labels"])
    ports = {p["name"] for c in controller["spec"]["containers"] for p in c["ports"]}
    assert {e["port"] for e in pod_monitor["podMetricsEndpoints"]} <= ports
    adapter = _pod_template(by_kind["Deployment", "gpuscale-adapter"])
    assert not _selects(pod_monitor["selector"]["matchLabels"], adapter["metadata"]["labels"])
    # The dcgm-exporter PodMonitor selects what the embedded scraper discovers (one selector, two values).
    dcgm = by_kind["PodMonitor", "dcgm-exporter"]["spec"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    selector = ",".join(f"{k}={v}" for k, v in dcgm["selector"]["matchLabels"].items())
    assert selector == values["metricsSource"]["embedded"]["dcgmExporterSelector"]


def test_one_adapter_replica_gets_no_disruption_budget(helm, work):
    """minAvailable 1 over one replica would block every node drain."""
    kinds = {o["kind"] for o in template(helm, {"adapter": {"replicas": 1}}, work)}
    assert "Deployment" in kinds and "PodDisruptionBudget" not in kinds


# values.schema.json: helm reports every violation of one file together, so one render checks them all.
SCHEMA_VIOLATIONS = {
    "adapter": {"replica": 3, "extraArgs": ["scrape-url=x"]},
    "metricsSource": {"type": "influx"},
    "tls": {"mode": "self-signed"},
    "policies": {"healt.yaml": "x"},
}
SCHEMA_MESSAGES = (
    "additional properties 'replica' not allowed",
    "/adapter/extraArgs/0",
    "/metricsSource/type",
    "/tls/mode",
    "'healt.yaml' not allowed",
)
# What the schema cannot say: the templates fail with the field and what to do.
BAD_COMBINATIONS = {
    "victoriametrics without url": (
        {"metricsSource": {"type": "victoriametrics"}},
        "metricsSource.victoriametrics.url: required",
    ),
    "no api at all": ({"apiServices": {"custom": False, "external": False}}, "apiServices: custom and external"),
    "report without history": (
        {"metricsSource": {"type": "embedded"}, "report": {"enabled": True}},
        "report.enabled: the report reads history from a Prometheus",
    ),
}


def _fails(helm, work, values, *args: str) -> str:
    from tests.helm import values_file

    done = run_helm(helm, "template", RELEASE, str(CHART), "--values", str(values_file(values, work)), *args)
    assert done.returncode != 0, f"helm template accepted {values}"
    return done.stderr


def test_values_outside_the_schema_fail_naming_each_field(helm, work):
    stderr = _fails(helm, work, SCHEMA_VIOLATIONS)
    missing = [m for m in SCHEMA_MESSAGES if m not in stderr]
    assert not missing, f"not named: {missing}\n{stderr}"


@pytest.mark.parametrize("case", BAD_COMBINATIONS)
def test_values_that_cannot_work_together_fail_naming_the_field(helm, work, case):
    values, message = BAD_COMBINATIONS[case]
    assert message in _fails(helm, work, values)


def test_a_kubernetes_older_than_supported_is_refused_by_name(helm, work):
    assert "Kubernetes v1.29.3: gpuscale needs 1.30 or newer" in _fails(helm, work, {}, "--kube-version", "1.29.3")


# issue 34: quantities and durations are refused at render time, naming the value and the fix. helm prints a
# failed keyword's own message only (never a description): the schema's hint is a branch that never validates,
# whose message is "value must be '<the fix>'".
QUANTITY_FIX = "value must be 'a Kubernetes quantity: a number and an optional unit, as in 512Mi, 2Gi, 500m or 1'"
DURATION_FIX = "value must be 'digits and a unit (ms, s, m, h or d): write 5s, not 5'"
REPORT = {"enabled": True}
REFUSED_AT_RENDER = {  # values → (the pointer helm names, the fix it prints)
    "memory limit 'lots'": (
        {"controller": {"resources": {"limits": {"memory": "lots"}}}},
        "/controller/resources/limits/memory",
        QUANTITY_FIX,
    ),
    "memory request '2 Gi'": (
        {"adapter": {"resources": {"requests": {"memory": "2 Gi"}}}},
        "/adapter/resources/requests/memory",
        QUANTITY_FIX,
    ),
    "negative cpu": (
        {"adapter": {"resources": {"requests": {"cpu": -1}}}},
        "/adapter/resources/requests/cpu",
        QUANTITY_FIX,
    ),
    "cpu '1 core'": (
        {"report": {**REPORT, "resources": {"limits": {"cpu": "1 core"}}}},
        "/report/resources/limits/cpu",
        QUANTITY_FIX,
    ),
    "gpu '-1'": (
        {"controller": {"resources": {"limits": {"nvidia.com/gpu": "-1"}}}},
        "/controller/resources/limits/nvidia.com~1gpu",
        QUANTITY_FIX,
    ),
    "volume size 'big'": (
        {"report": {**REPORT, "persistence": {"size": "big"}}},
        "/report/persistence/size",
        QUANTITY_FIX,
    ),
    "misspelt 'limit'": (
        {"controller": {"resources": {"limit": {"memory": "1Gi"}}}},
        "/controller/resources",
        "'limit' not allowed",
    ),
    "refreshInterval 5": ({"adapter": {"refreshInterval": 5}}, "/adapter/refreshInterval", DURATION_FIX),
    "refreshInterval '5'": ({"adapter": {"refreshInterval": "5"}}, "/adapter/refreshInterval", DURATION_FIX),
    "interval '1.5m'": ({"controller": {"interval": "1.5m"}}, "/controller/interval", DURATION_FIX),
    "timeout '10 s'": ({"metricsSource": {"timeout": "10 s"}}, "/metricsSource/timeout", DURATION_FIX),
    "window '1w'": ({"report": {**REPORT, "window": "1w"}}, "/report/window", DURATION_FIX),
}


@pytest.mark.parametrize("case", REFUSED_AT_RENDER)
def test_a_quantity_or_duration_is_refused_naming_the_value_and_the_fix(helm, work, case):
    values, pointer, fix = REFUSED_AT_RENDER[case]
    stderr = _fails(helm, work, values)
    assert f"at '{pointer}'" in stderr and fix in stderr, stderr


def test_quantities_kubernetes_accepts_reach_the_pods(helm, work):
    resources = {
        "requests": {"cpu": "100m", "memory": "0.5Gi", "ephemeral-storage": "1e9"},
        "limits": {"cpu": 2, "memory": 1073741824, "nvidia.com/gpu": "1"},
    }
    objects = template(helm, {"controller": {"resources": resources}, "adapter": {"refreshInterval": "500ms"}}, work)
    (container,) = _pod(_workloads(objects)["gpuscale-controller"])["containers"]
    assert container["resources"] == resources
    problems, _ = validation_problems(objects)
    assert not problems, "\n".join(problems)


# issue 34: a catalogue (or another policy file) passed through values that cannot be one fails the render with one
# line naming the file; the components check every field at start.
# tests/hostile/test_chart_policies.py tries bombs, nesting, sizes and what only gpuscale's start refuses.
BAD_POLICY_FILES = {
    "not YAML": ("metrics.yaml", "metrics: [gpu_utilization", "policies.metrics.yaml: not YAML with keys at the top"),
    "a list": ("metrics.yaml", "- name: x\n  series: [X]\n", "policies.metrics.yaml: not YAML with keys at the top"),
    "no metrics": ("metrics.yaml", "defaults: {max_age: 60s}\n", "policies.metrics.yaml: needs a `metrics:` list"),
    "metrics empty": ("metrics.yaml", "metrics: []\n", "policies.metrics.yaml: needs a `metrics:` list"),
    "an entry without name": (
        "metrics.yaml",
        "metrics:\n  - name: a\n    series: [X]\n  - help: no name\n",
        "policies.metrics.yaml: metrics[1] is not a metric entry with a name",
    ),
    "past a ConfigMap's 1 MiB": (
        "metrics.yaml",
        "#" + "x" * 2**20 + "\nmetrics: [{name: a}]\n",
        "policies.metrics.yaml: 1048599 bytes; its ConfigMap gpuscale-metrics holds at most 1 MiB",
    ),
    "health.yaml not YAML": ("health.yaml", "xids: {79: [", "policies.health.yaml: not YAML with keys at the top"),
}


@pytest.mark.parametrize("case", BAD_POLICY_FILES)
def test_a_policy_file_that_cannot_be_one_fails_the_render_naming_it(helm, work, case):
    file, text, message = BAD_POLICY_FILES[case]
    stderr = _fails(helm, work, {"policies": {file: text}})
    (error,) = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert message in error, stderr


def test_the_shipped_policy_files_pass_the_render_check(helm, work):
    policies = {p.name: p.read_text() for p in (ROOT / "policies").glob("*.yaml")}
    assert "metrics.yaml" in policies and len(policies) > 5
    configmaps = {
        o["metadata"]["name"]: o for o in template(helm, {"policies": policies}, work) if o["kind"] == "ConfigMap"
    }
    assert configmaps["gpuscale-metrics"]["data"] == {"metrics.yaml": policies["metrics.yaml"]}


def test_karpenter_nodepools_get_their_flags_and_rbac_narrowed_to_their_names(helm, work):
    """controller.karpenterNodePools: one --karpenter-nodepool per name, NodePools listed and watched, and only
    those names read back and patched; without the value no NodePool RBAC at all."""
    values = {"controller": {"karpenterNodePools": ["gpu-h100", "gpu-a100"]}}
    settings = _controller_settings(_controller_args(helm, work, values))
    assert settings.karpenter_nodepool == ["gpu-h100", "gpu-a100"] and settings.expander
    objects = template(helm, values, work)
    (role,) = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("karpenter-weights")]
    assert role["rules"] == [
        {"apiGroups": ["karpenter.sh"], "resources": ["nodepools"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["karpenter.sh"],
            "resources": ["nodepools"],
            "resourceNames": ["gpu-h100", "gpu-a100"],
            "verbs": ["get", "patch"],
        },
    ]
    default = template(helm, {}, work)
    assert not [r for o in default if o["kind"] == "ClusterRole" for r in o["rules"] if "nodepools" in r["resources"]]
