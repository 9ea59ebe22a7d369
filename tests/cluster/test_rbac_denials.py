"""deploy/controller's RBAC and ValidatingAdmissionPolicies on the real API server: what a compromised controller
could try is refused, what the controller does is allowed (issue 32, item 9).

Every request is sent with a bound token of the controller's own ServiceAccount, after `kubectl apply -k
deploy/controller` (as test_controller_real.py applies it). Refusals by RBAC say "cannot <verb> resource";
refusals by a policy name it. Allowed writes that would touch what other tests use (the expander's ConfigMap, the
Lease) are sent with dryRun=All, which the API server authorizes and admits as a real write and then discards.
The controller's real work under the same objects is tests/cluster/test_controller_real.py and
test_controller_gangs_real.py (PodTemplates created and deleted, gang pods annotated).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.metrics_stack import until
from tests.cluster.rest import Answer, Rest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NS = "rbac-denials"
POLICIES = ("gpuscale-controller-pod-annotations", "gpuscale-controller-own-objects")
POD = f"/api/v1/namespaces/{NS}/pods/trainer"
TEMPLATES = f"/api/v1/namespaces/{NS}/podtemplates"
KUBE_SYSTEM_CMS = "/api/v1/namespaces/kube-system/configmaps"
EXPANDER = "cluster-autoscaler-priority-expander"
DRY = {"dryRun": "All"}
RBAC = "cannot"  # "User ... cannot list resource ..."
ANNOTATIONS_POLICY = f"ValidatingAdmissionPolicy '{POLICIES[0]}'"
OBJECTS_POLICY = f"ValidatingAdmissionPolicy '{POLICIES[1]}'"


def _template(name: str, *, ours: bool) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "gpuscale"} if ours else {"team": "a"}
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "template": {"spec": {"containers": [{"name": "c", "image": "busybox:1"}]}},
    }


def _config_map(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}


def _lease(name: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}}


def _annotate(key: str, value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: value}}}


# what, (method, path, body, patch kind or None, params), the status expected, what its message must say.
DENIED: dict[str, tuple[tuple[str, str, Any, str | None, dict[str, str]], str]] = {
    "patch a pod's image": (
        ("PATCH", POD, {"spec": {"containers": [{"name": "c", "image": "evil:1"}]}}, "strategic", {}),
        "a pod's annotations only, not its spec",
    ),
    "patch a pod's image, dry run": (
        ("PATCH", POD, {"spec": {"containers": [{"name": "c", "image": "evil:1"}]}}, "strategic", DRY),
        "not its spec",
    ),
    "add a toleration to a pod": (
        ("PATCH", POD, [{"op": "add", "path": "/spec/tolerations/-", "value": {"operator": "Exists"}}], "json", {}),
        "not its spec",
    ),
    "patch a pod's label": (("PATCH", POD, {"metadata": {"labels": {"app": "other"}}}, "merge", {}), "not its labels"),
    "add a finalizer to a pod": (
        ("PATCH", POD, {"metadata": {"finalizers": ["example.com/hold"]}}, "merge", {}),
        "finalizers",
    ),
    "set another agent's pod annotation": (
        ("PATCH", POD, _annotate("example.com/owner", "mallory"), "merge", {}),
        "may not change the pod annotations example.com/owner",
    ),
    "remove another agent's pod annotation": (
        ("PATCH", POD, _annotate("example.com/keep", None), "merge", {}),
        "example.com/keep",
    ),
    "patch a pod's status": (("PATCH", f"{POD}/status", {"status": {"phase": "Failed"}}, "merge", {}), RBAC),
    "create a PodTemplate that is not gpuscale's": (
        ("POST", TEMPLATES, _template("not-ours", ours=False), None, {}),
        "only podtemplates labelled app.kubernetes.io/managed-by=gpuscale",
    ),
    "delete a PodTemplate that is not gpuscale's": (
        ("DELETE", f"{TEMPLATES}/theirs", None, None, {}),
        "may delete only podtemplates",
    ),
    "list kube-system's ConfigMaps": (("GET", KUBE_SYSTEM_CMS, None, None, {}), RBAC),
    "watch kube-system's ConfigMaps": (("GET", KUBE_SYSTEM_CMS, None, None, {"watch": "1"}), RBAC),
    "get a kube-system ConfigMap not named": (
        ("GET", f"{KUBE_SYSTEM_CMS}/extension-apiserver-authentication", None, None, {}),
        RBAC,
    ),
    "list a kube-system ConfigMap not named, by field selector": (
        ("GET", KUBE_SYSTEM_CMS, None, None, {"fieldSelector": "metadata.name=extension-apiserver-authentication"}),
        RBAC,
    ),
    "patch a kube-system ConfigMap not named": (
        ("PATCH", f"{KUBE_SYSTEM_CMS}/extension-apiserver-authentication", {"data": {"x": "y"}}, "merge", {}),
        RBAC,
    ),
    "create a kube-system ConfigMap not named": (
        ("POST", KUBE_SYSTEM_CMS, _config_map("kube-system", "planted"), None, DRY),
        "may not create the ConfigMap kube-system/planted",
    ),
    "list the ConfigMaps of its own namespace": (
        ("GET", "/api/v1/namespaces/gpuscale/configmaps", None, None, {}),
        RBAC,
    ),
    "create another ConfigMap in its own namespace": (
        ("POST", "/api/v1/namespaces/gpuscale/configmaps", _config_map("gpuscale", "planted"), None, DRY),
        "may not create the ConfigMap gpuscale/planted",
    ),
    "create another Lease": (
        ("POST", "/apis/coordination.k8s.io/v1/namespaces/gpuscale/leases", _lease("other"), None, DRY),
        "may not create the Lease gpuscale/other",
    ),
    "read a Secret": (("GET", "/api/v1/namespaces/kube-system/secrets", None, None, {}), RBAC),
}

ALLOWED: dict[str, tuple[tuple[str, str, Any, str | None, dict[str, str]], tuple[int, ...]]] = {
    "set a gpuscale.io/ pod annotation": (("PATCH", POD, _annotate("gpuscale.io/gang", "train"), "merge", {}), (200,)),
    "point a gang pod at its ProvisioningRequest": (
        (
            "PATCH",
            POD,
            {
                "metadata": {
                    "annotations": {
                        "autoscaling.x-k8s.io/consume-provisioning-request": "train-vc-1-try1",
                        "autoscaling.x-k8s.io/provisioning-class-name": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
                    }
                }
            },
            "strategic",
            {},
        ),
        (200,),
    ),
    "mark an idle pod safe to evict": (
        (
            "PATCH",
            POD,
            {
                "metadata": {
                    "annotations": {
                        "cluster-autoscaler.kubernetes.io/safe-to-evict": "true",
                        "gpuscale.io/safe-to-evict-by": "gpuscale-controller",
                    }
                }
            },
            "merge",
            {},
        ),
        (200,),
    ),
    "remove its safe-to-evict mark": (
        (
            "PATCH",
            POD,
            {
                "metadata": {
                    "annotations": {
                        "cluster-autoscaler.kubernetes.io/safe-to-evict": None,
                        "gpuscale.io/safe-to-evict-by": None,
                    }
                }
            },
            "merge",
            {},
        ),
        (200,),
    ),
    "list pods cluster-wide": (("GET", "/api/v1/pods", None, None, {}), (200,)),
    "create a gpuscale PodTemplate in a gang's namespace": (
        ("POST", TEMPLATES, _template("ours", ours=True), None, DRY),
        (201,),
    ),
    "delete a gpuscale PodTemplate": (("DELETE", f"{TEMPLATES}/ours-done", None, None, DRY), (200,)),
    "list the expander's ConfigMap by name": (
        ("GET", KUBE_SYSTEM_CMS, None, None, {"fieldSelector": f"metadata.name={EXPANDER}"}),
        (200,),
    ),
    "watch the expander's ConfigMap by name": (
        (
            "GET",
            KUBE_SYSTEM_CMS,
            None,
            None,
            {"fieldSelector": f"metadata.name={EXPANDER}", "watch": "1", "timeoutSeconds": "1"},
        ),
        (200,),
    ),
    "get the expander's ConfigMap (absent: 404, not 403)": (
        ("GET", f"{KUBE_SYSTEM_CMS}/{EXPANDER}", None, None, {}),
        (200, 404),
    ),
    "create the expander's ConfigMap": (
        ("POST", KUBE_SYSTEM_CMS, _config_map("kube-system", EXPANDER), None, DRY),
        (201, 409),
    ),
    "create the breaker's ConfigMap": (
        (
            "POST",
            "/api/v1/namespaces/gpuscale/configmaps",
            _config_map("gpuscale", "gpuscale-controller-state"),
            None,
            DRY,
        ),
        (201, 409),
    ),
    "list the breaker's ConfigMap by name": (
        (
            "GET",
            "/api/v1/namespaces/gpuscale/configmaps",
            None,
            None,
            {"fieldSelector": "metadata.name=gpuscale-controller-state"},
        ),
        (200,),
    ),
    "create its Lease": (
        (
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/gpuscale/leases",
            _lease("gpuscale-controller"),
            None,
            DRY,
        ),
        (201, 409),
    ),
}


@dataclass(frozen=True)
class Controller:
    rest: Rest  # as the controller's ServiceAccount
    pod: dict[str, Any]  # the pod as created (defaulted by the API server), before any request of the tests


def _send(rest: Rest, request: tuple[str, str, Any, str | None, dict[str, str]]) -> Answer:
    method, path, body, patch_kind, params = request
    if method == "PATCH":
        return rest.patch(path, body, patch_kind or "merge", **params)
    if method == "GET" and params.get("watch"):
        # NB: a watch that is allowed streams; one answer line (or none, at its timeout) is all this needs.
        return rest.request("GET", path, params={**params, "timeoutSeconds": "1"})
    return rest.request(method, path, body, params=params)


@pytest.fixture(scope="module")
def controller(control_plane: ControlPlane) -> Controller:
    """The controller's ServiceAccount token after deploy/controller is applied, with a pod and another agent's
    PodTemplate in a namespace of their own."""
    plane = control_plane
    applied = plane.kubectl(
        "apply", "--server-side", "--field-manager=gpuscale-test", "-k", str(REPO / "deploy/controller")
    )
    assert applied.returncode == 0, applied.stderr
    admin = plane.rest()
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    admin.post("/api/v1/namespaces", namespace).expect(201, 409)
    until(lambda: admin.get(f"/api/v1/namespaces/{NS}/serviceaccounts/default").ok, timeout=30, what="default SA")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "trainer",
            "namespace": NS,
            "labels": {"app": "trainer"},
            "annotations": {"example.com/keep": "yes"},
        },
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}], "automountServiceAccountToken": False},
    }
    admin.post(f"/api/v1/namespaces/{NS}/pods", pod).expect(201, 409)
    created = admin.get(POD).expect(200)
    admin.post(TEMPLATES, _template("theirs", ours=False)).expect(201, 409)
    admin.post(TEMPLATES, _template("ours-done", ours=True)).expect(201, 409)
    rest = plane.token_rest(plane.service_account_token("gpuscale", "gpuscale-controller"))
    # The admission plugin reads the policies through an informer, a moment after they are created: the first
    # denial is the sign that it holds them (a policy that never denies fails here). Their status (type checking) is not awaited: it is written by
    # a kube-controller-manager controller the test control plane does not run; an expression that does not
    # compile or type-check fails closed (failurePolicy Fail) and the allowed requests below then fail.
    probe = DENIED["patch a pod's image, dry run"][
        0
    ]  # NB: dry run: allowed before the policy holds, it changes nothing
    until(lambda: _send(rest, probe).status == 403, timeout=30, what="the pod policy in force")
    return Controller(rest, created)


@pytest.mark.parametrize("what", DENIED)
def test_the_controller_is_refused(controller, what):
    request, says = DENIED[what]
    answer = _send(controller.rest, request)
    assert answer.status == 403 and answer.reason == "Forbidden", f"{what}: HTTP {answer.status}: {answer.body}"
    message = answer.body["message"]
    assert says in message, message
    if says != RBAC:
        policy = ANNOTATIONS_POLICY if request[1].startswith(POD) else OBJECTS_POLICY
        assert policy in message, message


@pytest.mark.parametrize("what", ALLOWED)
def test_what_the_controller_does_is_allowed(controller, what):
    request, statuses = ALLOWED[what]
    answer = _send(controller.rest, request)
    assert answer.status in statuses, f"{what}: HTTP {answer.status}: {answer.body}"


def test_nothing_refused_was_changed(controller, control_plane):
    for what in DENIED:
        _send(controller.rest, DENIED[what][0])
    admin = control_plane.rest()
    pod = admin.get(POD).expect(200)
    assert pod["spec"] == controller.pod["spec"]
    assert pod["metadata"]["labels"] == {"app": "trainer"} and not pod["metadata"].get("finalizers")
    annotations = pod["metadata"]["annotations"]
    assert annotations.get("example.com/keep") == "yes" and "example.com/owner" not in annotations
    assert admin.get(f"{TEMPLATES}/theirs").ok
    assert admin.get(f"{TEMPLATES}/not-ours").status == 404
    assert admin.get("/api/v1/namespaces/kube-system/configmaps/planted").status == 404
