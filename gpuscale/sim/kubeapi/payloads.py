"""What goes over the wire: content types, the served form of stored objects (core/v1 ↔ events.k8s.io/v1
Events, autoscaling/v1 Scale, meta.k8s.io/v1 Table), request bodies, and per-request write options."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import yaml
from aiohttp import web

from gpuscale.sim.api_errors import (
    ApiStatusError,
    bad_request,
)
from gpuscale.sim.resources import (
    ResourceType,
)
from gpuscale.sim.tables import DEFAULT_TABLE, TABLES, selector_text

JSON = "application/json"


MERGE_PATCH = "application/merge-patch+json"


STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


JSON_PATCH = "application/json-patch+json"


APPLY_PATCH = "application/apply-patch+yaml"


PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH)


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def timestamp(when: datetime | None = None) -> str:
    return (when or _now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true")


# --- conversions between stored and served forms ----------------------------------------------------

# core/v1 Event field ↔ events.k8s.io/v1 Event field
EVENT_FIELDS = {
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


_EVENT_FIELDS_BACK = {v: k for k, v in EVENT_FIELDS.items()}


def to_served(rt: ResourceType, stored: Mapping[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(dict(stored))
    if rt.group == "events.k8s.io":
        out: dict[str, Any] = {"kind": "Event", "apiVersion": rt.api_version, "metadata": obj.get("metadata", {})}
        for core, v1 in EVENT_FIELDS.items():
            if core in obj:
                out[v1] = obj[core]
        return out
    obj["kind"] = rt.kind
    obj["apiVersion"] = rt.api_version
    return obj


def to_stored(rt: ResourceType, served: Mapping[str, Any]) -> dict[str, Any]:
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


# --- scale ------------------------------------------------------------------------------------------


def scale_of(obj: Mapping[str, Any]) -> dict[str, Any]:
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


def spec_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


# --- tables (meta.k8s.io/v1 Table, what `kubectl get` prints): rows in gpuscale.sim.tables ------------


def wants_table(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    first = accept.split(",")[0]
    return "as=Table" in first and "g=meta.k8s.io" in first


def table_of(
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
        served = to_served(rt, stored)
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


# --- requests and answers ---------------------------------------------------------------------------


@dataclass(slots=True)
class WriteOptions:
    """Per-request write options: ``dryRun=All``, the ``fieldValidation`` directive, warnings to send back."""

    dry_run: bool = False
    field_validation: str = "Warn"
    warnings: list[str] = field(default_factory=list)


NO_OPTIONS = WriteOptions()


def write_options(query: Mapping[str, str]) -> WriteOptions:
    """A request's write options from its query (400 for a ``fieldValidation`` that is none of the three)."""
    write = WriteOptions(query.get("dryRun") == "All", query.get("fieldValidation") or "Warn")
    if write.field_validation not in ("Ignore", "Warn", "Strict"):
        raise bad_request(f"fieldValidation must be one of Ignore, Warn or Strict, not {write.field_validation!r}")
    return write


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the server answered: method, path with query, and the bearer token (None if absent)."""

    method: str
    path_qs: str
    token: str | None


def verb_of(method: str, name: str | None, subresource: str | None, query: Mapping[str, str]) -> str:
    """The Kubernetes verb of a resource request (what RBAC and the fault plan match on)."""
    if method == "GET":
        if name is not None:
            return "get"
        return "watch" if truthy(query.get("watch")) else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if name is not None else "deletecollection"
    return method.lower()


def json_response(body: Any, *, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(body, separators=(",", ":")), status=status, content_type=JSON)


_BODY_TYPES = (JSON, "application/yaml")


async def read_body(request: web.Request) -> Any:
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


async def read_patch(request: web.Request) -> Any:
    """A PATCH body: decoded JSON, or the raw text of a server-side apply (YAML or JSON)."""
    raw = await request.read()
    patch: Any = raw
    if request.content_type != APPLY_PATCH:
        try:
            patch = json.loads(raw or b"null")
        except ValueError as e:
            raise bad_request(f"error decoding patch: {e}") from e
    return patch


async def read_delete_options(request: web.Request) -> dict[str, Any]:
    """The DeleteOptions of a DELETE body ({} without a body, or when it is not an object)."""
    options: dict[str, Any] = {}
    raw = await request.read()
    if raw.strip():
        try:
            options = json.loads(raw)
        except ValueError as e:
            raise bad_request(f"error decoding DeleteOptions: {e}") from e
    return options if isinstance(options, dict) else {}
