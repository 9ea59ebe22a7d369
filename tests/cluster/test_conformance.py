"""Every call gpuscale makes to Kubernetes, asserted as kube-apiserver v1.37 answers it — on the real server and
on gpuscale/sim's SimKubeApi alike (issue 19: the simulated API kept honest). One suite, run against both
servers: it also holds every check of the former side-by-side comparison (test_sim_conformance.py), each now
stated as the answer the real server gives.

Each test is written against the real API server first (the ``control_plane`` fixture) and states what it
answers; the same test then runs against SimKubeApi, so a difference between the two is a failing test that
names the call. The calls are those the product sends:

* sources/reflector.py (the list+watch under kube.py, objects.py, hpas.py): paged lists (``limit``/``continue``),
  watches from the list's resourceVersion with ``allowWatchBookmarks`` and ``timeoutSeconds``, 410 Gone (an ERROR
  event) for a resourceVersion older than the server keeps, ``labelSelector`` and ``fieldSelector``
  (``metadata.name``, ``spec.nodeName``, an Event's ``source``).
* controller/actuator.py through sources/kuberest.py: POST (409 AlreadyExists), PATCH as JSON patch (``test``
  ops, ``add`` on an existing member, ``~1`` escapes, ``remove``), merge patch (``null`` removes, a
  ``metadata.resourceVersion`` precondition → 409 Conflict) and strategic merge patch (node status conditions
  merged by ``type``), every write with ``fieldManager`` and, dry-run, ``dryRun=All``; DELETE (404); evictions
  through PodDisruptionBudgets (201, 429 with a DisruptionBudget cause, 500 for two budgets, 404).
* controller/leader.py: Lease GET/POST/PUT with the resourceVersion read (409 for the loser).
* cli/hpa_loop.py: the ``scale`` subresource, GET then PUT of the Scale read.
* tests/cluster/kubelet.py plays kubelet and scheduler through ``status`` and ``binding``: those too, and a Node
  reporting Ready losing its not-ready taint.

gpuscale does not use server-side apply (no ``application/apply-patch+yaml`` anywhere in gpuscale/), so it is
not covered here. Error answers are compared whole: a metav1.Status (kind, code, reason, message, details).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpuscale.sim.kubeapi import SimKubeApi
from tests.cluster.rest import Answer, Rest

pytestmark = pytest.mark.e2e

_names = itertools.count()


@dataclass
class Target:
    """One API server under test: ``name`` is "real" or "sim"; ``rest`` is an admin client of it."""

    name: str
    rest: Rest

    def namespace(self) -> str:
        name = f"conf-{next(_names)}-{uuid.uuid4().hex[:5]}"
        self.rest.post(
            "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        ).expect(201)
        return name


@pytest.fixture(scope="module")
def sim_target() -> Iterator[Target]:
    """SimKubeApi served over HTTP on its own event loop in a thread, as the demo serves it (any token or none
    is accepted when it is built without ``tokens``)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="sim-kubeapi", daemon=True)
    thread.start()
    api = SimKubeApi()
    url = asyncio.run_coroutine_threadsafe(api.start(), loop).result(10)
    yield Target("sim", Rest(url))
    asyncio.run_coroutine_threadsafe(api.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.fixture(scope="module", params=["real", "sim"])
def api(request) -> Target:
    if request.param == "real":
        return Target("real", request.getfixturevalue("control_plane").rest())
    return request.getfixturevalue("sim_target")


# --- helpers ----------------------------------------------------------------------------------------------------


def _until(what: str, probe: Callable[[], Any], *, seconds: float = 15.0) -> Any:
    """Poll ``probe`` until it returns something truthy, with a deadline (never a fixed sleep)."""
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.05)


