"""Atomic capacity for pending gangs: one ProvisioningRequest per gang, followed to the end. A pure planner.

For each pending gang (``gangs.py``) that asks for GPUs and that Kueue does not provision itself, the planner
wants one PodTemplate per pod set and one ``autoscaling.x-k8s.io/v1`` ProvisioningRequest (class
``best-effort-atomic-scale-up.autoscaling.x-k8s.io`` by default) whose pod sets hold the gang's full count, so
the cluster-autoscaler scales up for the whole gang at once or not at all. The gang's unbound pods are annotated
``autoscaling.x-k8s.io/consume-provisioning-request: <name>`` so they land on the booked capacity and CA does not
scale up for them a second time.

The request's conditions drive what follows. ``Provisioned`` (capacity booked) and ``Accepted=False`` (CA
refused the request) are said once in an Event on the gang. ``Failed``,
``BookingExpired`` (the gang did not start in time) and ``CapacityRevoked`` mean a new request after a
backoff (``gangs.backoff_base`` doubled per failed attempt up to ``gangs.backoff_max``, counted from the
condition's ``lastTransitionTime``); after ``gangs.max_attempts`` requests (0 = no limit) the planner gives up
and says so once, in an Event on the gang (the failed request stays, for an operator to read).

State lives in the objects, never in memory, so a restarted controller (or a second replica after a leader
change) plans exactly the same: the requests carry the gang's uid and their attempt number as labels
(``gpuscale.io/gang-uid``, ``gpuscale.io/attempt``); request names are ``<base>-<attempt>`` and template names
``<base>-<pod set>``, derived from the gang, so a Create that already happened is answered AlreadyExists. The
next request is created before the failed one is deleted, so the attempt count is never lost in between. When a
gang is admitted, running, covered by Kueue or gone, its requests and templates are deleted (they also carry
an ownerReference to the gang, for the garbage collector). A gang whose pods already consume a
ProvisioningRequest gpuscale did not make is someone else's to provision and is left alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from gpuscale.controller.events import already_reported
from gpuscale.controller.gangs import Gang, gangs_of
from gpuscale.controller.pools import PoolsPolicy
from gpuscale.controller.writes import ClusterView, Create, Delete, Emit, ObjectKey, Patch, Write

__all__ = [
    "ATTEMPT_LABEL",
    "CLASS_ANNOTATION",
    "CONSUME_ANNOTATION",
    "GANG_UID_LABEL",
    "MANAGED_BY_LABEL",
    "POD_TEMPLATE",
    "PROVISIONING_KINDS",
    "PROVISIONING_REQUEST",
    "RETRY_CONDITIONS",
    "plan_provisioning",
]

PROVISIONING_REQUEST = ("autoscaling.x-k8s.io/v1", "ProvisioningRequest")
POD_TEMPLATE = ("v1", "PodTemplate")
PROVISIONING_KINDS = (PROVISIONING_REQUEST, POD_TEMPLATE)
"""What ``plan_provisioning`` reads from the view besides ``gangs.GANG_KINDS``."""
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "gpuscale"
GANG_UID_LABEL = "gpuscale.io/gang-uid"
ATTEMPT_LABEL = "gpuscale.io/attempt"
GANG_ANNOTATION = "gpuscale.io/gang"
RETRY_CONDITIONS = ("Failed", "BookingExpired", "CapacityRevoked")
_FRAMEWORK_SHORT = {"volcano": "vc", "coscheduling": "cs", "kueue": "kq"}
_NAME_BUDGET = 200  # NB: object names may be 253 characters; this leaves room for the suffixes


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _base_name(gang: Gang) -> str:
    return f"{gang.key.name[:_NAME_BUDGET]}-{_FRAMEWORK_SHORT[gang.framework]}-{gang.uid[:8]}".lower()


def _template_name(base: str, index: int) -> str:
    return f"{base}-{index}"


def _request_name(base: str, attempt: int) -> str:
    return f"{base}-try{attempt}"


def _attempt(obj: Mapping[str, Any]) -> int:
    try:
        return int((_meta(obj).get("labels") or {}).get(ATTEMPT_LABEL, "0"))
    except ValueError:
        return 0


def _epoch(text: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _retry_condition(request: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The first of Failed / BookingExpired / CapacityRevoked that is True on ``request``, if any."""
    for condition in (request.get("status") or {}).get("conditions") or []:
        if condition.get("type") in RETRY_CONDITIONS and condition.get("status") == "True":
            return condition
    return None


def _labels(gang: Gang, **extra: str) -> dict[str, str]:
    return {MANAGED_BY_LABEL: MANAGER, GANG_UID_LABEL: gang.uid, **extra}


