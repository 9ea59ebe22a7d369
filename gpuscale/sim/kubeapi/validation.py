"""What kube-apiserver refuses before it stores an object: names, labels, workload selectors, pod spec
immutability, Jobs and CustomResourceDefinitions (422 Invalid with causes), the body's kind and apiVersion
(400), and unknown fields as the request's ``fieldValidation`` directive says."""

from __future__ import annotations

import json
import logging
import string
from collections.abc import Mapping
from typing import Any

from gpuscale.errors import SelectorError
from gpuscale.selectors import LabelSelector, label_key_problem, label_value_problem
from gpuscale.sim.api_errors import (
    Cause,
    bad_request,
    invalid,
)
from gpuscale.sim.kubeapi.payloads import (
    EVENT_FIELDS,
    WriteOptions,
)
from gpuscale.sim.resources import (
    RESOURCES,
    ResourceType,
)

log = logging.getLogger(__name__)


_DNS1123_LABEL_MAX = 63


_DNS1123_SUBDOMAIN_MAX = 253


_DNS1123_LABEL_RE = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"


_DNS1123_SUBDOMAIN_RE = rf"{_DNS1123_LABEL_RE}(\.{_DNS1123_LABEL_RE})*"


_NAME_CHARS = frozenset(string.ascii_lowercase + string.digits + "-.")


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


WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "DaemonSet"})


_POD_MUTABLE_SPEC = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def validate(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
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
    if rt.kind in WORKLOAD_KINDS:
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


_CORE_EVENT_FIELDS = frozenset(EVENT_FIELDS)


_V1_EVENT_FIELDS = frozenset(EVENT_FIELDS.values())


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


def check_fields(rt: ResourceType, body: Mapping[str, Any], write: WriteOptions) -> None:
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


def check_body(
    rt: ResourceType, body: Any, *, kind: str | None = None, api_version: str | None = None
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
