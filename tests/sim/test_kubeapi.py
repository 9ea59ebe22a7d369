"""The simulated Kubernetes API server behaves like kube-apiserver where clients can tell.

Scope: discovery, CRUD with resourceVersions and conflicts, patches (merge, strategic, JSON, apply), the status
and scale subresources, selectors, paging, validation, watches (resume, selectors, timeouts, bookmarks, 410 after
compaction), authentication, Tables — over raw HTTP, through kubernetes-asyncio, and through the real kubectl.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.config import new_client_from_config

from gpuscale.sim.kubeapi import ApiStatusError, SimKubeApi

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


def pod(name: str, namespace: str = "default", *, labels: dict[str, str] | None = None, **spec: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/tritonserver:24.08"}], **spec},
    }


def deployment(name: str, namespace: str = "default", *, replicas: int = 1, app: str | None = None) -> dict:
    labels = {"app": app or name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


@pytest.fixture
async def sim():
    api = SimKubeApi(bookmark_interval_seconds=0.2)
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
async def http(sim):
    async with aiohttp.ClientSession(sim.url, headers={"Authorization": "Bearer test-token"}) as session:
        yield session


async def call(http: aiohttp.ClientSession, method: str, path: str, *, status: int = 200, **kwargs: Any) -> Any:
    async with http.request(method, path, **kwargs) as resp:
        body = await resp.json(content_type=None)
        assert resp.status == status, (method, path, resp.status, body)
        return body


def assert_status(body: dict, code: int, reason: str) -> None:
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == code and body["reason"] == reason, body
    assert body["message"]


# --- discovery --------------------------------------------------------------------------------------

DISCOVERY = [
    ("/version", lambda b: b["major"] == "1" and b["minor"] == "32"),
    ("/api", lambda b: b["kind"] == "APIVersions" and b["versions"] == ["v1"]),
    ("/apis", lambda b: {g["name"] for g in b["groups"]} >= {"apps", "coordination.k8s.io", "events.k8s.io"}),
    ("/apis/apps", lambda b: b["kind"] == "APIGroup" and b["preferredVersion"]["groupVersion"] == "apps/v1"),
    (
        "/api/v1",
        lambda b: (
            {"pods", "pods/status", "nodes", "namespaces", "configmaps", "events", "services"}
            <= {r["name"] for r in b["resources"]}
        ),
    ),
    (
        "/apis/apps/v1",
        lambda b: (
            {"deployments", "deployments/scale", "statefulsets/scale", "statefulsets/status"}
            <= {r["name"] for r in b["resources"]}
        ),
    ),
    ("/apis/coordination.k8s.io/v1", lambda b: [r["name"] for r in b["resources"]] == ["leases"]),
    ("/apis/events.k8s.io/v1", lambda b: [r["name"] for r in b["resources"]] == ["events"]),
]


@pytest.mark.parametrize(("path", "check"), DISCOVERY)
async def test_discovery(http, path, check):
    assert check(await call(http, "GET", path))


async def test_resource_list_entries_carry_what_kubectl_needs(http):
    resources = {r["name"]: r for r in (await call(http, "GET", "/apis/apps/v1"))["resources"]}
    deploy = resources["deployments"]
    assert deploy["kind"] == "Deployment" and deploy["namespaced"] is True and deploy["shortNames"] == ["deploy"]
    assert set(deploy["verbs"]) >= {"create", "delete", "get", "list", "patch", "update", "watch"}
    scale = resources["deployments/scale"]
    assert (scale["group"], scale["version"], scale["kind"]) == ("autoscaling", "v1", "Scale")
    core = {r["name"]: r for r in (await call(http, "GET", "/api/v1"))["resources"]}
    assert core["nodes"]["namespaced"] is False and core["pods"]["shortNames"] == ["po"]
    assert core["namespaces"]["shortNames"] == ["ns"] and core["configmaps"]["shortNames"] == ["cm"]


NOT_FOUND_PATHS = ["/apis/nope", "/apis/apps/v2", "/api/v1/widgets", "/api/v1/namespaces/default/nodes", "/openapi/v2"]


@pytest.mark.parametrize("path", NOT_FOUND_PATHS)
async def test_unknown_paths_are_404_status(http, path):
    async with http.get(path) as resp:
        assert resp.status == 404
        if path != "/openapi/v2":
            assert_status(await resp.json(), 404, "NotFound")


# --- CRUD -------------------------------------------------------------------------------------------


async def test_create_get_list_delete(http, sim):
    created = await call(http, "POST", "/api/v1/namespaces/default/pods", json=pod("p1"), status=201)
    meta = created["metadata"]
    assert created["kind"] == "Pod" and created["apiVersion"] == "v1"
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and int(meta["resourceVersion"]) > 0
    assert created["status"] == {"phase": "Pending"}
    assert created["spec"]["restartPolicy"] == "Always"  # API defaults are applied

    got = await call(http, "GET", "/api/v1/namespaces/default/pods/p1")
    assert got == created

    listed = await call(http, "GET", "/api/v1/namespaces/default/pods")
    assert listed["kind"] == "PodList" and listed["apiVersion"] == "v1"
    assert listed["metadata"]["resourceVersion"] == sim.resource_version
    assert [i["metadata"]["name"] for i in listed["items"]] == ["p1"]
    assert "kind" not in listed["items"][0]  # kube-apiserver leaves TypeMeta off list items

    deleted = await call(http, "DELETE", "/api/v1/namespaces/default/pods/p1")
    assert deleted["metadata"]["uid"] == meta["uid"]
    assert_status(await call(http, "GET", "/api/v1/namespaces/default/pods/p1", status=404), 404, "NotFound")


async def test_errors_are_kube_statuses(http):
    await call(http, "POST", "/api/v1/namespaces/default/pods", json=pod("p1"), status=201)
    exists = await call(http, "POST", "/api/v1/namespaces/default/pods", json=pod("p1"), status=409)
    assert_status(exists, 409, "AlreadyExists")
    assert exists["message"] == 'pods "p1" already exists'
    assert exists["details"] == {"name": "p1", "kind": "pods"}

    missing = await call(http, "GET", "/apis/apps/v1/namespaces/default/deployments/x", status=404)
    assert missing["message"] == 'deployments.apps "x" not found'
    assert missing["details"] == {"name": "x", "kind": "deployments", "group": "apps"}

    no_ns = await call(http, "POST", "/api/v1/namespaces/nope/pods", json=pod("p", "nope"), status=404)
    assert no_ns["message"] == 'namespaces "nope" not found'

    assert_status(
        await call(http, "POST", "/api/v1/namespaces/default/pods/p1", json={}, status=405), 405, "MethodNotAllowed"
    )
    json_type = {"Content-Type": "application/json"}
    garbage = await call(http, "POST", "/api/v1/namespaces/default/pods", data="{nope", headers=json_type, status=400)
    assert_status(garbage, 400, "BadRequest")
    text = await call(http, "POST", "/api/v1/namespaces/default/pods", data="{}", status=415)
    assert_status(text, 415, "UnsupportedMediaType")
    wrong_kind = await call(http, "POST", "/api/v1/namespaces/default/configmaps", json=pod("x"), status=400)
    assert "kind" in wrong_kind["message"]
    wrong_ns = await call(http, "POST", "/api/v1/namespaces/kube-system/pods", json=pod("x"), status=400)
    assert "namespace" in wrong_ns["message"]


async def test_update_conflicts_on_stale_resource_version(http):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}}
    first = await call(http, "POST", "/api/v1/namespaces/default/configmaps", json=cm, status=201)
    first["data"]["a"] = "2"
    second = await call(http, "PUT", "/api/v1/namespaces/default/configmaps/c", json=first)
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    first["data"]["a"] = "3"  # still carries the old resourceVersion
    conflict = await call(http, "PUT", "/api/v1/namespaces/default/configmaps/c", json=first, status=409)
    assert_status(conflict, 409, "Conflict")
    assert "the object has been modified" in conflict["message"]
    # no resourceVersion at all is an unconditional update
    del first["metadata"]["resourceVersion"]
    assert (await call(http, "PUT", "/api/v1/namespaces/default/configmaps/c", json=first))["data"] == {"a": "3"}
    # a no-op update keeps the resourceVersion
    same = await call(http, "GET", "/api/v1/namespaces/default/configmaps/c")
    again = await call(http, "PUT", "/api/v1/namespaces/default/configmaps/c", json=same)
    assert again["metadata"]["resourceVersion"] == same["metadata"]["resourceVersion"]
    # updating something that does not exist is a 404
    cm["metadata"]["name"] = "other"
    await call(http, "PUT", "/api/v1/namespaces/default/configmaps/other", json=cm, status=404)


async def test_generation_follows_spec_changes_only(sim):
    d = sim.create(deployment("web"))
    assert d["metadata"]["generation"] == 1 and d["spec"]["replicas"] == 1
    d = sim.patch("apps/v1", "Deployment", "web", {"metadata": {"labels": {"team": "a"}}})
    assert d["metadata"]["generation"] == 1
    d = sim.patch("apps/v1", "Deployment", "web", {"spec": {"replicas": 3}})
    assert d["metadata"]["generation"] == 2


async def test_status_is_written_only_through_the_status_subresource(http, sim):
    sim.create(deployment("web"))
    d = await call(http, "GET", "/apis/apps/v1/namespaces/default/deployments/web")
    d["status"] = {"replicas": 5}
    d["spec"]["replicas"] = 2
    main = await call(http, "PUT", "/apis/apps/v1/namespaces/default/deployments/web", json=d)
    assert main["spec"]["replicas"] == 2 and main["status"] == {}
    main["status"] = {"replicas": 2, "readyReplicas": 2}
    main["spec"]["replicas"] = 9
    status = await call(http, "PUT", "/apis/apps/v1/namespaces/default/deployments/web/status", json=main)
    assert status["status"] == {"replicas": 2, "readyReplicas": 2} and status["spec"]["replicas"] == 2
    patched = await call(
        http,
        "PATCH",
        "/api/v1/namespaces/default/pods/p/status",
        status=404,
        data=json.dumps({"status": {"phase": "Running"}}),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert_status(patched, 404, "NotFound")


async def test_in_process_create_with_status_reports_it_through_status(sim):
    created = sim.create({**pod("p1"), "status": {"phase": "Running", "podIP": "10.0.0.7"}})
    assert created["status"] == {"phase": "Running", "podIP": "10.0.0.7"}
    assert sim.get("v1", "Pod", "p1", namespace="default") == created
    assert sim.get("v1", "Pod", "nope", namespace="default") is None
    with pytest.raises(ApiStatusError) as info:
        sim.create(pod("p1"))
    assert info.value.code == 409


async def test_preserve_identity_keeps_rendered_uids(sim):
    rendered = pod("p1")
    rendered["metadata"].update(uid="11111111-2222-3333-4444-555555555555", creationTimestamp="2025-01-01T00:00:00Z")
    kept = sim.create(rendered)
    assert kept["metadata"]["uid"] == "11111111-2222-3333-4444-555555555555"
    assert kept["metadata"]["creationTimestamp"] == "2025-01-01T00:00:00Z"
    rendered["metadata"]["name"] = "p2"
    fresh = sim.create(rendered, preserve_identity=False)
    assert fresh["metadata"]["uid"] != kept["metadata"]["uid"]


async def test_apply_helper_creates_then_merges(sim):
    sim.apply(deployment("web", replicas=2))
    applied = sim.apply({**deployment("web", replicas=4), "status": {"replicas": 4}})
    assert applied["spec"]["replicas"] == 4 and applied["status"] == {"replicas": 4}
    assert applied["metadata"]["generation"] == 2


# --- patches ----------------------------------------------------------------------------------------

PATCH = "/apis/apps/v1/namespaces/default/deployments/web"


async def patch(http, path, body, content_type, status=200):
    return await call(http, "PATCH", path, data=json.dumps(body), headers={"Content-Type": content_type}, status=status)


async def test_merge_patch(http, sim):
    sim.create(deployment("web"))
    out = await patch(
        http, PATCH, {"metadata": {"labels": {"team": "a"}, "annotations": {"x": "y"}}}, "application/merge-patch+json"
    )
    assert out["metadata"]["labels"] == {"app": "web", "team": "a"}
    out = await patch(http, PATCH, {"metadata": {"labels": {"team": None}}}, "application/merge-patch+json")
    assert out["metadata"]["labels"] == {"app": "web"}
    # a merge patch replaces lists
    out = await patch(
        http,
        PATCH,
        {"spec": {"template": {"spec": {"containers": [{"name": "d", "image": "j"}]}}}},
        "application/merge-patch+json",
    )
    assert [c["name"] for c in out["spec"]["template"]["spec"]["containers"]] == ["d"]


async def test_strategic_merge_patch_merges_containers_by_name(http, sim):
    sim.create(deployment("web"))
    body = {
        "spec": {
            "template": {"spec": {"containers": [{"name": "sidecar", "image": "s"}, {"name": "c", "image": "i2"}]}}
        }
    }
    out = await patch(http, PATCH, body, "application/strategic-merge-patch+json")
    containers = out["spec"]["template"]["spec"]["containers"]
    # The patch's order, as kube-apiserver v1.37 merges it (tests/cluster/test_conformance.py).
    assert [(c["name"], c["image"]) for c in containers] == [("sidecar", "s"), ("c", "i2")]
    body = {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}}}
    out = await patch(http, PATCH, body, "application/strategic-merge-patch+json")
    assert [c["name"] for c in out["spec"]["template"]["spec"]["containers"]] == ["c"]
    out = await patch(http, PATCH, {"metadata": {"finalizers": ["a"]}}, "application/strategic-merge-patch+json")
    out = await patch(http, PATCH, {"metadata": {"finalizers": ["b"]}}, "application/strategic-merge-patch+json")
    assert out["metadata"]["finalizers"] == ["a", "b"]


async def test_json_patch(http, sim):
    sim.create(deployment("web"))
    ops = [
        {"op": "test", "path": "/spec/replicas", "value": 1},
        {"op": "replace", "path": "/spec/replicas", "value": 3},
        {"op": "add", "path": "/metadata/labels/team", "value": "a"},
        {"op": "add", "path": "/metadata/annotations", "value": {"a~b/c": "1"}},
        {"op": "copy", "from": "/metadata/labels/team", "path": "/metadata/labels/owner"},
        {"op": "move", "from": "/metadata/labels/owner", "path": "/metadata/labels/lead"},
        {"op": "remove", "path": "/metadata/annotations/a~0b~1c"},
        {"op": "add", "path": "/spec/template/spec/containers/-", "value": {"name": "d", "image": "j"}},
    ]
    out = await patch(http, PATCH, ops, "application/json-patch+json")
    assert out["spec"]["replicas"] == 3
    assert out["metadata"]["labels"] == {"app": "web", "team": "a", "lead": "a"}
    assert "annotations" not in out["metadata"]  # NB: an empty map is omitted, as kube-apiserver serves it
    assert [c["name"] for c in out["spec"]["template"]["spec"]["containers"]] == ["c", "d"]
    failed = await patch(
        http, PATCH, [{"op": "test", "path": "/spec/replicas", "value": 1}], "application/json-patch+json", status=422
    )
    assert_status(failed, 422, "Invalid")
    bad = await patch(http, PATCH, {"op": "add"}, "application/json-patch+json", status=400)
    assert_status(bad, 400, "BadRequest")


async def test_patch_errors(http, sim):
    sim.create(deployment("web"))
    unsupported = await patch(http, PATCH, {}, "application/xml", status=415)
    assert_status(unsupported, 415, "UnsupportedMediaType")
    stale = await patch(
        http,
        PATCH,
        {"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 2}},
        "application/merge-patch+json",
        status=409,
    )
    assert_status(stale, 409, "Conflict")
    await patch(http, PATCH.replace("web", "nope"), {}, "application/merge-patch+json", status=404)


async def test_server_side_apply_creates_and_updates(http):
    doc = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  a: '1'\n"
    path = "/api/v1/namespaces/default/configmaps/cfg"
    headers = {"Content-Type": "application/apply-patch+yaml"}
    created = await call(http, "PATCH", path, params={"fieldManager": "t"}, data=doc, headers=headers)
    assert created["data"] == {"a": "1"}
    updated = await call(
        http, "PATCH", path, params={"fieldManager": "t"}, data=doc.replace("'1'", "'2'"), headers=headers
    )
    assert updated["data"] == {"a": "2"} and updated["metadata"]["uid"] == created["metadata"]["uid"]
    await call(http, "PATCH", path, data=doc, headers=headers, status=400)  # fieldManager is required


# --- scale subresource ------------------------------------------------------------------------------

SCALE = "/apis/apps/v1/namespaces/default/deployments/web/scale"


async def test_scale_subresource(http, sim):
    sim.create(deployment("web", replicas=2))
    scale = await call(http, "GET", SCALE)
    assert scale["kind"] == "Scale" and scale["apiVersion"] == "autoscaling/v1"
    assert scale["spec"] == {"replicas": 2} and scale["status"] == {"replicas": 0, "selector": "app=web"}
    scale["spec"]["replicas"] = 5
    put = await call(http, "PUT", SCALE, json=scale)
    assert put["spec"]["replicas"] == 5
    assert sim.get("apps/v1", "Deployment", "web")["spec"]["replicas"] == 5
    scale["spec"]["replicas"] = 6  # scale still carries the old resourceVersion
    assert_status(await call(http, "PUT", SCALE, json=scale, status=409), 409, "Conflict")
    patched = await patch(http, SCALE, {"spec": {"replicas": 1}}, "application/merge-patch+json")
    assert patched["spec"]["replicas"] == 1
    assert sim.get("apps/v1", "Deployment", "web")["metadata"]["generation"] == 3
    await patch(http, SCALE, {"spec": {"replicas": -1}}, "application/merge-patch+json", status=422)


async def test_statefulset_scale(http, sim):
    sts = deployment("db")
    sts["kind"] = "StatefulSet"
    sim.create(sts)
    out = await patch(
        http,
        "/apis/apps/v1/namespaces/default/statefulsets/db/scale",
        {"spec": {"replicas": 3}},
        "application/merge-patch+json",
    )
    assert out["spec"]["replicas"] == 3
    assert sim.get("apps/v1", "StatefulSet", "db")["spec"]["replicas"] == 3


# --- selectors and paging ---------------------------------------------------------------------------


async def test_label_and_field_selectors(http, sim):
    sim.create({**pod("a", labels={"app": "web", "tier": "gpu"}, nodeName="n1"), "status": {"phase": "Running"}})
    sim.create(pod("b", labels={"app": "web"}, nodeName="n2"))
    sim.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    sim.create(pod("c", "ml", labels={"app": "db"}))

    async def names(path, **params):
        body = await call(http, "GET", path, params=params)
        return [i["metadata"]["name"] for i in body["items"]]

    assert await names("/api/v1/pods") == ["a", "b", "c"]  # all namespaces
    assert await names("/api/v1/pods", labelSelector="app=web") == ["a", "b"]
    assert await names("/api/v1/pods", labelSelector="app=web,tier notin (gpu)") == ["b"]
    assert await names("/api/v1/pods", labelSelector="!tier") == ["b", "c"]
    assert await names("/api/v1/pods", fieldSelector="spec.nodeName=n1") == ["a"]
    assert await names("/api/v1/pods", fieldSelector="status.phase=Pending") == ["b", "c"]
    assert await names("/api/v1/pods", fieldSelector="metadata.namespace!=default") == ["c"]
    assert await names("/api/v1/namespaces/ml/pods", labelSelector="app") == ["c"]
    assert await names("/api/v1/namespaces", fieldSelector="metadata.name=ml") == ["ml"]
    assert sorted(p["metadata"]["name"] for p in sim.list("v1", "Pod", label_selector="app=web")) == ["a", "b"]

    bad = await call(http, "GET", "/api/v1/pods", params={"labelSelector": "app in web"}, status=400)
    assert_status(bad, 400, "BadRequest")
    unsupported = await call(http, "GET", "/api/v1/pods", params={"fieldSelector": "spec.image=x"}, status=400)
    assert "field label not supported: spec.image" in unsupported["message"]


async def test_limit_and_continue_page_through_a_list(http, sim):
    for i in range(5):
        sim.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}"}})
    seen, token, pages = [], None, 0
    while True:
        params = {"limit": "2", **({"continue": token} if token else {})}
        body = await call(http, "GET", "/api/v1/namespaces/default/configmaps", params=params)
        seen += [i["metadata"]["name"] for i in body["items"]]
        pages += 1
        token = body["metadata"].get("continue")
        if not token:
            break
        assert body["metadata"]["remainingItemCount"] == 5 - len(seen)
    assert seen == [f"c{i}" for i in range(5)] and pages == 3
    await call(http, "GET", "/api/v1/namespaces/default/configmaps", params={"continue": "garbage"}, status=400)


# --- validation and lifecycle -----------------------------------------------------------------------


async def test_validation_rejects_what_kube_apiserver_rejects(sim):
    bad = deployment("web")
    bad["spec"]["template"]["metadata"]["labels"] = {"app": "other"}
    with pytest.raises(ApiStatusError) as info:
        sim.create(bad)
    assert info.value.code == 422 and "does not match template" in info.value.message
    no_selector = deployment("web")
    del no_selector["spec"]["selector"]
    with pytest.raises(ApiStatusError, match=r"spec\.selector: Required value"):
        sim.create(no_selector)
    sim.create(deployment("web"))
    with pytest.raises(ApiStatusError, match="field is immutable"):
        sim.patch(
            "apps/v1",
            "Deployment",
            "web",
            {"spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}}}}},
        )
    with pytest.raises(ApiStatusError, match="Required value"):
        sim.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}})
    with pytest.raises(ApiStatusError, match="RFC 1123"):
        sim.create(pod("Bad_Name"))
    with pytest.raises(ApiStatusError, match=r"metadata\.labels"):
        sim.create(pod("p", labels={"bad key": "v"}))
    sim.create(pod("p", nodeName="n1"))
    with pytest.raises(ApiStatusError, match="pod updates may not change"):
        sim.patch("v1", "Pod", "p", {"spec": {"nodeName": "n2"}})
    image = sim.patch(
        "v1", "Pod", "p", {"spec": {"containers": [{"name": "main", "image": "new"}]}}, patch_type="strategic"
    )
    assert image["spec"]["containers"][0]["image"] == "new"


async def test_generate_name(sim):
    made = sim.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "cfg-"}})
    assert made["metadata"]["name"].startswith("cfg-") and len(made["metadata"]["name"]) == 9


async def test_finalizers_delay_deletion(sim):
    sim.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "finalizers": ["x/y"]}})
    deleting = sim.delete("v1", "ConfigMap", "c")
    assert deleting["metadata"]["deletionTimestamp"]
    assert sim.get("v1", "ConfigMap", "c") is not None
    sim.patch("v1", "ConfigMap", "c", [{"op": "remove", "path": "/metadata/finalizers"}], patch_type="json")
    assert sim.get("v1", "ConfigMap", "c") is None


async def test_delete_preconditions_and_collection(http, sim):
    sim.create(pod("a", labels={"app": "x"}))
    sim.create(pod("b", labels={"app": "y"}))
    body = {"preconditions": {"uid": "not-it"}}
    assert_status(
        await call(http, "DELETE", "/api/v1/namespaces/default/pods/a", json=body, status=409), 409, "Conflict"
    )
    gone = await call(http, "DELETE", "/api/v1/namespaces/default/pods", params={"labelSelector": "app=x"})
    assert [i["metadata"]["name"] for i in gone["items"]] == ["a"]
    assert [p["metadata"]["name"] for p in sim.list("v1", "Pod")] == ["b"]


async def test_deleting_a_namespace_deletes_its_objects(sim):
    sim.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    sim.create(pod("p", "ml"))
    sim.create(deployment("d", "ml"))
    sim.delete("v1", "Namespace", "ml")
    assert sim.list("v1", "Pod", namespace="ml") == [] and sim.list("apps/v1", "Deployment") == []


async def test_pod_binding_schedules_a_pod(http, sim):
    sim.create(pod("p"))
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}
    await call(http, "POST", "/api/v1/namespaces/default/pods/p/binding", json=body, status=201)
    assert sim.get("v1", "Pod", "p")["spec"]["nodeName"] == "n1"
    await call(http, "POST", "/api/v1/namespaces/default/pods/p/binding", json=body, status=409)


async def test_events_k8s_io_is_a_view_of_core_events(http, sim):
    sim.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "e1"},
            "involvedObject": {"kind": "Node", "name": "gpu-1"},
            "reason": "XidError",
            "message": "Xid 79",
            "type": "Warning",
            "reportingComponent": "gpuscale",
        }
    )
    v1 = await call(http, "GET", "/apis/events.k8s.io/v1/namespaces/default/events/e1")
    assert v1["apiVersion"] == "events.k8s.io/v1"
    assert v1["regarding"] == {"kind": "Node", "name": "gpu-1"} and v1["note"] == "Xid 79"
    assert v1["reportingController"] == "gpuscale"
    created = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "e2"},
        "regarding": {"kind": "Pod", "name": "p"},
        "note": "hello",
        "reason": "R",
        "type": "Normal",
    }
    await call(http, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", json=created, status=201)
    core = await call(http, "GET", "/api/v1/namespaces/default/events/e2")
    assert core["involvedObject"] == {"kind": "Pod", "name": "p"} and core["message"] == "hello"
    warnings = await call(http, "GET", "/api/v1/events", params={"fieldSelector": "type=Warning"})
    assert [e["metadata"]["name"] for e in warnings["items"]] == ["e1"]
    about_node = await call(
        http, "GET", "/apis/events.k8s.io/v1/events", params={"fieldSelector": "regarding.kind=Node"}
    )
    assert [e["metadata"]["name"] for e in about_node["items"]] == ["e1"]


async def test_field_validation(http):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}, "datum": {}}
    strict = await call(
        http, "POST", "/api/v1/namespaces/default/configmaps", params={"fieldValidation": "Strict"}, json=cm, status=400
    )
    assert 'unknown field "datum"' in strict["message"]
    async with http.post("/api/v1/namespaces/default/configmaps", json=cm) as resp:  # Warn is the default
        assert resp.status == 201
        assert resp.headers.getall("Warning") == ['299 - "unknown field \\"datum\\""']


async def test_dry_run_changes_nothing(http, sim):
    rv = sim.resource_version
    await call(http, "POST", "/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=pod("p"), status=201)
    assert sim.get("v1", "Pod", "p") is None and sim.resource_version == rv


async def test_tables_for_kubectl(http, sim):
    sim.create({**pod("p", nodeName="n1"), "status": {"phase": "Running", "podIP": "10.0.0.9"}})
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    table = await call(http, "GET", "/api/v1/pods", headers={"Accept": accept})
    assert table["kind"] == "Table" and table["apiVersion"] == "meta.k8s.io/v1"
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns[:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    row = table["rows"][0]
    assert row["cells"][:3] == ["p", "0/1", "Running"] and row["cells"][5:7] == ["10.0.0.9", "n1"]
    assert row["object"]["kind"] == "PartialObjectMetadata" and row["object"]["metadata"]["namespace"] == "default"


# --- authentication ---------------------------------------------------------------------------------


async def test_tokens_are_recorded_and_optionally_enforced():
    api = SimKubeApi(tokens={"good"})
    url = await api.start()
    try:
        async with aiohttp.ClientSession(url) as anonymous:
            assert_status(await call(anonymous, "GET", "/api/v1/pods", status=401), 401, "Unauthorized")
        async with aiohttp.ClientSession(url, headers={"Authorization": "Bearer bad"}) as bad:
            await call(bad, "GET", "/api/v1/pods", status=401)
        async with aiohttp.ClientSession(url, headers={"Authorization": "Bearer good"}) as good:
            await call(good, "GET", "/api/v1/pods")
        assert api.tokens_seen == {"bad", "good"}
        assert [r.token for r in api.requests] == [None, "bad", "good"]
    finally:
        await api.stop()


# --- watch ------------------------------------------------------------------------------------------


class Stream:
    """An open watch: read events one by one with a deadline, never sleeping."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self, timeout: float = 5.0) -> dict | None:
        line = await asyncio.wait_for(self.resp.content.readline(), timeout)
        return json.loads(line) if line else None

    async def until(self, event_type: str, timeout: float = 5.0) -> dict:
        while True:
            event = await self.next(timeout)
            assert event is not None, f"stream ended before a {event_type} event"
            if event["type"] == event_type:
                return event