def _status(code: int, reason: str | None, message: str, details: dict | None = None) -> dict:
    """A metav1.Status as kube-apiserver serialises a failure (no ``reason`` key when it has none)."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _failure(answer: Answer) -> tuple[int, Any]:
    return answer.status, answer.body


def _cm(name: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def _pod(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "gpuscale.test/none"}]},
    }


def _rv(obj: dict) -> int:
    return int(obj["metadata"]["resourceVersion"])


def _events(rest: Rest, path: str, *, seconds: float, **params: Any) -> list[tuple[str, Any]]:
    """A whole watch (until the server ends it after ``seconds``) as (type, name or resourceVersion) pairs."""
    out = []
    for event in rest.watch(path, timeout_seconds=seconds, **params):
        obj = event["object"]
        if event["type"] in ("BOOKMARK", "ERROR"):
            out.append((event["type"], obj))
        else:
            out.append((event["type"], obj["metadata"]["name"]))
    return out


CONFLICT = (
    'Operation cannot be fulfilled on configmaps "{}": the object has been modified; please apply your changes to '
    "the latest version and try again"
)
PATCH_REJECTED = _status(422, "Invalid", "the server rejected our request due to an error in our request", {})


# --- create, read, delete: the Status shapes ----------------------------------------------------------------------


def test_create_answers_409_already_exists_and_reads_answer_404_not_found(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    created = api.rest.post(base, _cm("a", k="1"), fieldManager="gpuscale-controller")
    assert created.status == 201
    assert created.body["kind"] == "ConfigMap" and created.body["data"] == {"k": "1"}
    assert _failure(api.rest.post(base, _cm("a", k="2"), fieldManager="gpuscale-controller")) == (
        409,
        _status(409, "AlreadyExists", 'configmaps "a" already exists', {"name": "a", "kind": "configmaps"}),
    )
    assert api.rest.get(f"{base}/a").body["data"] == {"k": "1"}
    not_found = _status(404, "NotFound", 'configmaps "nope" not found', {"name": "nope", "kind": "configmaps"})
    assert _failure(api.rest.get(f"{base}/nope")) == (404, not_found)
    assert _failure(api.rest.patch(f"{base}/nope", {"data": {"k": "v"}}, fieldManager="gpuscale-controller")) == (
        404,
        not_found,
    )
    assert _failure(api.rest.delete(f"{base}/nope")) == (404, not_found)
    assert _failure(api.rest.post("/api/v1/namespaces/conf-missing/configmaps", _cm("a"))) == (
        404,
        _status(404, "NotFound", 'namespaces "conf-missing" not found', {"name": "conf-missing", "kind": "namespaces"}),
    )


def test_delete_answers_a_success_status_or_the_object(api: Target):
    """A ConfigMap's DELETE answers a Success Status naming it (kube-apiserver returns the deleted object only
    for a few kinds: pods, namespaces, services…); a pod on no node is deleted at once and returned."""
    ns = api.namespace()
    cm = api.rest.post(f"/api/v1/namespaces/{ns}/configmaps", _cm("gone")).expect(201)
    answer = api.rest.delete(f"/api/v1/namespaces/{ns}/configmaps/gone")
    assert answer.status == 200
    assert answer.body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": "gone", "kind": "configmaps", "uid": cm["metadata"]["uid"]},
    }
    api.rest.post(f"/api/v1/namespaces/{ns}/pods", _pod("p")).expect(201)
    pod = api.rest.delete(f"/api/v1/namespaces/{ns}/pods/p")
    assert (pod.status, pod.body["kind"], pod.body["metadata"]["name"]) == (200, "Pod", "p")
    assert api.rest.get(f"/api/v1/namespaces/{ns}/pods/p").status == 404


def test_invalid_objects_answer_422_and_bad_requests_400(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    bad = api.rest.post(base, _cm("Bad_Name"))
    assert (bad.status, bad.body["reason"], bad.body["details"]["name"], bad.body["details"]["kind"]) == (
        422,
        "Invalid",
        "Bad_Name",
        "ConfigMap",
    )
    assert [(c["reason"], c["field"]) for c in bad.body["details"]["causes"]] == [
        ("FieldValueInvalid", "metadata.name")
    ]
    assert bad.body["message"].startswith('ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"')
    elsewhere = dict(_cm("m"), metadata={"name": "m", "namespace": "other"})
    assert _failure(api.rest.post(base, elsewhere)) == (
        400,
        _status(
            400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request"
        ),
    )
    too_long = api.rest.post(base, _cm("fm"), fieldManager="x" * 129)
    assert (too_long.status, too_long.body["reason"]) == (422, "Invalid")
    assert [(c["reason"], c["field"]) for c in too_long.body["details"]["causes"]] == [
        ("FieldValueTooLong", "fieldManager")
    ]
    bogus = api.rest.post(base, _cm("dry"), dryRun="Bogus")
    assert (bogus.status, bogus.body["reason"]) == (422, "Invalid")
    assert [(c["reason"], c["field"]) for c in bogus.body["details"]["causes"]] == [
        ("FieldValueNotSupported", "dryRun")
    ]


# --- writes: preconditions, patches, dry run -------------------------------------------------------------------


def test_a_stale_resource_version_answers_409_conflict(api: Target):
    """PUT with the resourceVersion read, and a merge patch carrying ``metadata.resourceVersion`` (the actuator's
    precondition): both 409 Conflict once someone else wrote; a JSON patch ``replace`` of the resourceVersion too."""
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    read = api.rest.post(base, _cm("c", k="1")).expect(201)
    rv = read["metadata"]["resourceVersion"]
    assert api.rest.patch(f"{base}/c", {"metadata": {"resourceVersion": rv}, "data": {"k": "2"}}).status == 200
    conflict = (409, _status(409, "Conflict", CONFLICT.format("c"), {"name": "c", "kind": "configmaps"}))
    assert _failure(api.rest.patch(f"{base}/c", {"metadata": {"resourceVersion": rv}, "data": {"k": "3"}})) == conflict
    assert _failure(api.rest.put(f"{base}/c", dict(read, data={"k": "4"}))) == conflict
    stale_json = [
        {"op": "replace", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/data/k", "value": "5"},
    ]
    assert _failure(api.rest.patch(f"{base}/c", stale_json, "json")) == conflict
    assert api.rest.get(f"{base}/c").body["data"] == {"k": "2"}
    # A PUT of the object as read goes through; the same PUT again is stale.
    read = api.rest.post(base, _cm("u", k="1")).expect(201)
    assert api.rest.put(f"{base}/u", dict(read, data={"k": "2"})).status == 200
    assert _failure(api.rest.put(f"{base}/u", dict(read, data={"k": "3"}))) == (
        409,
        _status(409, "Conflict", CONFLICT.format("u"), {"name": "u", "kind": "configmaps"}),
    )
    assert api.rest.get(f"{base}/u").body["data"] == {"k": "2"}


def test_json_patch_add_replaces_an_existing_member_and_test_ops_guard_it(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    cm = _cm("d")
    cm["metadata"]["annotations"] = {"theirs": "1"}
    api.rest.post(base, cm).expect(201)
    # RFC 6902: `add` of an existing member replaces it — why the actuator guards with `test`.
    replaced = api.rest.patch(
        f"{base}/d", [{"op": "add", "path": "/metadata/annotations", "value": {"ours": "1"}}], "json"
    )
    assert replaced.status == 200 and replaced.body["metadata"]["annotations"] == {"ours": "1"}
    # `test` of null fails against a member that is there: the guard before creating a map.
    create_if_absent = [
        {"op": "test", "path": "/metadata/annotations", "value": None},
        {"op": "add", "path": "/metadata/annotations", "value": {}},
    ]
    assert _failure(api.rest.patch(f"{base}/d", create_if_absent, "json")) == (422, PATCH_REJECTED)
    # A failed `test` rejects the whole patch: 422 with kube-apiserver's generic message, nothing written.
    guarded = [
        {"op": "test", "path": "/metadata/annotations", "value": {"theirs": "1"}},
        {"op": "add", "path": "/metadata/annotations/a~1b", "value": "x"},
    ]
    assert _failure(api.rest.patch(f"{base}/d", guarded, "json")) == (422, PATCH_REJECTED)
    # `test` against an absent member with the value null passes (the member reads as null).
    absent = [
        {"op": "test", "path": "/metadata/labels", "value": None},
        {"op": "add", "path": "/metadata/labels", "value": {}},
    ]
    assert api.rest.patch(f"{base}/d", absent, "json").status == 200
    guarded[0]["value"] = {"ours": "1"}
    ok = api.rest.patch(f"{base}/d", guarded, "json", fieldManager="gpuscale-controller")
    assert ok.status == 200 and ok.body["metadata"]["annotations"] == {"ours": "1", "a/b": "x"}
    # kube-apiserver's JSON patch lets `replace` add a missing key of an existing map (beyond RFC 6902's letter).
    added = [{"op": "replace", "path": "/metadata/annotations/new", "value": "1"}]
    assert api.rest.patch(f"{base}/d", added, "json").expect(200)["metadata"]["annotations"] == {
        "ours": "1",
        "a/b": "x",
        "new": "1",
    }
    for bad in (
        [{"op": "replace", "path": "/metadata/labels/missing", "value": "1"}],
        [{"op": "add", "path": "/metadata/ownerReferences/0/name", "value": "1"}],
        [{"op": "remove", "path": "/data/missing"}],
        [{"op": "test", "path": "/metadata/annotations/ours", "value": "2"}],
        [{"op": "frob", "path": "/data"}],
    ):
        assert _failure(api.rest.patch(f"{base}/d", bad, "json")) == (422, PATCH_REJECTED), bad
    not_a_list = api.rest.patch(f"{base}/d", {"op": "add"}, "json")
    assert (not_a_list.status, not_a_list.body["reason"]) == (400, "BadRequest")
    assert api.rest.get(f"{base}/d").body["metadata"]["annotations"] == {"ours": "1", "a/b": "x", "new": "1"}


def test_node_taints_and_unschedulable_by_json_patch(api: Target):
    """What health.node_json_patch sends: test + replace the taints read, remove them, add/remove unschedulable."""
    name = f"conf-node-{uuid.uuid4().hex[:6]}"
    path = f"/api/v1/nodes/{name}"
    node = api.rest.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}).expect(201)
    # TaintNodesByCondition: a new Node is tainted not-ready until it reports Ready.
    read = node["spec"]["taints"]
    assert [(t["key"], t["effect"]) for t in read] == [("node.kubernetes.io/not-ready", "NoSchedule")]
    ours = {"key": "gpuscale.io/unhealthy", "value": "xid-79", "effect": "NoSchedule"}
    ops = [
        {"op": "test", "path": "/spec/taints", "value": read},
        {"op": "replace", "path": "/spec/taints", "value": [*read, ours]},
    ]
    tainted = api.rest.patch(path, ops, "json", fieldManager="gpuscale-controller").expect(200)
    assert [t["key"] for t in tainted["spec"]["taints"]] == ["node.kubernetes.io/not-ready", "gpuscale.io/unhealthy"]
    assert _failure(api.rest.patch(path, ops, "json")) == (422, PATCH_REJECTED)  # the taints read are stale now
    cordoned = api.rest.patch(path, [{"op": "add", "path": "/spec/unschedulable", "value": True}], "json").expect(200)
    assert cordoned["spec"]["unschedulable"] is True
    ops = [
        {"op": "test", "path": "/spec/taints", "value": tainted["spec"]["taints"]},
        {"op": "remove", "path": "/spec/taints"},
        {"op": "remove", "path": "/spec/unschedulable"},
    ]
    cleared = api.rest.patch(path, ops, "json").expect(200)
    assert "taints" not in cleared["spec"] and "unschedulable" not in cleared["spec"]
    api.rest.delete(path).expect(200)


def test_node_taints_appended_by_json_patch_and_replaced_by_strategic_merge(api: Target):
    """A Node created with taints keeps them beside the not-ready one; ``add`` at ``/spec/taints/-`` appends;
    a strategic merge patch replaces the taints list whole (it has no merge key); ``unschedulable`` too."""
    name = f"conf-taints-{uuid.uuid4().hex[:6]}"
    path = f"/api/v1/nodes/{name}"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": [{"key": "theirs", "effect": "NoSchedule"}]},
    }
    created = api.rest.post("/api/v1/nodes", node).expect(201)
    assert [t["key"] for t in created["spec"]["taints"]] == ["theirs", "node.kubernetes.io/not-ready"]
    ours = {"key": "ours", "effect": "NoSchedule"}
    api.rest.patch(path, [{"op": "add", "path": "/spec/taints/-", "value": ours}], "json").expect(200)
    taints = [t["key"] for t in api.rest.get(path).expect(200)["spec"]["taints"]]
    assert taints == ["theirs", "node.kubernetes.io/not-ready", "ours"]
    wrong = [{"op": "test", "path": "/spec/taints", "value": []}]
    assert _failure(api.rest.patch(path, wrong, "json")) == (422, PATCH_REJECTED)
    only = {"spec": {"taints": [{"key": "only", "effect": "NoExecute"}]}}
    api.rest.patch(path, only, "strategic").expect(200)
    assert [t["key"] for t in api.rest.get(path).expect(200)["spec"]["taints"]] == ["only"]
    cordoned = api.rest.patch(path, {"spec": {"unschedulable": True}}, "strategic").expect(200)
    assert cordoned["spec"]["unschedulable"] is True
    api.rest.delete(path).expect(200)


def test_a_node_reporting_ready_keeps_only_the_taints_others_put(api: Target):
    """tests/cluster/kubelet.py's make_node: status Ready, then the not-ready taint gone (removed by a guarded
    patch — the node lifecycle controller's part, which the real control plane here leaves to the test and
    SimKubeApi does itself); a taint put afterwards is the only one."""
    from tests.cluster.kubelet import make_node

    name = f"conf-ready-{uuid.uuid4().hex[:6]}"
    node = make_node(api.rest, name, gpus=4)
    assert node["spec"].get("taints") is None
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    person = [{"op": "add", "path": "/spec/taints", "value": [{"key": "person", "effect": "NoSchedule"}]}]
    api.rest.patch(f"/api/v1/nodes/{name}", person, "json").expect(200)
    assert [t["key"] for t in api.rest.get(f"/api/v1/nodes/{name}").expect(200)["spec"]["taints"]] == ["person"]
    api.rest.delete(f"/api/v1/nodes/{name}").expect(200)


def test_a_pods_status_changes_only_through_its_status_subresource(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/pods"
    api.rest.post(base, _pod("st")).expect(201)
    running = {"status": {"phase": "Running"}}
    assert api.rest.patch(f"{base}/st", running).expect(200)["status"]["phase"] == "Pending"
    assert api.rest.patch(f"{base}/st/status", running).expect(200)["status"]["phase"] == "Running"


def test_merge_patch_null_removes_and_strategic_merge_merges_conditions_by_type(api: Target):
    ns = api.namespace()
    cm = _cm("m", a="1", b="2")
    cm["metadata"]["annotations"] = {"gpuscale.io/idle": "true", "keep": "1"}
    api.rest.post(f"/api/v1/namespaces/{ns}/configmaps", cm).expect(201)
    patched = api.rest.patch(
        f"/api/v1/namespaces/{ns}/configmaps/m",
        {"metadata": {"annotations": {"gpuscale.io/idle": None, "new": "1"}}, "data": {"a": None}},
        fieldManager="gpuscale-controller",
    ).expect(200)
    assert patched["metadata"]["annotations"] == {"keep": "1", "new": "1"} and patched["data"] == {"b": "2"}
    # Node conditions through nodes/status (health.py): strategic merge keys them by type; a merge patch would
    # replace the whole list.
    name = f"conf-cond-{uuid.uuid4().hex[:6]}"
    api.rest.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}).expect(201)
    status = f"/api/v1/nodes/{name}/status"

    def condition(kind: str, value: str) -> dict:
        stamp = "2026-01-01T00:00:00Z"
        return {"type": kind, "status": value, "reason": kind, "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}

    api.rest.patch(status, {"status": {"conditions": [condition("Ready", "True")]}}, "strategic").expect(200)
    merged = api.rest.patch(status, {"status": {"conditions": [condition("GpuHealthy", "False")]}}, "strategic")
    assert [(c["type"], c["status"]) for c in merged.expect(200)["status"]["conditions"]] == [
        ("GpuHealthy", "False"),
        ("Ready", "True"),
    ]
    flipped = api.rest.patch(status, {"status": {"conditions": [condition("GpuHealthy", "True")]}}, "strategic")
    assert [(c["type"], c["status"]) for c in flipped.expect(200)["status"]["conditions"]] == [
        ("GpuHealthy", "True"),
        ("Ready", "True"),
    ]
    replaced = api.rest.patch(status, {"status": {"conditions": [condition("Ready", "True")]}}, "merge")
    assert [c["type"] for c in replaced.expect(200)["status"]["conditions"]] == ["Ready"]
    # The main resource ignores status; the status subresource ignores spec.
    ignored = api.rest.patch(f"/api/v1/nodes/{name}", {"status": {"conditions": []}}).expect(200)
    assert [c["type"] for c in ignored["status"]["conditions"]] == ["Ready"]
    api.rest.delete(f"/api/v1/nodes/{name}").expect(200)


def test_dry_run_all_validates_and_stores_nothing(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    dry = api.rest.post(base, _cm("dry", k="1"), dryRun="All", fieldManager="gpuscale-controller")
    assert dry.status == 201 and dry.body["metadata"]["name"] == "dry" and "resourceVersion" not in dry.body["metadata"]
    assert api.rest.get(f"{base}/dry").status == 404
    kept = api.rest.post(base, _cm("kept", k="1")).expect(201)
    patched = api.rest.patch(f"{base}/kept", {"data": {"k": "2"}}, dryRun="All").expect(200)
    assert (
        patched["data"] == {"k": "2"} and patched["metadata"]["resourceVersion"] == kept["metadata"]["resourceVersion"]
    )
    assert api.rest.delete(f"{base}/kept", dryRun="All").status == 200
    again = api.rest.post(base, _cm("kept"), dryRun="All")
    assert (again.status, again.body["reason"]) == (409, "AlreadyExists")
    bad = api.rest.patch(f"{base}/kept", [{"op": "test", "path": "/data/k", "value": "2"}], "json", dryRun="All")
    assert _failure(bad) == (422, PATCH_REJECTED)
    assert api.rest.get(f"{base}/kept").body["data"] == {"k": "1"}


# --- list and watch: what the reflectors rely on ------------------------------------------------------------------


def test_lists_page_with_limit_and_continue_over_one_snapshot(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    for name in ("a", "b", "c", "d"):
        api.rest.post(base, _cm(name, v="1")).expect(201)
    first = api.rest.get(base, limit=2).expect(200)
    assert (first["kind"], first["apiVersion"]) == ("ConfigMapList", "v1")
    assert [i["metadata"]["name"] for i in first["items"]] == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 2 and first["metadata"]["continue"]
    assert all("kind" not in i for i in first["items"])  # typed lists: items carry no kind/apiVersion
    # Changes after the first page do not show in the next ones: every page is the first page's snapshot.
    api.rest.post(base, _cm("bb", v="1")).expect(201)
    api.rest.delete(f"{base}/c").expect(200)
    api.rest.patch(f"{base}/d", {"data": {"v": "2"}}).expect(200)
    rest = api.rest.get(base, limit=2, **{"continue": first["metadata"]["continue"]}).expect(200)
    assert [(i["metadata"]["name"], i["data"]) for i in rest["items"]] == [("c", {"v": "1"}), ("d", {"v": "1"})]
    assert rest["metadata"] == {"resourceVersion": first["metadata"]["resourceVersion"]}
    now = api.rest.get(base).expect(200)
    assert [(i["metadata"]["name"], i["data"]) for i in now["items"]] == [
        ("a", {"v": "1"}),
        ("b", {"v": "1"}),
        ("bb", {"v": "1"}),
        ("d", {"v": "2"}),
    ]
    bad = api.rest.get(base, limit=2, **{"continue": "garbage"})
    assert (bad.status, bad.body["reason"]) == (400, "BadRequest")
    assert bad.body["message"].startswith("invalid continue token: continue key is not valid: ")


def test_watch_from_the_lists_resource_version_replays_every_change_in_order(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    api.rest.post(base, _cm("before")).expect(201)
    listed = api.rest.get(base).expect(200)
    rv = listed["metadata"]["resourceVersion"]
    created = api.rest.post(base, _cm("w", k="1")).expect(201)
    modified = api.rest.patch(f"{base}/w", {"data": {"k": "2"}}).expect(200)
    api.rest.delete(f"{base}/w").expect(200)
    seen = []
    for event in api.rest.watch(base, timeout_seconds=2, resourceVersion=rv, allowWatchBookmarks="true"):
        if event["type"] != "BOOKMARK":
            obj = event["object"]
            seen.append(
                (event["type"], obj["kind"], obj["metadata"]["name"], (obj.get("data") or {}).get("k"), _rv(obj))
            )
        if len(seen) == 3:
            break
    assert [s[:4] for s in seen] == [
        ("ADDED", "ConfigMap", "w", "1"),
        ("MODIFIED", "ConfigMap", "w", "2"),
        ("DELETED", "ConfigMap", "w", "2"),
    ]
    assert seen[0][4] == _rv(created) and seen[1][4] == _rv(modified) and seen[2][4] > _rv(modified)
    # Without a resourceVersion (or "0") a watch starts with the current state as ADDED events.
    assert _events(api.rest, base, seconds=1, resourceVersion="0") == [("ADDED", "before")]


def test_watch_selectors_turn_objects_leaving_the_selection_into_deleted(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    rv = api.rest.get(base).expect(200)["metadata"]["resourceVersion"]
    for name, tier in (("x", "gpu"), ("y", "gpu"), ("z", "cpu")):
        cm = _cm(name)
        cm["metadata"]["labels"] = {"tier": tier}
        api.rest.post(base, cm).expect(201)
    api.rest.patch(f"{base}/y", {"metadata": {"labels": {"tier": "cpu"}}}).expect(200)
    api.rest.patch(f"{base}/z", {"metadata": {"labels": {"tier": "gpu"}}}).expect(200)
    assert _events(api.rest, base, seconds=1, resourceVersion=rv, labelSelector="tier=gpu") == [
        ("ADDED", "x"),
        ("ADDED", "y"),
        ("DELETED", "y"),
        ("ADDED", "z"),
    ]
    assert _events(api.rest, base, seconds=1, resourceVersion=rv, fieldSelector="metadata.name=y") == [
        ("ADDED", "y"),
        ("MODIFIED", "y"),
    ]


def test_a_watch_from_a_resource_version_older_than_the_server_keeps_gets_410_gone(api: Target):
    """A freshly served resource (a CustomResourceDefinition's) keeps no history from before it was served:
    a watch from resourceVersion 1 is answered HTTP 200 with one ERROR event carrying a 410 Expired Status, and
    the stream ends — the reflector's cue to list again."""
    group = f"c{uuid.uuid4().hex[:8]}.conformance.gpuscale.test"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    api.rest.post(crds, crd).expect(201)
    ns = api.namespace()
    base = f"/apis/{group}/v1/namespaces/{ns}/widgets"
    listed = _until("the custom resource served", lambda: (a := api.rest.get(base)).ok and a.body)
    started = time.monotonic()
    events = list(api.rest.watch(base, timeout_seconds=5, resourceVersion="1"))
    assert time.monotonic() - started < 3, "the stream ends after the ERROR event"
    assert [e["type"] for e in events] == ["ERROR"]
    gone = events[0]["object"]
    assert {k: v for k, v in gone.items() if k != "message"} == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
    }
    assert gone["message"].startswith("too old resource version: 1 (")
    # From the list's resourceVersion the same watch works.
    assert _events(api.rest, base, seconds=1, resourceVersion=listed["metadata"]["resourceVersion"]) == []
    api.rest.delete(f"{crds}/widgets.{group}").expect(200)


