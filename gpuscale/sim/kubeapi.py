"""A simulated Kubernetes API server (aiohttp), faithful enough for kubectl and kubernetes-asyncio.

Why it exists: no kube-apiserver can run where gpuscale is tested and demonstrated, yet the code that reads and
writes Kubernetes must be exercised over real HTTP, with real clients (kubectl v1.32, kubernetes-asyncio). This
module is a general-purpose stand-in: nothing in it knows about gpuscale, and product code never special-cases it.

What is faithful (the things clients and controllers depend on):

* Discovery: ``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>[/<version>]`` (legacy, not
  aggregated, discovery; kubectl falls back to it), with verbs, short names, categories and subresources
  (``pods/status``, ``deployments/scale`` as ``autoscaling/v1`` ``Scale``). ``/openapi/v2`` answers 404;
  ``/openapi/v3`` serves path stubs only, enough for kubectl to see that PATCH takes ``fieldValidation``.
* Storage: one global resourceVersion counter; ``metadata.uid``, ``creationTimestamp``, ``resourceVersion`` on
  every object, ``generation`` on workloads (bumped when the spec changes); a no-op write changes nothing and
  emits no event. Typed list responses (``PodList``…) whose items carry no kind/apiVersion, as kube-apiserver
  sends them; ``labelSelector``, ``fieldSelector`` (only the field labels kube-apiserver supports for the
  resource — others are a 400), ``limit`` + ``continue`` (every page is the first page's snapshot, as etcd
  serves it; 410 Expired once the history no longer reaches back to it).
* Writes: create → 201 (409 AlreadyExists, ``generateName``, the namespace must exist), update with a stale
  ``metadata.resourceVersion`` → 409 Conflict, no-op updates keep the resourceVersion, ``status`` changes only
  through the status subresource and the spec only through the main resource; PATCH as JSON merge patch,
  strategic merge patch (list merge keys for the common core fields, ``$patch`` directives), JSON patch
  (RFC 6902) and server-side apply (see limitations); ``dryRun=All``; delete → 200 with the object, honouring
  finalizers (``deletionTimestamp`` first) and DeleteOptions preconditions; ``deletecollection``;
  ``fieldValidation`` Strict (400) / Warn (the default: ``Warning`` headers) / Ignore, checked for top-level,
  ``metadata`` and workload/lease ``spec`` fields — deeper fields are not schema-checked.
* Resources: core v1 pods, nodes, namespaces, configmaps, services, events, podtemplates; apps/v1 deployments,
  statefulsets, replicasets, daemonsets; batch/v1 jobs (defaults and the generated selector and template labels);
  coordination.k8s.io/v1 leases; events.k8s.io/v1 events; policy/v1 poddisruptionbudgets;
  apiextensions.k8s.io/v1 customresourcedefinitions.
* Custom resources: creating a CustomResourceDefinition serves its resource at once (status ``Established``),
  one resource per served version, with discovery, list/watch, CRUD, dryRun, ``metadata.generation`` and the
  ``status`` subresource when the version declares it (then a create's status is dropped and the main
  resource cannot change it); deleting the CRD deletes its objects. Not simulated: OpenAPI schema validation
  and pruning, defaulting, conversion between versions (every version is served from one store, only
  ``apiVersion`` differs), printer columns, the scale subresource. ``gpuscale.sim.crds`` holds definitions of
  common batch-scheduling CRDs (Volcano, coscheduling, Kueue, ProvisioningRequest).
* Subresources: ``status`` (pods, nodes, namespaces, services and the apps kinds), ``scale`` (deployments,
  statefulsets, replicasets; GET/PUT/PATCH an ``autoscaling/v1`` Scale whose ``spec.replicas`` writes through),
  ``pods/binding``, ``pods/eviction`` (policy/v1 Eviction: PodDisruptionBudgets respected as kube-apiserver
  does — Pending/finished/terminating pods ignore them, 429 with kube's cause when one allows no disruption, 500
  under two). PodDisruptionBudget statuses are kept as the disruption controller keeps them
  (``gpuscale.sim.disruption_controller``), on every change of a pod or budget of their namespace.
* Validation that real clusters enforce and that would hide bugs if skipped: object names, label keys/values,
  workload ``spec.selector`` present, non-empty, matching the template labels and immutable, pods having
  containers, pod spec immutability (except images, tolerations, activeDeadlineSeconds).
* Watch (``?watch=1``): newline-delimited events ADDED/MODIFIED/DELETED/BOOKMARK/ERROR from a resourceVersion
  (or the current state as synthetic ADDED when it is unset or "0"), with selectors applied the way the watch
  cache applies them (an object leaving the selection is DELETED, entering it is ADDED), ``timeoutSeconds``,
  ``allowWatchBookmarks`` (a BOOKMARK every ``bookmark_interval_seconds`` and one 2 s before the timeout, as the
  watch cache sends them: only when the resource changed after the watch began); a resourceVersion older than
  the retained history (see ``compact()``; for a custom resource, older than its CRD being served) yields one
  ERROR event carrying a 410 ``Expired`` Status, exactly as kube-apiserver does.
* ``Accept: application/json;as=Table`` → server-side ``meta.k8s.io/v1`` Tables with kubectl's usual columns
  for every served kind.
* Errors are metav1.Status bodies with kube-apiserver's reasons and messages (NotFound, AlreadyExists, Conflict,
  Invalid, BadRequest, MethodNotAllowed, Unauthorized, UnsupportedMediaType, Expired).
* ``events.k8s.io/v1`` Events are a second view of the core v1 Events, converted field by field.
* Delegated authentication and authorization, for aggregated API servers: ``POST``
  ``/apis/authentication.k8s.io/v1/tokenreviews`` answers from tokens registered with ``add_token`` (adding
  ``system:authenticated`` as kube-apiserver does); ``POST /apis/authorization.k8s.io/v1/subjectaccessreviews``
  answers from RBAC-style grants registered with ``allow`` (matched as RBAC matches: ``pods`` does not cover
  ``pods/log``, ``*/log`` does; a grant with a namespace acts as a RoleBinding there), and allows the
  ``system:masters`` group everything. Both validate like kube-apiserver (400/422), answer 201, are recorded in
  ``token_reviews``/``access_reviews``, and can be made to fail (``fail_reviews``) or to be slow
  (``review_delay_seconds``).
* Fault injection, in kube-apiserver's own shapes: ``fail_next`` plans failures for the next N requests of a
  verb on a resource (410 on a watch as an ERROR event with an ``Expired`` Status, 409 ``Conflict``, 429
  ``TooManyRequests`` with ``Retry-After``, 500 ``InternalError``, 503/504); ``drop_watches`` cuts open watch
  connections mid-stream; ``go_away``/``come_back`` (or ``outage(seconds)``) close the listening socket and every
  connection and reopen on the same port, storage kept. ``faults_served`` records what was answered.

Limitations (on purpose): no controllers (a Deployment creates no pods; but for PodDisruptionBudgets, nothing
updates status unless you do), no kubelet (pods are deleted at once, without a grace period), no garbage collector
(ownerReferences do not cascade; deleting a namespace deletes its objects at once, standing in for the namespace
controller), no admission webhooks, no RBAC on its own API (any bearer token is accepted unless ``tokens`` is
given; the tokens of ``add_token`` and the grants of ``allow`` only answer TokenReviews and SubjectAccessReviews),
no field ownership in server-side apply (an apply is a strategic merge of the applied configuration; no
managedFields), no OpenAPI schemas, no aggregated discovery, and no protobuf: a protobuf body gets 415, so
kubectl's typed-client generators (``kubectl create deployment``, ``create configmap``) fail — ``kubectl create
-f`` / ``apply`` / ``patch`` / ``scale`` / ``label`` / ``delete`` work.

In-process helpers (``create``, ``apply``, ``replace``, ``patch``, ``delete``, ``get``, ``list``) go through the
same code as the HTTP handlers (same validation, resourceVersions and watch events) and raise ``ApiStatusError``.
Two conveniences exist only in-process, for seeding scenarios: ``create``/``apply`` write a given ``status``
through the status subresource afterwards, and ``create`` keeps a given ``uid``/``creationTimestamp``.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import copy
import json
import logging
import os
import random
import string
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from aiohttp import ClientError, ClientSession, ClientTimeout, web

from gpuscale.disruption import pdb_selects
from gpuscale.errors import SelectorError
from gpuscale.selectors import FieldSelector, LabelSelector, field_value, label_key_problem, label_value_problem
from gpuscale.sim.api_errors import (
    NO_RESOURCE,
    NOT_ALLOWED,
    ApiStatusError,
    Cause,
    bad_request,
    check_write_options,
    conflict,
    continue_expired,
    delete_answer,
    invalid,
    not_found,
    status_details,
)
from gpuscale.sim.disruption_controller import budget_status, can_ignore_budgets, eviction_verdict
from gpuscale.sim.patches import (
    PATCH_REJECTED,
    PatchBodyError,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
    strip_nulls,
)
from gpuscale.sim.resources import (
    ACCESS_REVIEWS,
    BY_KIND,
    BY_PATH,
    GROUPS,
    RESOURCES,
    REVIEWS,
    TOKEN_REVIEWS,
    ResourceType,
    resource_for,
)
from gpuscale.sim.tables import DEFAULT_TABLE, TABLES, selector_text

__all__ = [
    "RESOURCES",
    "AccessRule",
    "ApiStatusError",
    "RecordedRequest",
    "ResourceType",
    "ReviewUser",
    "ServedFault",
    "SimKubeApi",
]

log = logging.getLogger(__name__)

KUBERNETES_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-sim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
_PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)
# kube-apiserver picks a watch timeout in [min-request-timeout, 2×) when the client gives none.
_DEFAULT_WATCH_TIMEOUT_SECONDS = 1800.0
_WRITE_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def _deletes_collections(rt: ResourceType) -> bool:
    """Namespaces are deleted one by one (kube-apiserver serves no deletecollection for them)."""
    return rt.custom or (rt.api_version, rt.kind) != ("v1", "Namespace")


_SUBRESOURCE_VERBS = ("get", "patch", "update")


# --- small helpers ----------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _timestamp(when: datetime | None = None) -> str:
    return (when or _now()).strftime("%Y-%m-%dT%H:%M:%SZ")


_DNS1123_LABEL_MAX = 63
_DNS1123_SUBDOMAIN_MAX = 253
_DNS1123_LABEL_RE = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_RE = rf"{_DNS1123_LABEL_RE}(\.{_DNS1123_LABEL_RE})*"
_NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "-.")
_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def _name_problem(name: str, *, label: bool) -> str | None:
    limit = _DNS1123_LABEL_MAX if label else _DNS1123_SUBDOMAIN_MAX
    if len(name) > limit:
        return f"must be no more than {limit} characters"
    parts = [name] if label else name.split(".")
    for part in parts:
        if not part or not set(part) <= _NAME_CHARS - {"."} or not part[0].isalnum() or not part[-1].isalnum():
            if label:
                kind, chars, example, regex = "RFC 1123 label", "'-'", "'my-name',  or '123-abc'", _DNS1123_LABEL_RE
            else:
                kind, chars, example, regex = "RFC 1123 subdomain", "'-' or '.'", "'example.com'", _DNS1123_SUBDOMAIN_RE
            return (
                f"a lowercase {kind} must consist of lower case alphanumeric characters, {chars}, "
                f"and must start and end with an alphanumeric character (e.g. {example}, regex used for "
                f"validation is '{regex}')"
            )
    return None


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true")


# --- patches: gpuscale.sim.patches ------------------------------------------------------------------


# --- conversions between stored and served forms ----------------------------------------------------

# core/v1 Event field ↔ events.k8s.io/v1 Event field
_EVENT_FIELDS = {
    "involvedObject": "regarding",
    "related": "related",
    "message": "note",
    "reason": "reason",
    "type": "type",
    "eventTime": "eventTime",
    "series": "series",
    "action": "action",
    "reportingComponent": "reportingController",
    "reportingInstance": "reportingInstance",
    "source": "deprecatedSource",
    "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp",
    "count": "deprecatedCount",
}
_EVENT_FIELDS_BACK = {v: k for k, v in _EVENT_FIELDS.items()}


def _to_served(rt: ResourceType, stored: Mapping[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(dict(stored))
    if rt.group == "events.k8s.io":
        out: dict[str, Any] = {"kind": "Event", "apiVersion": rt.api_version, "metadata": obj.get("metadata", {})}
        for core, v1 in _EVENT_FIELDS.items():
            if core in obj:
                out[v1] = obj[core]
        return out
    obj["kind"] = rt.kind
    obj["apiVersion"] = rt.api_version
    return obj


def _to_stored(rt: ResourceType, served: Mapping[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(dict(served))
    if rt.group == "events.k8s.io":
        out: dict[str, Any] = {"kind": "Event", "apiVersion": "v1", "metadata": obj.get("metadata", {})}
        for v1, core in _EVENT_FIELDS_BACK.items():
            if v1 in obj:
                out[core] = obj[v1]
        return out
    obj["kind"] = rt.kind
    obj["apiVersion"] = rt.api_version
    return obj


def _field_set(rt: ResourceType, stored: Mapping[str, Any]) -> dict[str, str]:
    """The apiserver's field set for an object: supported field label → value (defaults for unset fields)."""
    fields = {}
    for label, path in rt.field_labels.items():
        value = field_value(stored, path)
        fields[label] = value if value else rt.field_defaults.get(label, "")
    return fields