async def open_watch(http, path: str, **params: str) -> Stream:
    resp = await http.get(path, params={"watch": "1", **params})
    assert resp.status == 200
    return Stream(resp)


async def test_watch_from_a_resource_version(http, sim):
    sim.create(pod("before"))
    rv = sim.resource_version
    stream = await open_watch(http, "/api/v1/namespaces/default/pods", resourceVersion=rv, timeoutSeconds="5")
    try:
        sim.create(pod("p"))
        sim.patch("v1", "Pod", "p", {"metadata": {"labels": {"a": "b"}}})
        sim.delete("v1", "Pod", "p")
        events = [await stream.next() for _ in range(3)]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("ADDED", "p"),
            ("MODIFIED", "p"),
            ("DELETED", "p"),
        ]
        assert events[0]["object"]["kind"] == "Pod"
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert versions == sorted(versions) and versions[0] > int(rv)
    finally:
        stream.resp.close()


async def test_watch_replays_history_and_starts_with_a_snapshot_without_resource_version(http, sim):
    rv = sim.resource_version
    sim.create(pod("a"))
    sim.create(pod("b"))
    replay = await open_watch(http, "/api/v1/pods", resourceVersion=rv, timeoutSeconds="1")
    assert [(await replay.next())["object"]["metadata"]["name"] for _ in range(2)] == ["a", "b"]
    assert await replay.next() is None  # timeoutSeconds closed the stream
    snapshot = await open_watch(http, "/api/v1/pods", timeoutSeconds="1")
    events = [await snapshot.next() for _ in range(2)]
    assert {(e["type"], e["object"]["metadata"]["name"]) for e in events} == {("ADDED", "a"), ("ADDED", "b")}
    assert await snapshot.next() is None


