"""deploy/controller: what `kubectl apply -k deploy/controller` sends, and that its RBAC is exactly enough.

Rendered by the real `kubectl kustomize` (alone and with each component), validated strictly against the Kubernetes
OpenAPI schemas (kubernetes-validate), container args accepted by the controller's own parser. The RBAC check is a
replay: a controller (health with drain, hints, leader election) remediates a node, recovers it and remediates it
again against the simulated API, and every request it made must be allowed by the rendered rules (matched as RBAC
matches, by the simulated API's SubjectAccessReview logic) — and every rule must have been used, so no grant is
there for nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
import yaml

from gpuscale.cli.controller import pool_activity, watch_specs
from gpuscale.controller.capacity import ExpanderPlanner, GangCapacityPlanner
from gpuscale.controller.health import HealthActions
from gpuscale.controller.hints import HintActions, HintsPlanner, load_hints_policy
from gpuscale.controller.leader import LeaseElector
from gpuscale.controller.pools import load_pools_policy
from gpuscale.pricing import load_prices
from gpuscale.settings import ControllerSettings, add_arguments, from_arguments
from gpuscale.sim.crds import BATCH_SCHEDULING_CRDS
from gpuscale.sim.exporters import ManualClock
from gpuscale.sim.kubeapi import AccessRule
from tests.controller.harness import NAMESPACE, start_harness
from tests.deploy.kube_schemas import validate
from tests.deploy.test_deploy import KUBECTL, KUBERNETES_VERSIONS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "controller"
COMPONENTS = ("drain", "safe-to-evict", "act", "dry-run", "embedded-scrape", "karpenter-weights")
VARIANTS = ("", *COMPONENTS, "+".join(c for c in COMPONENTS if c != "dry-run"), "+".join(COMPONENTS))
SA = "system:serviceaccount:gpuscale:gpuscale-controller"
GANG_LABEL = "scheduling.x-k8s.io/pod-group"
GPU = "nvidia.com/gpu"


@cache
def render(variant: str, root: Path) -> tuple[dict[str, Any], ...]:
    proc = _kustomize(variant, root)
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def _kustomize(variant: str, root: Path) -> subprocess.CompletedProcess[str]:
    target = DEPLOY
    if variant:
        target = root / variant.replace("+", "_")
        target.mkdir(parents=True, exist_ok=True)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY, target)],
            "components": [os.path.relpath(DEPLOY / "components" / c, target) for c in variant.split("+")],
        }
        (target / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return subprocess.run(
        [KUBECTL, "kustomize", str(target)],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": "/dev/null"},
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("controller-variants")


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_are_valid_kubernetes(root, variant):
    problems = []
    for obj in render(variant, root):
        for version in KUBERNETES_VERSIONS:
            try:
                validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{obj['kind']} {obj['metadata']['name']} ({version}): {e.message}")
    assert not problems, "\n".join(problems)


def _parsed(args: list[str]) -> ControllerSettings:
    """The settings `gpuscale controller` runs with, given these container args."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, ControllerSettings)
    return from_arguments(ControllerSettings, parser.parse_args(args))


def container(objects) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_args_are_what_the_controller_accepts(root, variant):
    c = container(render(variant, root))
    assert c["command"] == ["gpuscale", "controller"]
    settings = _parsed(c["args"])
    assert settings.health_drain is ("drain" in variant)
    assert settings.hint_safe_to_evict is ("safe-to-evict" in variant)
    assert settings.dry_run is ("act" not in variant or "dry-run" in variant), "dry-run unless components/act alone"
    assert settings.discover_exporters is ("embedded-scrape" in variant)
    assert (settings.prometheus.url is None) is ("embedded-scrape" in variant)
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    assert settings.port == port
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def _controller_args(variant: str, root: Path) -> list[str]:
    return container(render(variant, root))["args"]


def test_kubectl_apply_k_looks_before_it_acts(root):
    """issue 34: `kubectl apply -k deploy/controller` only validates and logs; components/act (one line in a
    kustomization) turns acting on, saying so in the args rather than by leaving a flag out."""
    assert "--dry-run" in _controller_args("", root) and "--no-dry-run" not in _controller_args("", root)
    acting = _controller_args("act", root)
    assert "--no-dry-run" in acting and "--dry-run" not in acting
    # Acting changes that one argument, nothing else.
    assert [a for a in acting if a != "--no-dry-run"] == [a for a in _controller_args("", root) if a != "--dry-run"]


def test_components_dry_run_wins_over_act_in_either_order(root):
    """A kustomization that lists components/dry-run (the way to dry-run before it was the default) keeps looking
    even where a shared base it builds on lists components/act."""
    assert _parsed(_controller_args("act", root)).dry_run is False
    for variant in ("act+dry-run", "dry-run+act"):
        assert _parsed(_controller_args(variant, root)).dry_run is True, variant


