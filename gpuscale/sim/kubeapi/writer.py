"""Writes as kube-apiserver makes them: create, update (main resource or ``status``), the four PATCH bodies,
the ``scale`` subresource, delete with finalizers and preconditions, and ``pods/binding`` — each validated,
defaulted and, unless ``dryRun=All``, committed at a fresh resourceVersion."""

from __future__ import annotations

import copy
import logging
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from aiohttp import web

from gpuscale.sim.api_errors import (
    ApiStatusError,
    Cause,
    bad_request,
    conflict,
    invalid,
    not_found,
    status_details,
)
from gpuscale.sim.kubeapi.defaults import apply_defaults, node_not_ready_taint, status_on_create
from gpuscale.sim.kubeapi.payloads import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    NO_OPTIONS,
    PATCH_TYPES,
    WriteOptions,
    json_response,
    scale_of,
    spec_of,
    timestamp,
    to_served,
    to_stored,
)
from gpuscale.sim.kubeapi.storage import Commit, ObjectStore
from gpuscale.sim.kubeapi.validation import check_body, check_fields, validate
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
    BY_KIND,
    ResourceType,
)

log = logging.getLogger(__name__)


_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"


class ObjectWriter:
    """The write path over one ``ObjectStore``; ``commit`` stores a change and tells whoever listens (watches,
    the CRD and disruption-budget bookkeeping); ``served`` lists the resources served now."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        commit: Commit,
        served: Callable[[], list[ResourceType]],
    ) -> None:
        self._store = store
        self._commit = commit
        self._served = served
        self._next_cluster_ip = 1

    def create(
        self,
        rt: ResourceType,
        namespace: str,
        body: dict[str, Any],
        *,
        write: WriteOptions | None = None,
        identity: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        check_fields(rt, check_body(rt, body), write or WriteOptions())
        obj = strip_nulls(to_stored(rt, body))
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
            ns_type = BY_KIND[("v1", "Namespace")]
            if self._store.stored(ns_type, "", namespace) is None:
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
        if self._store.stored(rt, meta.get("namespace", ""), name) is not None:
            raise ApiStatusError(
                409, "AlreadyExists", f'{rt.group_resource} "{name}" already exists', details=status_details(rt, name)
            )
        for server_field in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(server_field, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = timestamp()
        meta.update(identity or {})
        if rt.tracks_generation:
            meta["generation"] = 1
        apply_defaults(rt, obj, self.allocate_cluster_ip)
        status_on_create(rt, obj)
        validate(rt, obj, None)
        if (write or NO_OPTIONS).dry_run:
            return to_served(rt, obj)  # NB: nothing stored, so no resourceVersion
        return to_served(rt, self._commit(rt, "ADDED", obj, None))

    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: dict[str, Any],
        *,
        subresource: str | None = None,
        write: WriteOptions | None = None,
    ) -> dict[str, Any]:
        old = self._store.require(rt, namespace, name)
        check_fields(rt, check_body(rt, body), write or WriteOptions())
        new = strip_nulls(to_stored(rt, body))
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
                node_not_ready_taint(new, creating=False)
            apply_defaults(rt, new, self.allocate_cluster_ip)
            validate(rt, new, old)
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if rt.tracks_generation and spec_of(new) != spec_of(old):
            new["metadata"]["generation"] = int(old_meta.get("generation", 1)) + 1
        if new == old:
            return to_served(rt, old)  # NB: a no-op write keeps the resourceVersion and emits no event
        if (write or NO_OPTIONS).dry_run:
            return to_served(rt, new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return to_served(rt, self._commit(rt, "DELETED", new, old))
        return to_served(rt, self._commit(rt, "MODIFIED", new, old))

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        content_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        write: WriteOptions | None = None,
    ) -> dict[str, Any]:
        if content_type not in PATCH_TYPES:
            raise ApiStatusError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                + ", ".join(PATCH_TYPES),
            )
        if content_type == APPLY_PATCH:
            if not field_manager:
                raise bad_request("PATCH /apply requires a fieldManager query parameter")
            if isinstance(patch, (str, bytes)):
                try:
                    patch = yaml.safe_load(patch)
                except yaml.YAMLError as e:
                    raise bad_request(f"error decoding YAML: {e}") from e
            applied = check_body(rt, patch)
            if (applied.get("metadata") or {}).get("name") not in (None, name):
                raise bad_request(
                    f"the name of the object ({applied['metadata']['name']}) does not match the name on the URL "
                    f"({name})"
                )
            if self._store.stored(rt, namespace, name) is None and subresource is None:
                applied.setdefault("metadata", {})["name"] = name
                return self.create(rt, namespace, applied, write=write)
        old = self._store.require(rt, namespace, name)
        if subresource == "scale":
            current: dict[str, Any] = scale_of(old)
        else:
            current = to_served(rt, old)
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
            return self.update_scale(rt, namespace, name, patched, write=write)
        return self.update(rt, namespace, name, patched, subresource=subresource, write=write)

    def update_scale(
        self, rt: ResourceType, namespace: str, name: str, scale: Any, *, write: WriteOptions | None = None
    ) -> dict[str, Any]:
        old = self._store.require(rt, namespace, name)
        check_body(rt, scale, kind="Scale", api_version="autoscaling/v1")
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
        result = self.update(rt, namespace, name, to_served(rt, updated), write=write)
        return scale_of(result)

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        options: Mapping[str, Any],
        *,
        write: WriteOptions | None = None,
    ) -> dict[str, Any]:
        old = self._store.require(rt, namespace, name)
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
        if (write or NO_OPTIONS).dry_run:
            return to_served(rt, old)
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return to_served(rt, old)
            deleting = copy.deepcopy(old)
            deleting["metadata"]["deletionTimestamp"] = timestamp()
            deleting["metadata"]["deletionGracePeriodSeconds"] = 0
            return to_served(rt, self._commit(rt, "MODIFIED", deleting, old))
        if rt.kind == "Namespace":
            # NB: stands in for the namespace controller, which would delete the contents after the API call.
            for other in self._served():
                if other.namespaced and other.storage == other.group_resource:
                    for key in [k for k in self._store.of(other) if k[0] == name]:
                        gone = copy.deepcopy(self._store.of(other)[key])
                        self._commit(other, "DELETED", gone, self._store.of(other)[key])
        gone = copy.deepcopy(old)
        return to_served(rt, self._commit(rt, "DELETED", gone, old))

    def bind(self, rt: ResourceType, namespace: str, name: str, body: Any) -> web.Response:
        """POST pods/{name}/binding, as the scheduler binds: nodeName set once, PodScheduled=True."""
        if isinstance(body, dict) and (body.get("metadata") or {}).get("name") not in (None, "", name):
            raise bad_request("name in URL does not match name in Binding object")
        target = (body or {}).get("target") or {}
        node = target.get("name")
        if not node:
            raise invalid(rt, name, [Cause("target.name", "Required value", "FieldValueRequired")])
        pod = self._store.require(rt, namespace, name)
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
            "lastTransitionTime": timestamp(),
        }
        status["conditions"] = [
            *(c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"),
            scheduled,
        ]
        self._commit(rt, "MODIFIED", bound, pod)
        return json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, status=201
        )

    def allocate_cluster_ip(self) -> str:
        n = self._next_cluster_ip
        self._next_cluster_ip += 1
        return f"10.96.{n // 250}.{n % 250 + 1}"