def test_bookmarks_carry_only_a_resource_version_and_come_before_the_watch_ends(api: Target):
    """allowWatchBookmarks: kube-apiserver sends a BOOKMARK about 2 s before a watch's timeout (and every
    minute) with the newest resourceVersion of the resource — only when the resource changed (anywhere, even
    outside the watch's selection) after the watch began. Its object is the kind and a resourceVersion."""
    ns, elsewhere = api.namespace(), api.namespace()
    base = f"/api/v1/namespaces/{ns}/configmaps"
    rv = api.rest.get(base).expect(200)["metadata"]["resourceVersion"]
    api.rest.post(f"/api/v1/namespaces/{elsewhere}/configmaps", _cm("before")).expect(201)
    changes: list[dict] = []

    def change_elsewhere() -> None:
        time.sleep(0.5)
        changes.append(api.rest.post(f"/api/v1/namespaces/{elsewhere}/configmaps", _cm("during")).expect(201))

    thread = threading.Thread(target=change_elsewhere)
    thread.start()
    started = time.monotonic()
    seen = []
    for event in api.rest.watch(base, timeout_seconds=5, resourceVersion=rv, allowWatchBookmarks="true"):
        seen.append((event, time.monotonic() - started))
    thread.join()
    assert seen and {e["type"] for e, _ in seen} == {"BOOKMARK"}, seen
    bookmark, at = seen[0]
    assert bookmark["object"] == {
        "kind": "ConfigMap",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": changes[0]["metadata"]["resourceVersion"]},
    }
    assert at < 4.5, f"the first bookmark came {at:.1f} s into a 5 s watch, not about 2 s before its end"
    # Resuming from the bookmark replays nothing; a watch that does not allow bookmarks gets none.
    resumed = bookmark["object"]["metadata"]["resourceVersion"]
    # Changes only from before the watch began: no bookmark (the three watches run side by side).
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        watches = [
            pool.submit(_events, api.rest, base, seconds=1, resourceVersion=resumed),
            pool.submit(_events, api.rest, base, seconds=3, resourceVersion=rv),
            pool.submit(_events, api.rest, base, seconds=3, resourceVersion=resumed, allowWatchBookmarks="true"),
        ]
        assert [w.result() for w in watches] == [[], [], []]