async def test_watch_applies_selectors_like_the_watch_cache(http, sim):
    sim.create(pod("p", labels={"app": "web"}))
    stream = await open_watch(
        http,
        "/api/v1/namespaces/default/pods",
        resourceVersion=sim.resource_version,
        labelSelector="app=web",
        timeoutSeconds="5",
    )
    try:
        sim.create(pod("other", labels={"app": "db"}))  # never seen
        sim.patch("v1", "Pod", "p", {"metadata": {"labels": {"app": "db"}}})  # leaves the selection
        sim.patch("v1", "Pod", "other", {"metadata": {"labels": {"app": "web"}}})  # enters it
        first, second = await stream.next(), await stream.next()
        assert (first["type"], first["object"]["metadata"]["name"]) == ("DELETED", "p")
        assert (second["type"], second["object"]["metadata"]["name"]) == ("ADDED", "other")
    finally:
        stream.resp.close()


async def test_watch_bookmarks(http, sim):
    stream = await open_watch(
        http, "/api/v1/pods", resourceVersion=sim.resource_version, allowWatchBookmarks="true", timeoutSeconds="1"
    )
    sim.create(pod("p"))
    assert (await stream.next())["type"] == "ADDED"
    bookmark = await stream.until("BOOKMARK")
    assert bookmark["object"]["kind"] == "Pod"
    assert bookmark["object"]["metadata"]["resourceVersion"] == sim.resource_version
    stream.resp.close()


