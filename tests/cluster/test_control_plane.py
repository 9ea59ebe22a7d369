"""The harness itself: the real control plane answers as Kubernetes, and the tests' kubelet makes workloads run."""

from __future__ import annotations

import time

import pytest

from tests.cluster.kubelet import FakeKubelet, make_node

pytestmark = pytest.mark.e2e


def _deployment(name: str, replicas: int) -> dict:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "harness"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "none"}]}},
        },
    }


def test_a_deployment_runs_on_the_tests_nodes_through_the_real_controllers(control_plane):
    rest = control_plane.rest()
    rest.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "harness"}}).expect(
        201
    )
    node = make_node(rest, "harness-node", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    rest.post("/apis/apps/v1/namespaces/harness/deployments", _deployment("web", 3)).expect(201)
    with FakeKubelet(rest, namespaces=["harness"], nodes=["harness-node"]) as kubelet:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready = rest.get("/apis/apps/v1/namespaces/harness/deployments/web").body.get("status", {})
            if ready.get("readyReplicas") == 3:
                break
            time.sleep(0.2)
        assert ready.get("readyReplicas") == 3, ready
        pods = rest.get("/api/v1/namespaces/harness/pods", labelSelector="app=web").body["items"]
        assert {p["spec"]["nodeName"] for p in pods} == {"harness-node"}
        assert not kubelet.errors


def test_the_real_authorizer_denies_a_user_without_rbac(control_plane):
    answer = control_plane.rest("nobody").get("/api/v1/namespaces/default/pods")
    assert answer.status == 403 and answer.reason == "Forbidden", answer


def test_services_get_loopback_cluster_ips_the_aggregator_can_dial(control_plane):
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"ports": [{"port": 443}]},
    }
    created = control_plane.rest().post("/api/v1/namespaces/default/services", svc).expect(201)
    assert created["spec"]["clusterIP"].startswith("127.1.")