# --- validation and defaulting ----------------------------------------------------------------------

_WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"})
_POD_MUTABLE_SPEC = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def _validate(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    causes: list[Cause] = []
    problem = _name_problem(name, label=rt.kind == "Namespace")
    if problem:
        causes.append(Cause("metadata.name", f"Invalid value: {json.dumps(name)}: {problem}"))
    for key, value in (meta.get("labels") or {}).items():
        key_problem = label_key_problem(str(key))
        if key_problem:
            causes.append(Cause("metadata.labels", f"Invalid value: {key!r}: {key_problem}"))
        value_problem = label_value_problem(value) if isinstance(value, str) else "must be a string"
        if value_problem:
            causes.append(Cause("metadata.labels", f"Invalid value: {value!r}: {value_problem}"))
    spec = obj.get("spec") or {}
    if rt.kind in _WORKLOAD_KINDS:
        causes.extend(_workload_causes(spec, (old or {}).get("spec")))
    elif rt.kind == "Pod":
        containers = spec.get("containers")
        if not containers:
            causes.append(Cause("spec.containers", "Required value", "FieldValueRequired"))
        for i, c in enumerate(containers or []):
            if not isinstance(c, dict) or not c.get("name"):
                causes.append(Cause(f"spec.containers[{i}].name", "Required value", "FieldValueRequired"))
            elif not c.get("image"):
                causes.append(Cause(f"spec.containers[{i}].image", "Required value", "FieldValueRequired"))
        if old is not None and _pod_spec_frozen(spec) != _pod_spec_frozen(old.get("spec") or {}):
            causes.append(
                Cause(
                    "spec",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                    "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` "
                    "(only additions to existing tolerations), `spec.terminationGracePeriodSeconds`",
                    "FieldValueForbidden",
                )
            )
    elif rt.kind == "Job" and not rt.custom:
        causes.extend(_job_causes(spec, (old or {}).get("spec")))
    elif rt.kind == "Event" and rt.group == "" and not rt.custom:
        # NB: core/v1 Events live in their object's namespace; one about a cluster-scoped object (a Node) in
        # "default" (ValidateEventCreate).
        involved = str((obj.get("involvedObject") or {}).get("namespace") or "")
        if involved != meta.get("namespace", "") and not (involved == "" and meta.get("namespace") == "default"):
            causes.append(
                Cause("involvedObject.namespace", f'Invalid value: "{involved}": does not match event.namespace')
            )
    elif rt.kind == "CustomResourceDefinition" and not rt.custom:
        causes.extend(_crd_causes(name, spec, (old or {}).get("spec")))
    if causes:
        raise invalid(rt, name, causes)


def _job_causes(spec: Mapping[str, Any], old_spec: Mapping[str, Any] | None) -> list[Cause]:
    causes: list[Cause] = []
    template_spec = (spec.get("template") or {}).get("spec") or {}
    if not template_spec.get("containers"):
        causes.append(Cause("spec.template.spec.containers", "Required value", "FieldValueRequired"))
    restart = template_spec.get("restartPolicy")
    if restart not in ("OnFailure", "Never"):
        causes.append(
            Cause(
                "spec.template.spec.restartPolicy",
                f'Unsupported value: "{restart or ""}": supported values: "OnFailure", "Never"',
                "FieldValueNotSupported",
            )
        )
    if old_spec is not None and old_spec.get("selector") != spec.get("selector"):
        causes.append(Cause("spec.selector", "Invalid value: field is immutable"))
    return causes


def _crd_causes(name: str, spec: Mapping[str, Any], old_spec: Mapping[str, Any] | None) -> list[Cause]:
    names = spec.get("names") or {}
    group, plural = spec.get("group") or "", names.get("plural") or ""
    causes: list[Cause] = []
    if not group:
        causes.append(Cause("spec.group", "Required value", "FieldValueRequired"))
    elif "." not in group:
        causes.append(Cause("spec.group", f"Invalid value: {group!r}: should be a domain with at least one dot"))
    for key in ("plural", "kind"):
        if not names.get(key):
            causes.append(Cause(f"spec.names.{key}", "Required value", "FieldValueRequired"))
    if group and plural and name != f"{plural}.{group}":
        causes.append(Cause("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(
            Cause(
                "spec.scope",
                f'Unsupported value: "{spec.get("scope") or ""}": supported values: "Cluster", "Namespaced"',
                "FieldValueNotSupported",
            )
        )
    versions = spec.get("versions") or []
    if sum(1 for v in versions if isinstance(v, dict) and v.get("storage")) != 1:
        causes.append(Cause("spec.versions", "Invalid value: must have exactly one version marked as storage version"))
    for i, version in enumerate(versions):
        if not isinstance(version, dict) or not version.get("name"):
            causes.append(Cause(f"spec.versions[{i}].name", "Required value", "FieldValueRequired"))
    if any(rt.group == group and rt.plural == plural for rt in RESOURCES):
        # NB: kube-apiserver would serve the built-in and leave the CRD unestablished; here it is refused outright.
        causes.append(Cause("spec.group", f"Invalid value: {group!r}: {plural}.{group} is a built-in resource"))
    if old_spec is not None:
        for immutable in ("group", "scope"):
            if old_spec.get(immutable) != spec.get(immutable):
                causes.append(Cause(f"spec.{immutable}", "Invalid value: field is immutable"))
        if (old_spec.get("names") or {}).get("plural") != plural:
            causes.append(Cause("spec.names.plural", "Invalid value: field is immutable"))
    return causes


def _custom_resource_types(crd: Mapping[str, Any]) -> builtins.list[ResourceType]:
    """The resources a CustomResourceDefinition serves: one per served version, all in one store (the
    ``None`` conversion strategy: only ``apiVersion`` changes between versions; schemas are not enforced)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    return [
        ResourceType(
            spec["group"],
            version["name"],
            names["plural"],
            names["kind"],
            namespaced=spec.get("scope") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()),
            subresources=("status",) if "status" in (version.get("subresources") or {}) else (),
            categories=tuple(names.get("categories") or ()),
            tracks_generation=True,
            storage_name=f"{names['plural']}.{spec['group']}",
            custom=True,
        )
        for version in spec.get("versions") or []
        if version.get("served", True)
    ]


# fieldValidation: the fields kube-apiserver's typed decoding knows, at the levels manifests usually get wrong.
# NB: deeper levels (pod specs, container fields) are not schema-checked here; see the module docstring.
_OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_CORE_EVENT_FIELDS = frozenset(_EVENT_FIELDS)
_V1_EVENT_FIELDS = frozenset(_EVENT_FIELDS.values())
_TOP_LEVEL_FIELDS: dict[str, frozenset[str]] = {
    "ConfigMap": frozenset({"data", "binaryData", "immutable"}),
    "Lease": frozenset({"spec"}),
    "PodTemplate": frozenset({"template"}),
}
_SPEC_FIELDS: dict[str, frozenset[str]] = {
    "Deployment": frozenset(
        {
            "replicas",
            "selector",
            "template",
            "strategy",
            "minReadySeconds",
            "revisionHistoryLimit",
            "paused",
            "progressDeadlineSeconds",
        }
    ),
    "StatefulSet": frozenset(
        {
            "replicas",
            "selector",
            "template",
            "volumeClaimTemplates",
            "serviceName",
            "podManagementPolicy",
            "updateStrategy",
            "revisionHistoryLimit",
            "minReadySeconds",
            "persistentVolumeClaimRetentionPolicy",
            "ordinals",
        }
    ),
    "ReplicaSet": frozenset({"replicas", "minReadySeconds", "selector", "template"}),
    "Job": frozenset(
        {
            "parallelism",
            "completions",
            "activeDeadlineSeconds",
            "podFailurePolicy",
            "successPolicy",
            "backoffLimit",
            "backoffLimitPerIndex",
            "maxFailedIndexes",
            "selector",
            "manualSelector",
            "template",
            "ttlSecondsAfterFinished",
            "completionMode",
            "suspend",
            "podReplacementPolicy",
            "managedBy",
        }
    ),
    "DaemonSet": frozenset({"selector", "template", "updateStrategy", "minReadySeconds", "revisionHistoryLimit"}),
    "Lease": frozenset(
        {
            "holderIdentity",
            "leaseDurationSeconds",
            "acquireTime",
            "renewTime",
            "leaseTransitions",
            "strategy",
            "preferredHolder",
        }
    ),
}


def _unknown_fields(rt: ResourceType, body: Mapping[str, Any]) -> list[str]:
    if rt.kind == "Event":
        allowed = _V1_EVENT_FIELDS if rt.group == "events.k8s.io" else _CORE_EVENT_FIELDS
    elif rt.custom:
        allowed = frozenset(body)  # NB: no OpenAPI schema here, so nothing to prune or reject beyond metadata
    else:
        allowed = _TOP_LEVEL_FIELDS.get(rt.kind, frozenset({"spec", "status"}))
    unknown = [k for k in body if k not in allowed and k not in ("apiVersion", "kind", "metadata")]
    unknown += [f"metadata.{k}" for k in body.get("metadata") or {} if k not in _OBJECT_META_FIELDS]
    spec_fields = _SPEC_FIELDS.get(rt.kind)
    if spec_fields is not None and isinstance(body.get("spec"), dict):
        unknown += [f"spec.{k}" for k in body["spec"] if k not in spec_fields]
    return unknown


def _check_fields(rt: ResourceType, body: Mapping[str, Any], write: _Write) -> None:
    """Apply the request's fieldValidation directive: Strict rejects unknown fields, Warn reports them."""
    if write.field_validation == "Ignore":
        return
    unknown = _unknown_fields(rt, body)
    if not unknown:
        return
    if write.field_validation == "Strict":
        listed = ", ".join(f'unknown field "{f}"' for f in unknown)
        raise bad_request(
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: {listed}'
        )
    write.warnings.extend(f'unknown field \\"{f}\\"' for f in unknown)
    log.warning("%s %s: unknown fields %s", rt.kind, (body.get("metadata") or {}).get("name", ""), unknown)


def _workload_causes(spec: Mapping[str, Any], old_spec: Mapping[str, Any] | None) -> list[Cause]:
    raw = spec.get("selector")
    if raw is None:
        return [Cause("spec.selector", "Required value", "FieldValueRequired")]
    try:
        selector = LabelSelector.from_dict(raw)
    except SelectorError as e:
        return [Cause("spec.selector", f"Invalid value: {raw!r}: {e}")]
    if selector.is_empty:
        return [Cause("spec.selector", f"Invalid value: {raw!r}: empty selector is invalid for deployment")]
    causes: list[Cause] = []
    template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if not selector.matches(template_labels):
        causes.append(
            Cause(
                "spec.template.metadata.labels",
                f"Invalid value: {template_labels!r}: `selector` does not match template `labels`",
            )
        )
    if old_spec is not None and old_spec.get("selector") != raw:
        causes.append(Cause("spec.selector", f"Invalid value: {raw!r}: field is immutable"))
    return causes


def _pod_spec_frozen(spec: Mapping[str, Any]) -> dict[str, Any]:
    frozen = {k: v for k, v in spec.items() if k not in _POD_MUTABLE_SPEC}
    for list_name in ("containers", "initContainers"):
        if isinstance(frozen.get(list_name), list):
            frozen[list_name] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in frozen[list_name]
            ]
    return frozen


def _default(rt: ResourceType, obj: dict[str, Any], sim: SimKubeApi) -> None:
    """The few API defaults clients observe (replicas, pod phase, namespace phase/label, service IPs)."""
    no_spec = rt.custom or rt.kind in ("ConfigMap", "Event", "Namespace", "PodTemplate")
    spec = obj.get("spec") if no_spec else obj.setdefault("spec", {})
    if rt.kind in _WORKLOAD_KINDS:
        assert spec is not None
        if rt.kind != "DaemonSet":
            spec.setdefault("replicas", 1)
        if rt.kind != "ReplicaSet":
            spec.setdefault("revisionHistoryLimit", 10)
        if rt.kind == "DaemonSet":
            spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})
        elif rt.kind == "Deployment":
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault(
                "strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
            )
        elif rt.kind == "StatefulSet":
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    elif rt.kind == "Pod":
        assert spec is not None
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        for container in spec.get("containers") or []:
            for port in container.get("ports") or [] if isinstance(container, dict) else []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
    elif rt.kind == "Namespace":
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif rt.kind == "Job" and not rt.custom:
        assert spec is not None
        _default_job(spec, obj["metadata"])
    elif rt.kind == "CustomResourceDefinition" and not rt.custom and isinstance(spec, dict):
        names = spec.setdefault("names", {})
        if isinstance(names, dict) and names.get("kind"):
            names.setdefault("singular", str(names["kind"]).lower())
            names.setdefault("listKind", f"{names['kind']}List")
    elif rt.kind == "Service":
        assert spec is not None
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
        if spec["type"] != "ExternalName" and "clusterIP" not in spec:
            spec["clusterIP"] = sim._allocate_cluster_ip()
            spec["clusterIPs"] = [spec["clusterIP"]]