def test_label_and_field_selectors_on_lists(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/pods"
    for name, app in (("p1", "a"), ("p2", "a"), ("p3", "b")):
        api.rest.post(base, _pod(name, app=app, tier=name)).expect(201)
    node = f"conf-sel-{uuid.uuid4().hex[:6]}"
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p2"},
        "target": {"kind": "Node", "name": node},
    }
    api.rest.post(f"{base}/p2/binding", binding).expect(201)

    def names(path: str = base, **params: Any) -> list[str]:
        return sorted(p["metadata"]["name"] for p in api.rest.get(path, **params).expect(200)["items"])

    assert names(labelSelector="app=a") == ["p1", "p2"]
    assert names(labelSelector="app in (a,b),tier!=p1") == ["p2", "p3"]
    assert names(labelSelector="!app") == []
    assert names(labelSelector="app") == ["p1", "p2", "p3"]
    assert names(fieldSelector="metadata.name=p3") == ["p3"]
    assert names(fieldSelector=f"spec.nodeName={node}") == ["p2"]
    assert names(fieldSelector="spec.nodeName=") == ["p1", "p3"]
    assert names(fieldSelector="spec.nodeName=elsewhere") == []
    assert names(labelSelector="app==") == []  # an empty value selects an empty label only
    assert names(fieldSelector=f"spec.nodeName!={node},metadata.name!=p1") == ["p3"]
    assert names("/api/v1/pods", fieldSelector=f"spec.nodeName={node}") == ["p2"]
    unknown = api.rest.get(base, fieldSelector="spec.containers=x")
    assert (unknown.status, unknown.body["reason"]) == (400, "BadRequest")
    assert unknown.body["message"] == "field label not supported: spec.containers"