async def test_watch_from_a_compacted_resource_version_gets_410_expired(http, sim):
    old = sim.resource_version
    sim.create(pod("p"))
    sim.compact()
    stream = await open_watch(http, "/api/v1/pods", resourceVersion=old)
    event = await stream.next()
    assert event["type"] == "ERROR"
    assert_status(event["object"], 410, "Expired")
    assert event["object"]["message"].startswith(f"too old resource version: {old}")
    assert await stream.next() is None
    # the current resourceVersion is still watchable
    ok = await open_watch(http, "/api/v1/pods", resourceVersion=sim.resource_version, timeoutSeconds="1")
    assert await ok.next() is None


async def test_history_limit_expires_old_versions(http):
    api = SimKubeApi(history_limit=3)
    url = await api.start()
    try:
        start = api.resource_version
        for i in range(5):
            api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}"}})
        async with aiohttp.ClientSession(url) as session:
            stream = await open_watch(session, "/api/v1/configmaps", resourceVersion=start)
            assert (await stream.next())["object"]["code"] == 410
    finally:
        await api.stop()


async def test_stop_ends_open_watches(sim):
    async with aiohttp.ClientSession(sim.url) as session:
        stream = await open_watch(session, "/api/v1/pods", resourceVersion=sim.resource_version)
        await sim.stop()
        assert await stream.next() is None


