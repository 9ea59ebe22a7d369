"""metav1.Status errors as kube-apiserver words them (NotFound, AlreadyExists, Conflict, Invalid, BadRequest,
MethodNotAllowed, Expired), and the answers and option checks that go with writes."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuscale.sim.resources import ResourceType


class ApiStatusError(Exception):
    """A request failed the way kube-apiserver would fail it; ``status`` is the metav1.Status body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.details = dict(details or {})
        self._send_details = details is not None  # NB: `details: {}` is sent as given (a failed JSON patch)
        self.list_meta: dict[str, Any] = {}  # the Status's ListMeta (an expired continue's fresh token)
        self.headers = dict(headers or {})
        """HTTP headers sent with the Status (``Retry-After`` on 429 and 5xx that ask clients to come back)."""

    @property
    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.list_meta),
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:
            del body["reason"]  # NB: kube-apiserver leaves it out where it has none (an eviction under two PDBs)
        if self.details or self._send_details:
            body["details"] = self.details
        return body


def status_details(rt: ResourceType, name: str | None) -> dict[str, Any]:
    details: dict[str, Any] = {"kind": rt.plural}
    if name:
        details["name"] = name
    if rt.group:
        details["group"] = rt.group
    return details


# The kinds whose DELETE answers the deleted object (their registries set ReturnDeletedObject); every other kind
# answers a Success Status naming what was deleted — unless the object is only marked for deletion (finalizers).
RETURNS_DELETED_OBJECT = frozenset({("v1", "Pod"), ("v1", "Namespace"), ("v1", "Service"), ("v1", "PodTemplate")})


def delete_answer(rt: ResourceType, deleted: dict[str, Any]) -> dict[str, Any]:
    meta = deleted.get("metadata") or {}
    if (rt.api_version, rt.kind) in RETURNS_DELETED_OBJECT or meta.get("deletionTimestamp"):
        return deleted
    details = {**status_details(rt, meta.get("name")), "uid": meta.get("uid")}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


OPTIONS_KIND = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions", "DELETE": "DeleteOptions"}


def check_write_options(method: str, query: Mapping[str, str]) -> None:
    """The write options kube-apiserver validates before anything else: ``dryRun`` (only "All") and the
    ``fieldManager`` (at most 128 bytes) — a 422 about the CreateOptions/UpdateOptions/PatchOptions."""
    kind = OPTIONS_KIND.get(method)
    if kind is None:
        return
    causes: list[dict[str, str]] = []
    dry_run = query.getall("dryRun", []) if hasattr(query, "getall") else [query.get("dryRun", "")]
    bad = [v for v in dry_run if v != "All"]
    if bad:
        values = ", ".join(json.dumps(v) for v in dry_run)
        message = f'Unsupported value: [{values}]: supported values: "All"'
        causes.append({"reason": "FieldValueNotSupported", "message": message, "field": "dryRun"})
    if kind != "DeleteOptions" and len(query.get("fieldManager", "").encode()) > 128:
        message = "Too long: may not be more than 128 bytes"
        causes.append({"reason": "FieldValueTooLong", "message": message, "field": "fieldManager"})
    if causes:
        errors = [f"{c['field']}: {c['message']}" for c in causes]
        text = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
        raise ApiStatusError(
            422,
            "Invalid",
            f'{kind}.meta.k8s.io "" is invalid: {text}',
            details={"group": "meta.k8s.io", "kind": kind, "causes": causes},
        )


def continue_expired(rv: int, start: tuple[str, str]) -> ApiStatusError:
    """410 for a continue token older than the server keeps, with the inconsistent token kube-apiserver offers."""
    error = ApiStatusError(
        410,
        "Expired",
        "The provided continue parameter is too old to display a consistent list result. You can start a new list "
        "without the continue parameter, or use the continue token in this response to retrieve the remainder of "
        "the results. Continuing with the provided token results in an inconsistent list - objects that were "
        "created, modified, or deleted between the time the first chunk was returned and now may show up in the "
        "list.",
    )
    error.list_meta = {
        "continue": base64.urlsafe_b64encode(json.dumps({"rv": rv, "start": list(start)}).encode()).decode()
    }
    return error


def not_found(rt: ResourceType, name: str) -> ApiStatusError:
    return ApiStatusError(404, "NotFound", f'{rt.group_resource} "{name}" not found', details=status_details(rt, name))


def conflict(rt: ResourceType, name: str, why: str) -> ApiStatusError:
    return ApiStatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rt.group_resource} "{name}": {why}',
        details=status_details(rt, name),
    )


def bad_request(message: str) -> ApiStatusError:
    return ApiStatusError(400, "BadRequest", message)


@dataclass(frozen=True, slots=True)
class Cause:
    field: str
    message: str
    reason: str = "FieldValueInvalid"


def invalid(rt: ResourceType, name: str, causes: list[Cause]) -> ApiStatusError:
    text = ", ".join(f"{c.field}: {c.message}" for c in causes)
    details = {
        "name": name,
        "kind": rt.kind,
        **({"group": rt.group} if rt.group else {}),
        "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
    }
    return ApiStatusError(422, "Invalid", f'{rt.qualified_kind} "{name}" is invalid: {text}', details=details)


NOT_ALLOWED = ApiStatusError(
    405, "MethodNotAllowed", "the server does not allow this method on the requested resource", details={}
)
NO_RESOURCE = ApiStatusError(404, "NotFound", "the server could not find the requested resource")