def access_rules(objects) -> list[AccessRule]:
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"] in ("ClusterRole", "Role")}
    rules = []
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if not any(f"system:serviceaccount:{s['namespace']}:{s['name']}" == SA for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        namespace = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        for rule in role["rules"]:
            rules.append(
                AccessRule(
                    users=frozenset({SA}),
                    verbs=frozenset(rule["verbs"]),
                    api_groups=frozenset(rule["apiGroups"]),
                    resources=frozenset(rule["resources"]),
                    resource_names=frozenset(rule.get("resourceNames", ())),
                    namespace=namespace,
                )
            )
    return rules


def _selected_name(field_selector: str) -> str:
    """The name a list or watch is authorized for, as the API server's RequestInfo sets it: the value of a
    ``metadata.name=`` (or ``==``) term of its field selector, "" without one."""
    for term in field_selector.split(","):
        for operator in ("==", "="):
            key, found, value = term.partition(operator)
            if found and key == "metadata.name" and not value.startswith("="):
                return value
    return ""


def attributes(method: str, path_qs: str) -> dict[str, Any] | None:
    """A request's SubjectAccessReview resourceAttributes (None for discovery, which every user may read)."""
    url = urlsplit(path_qs)
    parts = [p for p in url.path.split("/") if p]
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if not rest:
        return None
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    name = rest[1] if len(rest) > 1 else ""
    query = parse_qs(url.query)
    watch = query.get("watch", ["false"])[0] in ("1", "true")
    verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
    if verb is None:
        verb = "get" if name else ("watch" if watch else "list")
        if not name:
            name = _selected_name(query.get("fieldSelector", [""])[0])
    return {
        "verb": verb,
        "group": group,
        "resource": rest[0],
        "subresource": rest[2] if len(rest) > 2 else "",
        "name": name,
        "namespace": namespace,
    }


async def test_rbac_allows_every_call_the_planners_make_and_nothing_unused(root, tmp_path):
    rules = access_rules(render("drain", root))
    clock = ManualClock()
    settings = ControllerSettings(prometheus_url="http://unused", health_drain=True)
    pools = load_pools_policy()
    planners = (
        HintsPlanner(load_hints_policy(), HintActions()),
        GangCapacityPlanner(pools, prices=load_prices()),
        ExpanderPlanner(pools, prices=load_prices(), activity=pool_activity(pools)),
    )
    h = await start_harness(
        tmp_path,
        nodes=10,
        actions=HealthActions(drain=True),
        extra_planners=planners,
        specs=watch_specs(settings, pools),
        seed=BATCH_SCHEDULING_CRDS,  # the Volcano Job CRD included
    )
    try:
        elector = LeaseElector(h.rest, namespace=NAMESPACE, name="gpuscale-controller", identity="a", monotonic=clock)
        h.api.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "job", "namespace": "default"},
                "spec": {"nodeName": "gpu-01", "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running"},
            }
        )
        # A pending coscheduling gang of two one-GPU pods.
        group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup"}
        h.api.create({**group, "metadata": {"name": "tp", "namespace": "default"}, "spec": {"minMember": 2}})
        for i in range(2):
            h.api.create(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"tp-{i}", "namespace": "default", "labels": {GANG_LABEL: "tp"}},
                    "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {GPU: "1"}}}]},
                    "status": {"phase": "Pending"},
                }
            )
        mark = len(h.api.requests)
        await elector.try_acquire_or_renew()
        clock.advance(2)
        await elector.try_acquire_or_renew()
        # Remediate and drain, recover; remediate again (the same Event repeats) and one more node (breaker state).
        for bad in (["gpu-01"], ["gpu-01", "gpu-03"]):
            for name in bad:
                h.exporters.sim.override_gpu(name, 0, last_xid=79, xid_window=((79, 1),))
            await h.reconcile()
            await h.reconcile()
            h.exporters.sim.clear_overrides()
            await h.reconcile_until_recovered()
        assert h.api.list("autoscaling.x-k8s.io/v1", "ProvisioningRequest"), "the gang got its request"
        # The gang goes (its request and template are deleted); a new pool re-ranks the expander's ConfigMap.
        h.api.delete("scheduling.x-k8s.io/v1alpha1", "PodGroup", "tp", namespace="default")
        for i in range(2):
            h.api.delete("v1", "Pod", f"tp-{i}", namespace="default")
        h.api.patch("v1", "Node", "gpu-05", {"metadata": {"labels": {"eks.amazonaws.com/nodegroup": "gpu-b"}}})
        await h.reconcile()
        assert not h.api.list("autoscaling.x-k8s.io/v1", "ProvisioningRequest")
        requests = [attributes(r.method, r.path_qs) for r in list(h.api.requests)[mark:]]
    finally:
        await h.close()
    used = set()
    denied = []
    for attrs in filter(None, requests):
        spec = {"user": SA, "resourceAttributes": attrs}
        allowing = [i for i, rule in enumerate(rules) if rule.allows(spec)]
        if not allowing:
            denied.append(attrs)
        used.update(allowing)
        if attrs["verb"] == "list":  # NB: a cache that lists also watches (the replay lists without watching)
            watch = {"user": SA, "resourceAttributes": {**attrs, "verb": "watch"}}
            used.update(i for i, rule in enumerate(rules) if rule.allows(watch))
    assert not denied, f"the controller needs, and RBAC does not grant: {denied}"
    unused = [rules[i] for i in range(len(rules)) if i not in used]
    assert not unused, f"granted but never used: {unused}"


def test_only_drain_and_karpenter_weights_add_rbac(root):
    def grants(variant: str) -> set:
        return {(r.verbs, r.api_groups, r.resources, r.resource_names) for r in access_rules(render(variant, root))}

    base = grants("")
    assert grants("safe-to-evict") == grants("dry-run") == grants("act") == grants("embedded-scrape") == base
    extra = grants("drain") - base
    assert sorted((sorted(v), sorted(res)) for v, _, res, _ in extra) == [
        (["create"], ["pods/eviction"]),
        (["list", "watch"], ["poddisruptionbudgets"]),
    ]
    weights = grants("karpenter-weights") - base
    assert [(sorted(v), sorted(g), sorted(res), sorted(names)) for v, g, res, names in weights] == [
        (["get", "list", "patch", "watch"], ["karpenter.sh"], ["nodepools"], [])
    ]