def _owner_reference(gang: Gang) -> dict[str, Any]:
    return {"apiVersion": gang.key.api_version, "kind": gang.key.kind, "name": gang.key.name, "uid": gang.uid}


def _pod_template(gang: Gang, base: str, index: int) -> dict[str, Any]:
    return {
        "apiVersion": POD_TEMPLATE[0],
        "kind": POD_TEMPLATE[1],
        "metadata": {
            "name": _template_name(base, index),
            "namespace": gang.key.namespace,
            "labels": _labels(gang),
            "annotations": {GANG_ANNOTATION: str(gang.key)},
            "ownerReferences": [_owner_reference(gang)],
        },
        "template": dict(gang.pod_sets[index].template),
    }


def _provisioning_request(gang: Gang, base: str, attempt: int, policy: PoolsPolicy) -> dict[str, Any]:
    return {
        "apiVersion": PROVISIONING_REQUEST[0],
        "kind": PROVISIONING_REQUEST[1],
        "metadata": {
            "name": _request_name(base, attempt),
            "namespace": gang.key.namespace,
            "labels": _labels(gang, **{ATTEMPT_LABEL: str(attempt)}),
            "annotations": {GANG_ANNOTATION: str(gang.key)},
            "ownerReferences": [_owner_reference(gang)],
        },
        "spec": {
            "provisioningClassName": policy.gangs.provisioning_class,
            "podSets": [
                {"podTemplateRef": {"name": _template_name(base, i)}, "count": pod_set.count}
                for i, pod_set in enumerate(gang.pod_sets)
            ],
            "parameters": {"ValidUntilSeconds": str(int(policy.gangs.valid_until))},
        },
    }


def _consume(gang: Gang, request_name: str, policy: PoolsPolicy) -> list[Write]:
    """Point the gang's unbound pods at ``request_name`` (pods already pointing there are left alone)."""
    writes: list[Write] = []
    for pod in gang.pods:
        annotations = _meta(pod).get("annotations") or {}
        if (pod.get("spec") or {}).get("nodeName") or annotations.get(CONSUME_ANNOTATION) == request_name:
            continue
        patch = {
            "metadata": {
                "annotations": {CONSUME_ANNOTATION: request_name, CLASS_ANNOTATION: policy.gangs.provisioning_class}
            }
        }
        writes.append(
            Patch(ObjectKey.of(pod), patch, why=f"gang {gang}: pod consumes ProvisioningRequest {request_name}")
        )
    return writes


def _managed(view: ClusterView, kind: tuple[str, str]) -> dict[str, list[Mapping[str, Any]]]:
    """gang uid → the objects of ``kind`` gpuscale made for it."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for obj in view.objects(*kind):
        labels = _meta(obj).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) == MANAGER and labels.get(GANG_UID_LABEL):
            out.setdefault(labels[GANG_UID_LABEL], []).append(obj)
    return out


def _foreign_request(gang: Gang) -> str | None:
    """The ProvisioningRequest a pod of ``gang`` already consumes that gpuscale did not make (someone else asked
    for this gang's capacity: gpuscale must not ask twice nor repoint the pods)."""
    base = _base_name(gang)
    for pod in gang.pods:
        name = (_meta(pod).get("annotations") or {}).get(CONSUME_ANNOTATION)
        if name and not name.startswith(f"{base}-try"):
            return name
    return None


def _why_done(gang: Gang | None) -> str:
    if gang is None:
        return "its gang no longer exists"
    if gang.covered_by is not None:
        return f"gang {gang} is provisioned by Kueue's admission check {gang.covered_by}"
    if gang.state == "done":
        return f"gang {gang} is admitted or running"
    if (foreign := _foreign_request(gang)) is not None:
        return f"gang {gang} consumes ProvisioningRequest {foreign}, which gpuscale did not create"
    return f"gang {gang} no longer waits for capacity"


def _progress(view: ClusterView, gang: Gang, request: Mapping[str, Any]) -> list[Write]:
    """One Event when CA books the capacity (Provisioned) or refuses the request (Accepted=False)."""
    name = _meta(request).get("name", "")
    for condition in (request.get("status") or {}).get("conditions") or []:
        kind, status = condition.get("type"), condition.get("status")
        detail = f": {condition['message']}" if condition.get("message") else ""
        if kind == "Provisioned" and status == "True":
            emit = Emit(
                gang.key, "Normal", "CapacityProvisioned", f"ProvisioningRequest {name}: capacity booked{detail}"
            )
        elif kind == "Accepted" and status == "False":
            emit = Emit(gang.key, "Warning", "ProvisioningNotAccepted", f"ProvisioningRequest {name} refused{detail}")
        else:
            continue
        return [] if already_reported(view, gang.key, emit.reason, emit.message) else [emit]
    return []


def _plan_gang(
    view: ClusterView,
    gang: Gang,
    requests: Sequence[Mapping[str, Any]],
    templates: Sequence[Mapping[str, Any]],
    *,
    now: float,
    policy: PoolsPolicy,
) -> list[Write]:
    base = _base_name(gang)
    writes: list[Write] = []
    have_templates = {_meta(t).get("name") for t in templates}
    for index in range(len(gang.pod_sets)):
        if _template_name(base, index) not in have_templates:
            template = _pod_template(gang, base, index)
            writes.append(Create(template, why=f"gang {gang}: pod template for pod set {gang.pod_sets[index].name}"))
    ordered = sorted(requests, key=_attempt)
    current = ordered[-1] if ordered else None
    # Older attempts are left over from a retry that created the next request but did not get to delete the old.
    writes.extend(
        Delete(ObjectKey.of(old), why=f"gang {gang}: superseded by {_meta(current or {}).get('name')}")
        for old in ordered[:-1]
    )
    if current is None:
        request = _provisioning_request(gang, base, 1, policy)
        writes.append(
            Create(request, why=f"gang {gang} waits for {gang.gpus} GPUs in {gang.pod_count} pods: asking for them")
        )
        writes.extend(_consume(gang, request["metadata"]["name"], policy))
        return writes
    name = _meta(current).get("name", "")
    condition = _retry_condition(current)
    if condition is None:
        return writes + _consume(gang, name, policy) + _progress(view, gang, current)
    attempt = _attempt(current)
    cause = f"{condition.get('type')}" + (f" ({condition['reason']})" if condition.get("reason") else "")
    detail = f": {condition['message']}" if condition.get("message") else ""
    if policy.gangs.max_attempts and attempt >= policy.gangs.max_attempts:
        message = f"ProvisioningRequest {name} {cause}{detail}; gave up after {attempt} attempts (max_attempts)"
        if not already_reported(view, gang.key, "ProvisioningGaveUp", message):
            writes.append(Emit(gang.key, "Warning", "ProvisioningGaveUp", message))
        return writes
    since = _epoch(condition.get("lastTransitionTime")) or _epoch(_meta(current).get("creationTimestamp")) or now
    backoff = policy.gangs.backoff_seconds(attempt)
    if now < since + backoff:
        return writes  # NB: waiting out the backoff; the next reconcile after it retries
    retry = _provisioning_request(gang, base, attempt + 1, policy)
    message = (
        f"ProvisioningRequest {name} {cause}{detail}; asking again as {retry['metadata']['name']} "
        f"(attempt {attempt + 1}, after {backoff:g}s backoff)"
    )
    writes.append(Create(retry, why=message))
    writes.append(Delete(ObjectKey.of(current), why=f"gang {gang}: replaced by {retry['metadata']['name']}"))
    writes.extend(_consume(gang, retry["metadata"]["name"], policy))
    writes.append(Emit(gang.key, "Warning", "ProvisioningRetry", message))
    return writes


def plan_provisioning(
    view: ClusterView, *, now: float, policy: PoolsPolicy, gangs: Sequence[Gang] | None = None
) -> list[Write]:
    """The writes that give every pending GPU gang one live ProvisioningRequest, and clean up after the others.

    ``now`` is seconds since the epoch; ``gangs`` defaults to ``gangs_of(view)`` (pass it when another planner
    already computed it). Running it again on the state its writes produced plans nothing.
    """
    if not policy.gangs.enabled:
        return []
    if gangs is None:
        gangs = gangs_of(view, gpu_resource=policy.gpu_resource)
    by_uid = {g.uid: g for g in gangs if g.uid}
    wanted = {
        uid: g
        for uid, g in by_uid.items()
        if g.state == "pending" and g.covered_by is None and g.gpus > 0 and _foreign_request(g) is None
    }
    requests = _managed(view, PROVISIONING_REQUEST)
    templates = _managed(view, POD_TEMPLATE)
    writes: list[Write] = []
    for uid in sorted(set(requests) | set(templates)):
        if uid in wanted:
            continue
        why = f"no longer needed: {_why_done(by_uid.get(uid))}"
        writes.extend(Delete(ObjectKey.of(o), why=why) for o in (*requests.get(uid, []), *templates.get(uid, [])))
    for uid, gang in wanted.items():
        writes.extend(_plan_gang(view, gang, requests.get(uid, []), templates.get(uid, []), now=now, policy=policy))
    return writes