def test_events_are_selected_by_source(api: Target):
    """The controller watches its own Events with ``fieldSelector=source=gpuscale-controller``."""
    ns = api.namespace()

    def event(name: str, component: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": ns},
            "reason": "GpuscaleTest",
            "message": "m",
            "type": "Normal",
            "count": 1,
            "source": {"component": component},
        }

    base = f"/api/v1/namespaces/{ns}/events"
    api.rest.post(base, event("ours.1", "gpuscale-controller"), fieldManager="gpuscale-controller").expect(201)
    api.rest.post(base, event("theirs.1", "kubelet")).expect(201)
    again = api.rest.post(base, event("ours.1", "gpuscale-controller"))
    assert (again.status, again.body["reason"]) == (409, "AlreadyExists")
    bumped = api.rest.patch(f"{base}/ours.1", {"count": 2, "lastTimestamp": "2026-01-01T00:00:00Z"}).expect(200)
    assert bumped["count"] == 2
    listed = api.rest.get(base, fieldSelector="source=gpuscale-controller").expect(200)
    assert [e["metadata"]["name"] for e in listed["items"]] == ["ours.1"]


def test_an_event_lives_in_its_objects_namespace(api: Target):
    """A core/v1 Event about a cluster-scoped object (a Node) belongs in "default" — as the controller's actuator
    writes it — and one about a Pod in the Pod's namespace; elsewhere it is 422 Invalid."""
    ns = api.namespace()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "ev.1", "namespace": ns},
        "involvedObject": {"kind": "Node", "name": "n1", "apiVersion": "v1"},
        "reason": "GpuscaleCordoned",
        "message": "m",
        "type": "Warning",
        "source": {"component": "gpuscale-controller"},
        "count": 1,
    }
    elsewhere = api.rest.post(f"/api/v1/namespaces/{ns}/events", event)
    assert (elsewhere.status, elsewhere.body["reason"]) == (422, "Invalid")
    assert [c["field"] for c in elsewhere.body["details"]["causes"]] == ["involvedObject.namespace"]
    event["metadata"] = {"name": f"{ns}.ev", "namespace": "default"}
    api.rest.post("/api/v1/namespaces/default/events", event).expect(201)
    again = api.rest.post("/api/v1/namespaces/default/events", event)
    assert (again.status, again.body["reason"]) == (409, "AlreadyExists")
    about_a_pod = dict(
        event, metadata={"name": "ev.2", "namespace": ns}, involvedObject={"kind": "Pod", "name": "p", "namespace": ns}
    )
    api.rest.post(f"/api/v1/namespaces/{ns}/events", about_a_pod).expect(201)
    listed = api.rest.get("/api/v1/namespaces/default/events", fieldSelector=f"metadata.name={ns}.ev").expect(200)
    assert [e["reason"] for e in listed["items"]] == ["GpuscaleCordoned"]
    api.rest.delete(f"/api/v1/namespaces/default/events/{ns}.ev").expect(200)