def _default_job(spec: dict[str, Any], meta: Mapping[str, Any]) -> None:
    """The Job defaults and, unless ``manualSelector``, the generated selector and template labels."""
    spec.setdefault("parallelism", 1)
    if spec.get("completionMode") != "Indexed" or "completions" in spec:
        spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if not spec.get("manualSelector") and "selector" not in spec:
        uid = meta["uid"]
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        labels = spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
        for prefix in ("batch.kubernetes.io/", ""):
            labels.setdefault(f"{prefix}controller-uid", uid)
            labels.setdefault(f"{prefix}job-name", meta["name"])


NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def _node_not_ready_taint(node: dict[str, Any], *, creating: bool) -> None:
    """The taint kube-apiserver's TaintNodesByCondition admission puts on every new Node (``creating``), and the
    node lifecycle controller takes off once the Node reports Ready (at once here, on any write)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions if isinstance(c, dict))
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    has = any(t.get("key") == NOT_READY_TAINT["key"] and t.get("effect") == "NoSchedule" for t in taints)
    if ready and has:
        spec["taints"] = [
            t for t in taints if t.get("key") != NOT_READY_TAINT["key"] or t.get("effect") != "NoSchedule"
        ]
        if not spec["taints"]:
            del spec["taints"]
    elif creating and not ready and not has:
        spec["taints"] = [*taints, dict(NOT_READY_TAINT)]
    if spec.get("taints") == []:
        del spec["taints"]  # NB: omitempty — kube-apiserver serves no taints as no field at all


def _status_on_create(rt: ResourceType, obj: dict[str, Any]) -> None:
    """What kube-apiserver keeps of a status sent with a create (PrepareForCreate)."""
    if rt.kind == "Node" and not rt.custom:
        _node_not_ready_taint(obj, creating=True)
    if rt.custom:
        if rt.has_status:
            obj.pop("status", None)  # NB: with the status subresource, a create's status is dropped
    elif rt.kind == "Pod":
        obj["status"] = {"phase": "Pending"}
    elif rt.kind in _WORKLOAD_KINDS or rt.kind == "Job":
        obj["status"] = {}
    elif rt.kind == "CustomResourceDefinition":
        # NB: the CRD controllers accept the names and establish the resource at once here (no delay).
        names = (obj.get("spec") or {}).get("names") or {}
        now = _timestamp()
        obj["status"] = {
            "acceptedNames": copy.deepcopy(names),
            "storedVersions": [v["name"] for v in (obj.get("spec") or {}).get("versions") or [] if v.get("storage")],
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now}
                for t, r, m in (
                    ("NamesAccepted", "NoConflicts", "no conflicts found"),
                    ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
                )
            ],
        }
    elif rt.kind == "Namespace":
        obj["status"] = {"phase": "Active"}
    elif rt.kind == "Service":
        obj["status"] = {"loadBalancer": {}}
    # Nodes keep the status they are created with, as in Kubernetes.


# --- scale ------------------------------------------------------------------------------------------


def _scale_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"],
        },
        # NB: ScaleSpec.replicas is omitempty: a target scaled to 0 has an empty spec.
        "spec": {"replicas": spec["replicas"]} if spec.get("replicas") else {},
        "status": {"replicas": status.get("replicas", 0), "selector": selector_text(spec.get("selector"))},
    }


# --- tables (meta.k8s.io/v1 Table, what `kubectl get` prints): rows in gpuscale.sim.tables ------------


def _wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    first = accept.split(",")[0]
    return "as=Table" in first and "g=meta.k8s.io" in first


def _table(
    rt: ResourceType, stored_objects: Iterable[Mapping[str, Any]], *, rv: str, include: str, columns: bool = True
) -> dict[str, Any]:
    if rt.custom:
        column_defs, row = DEFAULT_TABLE
    elif rt.group == "events.k8s.io":
        column_defs, row = TABLES["Event"]
    else:
        column_defs, row = TABLES.get(rt.kind, DEFAULT_TABLE)
    rows = []
    for stored in stored_objects:
        served = _to_served(rt, stored)
        entry: dict[str, Any] = {"cells": row(stored)}
        if include == "Object":
            entry["object"] = served
        elif include != "None":
            entry["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": served["metadata"],
            }
        rows.append(entry)
    table: dict[str, Any] = {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv}}
    if columns:
        table["columnDefinitions"] = [
            {
                "name": name,
                "type": "string",
                "format": "name" if name == "Name" else "",
                "description": name,
                "priority": priority,
            }
            for name, priority in column_defs
        ]
    table["rows"] = rows
    return table


# --- watch plumbing ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Change:
    rv: int
    storage: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]  # stored form, new state (last state for DELETED)
    prev: dict[str, Any] | None  # stored form before the change


@dataclass(frozen=True, slots=True)
class _Filter:
    """Which stored objects a list or watch selects: namespace (None = all), label and field selectors."""

    rt: ResourceType
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def passes(self, stored: Mapping[str, Any] | None) -> bool:
        if stored is None:
            return False
        meta = stored.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if not self.labels.matches(meta.get("labels") or {}):
            return False
        return self.fields.is_empty or self.fields.matches_fields(_field_set(self.rt, stored))

    def event_for(self, change: _Change) -> tuple[str, dict[str, Any]] | None:
        """The event a watch with this filter sees for a change, as the watch cache decides it: an object
        that stops passing is DELETED, one that starts passing is ADDED (None = not seen at all)."""
        if change.type == "ADDED":
            before, now = False, self.passes(change.obj)
        elif change.type == "MODIFIED":
            before, now = self.passes(change.prev), self.passes(change.obj)
        else:
            before, now = self.passes(change.obj), False
        if now and before:
            kind = "MODIFIED"
        elif now:
            kind = "ADDED"
        elif before:
            kind = "DELETED"
        else:
            return None
        return kind, change.obj


@dataclass(eq=False, slots=True)
class _Watcher:
    filter: _Filter
    queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = field(default_factory=asyncio.Queue)
    transport: asyncio.BaseTransport | None = None
    dropped: bool = False  # cut by drop_watches: end without a final BOOKMARK


@dataclass(slots=True)
class _Write:
    """Per-request write options: ``dryRun=All``, the ``fieldValidation`` directive, warnings to send back."""

    dry_run: bool = False
    field_validation: str = "Warn"
    warnings: list[str] = field(default_factory=list)


_NO_OPTIONS = _Write()


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the server answered: method, path with query, and the bearer token (None if absent)."""

    method: str
    path_qs: str
    token: str | None