# --- kubernetes-asyncio against the simulator -------------------------------------------------------


@pytest.fixture
async def api_client(sim, tmp_path):
    api = await new_client_from_config(config_file=sim.write_kubeconfig(tmp_path / "kubeconfig"), persist_config=False)
    yield api
    await api.close()


async def test_kubernetes_asyncio_client(api_client, sim):
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    await core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    await apps.create_namespaced_deployment("ml", deployment("triton", "ml", replicas=2))
    deploy = await apps.read_namespaced_deployment("triton", "ml")
    assert deploy.spec.replicas == 2 and deploy.metadata.generation == 1
    scale = await apps.patch_namespaced_deployment_scale("triton", "ml", {"spec": {"replicas": 4}})
    assert scale.spec.replicas == 4 and scale.status.selector == "app=triton"
    assert (await apps.read_namespaced_deployment_scale("triton", "ml")).spec.replicas == 4

    await core.create_namespaced_pod("ml", pod("triton-0", "ml", labels={"app": "triton"}))
    pods = await core.list_namespaced_pod("ml", label_selector="app=triton")
    assert [p.metadata.name for p in pods.items] == ["triton-0"] and pods.metadata.resource_version

    with pytest.raises(client.ApiException) as info:
        await core.read_namespaced_pod("nope", "ml")
    assert info.value.status == 404
    assert sim.tokens_seen == {"sim-token"}

    rv = pods.metadata.resource_version
    sim.patch("v1", "Pod", "triton-0", {"metadata": {"labels": {"ready": "yes"}}}, namespace="ml")
    seen = []
    async with watch.Watch() as w:
        async for event in w.stream(core.list_namespaced_pod, "ml", resource_version=rv, timeout_seconds=1):
            seen.append((event["type"], event["object"].metadata.labels))
    assert seen == [("MODIFIED", {"app": "triton", "ready": "yes"})]