# --- the leader's Lease, the HPA loop's scale subresource, the kubelet's binding ------------------------------


def test_lease_put_with_the_resource_version_read_lets_one_replica_win(api: Target):
    ns = api.namespace()
    base = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    spec = {"holderIdentity": "a", "leaseDurationSeconds": 15, "acquireTime": "2026-01-01T00:00:00.000000Z"}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "gpuscale"}, "spec": spec}
    api.rest.post(base, lease).expect(201)
    again = api.rest.post(base, lease)
    assert (again.status, again.body["reason"]) == (409, "AlreadyExists")
    read = api.rest.get(f"{base}/gpuscale").expect(200)
    first = api.rest.put(
        f"{base}/gpuscale", dict(read, spec=dict(read["spec"], holderIdentity="b", leaseTransitions=1))
    )
    second = api.rest.put(
        f"{base}/gpuscale", dict(read, spec=dict(read["spec"], holderIdentity="c", leaseTransitions=1))
    )
    assert first.status == 200
    assert _failure(second) == (
        409,
        _status(
            409,
            "Conflict",
            'Operation cannot be fulfilled on leases.coordination.k8s.io "gpuscale": the object has been modified; '
            "please apply your changes to the latest version and try again",
            {"name": "gpuscale", "group": "coordination.k8s.io", "kind": "leases"},
        ),
    )
    # Released: holderIdentity null is dropped, as every null in a typed object.
    held = first.body
    released = api.rest.put(
        f"{base}/gpuscale", dict(held, spec=dict(held["spec"], holderIdentity=None, leaseDurationSeconds=1))
    )
    assert "holderIdentity" not in released.expect(200)["spec"]