@dataclass(frozen=True, slots=True)
class ReviewUser:
    """Who a token registered with ``add_token`` belongs to (a TokenReview's ``status.user``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AccessRule:
    """One RBAC-style grant for SubjectAccessReviews: subjects, verbs, and resources or non-resource URLs.

    Matched as RBAC matches (``*`` everywhere; ``resources`` entries match ``resource`` or
    ``resource/subresource`` exactly, or ``*/subresource``; ``resource_names`` empty = any name, otherwise only
    requests naming one). ``namespace`` None grants cluster-wide (a ClusterRoleBinding), a namespace grants only
    requests in it (a RoleBinding). A rule with ``non_resource_urls`` grants non-resource requests only
    (exact paths, or prefixes ending in ``*``).
    """

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    verbs: frozenset[str] = frozenset({"*"})
    api_groups: frozenset[str] = frozenset({"*"})
    resources: frozenset[str] = frozenset({"*"})
    resource_names: frozenset[str] = frozenset()
    namespace: str | None = None
    non_resource_urls: frozenset[str] = frozenset()

    def allows(self, spec: Mapping[str, Any]) -> bool:
        """Whether this rule grants a SubjectAccessReview ``spec``."""
        if spec.get("user") not in self.users and not self.groups.intersection(spec.get("groups") or ()):
            return False
        resource = spec.get("resourceAttributes")
        if resource is None:
            attributes = spec.get("nonResourceAttributes") or {}
            path = attributes.get("path", "")
            return (
                self.namespace is None
                and _verb_matches(self.verbs, attributes.get("verb", ""))
                and any(
                    u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1]))
                    for u in self.non_resource_urls
                )
            )
        if self.non_resource_urls:
            return False
        if self.namespace is not None and resource.get("namespace", "") != self.namespace:
            return False
        if not _verb_matches(self.verbs, resource.get("verb", "")):
            return False
        if "*" not in self.api_groups and resource.get("group", "") not in self.api_groups:
            return False
        plural, sub = resource.get("resource", ""), resource.get("subresource", "")
        combined = f"{plural}/{sub}" if sub else plural
        if not any(r in ("*", combined) or (sub and r == f"*/{sub}") for r in self.resources):
            return False
        return not self.resource_names or resource.get("name", "") in self.resource_names


def _verb_matches(verbs: frozenset[str], verb: str) -> bool:
    return "*" in verbs or verb in verbs


_REVIEW_FAILURE_REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
_FAULT_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "*")


@dataclass(slots=True)
class _PlannedFailure:
    """One entry of the fault plan (see ``SimKubeApi.fail_next``)."""

    code: int
    verb: str
    resource: str | None  # group_resource ("pods", "deployments.apps"); None = any
    remaining: int
    retry_after_seconds: int

    def matches(self, verb: str, rt: ResourceType) -> bool:
        return self.verb in ("*", verb) and self.resource in (None, rt.group_resource, rt.plural)


@dataclass(frozen=True, slots=True)
class ServedFault:
    """A request the fault plan answered: what it asked for and the status it got."""

    verb: str
    resource: str
    code: int
    path_qs: str


# --- the server -------------------------------------------------------------------------------------


class SimKubeApi:
    """An in-memory Kubernetes API server over aiohttp. See the module docstring for what it covers.

    ``history_limit`` is how many changes a watch can replay (older resourceVersions get 410 Expired);
    ``tokens``, when given, is the set of bearer tokens accepted (others get 401), otherwise any token —
    or none — is accepted; ``bookmark_interval_seconds`` spaces BOOKMARK events on watches that allow them.
    """

    def __init__(
        self,
        *,
        history_limit: int = 1000,
        tokens: Collection[str] | None = None,
        bookmark_interval_seconds: float = 60.0,
        namespaces: Iterable[str] = ("default", "kube-system", "kube-public", "kube-node-lease"),
    ) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self._tokens = frozenset(tokens) if tokens is not None else None
        self._bookmark_interval = bookmark_interval_seconds
        self._objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self._rv = 0
        self._history: deque[_Change] = deque(maxlen=history_limit)
        self._floor = 0  # every change with rv > floor is in the history
        self._storage_floor: dict[str, int] = {}  # per storage, a later floor (a newly served custom resource)
        self._storage_rv: dict[str, int] = {}  # per storage, the resourceVersion of its newest change
        self._watchers: dict[str, set[_Watcher]] = {}
        self._next_cluster_ip = 1
        self._runner: web.AppRunner | None = None
        self._stopping = False
        self.url = ""
        self.requests: deque[RecordedRequest] = deque(maxlen=10_000)
        self.request_count = 0
        self.tokens_seen: set[str] = set()
        self.review_users: dict[str, ReviewUser] = {}
        """token → user, for TokenReviews (see ``add_token``)."""
        self.access_rules: builtins.list[AccessRule] = []
        """The grants SubjectAccessReviews are answered from (see ``allow``); clear it to deny everything again."""
        self.token_reviews: builtins.list[dict[str, Any]] = []
        """The ``spec`` of every TokenReview received, in order (failed ones included)."""
        self.access_reviews: builtins.list[dict[str, Any]] = []
        """The ``spec`` of every SubjectAccessReview received, in order (failed ones included)."""
        self.review_delay_seconds = 0.0
        """How long each review takes to answer (to exercise clients' timeouts and request coalescing)."""
        self._review_failure: int | None = None
        self._fault_plan: builtins.list[_PlannedFailure] = []
        self.faults_served: builtins.list[ServedFault] = []
        """Every request answered by the fault plan (``fail_next``), in order."""
        self.watches_dropped = 0
        """How many open watch connections ``drop_watches`` and ``go_away`` cut."""
        self._address: tuple[str, int] | None = None
        self._custom: dict[tuple[str, str, str], ResourceType] = {}
        """(group, version, plural) → the resource an established CustomResourceDefinition serves."""
        for name in namespaces:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # -- lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on host:port (0 = a free port) and return the base URL."""
        if self._runner is not None:
            raise RuntimeError("SimKubeApi is already started")
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        self._stopping = False
        bound = runner.addresses[0]
        self._address = (host, bound[1])
        self.url = f"http://{host}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        """End every watch stream, then close the server. Safe to call twice."""
        self._stopping = True
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.queue.put_nowait(None)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> SimKubeApi:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def write_kubeconfig(
        self, path: str | os.PathLike[str], *, token: str | None = None, namespace: str = "default"
    ) -> str:
        """Write a kubeconfig for this server (context "sim", bearer-token user) and return its path."""
        if not self.url:
            raise RuntimeError("start() the server before writing a kubeconfig")
        if token is None:
            token = sorted(self._tokens)[0] if self._tokens else "sim-token"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
            "users": [{"name": "sim", "user": {"token": token}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": namespace}}],
            "current-context": "sim",
            "preferences": {},
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(config, sort_keys=False))
        return str(target)

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._rv)

    # -- in-process helpers (same semantics as HTTP)

    def create(self, obj: Mapping[str, Any], *, preserve_identity: bool = True) -> dict[str, Any]:
        """Create an object, as POST does, with two conveniences for seeding a scenario:

        * a ``status`` given for a resource with a status subresource is then written through ``/status``
          (a second change, as the kubelet or a controller would report it);
        * with ``preserve_identity`` a given ``metadata.uid`` and ``creationTimestamp`` are kept, so
          ownerReferences rendered ahead of time stay true (over HTTP the server always assigns both).
        """
        rt = self._resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        namespace = self._helper_namespace(rt, obj)
        meta = obj.get("metadata") or {}
        identity = {k: meta[k] for k in ("uid", "creationTimestamp") if preserve_identity and meta.get(k)}
        created = self._create(rt, namespace, copy.deepcopy(dict(obj)), identity=identity)
        return self._write_status(rt, namespace, created, obj.get("status"))

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object if absent, else merge the given fields into it (server-side apply without field
        ownership); a given ``status`` is applied through ``/status`` afterwards, as in ``create``."""
        rt = self._resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        namespace = self._helper_namespace(rt, obj)
        name = (obj.get("metadata") or {}).get("name", "")
        if not name or self._stored(rt, namespace, name) is None:
            return self.create(obj)
        body = {k: copy.deepcopy(v) for k, v in obj.items() if k != "status"}
        for server_field in ("uid", "creationTimestamp", "resourceVersion", "generation"):
            body.get("metadata", {}).pop(server_field, None)
        applied = self._patch(rt, namespace, name, APPLY_PATCH, body, field_manager="sim")
        return self._write_status(rt, namespace, applied, obj.get("status"))

    def _write_status(self, rt: ResourceType, namespace: str, current: dict[str, Any], status: Any) -> dict[str, Any]:
        if not rt.has_status or status is None or current.get("status") == status:
            return current
        updated = copy.deepcopy(current)
        updated["status"] = copy.deepcopy(status)
        return self._update(rt, namespace, current["metadata"]["name"], updated, subresource="status")

    def replace(self, obj: Mapping[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        """PUT an object (``subresource="status"`` to write its status)."""
        rt = self._resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        name = (obj.get("metadata") or {}).get("name", "")
        return self._update(rt, self._helper_namespace(rt, obj), name, dict(obj), subresource=subresource)

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PATCH an object; ``patch_type`` is merge, strategic, json or apply (or a full content type)."""
        rt = self._resource_for(api_version, kind)
        content_type = {
            "merge": MERGE_PATCH,
            "strategic": STRATEGIC_MERGE_PATCH,
            "json": JSON_PATCH,
            "apply": APPLY_PATCH,
        }.get(patch_type, patch_type)
        namespace = self._helper_namespace(rt, {"metadata": {"namespace": namespace}})
        return self._patch(rt, namespace, name, content_type, patch, subresource=subresource, field_manager="sim")

    def delete(self, api_version: str, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        rt = self._resource_for(api_version, kind)
        return self._delete(rt, self._helper_namespace(rt, {"metadata": {"namespace": namespace}}), name, {})

    def get(self, api_version: str, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        rt = self._resource_for(api_version, kind)
        stored = self._stored(rt, self._helper_namespace(rt, {"metadata": {"namespace": namespace}}), name)
        return _to_served(rt, stored) if stored is not None else None

    def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> builtins.list[dict[str, Any]]:
        """Objects of a kind (all namespaces when ``namespace`` is None), each with kind and apiVersion."""
        rt = self._resource_for(api_version, kind)
        try:
            labels = LabelSelector.parse(label_selector)
            fields = self._field_selector(rt, field_selector)
        except SelectorError as e:
            raise bad_request(str(e)) from e
        return [_to_served(rt, o) for o in self._select(rt, namespace, labels, fields)]

    def compact(self) -> None:
        """Forget the change history: a watch from any resourceVersion before now gets 410 Expired."""
        self._history.clear()
        self._floor = self._rv

    # -- delegated authentication and authorization policy

    def add_token(
        self,
        token: str,
        username: str,
        *,
        uid: str = "",
        groups: Iterable[str] = (),
        extra: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """Make TokenReviews of ``token`` answer with this user (``system:authenticated`` is added)."""
        if not token or not username:
            raise ValueError("a token and a username are required")
        self.review_users[token] = ReviewUser(
            username, uid, tuple(groups), {k: tuple(v) for k, v in (extra or {}).items()}
        )

    def allow(
        self,
        *,
        users: Iterable[str] = (),
        groups: Iterable[str] = (),
        verbs: Iterable[str] = ("*",),
        api_groups: Iterable[str] = ("*",),
        resources: Iterable[str] = ("*",),
        resource_names: Iterable[str] = (),
        namespace: str | None = None,
        non_resource_urls: Iterable[str] = (),
    ) -> AccessRule:
        """Grant, for SubjectAccessReviews, what an RBAC role bound to these users and groups would grant."""
        rule = AccessRule(
            frozenset(users),
            frozenset(groups),
            frozenset(verbs),
            frozenset(api_groups),
            frozenset(resources),
            frozenset(resource_names),
            namespace,
            frozenset(non_resource_urls),
        )
        if not rule.users and not rule.groups:
            raise ValueError("allow() needs at least one user or group")
        if rule.non_resource_urls and namespace is not None:
            raise ValueError("non-resource URLs can only be granted cluster-wide")
        self.access_rules.append(rule)
        return rule

    def fail_reviews(self, status: int | None = 503) -> None:
        """Answer every TokenReview and SubjectAccessReview with this HTTP status (None: answer normally)."""
        self._review_failure = status

    # -- fault injection: what a real control plane does to its clients now and then

    def fail_next(
        self,
        code: int,
        *,
        verb: str = "list",
        resource: str | None = None,
        times: int = 1,
        retry_after_seconds: int = 1,
    ) -> None:
        """Answer the next ``times`` requests of ``verb`` on ``resource`` with ``code``, as kube-apiserver would.

        ``verb`` is a Kubernetes verb (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
        ``deletecollection``, or ``*``); ``resource`` a plural with its group (``pods``, ``deployments.apps``) or
        None for any. Entries queue up in order; a request takes the first entry it matches. The answers:

        * 410 on a watch: HTTP 200 and one ERROR event carrying an ``Expired`` Status ("too old resource
          version"), exactly what the watch cache sends; 410 on anything else: an HTTP 410 ``Expired`` Status.
        * 409: ``Conflict`` ("Operation cannot be fulfilled on pods ...: the object has been modified ...").
        * 429: ``TooManyRequests`` with ``Retry-After`` and ``details.retryAfterSeconds`` (the shape of
          apierrors.NewTooManyRequests; note that API Priority and Fairness itself answers 429 in plain text).
        * 500: ``InternalError`` ("Internal error occurred: etcdserver: leader changed", with the cause).
        * 503/504: ``ServiceUnavailable`` / ``Timeout``, with ``Retry-After``. Any other code: a Status with it.
        """
        if verb not in _FAULT_VERBS:
            raise ValueError(f"verb must be one of {', '.join(_FAULT_VERBS)}, not {verb!r}")
        if times < 1:
            raise ValueError("times must be at least 1")
        if not 400 <= code <= 599:
            raise ValueError(f"code must be an HTTP error status (4xx/5xx), not {code}")
        self._fault_plan.append(_PlannedFailure(code, verb, resource, times, retry_after_seconds))

    def clear_faults(self) -> None:
        """Forget every planned failure not yet served."""
        self._fault_plan.clear()

    @property
    def pending_faults(self) -> int:
        """How many planned failures are still to be served."""
        return sum(f.remaining for f in self._fault_plan)

    def drop_watches(self, resource: str | None = None) -> int:
        """Cut every open watch (of ``resource``, or all) mid-stream, as a restarting apiserver or a load
        balancer's idle timeout does: the connection is aborted, with no final chunk and no BOOKMARK.
        Returns how many were cut."""
        dropped = 0
        for watchers in self._watchers.values():
            for watcher in builtins.list(watchers):
                if resource is not None and resource not in (
                    watcher.filter.rt.group_resource,
                    watcher.filter.rt.plural,
                ):
                    continue
                watcher.dropped = True
                if watcher.transport is not None:
                    watcher.transport.abort()
                watcher.queue.put_nowait(None)
                dropped += 1
        self.watches_dropped += dropped
        return dropped

    @property
    def available(self) -> bool:
        """False between ``go_away`` and ``come_back``."""
        return self._runner is not None

    async def go_away(self) -> None:
        """Stop answering entirely: cut every watch, close the listening socket and every connection (clients
        get connection refused). Storage stays, and in-process writes keep working (as other apiservers
        behind the same etcd would take them), so ``come_back`` serves what changed meanwhile."""
        if self._runner is None:
            raise RuntimeError("SimKubeApi is not serving")
        self.drop_watches()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def come_back(self) -> str:
        """Listen again on the same address as before ``go_away``; returns the (unchanged) URL."""
        if self._address is None:
            raise RuntimeError("SimKubeApi was never started")
        host, port = self._address
        return await self.start(host, port)

    async def outage(self, seconds: float) -> None:
        """``go_away``, wait ``seconds``, ``come_back``."""
        await self.go_away()
        try:
            await asyncio.sleep(seconds)
        finally:
            await self.come_back()

    def _take_fault(self, verb: str, rt: ResourceType) -> _PlannedFailure | None:
        for i, planned in enumerate(self._fault_plan):
            if planned.matches(verb, rt):
                planned.remaining -= 1
                if planned.remaining == 0:
                    del self._fault_plan[i]
                return planned
        return None

    def _planned_status(self, planned: _PlannedFailure, rt: ResourceType, name: str | None) -> ApiStatusError:
        code, retry = planned.code, planned.retry_after_seconds
        if code == 409:
            why = "the object has been modified; please apply your changes to the latest version and try again"
            return conflict(rt, name or "", why)
        if code == 410:
            return ApiStatusError(410, "Expired", f"too old resource version: {self._floor} ({self._rv})")
        if code == 429:
            return ApiStatusError(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                details={"retryAfterSeconds": retry},
                headers={"Retry-After": str(retry)},
            )
        if code == 500:
            cause = "etcdserver: leader changed"
            return ApiStatusError(
                500, "InternalError", f"Internal error occurred: {cause}", details={"causes": [{"message": cause}]}
            )
        if code == 503:
            return ApiStatusError(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
                details={"retryAfterSeconds": retry},
                headers={"Retry-After": str(retry)},
            )
        if code == 504:
            return ApiStatusError(
                504,
                "Timeout",
                "the server was unable to return a response in the time allotted, but may still be processing "
                "the request",
                details={"retryAfterSeconds": retry},
                headers={"Retry-After": str(retry)},
            )
        reason = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(code, "Unknown")
        return ApiStatusError(code, reason, f"simulated failure: HTTP {code}")

    # -- custom resources (CustomResourceDefinitions)

    def _resource_for(self, api_version: str, kind: str) -> ResourceType:
        for rt in self._custom.values():
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        return resource_for(api_version, kind)

    def _served(self) -> builtins.list[ResourceType]:
        """Every resource served now: the built-in ones, then those of established CustomResourceDefinitions."""
        return [*RESOURCES, *self._custom.values()]

    def _groups(self) -> dict[str, builtins.list[str]]:
        groups = {g: builtins.list(v) for g, v in GROUPS.items()}
        for rt in self._custom.values():
            if rt.version not in groups.setdefault(rt.group, []):
                groups[rt.group].append(rt.version)
        return groups

    def _crd_changed(self, kind: str, crd: Mapping[str, Any]) -> None:
        """Serve (or stop serving, deleting its objects as the CRD finalizer does) what a CRD defines."""
        storage = f"{(crd.get('spec') or {}).get('names', {}).get('plural')}.{(crd.get('spec') or {}).get('group')}"
        for path in [p for p, rt in self._custom.items() if rt.storage == storage]:
            del self._custom[path]
        if kind != "DELETED":
            if storage not in self._storage_floor and not any(rt.storage == storage for rt in self._custom.values()):
                # NB: like the watch cache kube-apiserver starts for a newly served resource, no history from before
                # now: a watch from an older resourceVersion gets 410 Expired.
                self._storage_floor[storage] = self._rv
            for rt in _custom_resource_types(crd):
                self._custom[(rt.group, rt.version, rt.plural)] = rt
            return
        self._storage_floor.pop(storage, None)
        types = _custom_resource_types(crd)
        if types:
            for _, stored in sorted(self._store(types[0]).items()):
                self._commit(types[0], "DELETED", copy.deepcopy(stored), stored)
        self._objects.pop(storage, None)

    # -- storage core

    def _helper_namespace(self, rt: ResourceType, obj: Mapping[str, Any]) -> str:
        if not rt.namespaced:
            return ""
        return (obj.get("metadata") or {}).get("namespace") or "default"

    def _store(self, rt: ResourceType) -> dict[tuple[str, str], dict[str, Any]]:
        return self._objects.setdefault(rt.storage, {})

    def _stored(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        return self._store(rt).get((namespace, name))

    def _require(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        stored = self._stored(rt, namespace, name)
        if stored is None:
            raise not_found(rt, name)
        return stored

    def _field_selector(self, rt: ResourceType, text: str) -> FieldSelector:
        selector = FieldSelector.parse(text)
        unsupported = sorted(selector.fields - set(rt.field_labels))
        if unsupported:
            raise SelectorError(f"field label not supported: {unsupported[0]}")
        return selector

    def _select(
        self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldSelector
    ) -> builtins.list[dict[str, Any]]:
        selection = _Filter(rt, namespace, labels, fields)
        return [o for _, o in sorted(self._store(rt).items()) if selection.passes(o)]

    def _commit(self, rt: ResourceType, kind: str, new: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any]:
        """Write (or, for DELETED, remove) an object at a fresh resourceVersion and tell the watchers."""
        meta = new["metadata"]
        for omitempty in ("labels", "annotations", "finalizers", "ownerReferences"):
            if omitempty in meta and not meta[omitempty]:
                del meta[omitempty]  # NB: kube-apiserver stores and serves an empty one as no field at all
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        key = (new["metadata"].get("namespace", ""), new["metadata"]["name"])
        store = self._store(rt)
        if kind == "DELETED":
            store.pop(key, None)
        else:
            store[key] = new
        self._storage_rv[rt.storage] = self._rv
        change = _Change(self._rv, rt.storage, kind, new, prev)
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(change)
        for watcher in self._watchers.get(rt.storage, ()):
            event = watcher.filter.event_for(change)
            if event is not None:
                watcher.queue.put_nowait(event)
        if rt.kind == "CustomResourceDefinition" and not rt.custom:
            self._crd_changed(kind, new)
        if not rt.custom and (rt.kind == "Pod" or (rt.kind == "PodDisruptionBudget" and kind != "DELETED")):
            self._keep_budget_statuses(key[0])
        return new

    def _keep_budget_statuses(self, namespace: str) -> None:
        """The disruption controller's part: every PodDisruptionBudget of ``namespace`` gets the status computed
        from its pods (gpuscale.sim.disruption_controller), written like any status change (MODIFIED)."""
        budgets_rt = BY_KIND[("policy/v1", "PodDisruptionBudget")]
        budgets = [(k, b) for k, b in self._store(budgets_rt).items() if k[0] == namespace]
        if not budgets:
            return
        pods = [p for (ns, _), p in self._store(BY_KIND[("v1", "Pod")]).items() if ns == namespace]
        for _, budget in budgets:
            status = budget_status(budget, pods, now=_timestamp(), previous=budget.get("status"))
            if status != budget.get("status"):
                updated = copy.deepcopy(budget)
                updated["status"] = status
                self._commit(budgets_rt, "MODIFIED", updated, budget)

    def _create(
        self,
        rt: ResourceType,
        namespace: str,
        body: dict[str, Any],
        *,
        write: _Write | None = None,
        identity: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        _check_fields(rt, self._check_body(rt, body), write or _Write())
        obj = strip_nulls(_to_stored(rt, body))
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
            ns_type = BY_KIND[("v1", "Namespace")]
            if self._stored(ns_type, "", namespace) is None:
                raise not_found(ns_type, namespace)
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise ApiStatusError(500, "InternalError", "resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    rt,
                    "",
                    [Cause("metadata.name", "Required value: name or generateName is required", "FieldValueRequired")],
                )
            meta["name"] = meta["generateName"] + "".join(random.choice(_GENERATE_CHARS) for _ in range(5))
        name = meta["name"]
        if self._stored(rt, meta.get("namespace", ""), name) is not None:
            raise ApiStatusError(
                409, "AlreadyExists", f'{rt.group_resource} "{name}" already exists', details=status_details(rt, name)
            )
        for server_field in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(server_field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _timestamp()
        meta.update(identity or {})
        if rt.tracks_generation:
            meta["generation"] = 1
        _default(rt, obj, self)
        _status_on_create(rt, obj)
        _validate(rt, obj, None)
        if (write or _NO_OPTIONS).dry_run:
            return _to_served(rt, obj)  # NB: nothing stored, so no resourceVersion
        return _to_served(rt, self._commit(rt, "ADDED", obj, None))

    def _check_body(
        self, rt: ResourceType, body: Any, *, kind: str | None = None, api_version: str | None = None
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        want_kind = kind or rt.kind
        want_version = api_version or rt.api_version
        if body.get("kind") not in (None, "", want_kind):
            raise bad_request(f"the kind in the data ({body['kind']}) does not match the expected kind ({want_kind})")
        if body.get("apiVersion") not in (None, "", want_version):
            raise bad_request(
                f"the API version in the data ({body['apiVersion']}) does not match the expected API version "
                f"({want_version})"
            )
        if not isinstance(body.get("metadata", {}), dict):
            raise bad_request("metadata must be an object")
        return body

    def _update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: dict[str, Any],
        *,
        subresource: str | None = None,
        write: _Write | None = None,
    ) -> dict[str, Any]:
        old = self._require(rt, namespace, name)
        _check_fields(rt, self._check_body(rt, body), write or _Write())
        new = strip_nulls(_to_stored(rt, body))
        meta = new.setdefault("metadata", {})
        if meta.get("name") not in (None, name):
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        if rt.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        old_meta = old["metadata"]
        if meta.get("uid") not in (None, "", old_meta["uid"]):
            raise conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: {old_meta['uid']}",
            )
        if meta.get("resourceVersion") not in (None, "", old_meta["resourceVersion"]):
            raise conflict(
                rt, name, "the object has been modified; please apply your changes to the latest version and try again"
            )
        if subresource == "status":
            merged = copy.deepcopy(old)
            merged["status"] = new.get("status", {})
            new = merged
        else:
            for server_field in (
                "uid",
                "creationTimestamp",
                "generation",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if server_field in old_meta:
                    meta[server_field] = old_meta[server_field]
                else:
                    meta.pop(server_field, None)
            meta["name"] = name
            if rt.namespaced:
                meta["namespace"] = namespace
            if rt.has_status:
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            if rt.kind == "Service":
                # NB: like kube-apiserver's PatchAllocatedValues: an update without the IP keeps the allocated one.
                old_spec, new_spec = old.get("spec") or {}, new.setdefault("spec", {})
                for allocated in ("clusterIP", "clusterIPs"):
                    if allocated in old_spec and allocated not in new_spec:
                        new_spec[allocated] = copy.deepcopy(old_spec[allocated])
            if rt.kind == "Node" and not rt.custom:
                _node_not_ready_taint(new, creating=False)
            _default(rt, new, self)
            _validate(rt, new, old)
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if rt.tracks_generation and _spec_of(new) != _spec_of(old):
            new["metadata"]["generation"] = int(old_meta.get("generation", 1)) + 1
        if new == old:
            return _to_served(rt, old)  # NB: a no-op write keeps the resourceVersion and emits no event
        if (write or _NO_OPTIONS).dry_run:
            return _to_served(rt, new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return _to_served(rt, self._commit(rt, "DELETED", new, old))
        return _to_served(rt, self._commit(rt, "MODIFIED", new, old))

    def _patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        write: _Write | None = None,
    ) -> dict[str, Any]:
        if content_type not in _PATCH_TYPES:
            raise ApiStatusError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(_PATCH_TYPES),
            )
        if content_type == APPLY_PATCH:
            if not field_manager:
                raise bad_request("PATCH /apply requires a fieldManager query parameter")
            if isinstance(patch, (str, bytes)):
                try:
                    patch = yaml.safe_load(patch)
                except yaml.YAMLError as e:
                    raise bad_request(f"error decoding YAML: {e}") from e
            applied = self._check_body(rt, patch)
            if (applied.get("metadata") or {}).get("name") not in (None, name):
                raise bad_request(
                    f"the name of the object ({applied['metadata']['name']}) does not match the name on the URL "
                    f"({name})"
                )
            if self._stored(rt, namespace, name) is None and subresource is None:
                applied.setdefault("metadata", {})["name"] = name
                return self._create(rt, namespace, applied, write=write)
        old = self._require(rt, namespace, name)
        if subresource == "scale":
            current: dict[str, Any] = _scale_of(old)
        else:
            current = _to_served(rt, old)
        try:
            if content_type == JSON_PATCH:
                patched = json_patch(current, patch)
            elif content_type == MERGE_PATCH:
                if not isinstance(patch, dict):
                    raise bad_request("a merge patch must be a JSON object")
                patched = merge_patch(current, patch)
            else:
                if not isinstance(patch, dict):
                    raise bad_request("a strategic merge patch must be a JSON object")
                patched = strategic_merge_patch(current, patch)
        except PatchBodyError as e:
            raise bad_request(str(e)) from None
        except PatchError as e:
            # NB: kube-apiserver does not say which operation failed: one generic 422 with empty details.
            log.debug("JSON patch of %s %s/%s not applied: %s", rt.kind, namespace, name, e)
            raise ApiStatusError(422, "Invalid", PATCH_REJECTED, details={}) from e
        if not isinstance(patched, dict):
            raise bad_request("the patched object is not a JSON object")
        # NB: a patch carries the current resourceVersion unless it sets one, which then acts as a precondition.
        if subresource == "scale":
            return self._update_scale(rt, namespace, name, patched, write=write)
        return self._update(rt, namespace, name, patched, subresource=subresource, write=write)

    def _update_scale(
        self, rt: ResourceType, namespace: str, name: str, scale: Any, *, write: _Write | None = None
    ) -> dict[str, Any]:
        old = self._require(rt, namespace, name)
        self._check_body(rt, scale, kind="Scale", api_version="autoscaling/v1")
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ApiStatusError(
                422,
                "Invalid",
                f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: {replicas!r}: '
                "must be greater than or equal to 0",
            )
        updated = copy.deepcopy(old)
        updated["spec"]["replicas"] = replicas
        precondition = (scale.get("metadata") or {}).get("resourceVersion")
        updated["metadata"]["resourceVersion"] = precondition or old["metadata"]["resourceVersion"]
        result = self._update(rt, namespace, name, _to_served(rt, updated), write=write)
        return _scale_of(result)

    def _delete(
        self, rt: ResourceType, namespace: str, name: str, options: Mapping[str, Any], *, write: _Write | None = None
    ) -> dict[str, Any]:
        old = self._require(rt, namespace, name)
        preconditions = options.get("preconditions") or {}
        meta = old["metadata"]
        if preconditions.get("uid") not in (None, "", meta["uid"]):
            raise conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, UID in object meta: {meta['uid']}",
            )
        if preconditions.get("resourceVersion") not in (None, "", meta["resourceVersion"]):
            raise conflict(
                rt,
                name,
                f"Precondition failed: ResourceVersion in precondition: {preconditions['resourceVersion']}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}",
            )
        if (write or _NO_OPTIONS).dry_run:
            return _to_served(rt, old)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return _to_served(rt, old)
            deleting = copy.deepcopy(old)
            deleting["metadata"]["deletionTimestamp"] = _timestamp()
            deleting["metadata"]["deletionGracePeriodSeconds"] = 0
            return _to_served(rt, self._commit(rt, "MODIFIED", deleting, old))
        if rt.kind == "Namespace":
            # NB: stands in for the namespace controller, which would delete the contents after the API call.
            for other in self._served():
                if other.namespaced and other.storage == other.group_resource:
                    for key in [k for k in self._store(other) if k[0] == name]:
                        gone = copy.deepcopy(self._store(other)[key])
                        self._commit(other, "DELETED", gone, self._store(other)[key])
        gone = copy.deepcopy(old)
        return _to_served(rt, self._commit(rt, "DELETED", gone, old))

    def _allocate_cluster_ip(self) -> str:
        n = self._next_cluster_ip
        self._next_cluster_ip += 1
        return f"10.96.{n // 250}.{n % 250 + 1}"

    # -- HTTP: middleware and dispatch

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        self.request_count += 1
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        self.requests.append(RecordedRequest(request.method, request.path_qs, token))
        if token:
            self.tokens_seen.add(token)
        try:
            if self._tokens is not None and token not in self._tokens:
                raise ApiStatusError(401, "Unauthorized", "Unauthorized")
            return await handler(request)
        except ApiStatusError as e:
            response = _json(e.status, status=e.code)
            response.headers.update(e.headers)
            return response
        except web.HTTPException:
            raise
        except Exception as e:  # the server must answer with a Status, as kube-apiserver does
            log.exception("simulated apiserver failed on %s %s", request.method, request.path_qs)
            return _json(ApiStatusError(500, "InternalError", f"Internal error occurred: {e}").status, status=500)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if not parts:
            return _json(
                {"paths": ["/api", "/api/v1", "/apis", *(f"/apis/{g}" for g in self._groups()), "/version", "/healthz"]}
            )
        head = parts[0]
        if head in ("healthz", "livez", "readyz") and len(parts) == 1:
            return web.Response(text="ok")
        if head == "openapi" and len(parts) >= 2 and parts[1] == "v3":
            return _json(_openapi_v3(parts[2:], self._served()))
        if head == "version" and len(parts) == 1:
            return _json(KUBERNETES_VERSION)
        if head == "api":
            if len(parts) == 1:
                return _json(
                    {
                        "kind": "APIVersions",
                        "versions": ["v1"],
                        "serverAddressByClientCIDRs": [
                            {"clientCIDR": "0.0.0.0/0", "serverAddress": self.url.split("://", 1)[-1]}
                        ],
                    }
                )
            group, version, rest = "", parts[1], parts[2:]
        elif head == "apis":
            groups = self._groups()
            if len(parts) == 1:
                return _json(
                    {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group_doc(g, groups) for g in groups]}
                )
            if parts[1] not in groups:
                raise NO_RESOURCE
            if len(parts) == 2:
                return _json({"kind": "APIGroup", "apiVersion": "v1", **_group_doc(parts[1], groups)})
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise NO_RESOURCE
        if any(rt.group == group and rt.version == version for rt in REVIEWS.values()):
            return await self._serve_review(request, group, version, rest)
        served = self._served()
        if not any(rt.group == group and rt.version == version for rt in served):
            raise NO_RESOURCE
        if not rest:
            if request.method != "GET":
                raise NOT_ALLOWED
            return _json(_resource_list(group, version, served))
        if group == "" and len(rest) >= 5 and rest[0] == "namespaces" and rest[2] == "pods" and rest[4] == "proxy":
            return await self._proxy_to_pod(request, rest[1], rest[3], "/" + "/".join(rest[5:]))
        return await self._serve_resource(request, group, version, rest)

    async def _proxy_to_pod(self, request: web.Request, namespace: str, target: str, path: str) -> web.StreamResponse:
        """``pods/{[scheme:]name[:port]}/proxy/{path}``: the request passed on to the pod's IP, as kube-apiserver
        does (``kubectl get --raw``, ``gpuscale top --discover-exporters``). Unlike kube-apiserver, a loopback pod
        IP is allowed: every simulated pod listens on loopback."""
        if request.method != "GET":
            raise NOT_ALLOWED
        parts = target.split(":")
        scheme = parts.pop(0) if len(parts) == 3 else "http"
        name, port = parts[0], (parts[1] if len(parts) > 1 else "")
        rt = BY_PATH[("", "v1", "pods")]
        pod = self._stored(rt, namespace, name)
        if pod is None:
            raise not_found(rt, name)
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            raise ApiStatusError(503, "ServiceUnavailable", f"pod {name} does not have a host assigned")
        if not port:
            ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
            port = str(ports[0]["containerPort"]) if ports else "80"
        elif not port.isdigit():  # NB: a named port, as kube-apiserver resolves it
            named = {
                p.get("name"): p.get("containerPort")
                for c in (pod.get("spec") or {}).get("containers") or []
                for p in c.get("ports") or []
            }
            if port not in named:
                raise ApiStatusError(503, "ServiceUnavailable", f'no container port named "{port}" in pod {name}')
            port = str(named[port])
        host = f"[{ip}]" if ":" in ip else ip
        url = f"{scheme}://{host}:{port}{path}"
        try:
            async with (
                ClientSession(timeout=ClientTimeout(total=30)) as session,
                session.get(url, params=request.query) as resp,
            ):
                body = await resp.read()
                content_type = resp.headers.get("Content-Type", "text/plain")
                return web.Response(body=body, status=resp.status, headers={"Content-Type": content_type})
        except (ClientError, TimeoutError) as e:
            raise ApiStatusError(
                503, "ServiceUnavailable", f"error trying to reach service: {str(e) or type(e).__name__}"
            ) from None

    async def _serve_review(
        self, request: web.Request, group: str, version: str, rest: builtins.list[str]
    ) -> web.StreamResponse:
        if not rest:
            if request.method != "GET":
                raise NOT_ALLOWED
            return _json(_review_resource_list(group, version))
        rt = REVIEWS.get((group, version, rest[0]))
        if rt is None or len(rest) > 1:
            raise NO_RESOURCE
        if request.method != "POST":
            raise NOT_ALLOWED
        body = await _body(request)
        if not isinstance(body, dict) or body.get("kind", rt.kind) != rt.kind:
            raise bad_request(f"the body is not a {rt.kind}: cannot be handled as a {rt.kind}")
        raw_spec = body.get("spec")
        spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
        (self.token_reviews if rt is TOKEN_REVIEWS else self.access_reviews).append(copy.deepcopy(spec))
        if self.review_delay_seconds > 0:
            await asyncio.sleep(self.review_delay_seconds)
        if self._review_failure is not None:
            code = self._review_failure
            raise ApiStatusError(
                code,
                _REVIEW_FAILURE_REASONS.get(code, "InternalError"),
                "the server is currently unable to handle the request",
            )
        status = self._token_review(spec) if rt is TOKEN_REVIEWS else self._access_review(spec)
        answer = {
            "kind": rt.kind,
            "apiVersion": rt.api_version,
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
        return _json(answer, status=201)

    def _token_review(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        token = spec.get("token")
        if not token:
            raise bad_request("token is required for TokenReview in authentication")
        user = self.review_users.get(token)
        if user is None:
            return {"user": {}, "error": "invalid bearer token"}
        groups = list(user.groups)
        if "system:authenticated" not in groups:
            groups.append("system:authenticated")
        info: dict[str, Any] = {"username": user.username, "groups": groups}
        if user.uid:
            info["uid"] = user.uid
        if user.extra:
            info["extra"] = {k: list(v) for k, v in user.extra.items()}
        status: dict[str, Any] = {"authenticated": True, "user": info}
        if spec.get("audiences"):
            status["audiences"] = list(spec["audiences"])
        return status

    def _access_review(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        has_resource, has_path = (
            spec.get("resourceAttributes") is not None,
            spec.get("nonResourceAttributes") is not None,
        )
        causes = []
        if has_resource and has_path:
            causes.append(
                Cause(
                    "spec.nonResourceAttributes",
                    f"Invalid value: {json.dumps(spec['nonResourceAttributes'])}: "
                    "cannot be specified in combination with resourceAttributes",
                )
            )
        elif not has_resource and not has_path:
            causes.append(
                Cause(
                    "spec.resourceAttributes",
                    'Invalid value: "null": '
                    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                )
            )
        if not spec.get("user") and not spec.get("groups"):
            causes.append(Cause("spec.user", 'Invalid value: "": at least one of user or group must be specified'))
        if causes:
            raise invalid(ACCESS_REVIEWS, "", causes)
        if "system:masters" in (spec.get("groups") or ()):
            return {"allowed": True}
        for index, rule in enumerate(self.access_rules):
            if rule.allows(spec):
                return {"allowed": True, "reason": f"RBAC: allowed by sim access rule #{index}"}
        return {"allowed": False}

    async def _serve_resource(
        self, request: web.Request, group: str, version: str, rest: builtins.list[str]
    ) -> web.StreamResponse:
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) > 1 and not (len(rest) > 2 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
            if not rest:  # /api/v1/namespaces/{name}
                rest = ["namespaces", namespace]
                namespace = None
        if len(rest) > 3:
            raise NO_RESOURCE
        rt = BY_PATH.get((group, version, rest[0])) or self._custom.get((group, version, rest[0]))
        if rt is None or (namespace is not None and not rt.namespaced):
            raise NO_RESOURCE
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource is not None and subresource not in rt.subresources:
            raise NO_RESOURCE
        if rt.namespaced and name is not None and namespace is None:
            raise NO_RESOURCE
        ns = namespace if rt.namespaced else ""
        check_write_options(request.method, request.query)
        write = _Write(request.query.get("dryRun") == "All", request.query.get("fieldValidation") or "Warn")
        if write.field_validation not in ("Ignore", "Warn", "Strict"):
            raise bad_request(f"fieldValidation must be one of Ignore, Warn or Strict, not {write.field_validation!r}")
        response = await self._serve_object(request, rt, namespace, ns, name, subresource, write)
        for warning in write.warnings:
            response.headers.add("Warning", f'299 - "{warning}"')
        return response

    async def _serve_object(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        ns: str | None,
        name: str | None,
        subresource: str | None,
        write: _Write,
    ) -> web.StreamResponse:
        query = request.query
        method = request.method
        planned = self._take_fault(_verb_of(method, name, subresource, query), rt)
        if planned is not None:
            verb = _verb_of(method, name, subresource, query)
            self.faults_served.append(ServedFault(verb, rt.group_resource, planned.code, request.path_qs))
            if not (verb == "watch" and planned.code == 410):
                raise self._planned_status(planned, rt, name)
            return await self._watch(request, rt, namespace if rt.namespaced else None, expire=True)
        if name is None:
            if method == "GET":
                if _truthy(query.get("watch")):
                    return await self._watch(request, rt, namespace if rt.namespaced else None)
                return self._list_response(request, rt, namespace if rt.namespaced else None)
            if method == "POST" and (ns or not rt.namespaced):
                created = self._create(rt, ns or "", await _body(request), write=write)
                return _json(created, status=201)
            if method == "DELETE" and (ns or not rt.namespaced) and _deletes_collections(rt):
                return self._delete_collection(request, rt, ns or "", write=write)
            raise NOT_ALLOWED
        assert ns is not None
        if subresource == "binding":
            if method != "POST":
                raise NOT_ALLOWED
            return self._bind(rt, ns, name, await _body(request))
        if subresource == "eviction":
            if method != "POST":
                raise NOT_ALLOWED
            return self._evict(ns, name, await _body(request), write=write)
        if subresource == "scale":
            if method == "GET":
                return _json(_scale_of(self._require(rt, ns, name)))
            if method == "PUT":
                return _json(self._update_scale(rt, ns, name, await _body(request), write=write))
        if method == "GET" and subresource in (None, "status"):
            stored = self._require(rt, ns, name)
            if _wants_table(request):
                return _json(_table(rt, [stored], rv=str(self._rv), include=query.get("includeObject", "Metadata")))
            return _json(_to_served(rt, stored))
        if method == "PUT" and subresource in (None, "status"):
            return _json(self._update(rt, ns, name, await _body(request), subresource=subresource, write=write))
        if method == "PATCH":
            content_type = request.content_type
            raw = await request.read()
            patch: Any = raw
            if content_type != APPLY_PATCH:
                try:
                    patch = json.loads(raw or b"null")
                except ValueError as e:
                    raise bad_request(f"error decoding patch: {e}") from e
            result = self._patch(
                rt,
                ns,
                name,
                content_type,
                patch,
                subresource=subresource,
                field_manager=query.get("fieldManager"),
                write=write,
            )
            return _json(result)
        if method == "DELETE" and subresource is None:
            options: dict[str, Any] = {}
            raw = await request.read()
            if raw.strip():
                try:
                    options = json.loads(raw)
                except ValueError as e:
                    raise bad_request(f"error decoding DeleteOptions: {e}") from e
            deleted = self._delete(rt, ns, name, options if isinstance(options, dict) else {}, write=write)
            return _json(delete_answer(rt, deleted))
        raise NOT_ALLOWED

    def _bind(self, rt: ResourceType, namespace: str, name: str, body: Any) -> web.Response:
        """POST pods/{name}/binding, as the scheduler binds: nodeName set once, PodScheduled=True."""
        if isinstance(body, dict) and (body.get("metadata") or {}).get("name") not in (None, "", name):
            raise bad_request("name in URL does not match name in Binding object")
        target = (body or {}).get("target") or {}
        node = target.get("name")
        if not node:
            raise invalid(rt, name, [Cause("target.name", "Required value", "FieldValueRequired")])
        pod = self._require(rt, namespace, name)
        if (pod.get("spec") or {}).get("nodeName"):
            raise ApiStatusError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already assigned to node '
                f'"{pod["spec"]["nodeName"]}"',
                details={"name": name, "kind": "pods/binding"},
            )
        bound = copy.deepcopy(pod)
        bound["spec"]["nodeName"] = node
        status = bound.setdefault("status", {})
        scheduled = {
            "type": "PodScheduled",
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": _timestamp(),
        }
        status["conditions"] = [
            *(c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"),
            scheduled,
        ]
        self._commit(rt, "MODIFIED", bound, pod)
        return _json(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, status=201
        )

    # -- pods/eviction: the Eviction API, PodDisruptionBudgets computed as the disruption controller would

    def _evict(self, namespace: str, name: str, body: Any, *, write: _Write) -> web.Response:
        """POST pods/{name}/eviction, as kube-apiserver's eviction REST does it.

        A Pending, finished (Succeeded/Failed) or terminating pod is deleted without consulting budgets.
        Otherwise the PDBs selecting the pod decide: more than one → 500 (unsupported, as upstream); one that
        forbids it (``eviction_verdict``, from the budget's status) → 429 TooManyRequests with kube-apiserver's
        ``DisruptionBudget`` cause; else the pod is deleted (``dryRun=All`` honoured) and the answer is a 201
        Success Status.
        """
        pods = BY_KIND[("v1", "Pod")]
        if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction":
            raise bad_request("the body of the request must be an Eviction")
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, "", name):
            raise bad_request(f"name in URL does not match name in Eviction object: {meta.get('name')} vs {name}")
        pod = self._require(pods, namespace, name)
        if not can_ignore_budgets(pod):
            budgets = [
                b
                for (ns, _), b in self._store(BY_KIND[("policy/v1", "PodDisruptionBudget")]).items()
                if ns == namespace and pdb_selects(b, pod)
            ]
            if len(budgets) > 1:
                raise ApiStatusError(
                    500,
                    "",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                )
            if budgets:
                verdict = eviction_verdict(budgets[0], pod)
                if not verdict.allowed:
                    details: dict[str, Any] = {"causes": [{"reason": "DisruptionBudget", "message": verdict.cause}]}
                    headers = {}
                    if verdict.retry_after_seconds:
                        details["retryAfterSeconds"] = verdict.retry_after_seconds
                        headers["Retry-After"] = str(verdict.retry_after_seconds)
                    raise ApiStatusError(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        details=details,
                        headers=headers,
                    )
        self._delete(pods, namespace, name, body.get("deleteOptions") or {}, write=write)
        return _json(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, status=201
        )

    def _selectors(self, rt: ResourceType, query: Mapping[str, str]) -> tuple[LabelSelector, FieldSelector]:
        try:
            return LabelSelector.parse(query.get("labelSelector", "")), self._field_selector(
                rt, query.get("fieldSelector", "")
            )
        except SelectorError as e:
            raise bad_request(str(e)) from e

    def _list_response(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        query = request.query
        labels, fields = self._selectors(rt, query)
        items = self._select(rt, namespace, labels, fields)
        list_rv = self._rv
        meta: dict[str, Any] = {}
        token = query.get("continue")
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                start = (str(state["start"][0]), str(state["start"][1]))
                list_rv = int(state["rv"])
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise bad_request(f"invalid continue token: continue key is not valid: {e}") from e
            # NB: every page of a list is the same snapshot, the first page's resourceVersion (etcd serves the
            # later pages at that revision); once the history no longer reaches back to it, 410 Expired.
            snapshot = self._snapshot(rt, list_rv)
            if snapshot is None:
                raise continue_expired(self._rv, start)
            selection = _Filter(rt, namespace, labels, fields)
            items = [o for _, o in sorted(snapshot.items()) if selection.passes(o)]
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > start]
        limit = query.get("limit")
        if limit:
            try:
                n = int(limit)
            except ValueError as e:
                raise bad_request(f"invalid limit {limit!r}") from e
            if 0 < n < len(items):
                last = items[n - 1]["metadata"]
                state = {"rv": list_rv, "start": [last.get("namespace", ""), last["name"]]}
                meta["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
                meta["remainingItemCount"] = len(items) - n
                items = items[:n]
        meta["resourceVersion"] = str(list_rv)
        if _wants_table(request):
            table = _table(rt, items, rv=str(list_rv), include=query.get("includeObject", "Metadata"))
            table["metadata"].update(meta)
            return _json(table)
        served = []
        for stored in items:
            obj = _to_served(rt, stored)
            if not rt.custom:  # NB: custom resources are listed unstructured, each item with its TypeMeta
                obj.pop("kind", None)  # NB: kube-apiserver leaves TypeMeta off the items of a typed list
                obj.pop("apiVersion", None)
            served.append(obj)
        return _json({"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": served})

    def _snapshot(self, rt: ResourceType, rv: int) -> dict[tuple[str, str], dict[str, Any]] | None:
        """The stored objects of ``rt`` as they were at resourceVersion ``rv`` (the current ones with the newer
        changes undone), or None when the history no longer reaches back that far."""
        if rv < max(self._floor, self._storage_floor.get(rt.storage, 0)):
            return None
        state = dict(self._store(rt))
        for change in reversed(self._history):
            if change.rv <= rv:
                break
            if change.storage != rt.storage:
                continue
            key = (change.obj["metadata"].get("namespace", ""), change.obj["metadata"]["name"])
            if change.prev is None:
                state.pop(key, None)
            else:
                state[key] = change.prev
        return state

    def _delete_collection(
        self, request: web.Request, rt: ResourceType, namespace: str, *, write: _Write
    ) -> web.Response:
        labels, fields = self._selectors(rt, request.query)
        deleted = []
        for stored in self._select(rt, namespace if rt.namespaced else None, labels, fields):
            meta = stored["metadata"]
            deleted.append(self._delete(rt, meta.get("namespace", ""), meta["name"], {}, write=write))
        for obj in deleted:
            obj.pop("kind", None)
            obj.pop("apiVersion", None)
        return _json(
            {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.api_version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": deleted,
            }
        )

    # -- HTTP: watch

    async def _watch(
        self, request: web.Request, rt: ResourceType, namespace: str | None, *, expire: bool = False
    ) -> web.StreamResponse:
        query = request.query
        labels, fields = self._selectors(rt, query)
        try:
            timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else _DEFAULT_WATCH_TIMEOUT_SECONDS
        except ValueError as e:
            raise bad_request(f"invalid timeoutSeconds {query.get('timeoutSeconds')!r}") from e
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        table = _wants_table(request)
        include = query.get("includeObject", "Metadata")
        rv_text = query.get("resourceVersion", "")
        since = 0
        if rv_text not in ("", "0"):
            try:
                since = int(rv_text)
            except ValueError as e:
                raise bad_request(f"invalid resource version {rv_text!r}") from e
        watcher = _Watcher(_Filter(rt, namespace, labels, fields), transport=request.transport)
        initial: builtins.list[tuple[str, dict[str, Any]]] = []
        expired = expire
        # NB: everything from here to registering the watcher runs without an await, so no change can fall
        # between the replayed history (or the synthetic ADDED snapshot) and the live queue.
        if expired:
            pass
        elif rv_text in ("", "0"):
            initial = [("ADDED", o) for o in self._select(rt, namespace, labels, fields)]
        elif since < max(self._floor, self._storage_floor.get(rt.storage, 0)):
            expired = True
        else:
            for change in self._history:
                if change.rv > since and change.storage == rt.storage:
                    event = watcher.filter.event_for(change)
                    if event is not None:
                        initial.append(event)
        if not expired:
            self._watchers.setdefault(rt.storage, set()).add(watcher)
        # NB: the watch cache sends a bookmark only with a resourceVersion of the resource newer than every one the
        # watch had when it began (events it replayed included, whether or not they passed its selectors).
        started_rv = max(since, self._storage_rv.get(rt.storage, 0))
        response = web.StreamResponse(status=200, headers={"Content-Type": JSON, "Cache-Control": "no-cache, private"})
        first_table = True

        async def send(kind: str, obj: dict[str, Any]) -> None:
            nonlocal first_table
            if kind in ("ERROR", "BOOKMARK"):
                payload = obj
            elif table:
                payload = _table(rt, [obj], rv=obj["metadata"]["resourceVersion"], include=include, columns=first_table)
                first_table = False
            else:
                payload = _to_served(rt, obj)
            await response.write(json.dumps({"type": kind, "object": payload}, separators=(",", ":")).encode() + b"\n")

        async def bookmark() -> None:
            newest = self._storage_rv.get(rt.storage, 0)
            if newest > started_rv:
                obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {"resourceVersion": str(newest)}}
                await send("BOOKMARK", obj)

        try:
            await response.prepare(request)
            if expired:
                # NB: a planned 410 (``fail_next``) names the current resourceVersion as the oldest one kept.
                oldest = self._rv if expire else max(self._floor, self._storage_floor.get(rt.storage, 0))
                gone = ApiStatusError(410, "Expired", f"too old resource version: {rv_text} ({oldest})").status
                await send("ERROR", gone)
                return response
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            # NB: kube-apiserver sends bookmarks every minute and once about 2 s before the watch times out, so
            # the client resumes from as close to now as it can; none when that moment has passed at the start.
            pre_timeout = deadline - 2.0 if timeout >= 2.0 else None
            next_bookmark = loop.time() + self._bookmark_interval
            if pre_timeout is not None:
                next_bookmark = min(next_bookmark, pre_timeout)
            for kind, obj in initial:
                await send(kind, obj)
            while not self._stopping:
                now = loop.time()
                if now >= deadline:
                    break
                if request.transport is None or request.transport.is_closing():
                    return response  # the client went away
                # NB: wake at least once a second to notice a client that hung up without a write failing.
                wait = min(deadline - now, 1.0)
                if bookmarks:
                    wait = min(wait, max(next_bookmark - now, 0.0))
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                except TimeoutError:
                    # An empty queue means every change up to now that this watch selects has been sent.
                    if bookmarks and loop.time() >= next_bookmark and watcher.queue.empty():
                        await bookmark()
                        next_bookmark = loop.time() + self._bookmark_interval
                        if pre_timeout is not None and loop.time() < pre_timeout:
                            next_bookmark = min(next_bookmark, pre_timeout)
                    continue
                if item is None:
                    break
                kind, obj = item
                await send(kind, obj)
        except ConnectionResetError:
            pass
        finally:
            self._watchers.get(rt.storage, set()).discard(watcher)
        return response


def _verb_of(method: str, name: str | None, subresource: str | None, query: Mapping[str, str]) -> str:
    """The Kubernetes verb of a resource request (what RBAC and the fault plan match on)."""
    if method == "GET":
        if name is not None:
            return "get"
        return "watch" if _truthy(query.get("watch")) else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if name is not None else "deletecollection"
    return method.lower()


def _spec_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


def _json(body: Any, *, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")), status=status, content_type=JSON)


_BODY_TYPES = (JSON, "application/yaml")


async def _body(request: web.Request) -> Any:
    if request.content_type not in _BODY_TYPES:
        # NB: kube-apiserver also speaks protobuf; this server does not, and says so the standard way, which
        # makes client-go (kubectl create, typed clients) retry with JSON.
        raise ApiStatusError(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: "
            + ", ".join(_BODY_TYPES),
        )
    raw = await request.read()
    if not raw.strip():
        raise bad_request("the request body is empty")
    try:
        if "yaml" in request.content_type:
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise bad_request(f"couldn't decode the request body: {e}") from e


def _group_doc(group: str, groups: Mapping[str, builtins.list[str]] = GROUPS) -> dict[str, Any]:
    versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in groups[group]]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def _resource_list(group: str, version: str, served: Iterable[ResourceType] = RESOURCES) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for rt in served:
        if rt.group != group or rt.version != version:
            continue
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": [v for v in _WRITE_VERBS if v != "deletecollection" or _deletes_collections(rt)],
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in rt.subresources:
            sub_entry: dict[str, Any] = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced}
            if sub == "scale":
                sub_entry.update(
                    {"group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": list(_SUBRESOURCE_VERBS)}
                )
            elif sub == "binding":
                sub_entry.update({"kind": "Binding", "verbs": ["create"]})
            elif sub == "eviction":
                sub_entry.update({"group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]})
            else:
                sub_entry.update({"kind": rt.kind, "verbs": list(_SUBRESOURCE_VERBS)})
            resources.append(sub_entry)
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": resources,
    }


def _review_resource_list(group: str, version: str) -> dict[str, Any]:
    resources = [
        {"name": rt.plural, "singularName": rt.singular, "namespaced": False, "kind": rt.kind, "verbs": ["create"]}
        for rt in REVIEWS.values()
        if rt.group == group and rt.version == version
    ]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}", "resources": resources}


def _openapi_v3(gv_parts: list[str], served: Iterable[ResourceType] = RESOURCES) -> dict[str, Any]:
    """OpenAPI v3 stubs: the root index and, per group-version, each kind's PATCH with ``fieldValidation``.

    NB: kubectl ≥1.27 validates manifests client-side from OpenAPI schemas unless the server declares that it
    validates fields itself; these stubs declare it (and ``_check_fields`` honours it). No schemas are served.
    """
    if not gv_parts:
        paths: dict[str, Any] = {}
        for rt in served:
            key = f"apis/{rt.group}/{rt.version}" if rt.group else f"api/{rt.version}"
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash=0"}
        return {"paths": paths}
    prefix = "/" + "/".join(gv_parts)
    paths = {}
    for rt in served:
        base = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
        if base != prefix:
            continue
        path = (
            f"{base}/namespaces/{{namespace}}/{rt.plural}/{{name}}" if rt.namespaced else f"{base}/{rt.plural}/{{name}}"
        )
        paths[path] = {
            "patch": {
                "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }
