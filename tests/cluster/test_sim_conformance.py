"""gpuscale/sim kept honest: the calls the product makes, answered alike by the real API server and by SimKubeApi.

Each scenario is one function of a REST client and a fresh namespace that returns what a client can observe
(status codes, Status reasons, the fields the product reads back). The test runs it against kube-apiserver
v1.37 (the real control plane) and against gpuscale/sim's SimKubeApi and requires the same observations —
so every difference is a failing test that names the scenario and both answers, and the real server is the
judge. The calls are those of sources/kube.py (list, watch from a resourceVersion, selectors),
sources/kuberest.py and controller/actuator.py (create, JSON patches with ``test`` ops, merge and strategic
patches, resourceVersion preconditions, dryRun, Events, evictions through PodDisruptionBudgets) and the HPA
loop (the scale subresource).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuscale.sim.kubeapi import SimKubeApi
from tests.cluster.rest import Answer, Rest

pytestmark = pytest.mark.e2e

_names = itertools.count()


@pytest.fixture(scope="module")
def sim_rest() -> Iterator[Rest]:
    """SimKubeApi served on its own event loop in a thread, as the demo serves it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    api = SimKubeApi()
    url = asyncio.run_coroutine_threadsafe(api.start(), loop).result(10)
    yield Rest(url)
    asyncio.run_coroutine_threadsafe(api.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _ns(rest: Rest) -> str:
    name = f"conformance-{next(_names)}"
    rest.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}).expect(201)
    return name


def _status(answer: Answer) -> tuple:
    """What a client reads from an answer: the code and, for errors, the Status's kind, code and reason."""
    if answer.ok:
        return (answer.status,)
    body = answer.body if isinstance(answer.body, dict) else {}
    return (answer.status, body.get("kind"), body.get("code"), body.get("reason"))


def _cm(name: str, ns: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data}


def _pod(name: str, ns: str, labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "none"}]},
    }


# --- scenarios -----------------------------------------------------------------------------------------------