def test_scale_subresource_reads_and_writes_the_replicas(api: Target):
    ns = api.namespace()
    labels = {"app": "s"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "s"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "none"}]}},
        },
    }
    created = api.rest.post(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment).expect(201)
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/s/scale"
    scale = api.rest.get(path).expect(200)
    assert (scale["kind"], scale["apiVersion"], scale["spec"], scale["status"].get("selector")) == (
        "Scale",
        "autoscaling/v1",
        {},  # NB: replicas 0 is omitted from a Scale's spec
        "app=s",
    )
    # The Scale carries its Deployment's resourceVersion (read together: the deployment controller may write the
    # Deployment's status between two reads on the real server).
    deployment_path = f"/apis/apps/v1/namespaces/{ns}/deployments/s"
    _until(
        "the Scale to carry its Deployment's resourceVersion",
        lambda: (
            api.rest.get(path).expect(200)["metadata"]["resourceVersion"]
            == api.rest.get(deployment_path).expect(200)["metadata"]["resourceVersion"]
        ),
    )
    assert scale["metadata"]["uid"] == created["metadata"]["uid"]
    # What hpa_loop sends: the Scale it read, resized. The deployment controller writes the Deployment's status
    # meanwhile (a new resourceVersion), so a read-and-put may meet a Conflict and is tried again.
    resized = _until(
        "a resize to go through",
        lambda: (a := api.rest.put(path, {**api.rest.get(path).expect(200), "spec": {"replicas": 1}})).ok and a,
    )
    assert (resized.status, resized.body["spec"]) == (200, {"replicas": 1})
    stale = api.rest.put(path, {**scale, "spec": {"replicas": 0}})
    assert (stale.status, stale.body["reason"]) == (409, "Conflict")
    assert stale.body["details"] == {"name": "s", "group": "apps", "kind": "deployments"}
    assert api.rest.get(f"/apis/apps/v1/namespaces/{ns}/deployments/s").expect(200)["spec"]["replicas"] == 1
    # A merge patch of the Scale, and a PUT without a resourceVersion, are unconditional.
    assert api.rest.patch(path, {"spec": {"replicas": 2}}).expect(200)["spec"] == {"replicas": 2}
    unversioned = {k: v for k, v in scale["metadata"].items() if k != "resourceVersion"}
    put = api.rest.put(path, {**scale, "metadata": unversioned, "spec": {"replicas": 3}})
    assert (put.status, put.body["spec"]) == (200, {"replicas": 3})
    assert api.rest.get(f"/apis/apps/v1/namespaces/{ns}/deployments/s").expect(200)["spec"]["replicas"] == 3
    missing = api.rest.get(f"/apis/apps/v1/namespaces/{ns}/deployments/nope/scale")
    assert _failure(missing) == (
        404,
        _status(
            404,
            "NotFound",
            'deployments.apps "nope" not found',
            {"name": "nope", "group": "apps", "kind": "deployments"},
        ),
    )


def test_binding_assigns_a_node_once(api: Target):
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/pods"
    api.rest.post(base, _pod("p")).expect(201)

    def binding(name: str, node: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"kind": "Node", "name": node},
        }

    bound = api.rest.post(f"{base}/p/binding", binding("p", "n1"))
    assert (bound.status, bound.body) == (
        201,
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
    )
    pod = api.rest.get(f"{base}/p").expect(200)
    assert pod["spec"]["nodeName"] == "n1"
    assert [(c["type"], c["status"]) for c in pod["status"]["conditions"]] == [("PodScheduled", "True")]
    assert _failure(api.rest.post(f"{base}/p/binding", binding("p", "n2"))) == (
        409,
        _status(
            409,
            "Conflict",
            'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1"',
            {"name": "p", "kind": "pods/binding"},
        ),
    )
    assert _failure(api.rest.post(f"{base}/q/binding", binding("q", "n1"))) == (
        404,
        _status(404, "NotFound", 'pods "q" not found', {"name": "q", "kind": "pods"}),
    )
    assert _failure(api.rest.post(f"{base}/p/binding", binding("zz", "n1"))) == (
        400,
        _status(400, "BadRequest", "name in URL does not match name in Binding object"),
    )
    # Bound to a node, a pod's DELETE is graceful (the kubelet finishes it); gracePeriodSeconds=0 is not.
    api.rest.delete(f"{base}/p", gracePeriodSeconds="0").expect(200)
    assert api.rest.get(f"{base}/p").status == 404


# --- evictions through PodDisruptionBudgets ---------------------------------------------------------------------


def _pdb_settled(api: Target, path: str, **expected: int) -> Callable[[], Any]:
    """The budget's status as the disruption controller computes it, once it has observed the budget's
    generation and shows ``expected``."""

    def probe() -> Any:
        pdb = api.rest.get(path).expect(200)
        status = pdb.get("status") or {}
        if status.get("observedGeneration") != pdb["metadata"]["generation"]:
            return None
        return status if all(status.get(k) == v for k, v in expected.items()) else None

    return probe


