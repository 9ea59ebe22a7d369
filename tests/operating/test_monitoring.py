"""deploy/monitoring, deploy/dashboards: the prometheus-operator objects and the Grafana sidecar ConfigMaps.

Rendered by the real `kubectl kustomize`: the ServiceMonitor and PodMonitors select exactly the Services and Pods
deploy/ renders (adapter Service and port, controller pods and port, the dcgm-exporter pods the embedded-scrape
overlay discovers), the component adds them to an overlay, and each dashboard ConfigMap carries its JSON as committed
under the sidecar's label.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import yaml

from tests.deploy.test_deploy import DEPLOY, _kustomize


def render(path: str) -> list[dict]:
    return _kustomize(DEPLOY / path)


def one(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_the_monitoring_objects_are_the_expected_ones():
    kinds = sorted((o["kind"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in render("monitoring"))
    assert kinds == [
        ("PodMonitor", "dcgm-exporter", "gpuscale"),
        ("PodMonitor", "gpuscale-controller", "gpuscale"),
        ("PrometheusRule", "gpuscale-alerts", "gpuscale"),
        ("PrometheusRule", "gpuscale-recording", "gpuscale"),
        ("ServiceMonitor", "gpuscale-adapter", "gpuscale"),
    ]
    for o in render("monitoring"):
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpuscale"


def test_servicemonitor_selects_the_adapter_service_and_its_port():
    monitor = one(render("monitoring"), "ServiceMonitor", "gpuscale-adapter")
    services = [o for o in render("overlays/prometheus") if o["kind"] == "Service"]
    selected = [
        s for s in services if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == ["gpuscale-adapter"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["serverName"] == "gpuscale-adapter.gpuscale.svc"
    # the CA secret is the one deploy/components/cert-manager issues
    secrets = {o["spec"].get("secretName") for o in render("overlays/prometheus") if o["kind"] == "Certificate"}
    assert endpoint["tlsConfig"]["ca"]["secret"]["name"] in secrets


def test_podmonitor_selects_the_controller_pods_and_their_port():
    monitor = one(render("monitoring"), "PodMonitor", "gpuscale-controller")
    deployments = [o for o in render("controller") if o["kind"] == "Deployment"]
    selected = [
        d
        for d in deployments
        if monitor["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert [d["metadata"]["name"] for d in selected] == ["gpuscale-controller"]
    ports = {p["name"] for c in selected[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports
    assert monitor["metadata"]["namespace"] == selected[0]["metadata"]["namespace"]


def test_dcgm_podmonitor_selects_what_the_embedded_scrape_discovers():
    monitor = one(render("monitoring"), "PodMonitor", "dcgm-exporter")
    args = [
        a
        for o in render("overlays/embedded-scrape")
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
        for a in c.get("args", [])
    ]
    (selector,) = [a.split("=", 1)[1] for a in args if a.startswith("--dcgm-exporter-selector=")]
    assert dict(kv.split("=") for kv in selector.split(",")) == monitor["spec"]["selector"]["matchLabels"]
    # the GPU Operator's namespace, as deploy/dcgm-exporter's ConfigMap for it
    counters = render("dcgm-exporter")
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [counters[0]["metadata"]["namespace"]]
    assert monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True


def test_the_component_adds_the_monitoring_objects_to_an_overlay(tmp_path):
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "overlays/prometheus", tmp_path)],
        "components": [os.path.relpath(DEPLOY / "components/monitoring", tmp_path)],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    from tests.deploy.test_deploy import _kustomize as kustomize

    objects = kustomize(tmp_path)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "APIService", "ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds


def test_dashboard_configmaps_carry_the_committed_json_for_the_sidecar():
    objects = render("dashboards")
    files = sorted(p.stem for p in (DEPLOY / "dashboards").glob("*.json"))
    assert sorted(o["metadata"]["name"].removeprefix("gpuscale-dashboard-") for o in objects) == files
    uids = set()
    for o in objects:
        assert o["metadata"]["labels"]["grafana_dashboard"] == "1"
        name = o["metadata"]["name"].removeprefix("gpuscale-dashboard-")
        ((key, text),) = o["data"].items()
        assert key == f"gpuscale-{name}.json"
        assert text == (DEPLOY / "dashboards" / f"{name}.json").read_text()
        board = json.loads(text)
        uids.add(board["uid"])
        assert re.fullmatch(r"gpuscale-[a-z-]+", board["uid"])
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
    assert len(uids) == len(objects)


def test_dashboards_are_generated_not_hand_written():
    generator = (Path(DEPLOY) / "generator" / "dashboards.py").read_text()
    assert "grafana_foundation_sdk" in generator


def test_dashboards_offer_the_template_variables_operators_filter_by():
    seen: dict[str, set[str]] = {}
    for path in (DEPLOY / "dashboards").glob("*.json"):
        board = json.loads(path.read_text())
        names = {v["name"] for v in board["templating"]["list"]}
        assert {"datasource", "cluster"} <= names, path.name
        for v in board["templating"]["list"]:
            seen.setdefault(v["name"], set()).add(path.stem)
            if v["type"] == "query":  # every query variable can be All (".*" also matches a missing label)
                assert v["includeAll"] and v["multi"] and v["allValue"] == ".*", (path.name, v["name"])
        for p in board["panels"]:
            for t in p.get("targets", []):
                used = set(re.findall(r"\$([A-Za-z_]\w*)", t["expr"])) - {"__range"}  # $1: label_replace
                assert used <= names, f"{path.name} {p['title']!r} uses undefined variables {used - names}"
    assert {"cluster", "namespace", "pool", "node", "model", "job"} <= seen.keys()
    assert "job" in {v for v in seen if "training" in seen[v]} and "model" in {
        v for v in seen if "inference" in seen[v]
    }


def test_the_documented_overlay_points_every_runbook_link_at_your_page(tmp_path):
    """issue 34: docs/operating.md's kustomize overlay, as written there, rewrites the page of every runbook_url,
    keeps each alert's anchor, changes nothing else and applies no extra object."""
    docs = (Path(DEPLOY).parent / "docs" / "operating.md").read_text()
    (block,) = re.findall(r"```yaml\n( *# my-monitoring/kustomization.yaml\n.*?)```", docs, re.S)
    overlay = tmp_path / "my-monitoring"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(textwrap.dedent(block))
    (tmp_path / "deploy").symlink_to(DEPLOY)
    (page,) = re.findall(r"literals: \[page=(\S+)\]", block)
    objects = _kustomize(overlay)
    shipped = render("monitoring")
    key = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert key == [(o["kind"], o["metadata"]["name"]) for o in shipped]
    rules = one(objects, "PrometheusRule", "gpuscale-alerts")
    alerts = [r for g in rules["spec"]["groups"] for r in g["rules"]]
    assert len(alerts) > 20
    for rule in alerts:
        assert rule["annotations"]["runbook_url"] == f"{page}#{rule['alert'].lower()}"
    before = one(shipped, "PrometheusRule", "gpuscale-alerts")
    for rule, old in zip(alerts, [r for g in before["spec"]["groups"] for r in g["rules"]], strict=True):
        rule["annotations"]["runbook_url"] = old["annotations"]["runbook_url"]
    assert objects == shipped