def create_get_conflict_and_not_found(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    first = rest.post(base, _cm("a", ns, k="v"))
    again = rest.post(base, _cm("a", ns, k="w"))
    missing = rest.get(f"{base}/nope")
    kept = rest.get(f"{base}/a").body["data"]
    return [_status(first), _status(again), again.body.get("details", {}).get("name"), _status(missing), kept]


def update_with_a_stale_resource_version(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    created = rest.post(base, _cm("b", ns, k="1")).body
    fresh = dict(created, data={"k": "2"})
    ok = rest.put(f"{base}/b", fresh)
    stale = rest.put(f"{base}/b", dict(created, data={"k": "3"}))
    return [_status(ok), _status(stale), rest.get(f"{base}/b").body["data"]]


def merge_patch_with_a_resource_version_precondition(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    created = rest.post(base, _cm("c", ns, k="1")).body
    rv = created["metadata"]["resourceVersion"]
    ok = rest.patch(f"{base}/c", {"metadata": {"resourceVersion": rv}, "data": {"k": "2"}})
    stale = rest.patch(f"{base}/c", {"metadata": {"resourceVersion": rv}, "data": {"k": "3"}})
    return [_status(ok), _status(stale), rest.get(f"{base}/c").body["data"]]


def json_patch_add_replaces_an_existing_member_and_test_guards_it(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    cm = _cm("d", ns)
    cm["metadata"]["annotations"] = {"theirs": "1"}
    rest.post(base, cm).expect(201)
    # RFC 6902: `add` of an existing member replaces it — the reason a controller must guard with `test`.
    replaced = rest.patch(f"{base}/d", [{"op": "add", "path": "/metadata/annotations", "value": {"ours": "1"}}], "json")
    after_add = rest.get(f"{base}/d").body["metadata"].get("annotations")
    guarded = rest.patch(
        f"{base}/d",
        [
            {"op": "test", "path": "/metadata/annotations", "value": None},
            {"op": "add", "path": "/metadata/annotations", "value": {}},
        ],
        "json",
    )
    keyed = rest.patch(f"{base}/d", [{"op": "add", "path": "/metadata/annotations/mine", "value": "2"}], "json")
    return [
        _status(replaced),
        after_add,
        _status(guarded),
        _status(keyed),
        rest.get(f"{base}/d").body["metadata"]["annotations"],
    ]


def node_taints_by_json_patch_and_strategic_merge(rest: Rest, ns: str) -> list:
    name = f"{ns}-node"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": [{"key": "theirs", "effect": "NoSchedule"}]},
    }
    # A new Node is tainted not-ready (admission) until it reports Ready.
    at_create = [t["key"] for t in rest.post("/api/v1/nodes", node).expect(201)["spec"]["taints"]]
    path = f"/api/v1/nodes/{name}"
    appended = rest.patch(
        path, [{"op": "add", "path": "/spec/taints/-", "value": {"key": "ours", "effect": "NoSchedule"}}], "json"
    )
    taints = [t["key"] for t in rest.get(path).body["spec"]["taints"]]
    wrong_test = rest.patch(path, [{"op": "test", "path": "/spec/taints", "value": []}], "json")
    strategic = rest.patch(path, {"spec": {"taints": [{"key": "only", "effect": "NoExecute"}]}}, "strategic")
    after = [t["key"] for t in rest.get(path).body["spec"]["taints"]]
    unschedulable = rest.patch(path, {"spec": {"unschedulable": True}}, "strategic").body["spec"].get("unschedulable")
    rest.delete(path)
    return [at_create, _status(appended), taints, _status(wrong_test), _status(strategic), after, unschedulable]


def a_node_reporting_ready_keeps_only_the_taints_others_put(rest: Rest, ns: str) -> list:
    """make_node: status Ready, then the not-ready taint removed by a guarded patch (the lifecycle controller's
    part, which the real control plane here leaves to the test and gpuscale/sim does itself)."""
    from tests.cluster.kubelet import make_node

    name = f"{ns}-ready"
    node = make_node(rest, name, gpus=4)
    rest.patch(
        f"/api/v1/nodes/{name}",
        [{"op": "add", "path": "/spec/taints", "value": [{"key": "person", "effect": "NoSchedule"}]}],
        "json",
    )
    keys = [t["key"] for t in rest.get(f"/api/v1/nodes/{name}").body["spec"].get("taints", [])]
    rest.delete(f"/api/v1/nodes/{name}")
    return [node["spec"].get("taints"), node["status"]["allocatable"]["nvidia.com/gpu"], keys]


def dry_run_stores_nothing(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    created = rest.post(base, _cm("e", ns), dryRun="All")
    return [_status(created), created.body.get("metadata", {}).get("name"), _status(rest.get(f"{base}/e"))]


def invalid_objects_are_422(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    bad_name = rest.post(base, _cm("Not_A_Name", ns))
    wrong_ns = rest.post(base, _cm("f", "elsewhere"))
    return [_status(bad_name), _status(wrong_ns)]


def label_and_field_selectors(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/pods"
    for name, app in (("p1", "a"), ("p2", "a"), ("p3", "b")):
        rest.post(base, _pod(name, ns, {"app": app, "tier": name})).expect(201)

    def names(**params: Any) -> list[str]:
        return sorted(p["metadata"]["name"] for p in rest.get(base, **params).body["items"])

    return [
        names(labelSelector="app=a"),
        names(labelSelector="app in (a,b),tier!=p1"),
        names(labelSelector="!app"),
        names(fieldSelector="metadata.name=p3"),
        names(fieldSelector="spec.nodeName="),
        names(fieldSelector="spec.nodeName=elsewhere"),
        _status(rest.get(base, labelSelector="app==")),
    ]


def watch_from_a_resource_version(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/configmaps"
    listed = rest.get(base).body
    rv = listed["metadata"]["resourceVersion"]
    rest.post(base, _cm("w1", ns)).expect(201)
    rest.patch(f"{base}/w1", {"data": {"k": "v"}}).expect(200)
    rest.delete(f"{base}/w1").expect(200)
    events = []
    for event in rest.watch(base, timeout_seconds=1, resourceVersion=rv):
        events.append(
            (event["type"], event["object"]["metadata"]["name"], (event["object"].get("data") or {}).get("k"))
        )
        if len(events) == 3:
            break
    return [listed["kind"], events]


def scale_subresource(rest: Rest, ns: str) -> list:
    labels = {"app": "s"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "s", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "none"}]}},
        },
    }
    rest.post(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment).expect(201)
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/s/scale"
    scale = rest.get(path).body
    patched = rest.patch(path, {"spec": {"replicas": 3}})
    # The Scale's resourceVersion is the Deployment's: a PUT from before the patch is a conflict, one without a
    # resourceVersion is unconditional (the HPA's own writes carry it).
    scale["spec"]["replicas"] = 4
    stale = rest.put(path, scale)
    del scale["metadata"]["resourceVersion"]
    put = rest.put(path, dict(scale, spec={"replicas": 3}))
    return [
        scale["kind"],
        scale["apiVersion"],
        scale["status"].get("selector"),
        _status(patched),
        _status(stale),
        _status(put),
        rest.get(f"/apis/apps/v1/namespaces/{ns}/deployments/s").body["spec"]["replicas"],
    ]


def status_subresource_is_separate_from_spec(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/pods"
    rest.post(base, _pod("st", ns)).expect(201)
    through_main = rest.patch(f"{base}/st", {"status": {"phase": "Running"}}).body["status"].get("phase")
    through_status = rest.patch(f"{base}/st/status", {"status": {"phase": "Running"}}).body["status"].get("phase")
    return [through_main, through_status]


def events_are_created_and_listed(rest: Rest, ns: str) -> list:
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
    # An Event about a Node (cluster-scoped) belongs in "default", as the controller's actuator writes it.
    elsewhere = rest.post(f"/api/v1/namespaces/{ns}/events", event)
    event["metadata"] = {"name": f"{ns}.ev", "namespace": "default"}
    created = rest.post("/api/v1/namespaces/default/events", event)
    again = rest.post("/api/v1/namespaces/default/events", event)
    pod_event = dict(
        event, metadata={"name": "ev.2", "namespace": ns}, involvedObject={"kind": "Pod", "name": "p", "namespace": ns}
    )
    in_its_namespace = rest.post(f"/api/v1/namespaces/{ns}/events", pod_event)
    listed = rest.get("/api/v1/namespaces/default/events", fieldSelector=f"metadata.name={ns}.ev").body["items"]
    return [
        _status(elsewhere),
        _status(created),
        _status(again),
        _status(in_its_namespace),
        [e["reason"] for e in listed],
    ]


def evictions_through_disruption_budgets(rest: Rest, ns: str) -> list:
    base = f"/api/v1/namespaces/{ns}/pods"
    rest.post(base, _pod("ev", ns, {"app": "ev"})).expect(201)
    rest.patch(f"{base}/ev/status", {"status": {"phase": "Running"}}).expect(200)

    def pdb(name: str) -> dict:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "ev"}}},
        }

    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "ev", "namespace": ns}}
    rest.post(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb("one")).expect(201)
    blocked = rest.post(f"{base}/ev/eviction", eviction)
    rest.post(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb("two")).expect(201)
    two = rest.post(f"{base}/ev/eviction", eviction)
    still_there = rest.get(f"{base}/ev").status
    return [_status(blocked), _status(two), still_there]


SCENARIOS: list[Callable[[Rest, str], list]] = [
    create_get_conflict_and_not_found,
    update_with_a_stale_resource_version,
    merge_patch_with_a_resource_version_precondition,
    json_patch_add_replaces_an_existing_member_and_test_guards_it,
    node_taints_by_json_patch_and_strategic_merge,
    a_node_reporting_ready_keeps_only_the_taints_others_put,
    dry_run_stores_nothing,
    invalid_objects_are_422,
    label_and_field_selectors,
    watch_from_a_resource_version,
    scale_subresource,
    status_subresource_is_separate_from_spec,
    events_are_created_and_listed,
    evictions_through_disruption_budgets,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_the_simulated_api_answers_as_the_real_one(control_plane, sim_rest, scenario):
    real_rest = control_plane.rest()
    real = scenario(real_rest, _ns(real_rest))
    sim = scenario(sim_rest, _ns(sim_rest))
    assert sim == real, f"{scenario.__name__}:\n  real kube-apiserver: {real}\n  gpuscale/sim:        {sim}"
