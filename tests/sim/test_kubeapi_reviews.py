"""TokenReview and SubjectAccessReview on the simulated API server, and the ConfigMap aggregated servers watch.

Scope: discovery of the two review groups; TokenReviews answered from ``add_token``; SubjectAccessReviews
answered from ``allow`` grants with RBAC's matching rules (a table); kube-apiserver's validation (400/422); the
request log and the failure knob; the typed kubernetes-asyncio client; and
``kube-system/extension-apiserver-authentication`` created, updated and watched with a name field selector.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.config import new_client_from_config

from gpuscale.sim.kubeapi import SimKubeApi

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
CUSTOM = "custom.metrics.k8s.io"


@pytest.fixture
async def sim():
    api = SimKubeApi()
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
async def http(sim):
    async with aiohttp.ClientSession(sim.url, headers={"Authorization": "Bearer adapter-token"}) as session:
        yield session


async def call(http: aiohttp.ClientSession, method: str, path: str, *, status: int, **kwargs: Any) -> Any:
    async with http.request(method, path, **kwargs) as resp:
        body = await resp.json(content_type=None)
        assert resp.status == status, (method, path, resp.status, body)
        return body


def token_review(token: str, **spec: Any) -> dict:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token, **spec}}


def access_review(spec: dict) -> dict:
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def resource(user: str | None = None, groups: tuple[str, ...] = (), **attributes: str) -> dict:
    spec: dict[str, Any] = {"resourceAttributes": {"verb": "get", "version": "v1beta1", **attributes}}
    if user:
        spec["user"] = user
    if groups:
        spec["groups"] = list(groups)
    return spec


def path(user: str | None = None, groups: tuple[str, ...] = (), *, url: str, verb: str = "get") -> dict:
    spec: dict[str, Any] = {"nonResourceAttributes": {"path": url, "verb": verb}}
    if user:
        spec["user"] = user
    if groups:
        spec["groups"] = list(groups)
    return spec


# --- discovery --------------------------------------------------------------------------------------


async def test_review_groups_are_discoverable(http):
    groups = {g["name"]: g for g in (await call(http, "GET", "/apis", status=200))["groups"]}
    assert groups["authentication.k8s.io"]["preferredVersion"]["groupVersion"] == "authentication.k8s.io/v1"
    assert groups["authorization.k8s.io"]["preferredVersion"]["version"] == "v1"
    group = await call(http, "GET", "/apis/authorization.k8s.io", status=200)
    assert group["kind"] == "APIGroup" and group["versions"] == [
        {"groupVersion": "authorization.k8s.io/v1", "version": "v1"}
    ]
    for url, name, kind in (
        ("/apis/authentication.k8s.io/v1", "tokenreviews", "TokenReview"),
        ("/apis/authorization.k8s.io/v1", "subjectaccessreviews", "SubjectAccessReview"),
    ):
        listing = await call(http, "GET", url, status=200)
        assert listing["kind"] == "APIResourceList"
        assert listing["resources"] == [
            {"name": name, "singularName": kind.lower(), "namespaced": False, "kind": kind, "verbs": ["create"]}
        ]


# --- TokenReview ------------------------------------------------------------------------------------


async def test_token_review_answers_a_registered_token_with_its_user(sim, http):
    sim.add_token("t-alice", "alice", uid="u-1", groups=["dev"], extra={"scopes": ["metrics"]})
    body = await call(http, "POST", TOKEN_REVIEWS, json=token_review("t-alice", audiences=["api"]), status=201)
    assert body["kind"] == "TokenReview" and body["apiVersion"] == "authentication.k8s.io/v1"
    assert body["status"] == {
        "authenticated": True,
        "user": {
            "username": "alice",
            "uid": "u-1",
            "groups": ["dev", "system:authenticated"],
            "extra": {"scopes": ["metrics"]},
        },
        "audiences": ["api"],
    }


async def test_token_review_of_an_unknown_token_is_not_authenticated(sim, http):
    body = await call(http, "POST", TOKEN_REVIEWS, json=token_review("nobody"), status=201)
    assert not body["status"].get("authenticated") and body["status"]["user"] == {}
    assert body["status"]["error"]


async def test_token_review_needs_a_token(http):
    body = await call(http, "POST", TOKEN_REVIEWS, json=token_review(""), status=400)
    assert body["reason"] == "BadRequest" and "token is required" in body["message"]


# --- SubjectAccessReview: RBAC matching -----------------------------------------------------------------


@pytest.fixture
def policy(sim):
    sim.allow(users=["alice"], verbs=["get"], api_groups=[CUSTOM], resources=["*"])
    sim.allow(groups=["viewers"], verbs=["get", "list"], api_groups=[""], resources=["pods"], namespace="team-a")
    sim.allow(users=["bob"], api_groups=[CUSTOM], resources=["*/gpu_util"])
    sim.allow(users=["carol"], api_groups=[""], resources=["pods"], resource_names=["p1"])
    sim.allow(groups=["system:authenticated"], verbs=["get"], non_resource_urls=["/version", "/apis/*"])
    return sim


SAR_CASES = [
    ("alice gets any custom metric", resource("alice", group=CUSTOM, resource="pods", name="*", subresource="m"), True),
    ("alice may not list", resource("alice", verb="list", group=CUSTOM, resource="pods"), False),
    ("alice's grant is for one API group", resource("alice", group="external.metrics.k8s.io", resource="q"), False),
    ("a group grant", resource("x", ("viewers",), group="", resource="pods", namespace="team-a", name="p"), True),
    ("a RoleBinding is one namespace", resource("x", ("viewers",), group="", resource="pods", namespace="b"), False),
    (
        "'pods' is not 'pods/log'",
        resource("x", ("viewers",), resource="pods", subresource="log", namespace="team-a"),
        False,
    ),
    (
        "'*/gpu_util' matches the subresource",
        resource("bob", group=CUSTOM, resource="nodes", subresource="gpu_util"),
        True,
    ),
    ("but no other", resource("bob", group=CUSTOM, resource="nodes", subresource="power"), False),
    ("resourceNames: the named object", resource("carol", group="", resource="pods", name="p1", namespace="n"), True),
    ("resourceNames: another object", resource("carol", group="", resource="pods", name="p2", namespace="n"), False),
    ("resourceNames: not a list", resource("carol", verb="list", group="", resource="pods", namespace="n"), False),
    ("system:masters may do anything", resource("root", ("system:masters",), group="x", resource="y"), True),
    ("a non-resource prefix", path("eve", ("system:authenticated",), url="/apis/custom.metrics.k8s.io/v1beta1"), True),
    ("an exact non-resource path", path("eve", ("system:authenticated",), url="/version"), True),
    ("a path not granted", path("eve", ("system:authenticated",), url="/healthz"), False),
    ("a non-resource verb not granted", path("eve", ("system:authenticated",), url="/version", verb="post"), False),
    ("grants are per subject", path("eve", url="/version"), False),
]


@pytest.mark.parametrize(("case", "spec", "allowed"), SAR_CASES, ids=[c[0] for c in SAR_CASES])
async def test_access_review_follows_rbac_matching(policy, http, case, spec, allowed):
    body = await call(http, "POST", ACCESS_REVIEWS, json=access_review(spec), status=201)
    assert body["kind"] == "SubjectAccessReview" and body["spec"] == spec
    assert body["status"]["allowed"] is allowed, case
    if allowed and "system:masters" not in spec.get("groups", ()):
        assert body["status"]["reason"].startswith("RBAC: allowed by")


def test_allow_rejects_grants_without_subjects_or_with_namespaced_urls(sim):
    with pytest.raises(ValueError, match="user or group"):
        sim.allow(verbs=["get"])
    with pytest.raises(ValueError, match="cluster-wide"):
        sim.allow(users=["a"], non_resource_urls=["/x"], namespace="n")


INVALID = [
    ({"user": "a"}, "spec.resourceAttributes", "exactly one of nonResourceAttributes or resourceAttributes"),
    (
        {**resource("a", resource="pods"), **path(url="/x")},
        "spec.nonResourceAttributes",
        "cannot be specified in combination",
    ),
    (resource(resource="pods"), "spec.user", "at least one of user or group must be specified"),
]


@pytest.mark.parametrize(("spec", "field", "text"), INVALID)
async def test_access_review_is_validated_like_kube_apiserver(http, spec, field, text):
    body = await call(http, "POST", ACCESS_REVIEWS, json=access_review(spec), status=422)
    assert body["reason"] == "Invalid"
    assert body["message"].startswith('SubjectAccessReview.authorization.k8s.io "" is invalid: ')
    assert text in body["message"]
    assert [c["field"] for c in body["details"]["causes"]] == [field]


async def test_reviews_are_create_only(http):
    await call(http, "GET", TOKEN_REVIEWS, status=405)
    await call(http, "POST", f"{ACCESS_REVIEWS}/x", json=access_review(path("a", url="/")), status=404)
    await call(http, "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", json={}, status=404)
    body = await call(http, "POST", TOKEN_REVIEWS, json={"kind": "SubjectAccessReview", "spec": {}}, status=400)
    assert "TokenReview" in body["message"]


# --- recording and faults ---------------------------------------------------------------------------


async def test_reviews_are_recorded_in_order(sim, http):
    sim.add_token("t", "alice")
    await call(http, "POST", TOKEN_REVIEWS, json=token_review("t"), status=201)
    await call(http, "POST", TOKEN_REVIEWS, json=token_review("u"), status=201)
    spec = resource("alice", resource="pods")
    await call(http, "POST", ACCESS_REVIEWS, json=access_review(spec), status=201)
    assert sim.token_reviews == [{"token": "t"}, {"token": "u"}]
    assert sim.access_reviews == [spec]


async def test_reviews_can_be_made_to_fail_and_recover(sim, http):
    sim.add_token("t", "alice")
    sim.fail_reviews(503)
    body = await call(http, "POST", TOKEN_REVIEWS, json=token_review("t"), status=503)
    assert body["kind"] == "Status" and body["reason"] == "ServiceUnavailable"
    body = await call(http, "POST", ACCESS_REVIEWS, json=access_review(path("a", url="/")), status=503)
    assert body["reason"] == "ServiceUnavailable"
    sim.fail_reviews(500)
    assert (await call(http, "POST", TOKEN_REVIEWS, json=token_review("t"), status=500))["reason"] == "InternalError"
    sim.fail_reviews(None)
    assert (await call(http, "POST", TOKEN_REVIEWS, json=token_review("t"), status=201))["status"]["authenticated"]
    assert len(sim.token_reviews) == 3 and len(sim.access_reviews) == 1  # failed attempts are recorded too


async def test_a_slow_review_still_answers(sim, http):
    sim.review_delay_seconds = 0.05
    loop = asyncio.get_running_loop()
    started = loop.time()
    await call(http, "POST", ACCESS_REVIEWS, json=access_review(path("a", url="/")), status=201)
    assert loop.time() - started >= 0.05


# --- typed clients ----------------------------------------------------------------------------------


@pytest.fixture
async def api(sim, tmp_path):
    api = await new_client_from_config(config_file=sim.write_kubeconfig(tmp_path / "kubeconfig"))
    yield api
    await api.close()


async def test_kubernetes_asyncio_typed_review_clients(sim, api):
    sim.add_token("t-alice", "alice", groups=["dev"])
    sim.allow(groups=["dev"], verbs=["get"], api_groups=[CUSTOM])
    review = await client.AuthenticationV1Api(api).create_token_review(
        client.V1TokenReview(spec=client.V1TokenReviewSpec(token="t-alice"))
    )
    assert review.status.authenticated and review.status.user.username == "alice"
    assert review.status.user.groups == ["dev", "system:authenticated"]
    sar = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user="alice",
            groups=["dev"],
            resource_attributes=client.V1ResourceAttributes(
                verb="get", group=CUSTOM, version="v1beta2", resource="pods", name="*", subresource="m", namespace="ns"
            ),
        )
    )
    answer = await client.AuthorizationV1Api(api).create_subject_access_review(sar)
    assert answer.status.allowed is True


# --- the ConfigMap aggregated API servers read ------------------------------------------------------

AUTH_CM = "extension-apiserver-authentication"


def auth_configmap(ca: str, names: list[str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": AUTH_CM, "namespace": "kube-system"},
        "data": {
            "requestheader-client-ca-file": ca,
            "requestheader-allowed-names": json.dumps(names),
            "requestheader-username-headers": '["X-Remote-User"]',
        },
    }


async def test_extension_apiserver_authentication_configmap_is_listed_and_watched_by_name(sim, api):
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map("kube-system", auth_configmap("CA-1", ["front-proxy-client"]))
    sim.create({**auth_configmap("other", []), "metadata": {"name": "unrelated", "namespace": "kube-system"}})
    selector = f"metadata.name={AUTH_CM}"
    listed = await core.list_namespaced_config_map("kube-system", field_selector=selector)
    assert [cm.metadata.name for cm in listed.items] == [AUTH_CM]
    assert json.loads(listed.items[0].data["requestheader-allowed-names"]) == ["front-proxy-client"]
    response = await core.list_namespaced_config_map(
        "kube-system",
        field_selector=selector,
        watch=True,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=5,
        _preload_content=False,
    )
    try:
        sim.replace(sim.get("v1", "ConfigMap", "unrelated", namespace="kube-system") | {"data": {"x": "y"}})
        sim.apply(auth_configmap("CA-2", []))
        event = json.loads(await asyncio.wait_for(response.content.readline(), 5))
    finally:
        response.close()
    assert event["type"] == "MODIFIED" and event["object"]["metadata"]["name"] == AUTH_CM
    assert event["object"]["data"]["requestheader-client-ca-file"] == "CA-2"