# --- the real kubectl -------------------------------------------------------------------------------

needs_kubectl = pytest.mark.skipif(not os.path.exists(KUBECTL), reason="kubectl is not installed")


@pytest.fixture
async def kubectl(sim, tmp_path):
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    # NB: a private HOME and cache dir, so kubectl never reads or writes ~/.kube.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}

    async def run(*args: str, check: bool = True, stdin: str | None = None) -> str:
        proc = await asyncio.create_subprocess_exec(
            KUBECTL,
            "--kubeconfig",
            kubeconfig,
            "--cache-dir",
            str(tmp_path / "cache"),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        if check:
            assert proc.returncode == 0, (args, out.decode(), err.decode())
        return out.decode() + err.decode() if not check else out.decode()

    return run


@needs_kubectl
async def test_kubectl_reads(sim, kubectl):
    sim.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    sim.create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-1"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    sim.create(
        {
            **pod("triton-0", "ml", labels={"app": "triton"}, nodeName="gpu-1"),
            "status": {"phase": "Running", "podIP": "10.0.0.5"},
        }
    )
    sim.create(deployment("triton", "ml", replicas=2))

    pods = json.loads(await kubectl("get", "pods", "-A", "-o", "json"))
    assert pods["kind"] == "List" or pods["kind"] == "PodList"
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods["items"]] == [("ml", "triton-0")]
    assert pods["items"][0]["status"]["podIP"] == "10.0.0.5"

    nodes = await kubectl("get", "nodes")
    assert nodes.splitlines()[0].split()[:2] == ["NAME", "STATUS"] and "gpu-1" in nodes and "Ready" in nodes

    deploys = json.loads(await kubectl("get", "deploy", "-n", "ml", "-o", "json"))
    assert [d["metadata"]["name"] for d in deploys["items"]] == ["triton"]
    assert deploys["items"][0]["spec"]["replicas"] == 2

    wide = await kubectl("get", "po", "-n", "ml", "-o", "wide", "-l", "app=triton")
    assert "10.0.0.5" in wide and "gpu-1" in wide
    assert "triton-0" in await kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=gpu-1")