def test_evictions_respect_disruption_budgets(api: Target):
    from tests.cluster.kubelet import FakeKubelet, make_node

    ns = api.namespace()
    node = f"conf-ev-{uuid.uuid4().hex[:6]}"
    make_node(api.rest, node, gpus=1)
    base = f"/api/v1/namespaces/{ns}/pods"
    budgets = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"

    def budget(name: str) -> dict:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "ev"}}},
        }

    def eviction(name: str, **delete_options: Any) -> dict:
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
        if delete_options:
            body["deleteOptions"] = delete_options
        return body

    success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    api.rest.post(budgets, budget("one")).expect(201)
    # A Pending pod is evicted whatever its budgets say: it disrupts nothing yet.
    api.rest.post(base, _pod("pending", app="ev")).expect(201)
    assert api.rest.post(f"{base}/pending/eviction", eviction("pending")).body == success
    assert api.rest.get(f"{base}/pending").status == 404
    for name in ("a", "b", "c", "u"):
        api.rest.post(base, _pod(name, app="ev")).expect(201)
    with FakeKubelet(api.rest, namespaces=[ns], nodes=[node], interval_seconds=0.1) as kubelet:
        status = _until(
            "the budget to allow two disruptions",
            _pdb_settled(
                api, f"{budgets}/one", currentHealthy=4, desiredHealthy=2, disruptionsAllowed=2, expectedPods=4
            ),
        )
        assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
            ("DisruptionAllowed", "True", "SufficientPods")
        ]
        dry = api.rest.post(f"{base}/a/eviction", eviction("a"), dryRun="All")
        assert (dry.status, dry.body) == (201, success)
        assert "deletionTimestamp" not in api.rest.get(f"{base}/a").expect(200)["metadata"]
        assert api.rest.get(f"{budgets}/one").expect(200)["status"]["disruptionsAllowed"] == 2
        evicted = api.rest.post(f"{base}/a/eviction", eviction("a", gracePeriodSeconds=0))
        assert (evicted.status, evicted.body) == (201, success)
        assert api.rest.get(f"{base}/a").status == 404
        # u stops being Ready: the budget is exactly met, so no ready pod may go — but u itself may (the default
        # unhealthyPodEvictionPolicy, IfHealthyBudget, lets an unready pod go while the budget is met).
        unready = {"status": {"conditions": [{"type": "Ready", "status": "False"}]}}
        api.rest.patch(f"{base}/u/status", unready, "strategic").expect(200)
        _until(
            "the budget to allow no disruption",
            _pdb_settled(
                api, f"{budgets}/one", currentHealthy=2, desiredHealthy=2, disruptionsAllowed=0, expectedPods=3
            ),
        )
        blocked = api.rest.post(f"{base}/b/eviction", eviction("b"))
        assert _failure(blocked) == (
            429,
            _status(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": "The disruption budget one needs 2 healthy pods and has 2 currently",
                        }
                    ]
                },
            ),
        )
        assert api.rest.post(f"{base}/u/eviction", eviction("u", gracePeriodSeconds=0)).body == success
        assert api.rest.get(f"{base}/u").status == 404
        api.rest.post(budgets, budget("two")).expect(201)
        two = api.rest.post(f"{base}/b/eviction", eviction("b"))
        assert _failure(two) == (
            500,
            _status(
                500,
                None,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ),
        )
        assert api.rest.get(f"{base}/b").status == 200
        assert _failure(api.rest.post(f"{base}/nope/eviction", eviction("nope"))) == (
            404,
            _status(404, "NotFound", 'pods "nope" not found', {"name": "nope", "kind": "pods"}),
        )
        assert not kubelet.errors
    api.rest.delete(f"/api/v1/nodes/{node}").expect(200)


def test_an_unready_pod_is_not_evicted_while_its_budget_is_unmet(api: Target):
    """A Running pod that is not Ready, under a budget it does not meet (minAvailable 1, none healthy): the
    eviction is refused (unhealthyPodEvictionPolicy IfHealthyBudget lets it go only once the budget is met)."""
    ns = api.namespace()
    base = f"/api/v1/namespaces/{ns}/pods"
    budgets = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"
    api.rest.post(base, _pod("ev", app="ev")).expect(201)
    api.rest.patch(f"{base}/ev/status", {"status": {"phase": "Running"}}).expect(200)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "one"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "ev"}}},
    }
    api.rest.post(budgets, budget).expect(201)
    _until(
        "the budget to count the pod",
        _pdb_settled(api, f"{budgets}/one", currentHealthy=0, desiredHealthy=1, disruptionsAllowed=0, expectedPods=1),
    )
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "ev"}}
    blocked = api.rest.post(f"{base}/ev/eviction", eviction)
    assert (blocked.status, blocked.body["reason"]) == (429, "TooManyRequests")
    assert blocked.body["details"]["causes"] == [
        {"reason": "DisruptionBudget", "message": "The disruption budget one needs 1 healthy pods and has 0 currently"}
    ]
    assert api.rest.get(f"{base}/ev").status == 200


# --- discovery: how sources/kuberest.py finds where a kind is served -------------------------------------------

_ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_STATUS_VERBS = ["get", "patch", "update"]
DISCOVERY = {
    "/api/v1": {
        "pods": (True, "Pod", None, None, _ALL_VERBS),
        "pods/binding": (True, "Binding", None, None, ["create"]),
        "pods/eviction": (True, "Eviction", "policy", "v1", ["create"]),
        "pods/status": (True, "Pod", None, None, _STATUS_VERBS),
        "nodes": (False, "Node", None, None, _ALL_VERBS),
        "nodes/status": (False, "Node", None, None, _STATUS_VERBS),
        "configmaps": (True, "ConfigMap", None, None, _ALL_VERBS),
        "events": (True, "Event", None, None, _ALL_VERBS),
        "namespaces": (False, "Namespace", None, None, [v for v in _ALL_VERBS if v != "deletecollection"]),
    },
    "/apis/policy/v1": {
        "poddisruptionbudgets": (True, "PodDisruptionBudget", None, None, _ALL_VERBS),
        "poddisruptionbudgets/status": (True, "PodDisruptionBudget", None, None, _STATUS_VERBS),
    },
    "/apis/coordination.k8s.io/v1": {"leases": (True, "Lease", None, None, _ALL_VERBS)},
    "/apis/apps/v1": {
        "deployments": (True, "Deployment", None, None, _ALL_VERBS),
        "deployments/scale": (True, "Scale", "autoscaling", "v1", _STATUS_VERBS),
        "statefulsets": (True, "StatefulSet", None, None, _ALL_VERBS),
        "statefulsets/scale": (True, "Scale", "autoscaling", "v1", _STATUS_VERBS),
    },
}


@pytest.mark.parametrize("path", list(DISCOVERY))
def test_discovery_names_each_kinds_resource_and_scope(api: Target, path: str):
    listed = api.rest.get(path).expect(200)
    assert (listed["kind"], listed["groupVersion"]) == (
        "APIResourceList",
        path.removeprefix("/api/").removeprefix("/apis/"),
    )
    found = {
        e["name"]: (e["namespaced"], e["kind"], e.get("group"), e.get("version"), sorted(e["verbs"]))
        for e in listed["resources"]
        if e["name"] in DISCOVERY[path]
    }
    assert found == DISCOVERY[path]


def test_a_group_version_not_served_answers_404(api: Target):
    """An optional kind (a ProvisioningRequest without its CRD): the group/version is simply not there."""
    assert api.rest.get("/apis/autoscaling.x-k8s.io/v1beta1").status == 404
    # Namespaces are deleted one by one: no deletecollection.
    assert _failure(api.rest.delete("/api/v1/namespaces", labelSelector="conformance=none")) == (
        405,
        _status(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}),
    )