@needs_kubectl
async def test_kubectl_writes(sim, kubectl):
    sim.create(deployment("web", replicas=1))
    assert "scaled" in await kubectl("scale", "deploy/web", "--replicas=3")
    assert sim.get("apps/v1", "Deployment", "web")["spec"]["replicas"] == 3

    assert "patched" in await kubectl("patch", "deploy", "web", "-p", '{"metadata":{"labels":{"team":"a"}}}')
    assert sim.get("apps/v1", "Deployment", "web")["metadata"]["labels"]["team"] == "a"
    await kubectl("patch", "deploy", "web", "--type=json", "-p", '[{"op":"replace","path":"/spec/replicas","value":2}]')
    assert sim.get("apps/v1", "Deployment", "web")["spec"]["replicas"] == 2

    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cfg\ndata:\n  a: '1'\n"
    assert "created" in await kubectl("apply", "-f", "-", stdin=manifest)
    assert "configured" in await kubectl("apply", "-f", "-", stdin=manifest.replace("'1'", "'2'"))
    assert sim.get("v1", "ConfigMap", "cfg")["data"] == {"a": "2"}
    rejected = await kubectl("apply", "-f", "-", stdin=manifest.replace("\ndata:", "\ndatum:"), check=False)
    assert 'unknown field "datum"' in rejected

    await kubectl("label", "cm", "cfg", "x=y")
    assert sim.get("v1", "ConfigMap", "cfg")["metadata"]["labels"] == {"x": "y"}
    assert "deleted" in await kubectl("delete", "cm", "cfg")
    assert sim.get("v1", "ConfigMap", "cfg") is None
    missing = await kubectl("get", "cm", "cfg", check=False)
    assert 'configmaps "cfg" not found' in missing
