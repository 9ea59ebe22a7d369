"""Discovery documents: ``/version``, API groups and resource lists (legacy, not aggregated, discovery), and
the OpenAPI v3 stubs that tell kubectl the server validates fields itself."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuscale.sim.resources import (
    GROUPS,
    RESOURCES,
    REVIEWS,
    ResourceType,
)

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


_WRITE_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def deletes_collections(rt: ResourceType) -> bool:
    """Namespaces are deleted one by one (kube-apiserver serves no deletecollection for them)."""
    return rt.custom or (rt.api_version, rt.kind) != ("v1", "Namespace")


_SUBRESOURCE_VERBS = ("get", "patch", "update")


def root_paths(groups: Iterable[str]) -> dict[str, Any]:
    """The document at ``/``: the paths served."""
    return {"paths": ["/api", "/api/v1", "/apis", *(f"/apis/{g}" for g in groups), "/version", "/healthz"]}


def api_versions(url: str) -> dict[str, Any]:
    """The document at ``/api``: the core group's versions and the address clients reach the server at."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": url.split("://", 1)[-1]}],
    }


def group_doc(group: str, groups: Mapping[str, list[str]] = GROUPS) -> dict[str, Any]:
    versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in groups[group]]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def resource_list(group: str, version: str, served: Iterable[ResourceType] = RESOURCES) -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for rt in served:
        if rt.group != group or rt.version != version:
            continue
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": [v for v in _WRITE_VERBS if v != "deletecollection" or deletes_collections(rt)],
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


def review_resource_list(group: str, version: str) -> dict[str, Any]:
    resources = [
        {"name": rt.plural, "singularName": rt.singular, "namespaced": False, "kind": rt.kind, "verbs": ["create"]}
        for rt in REVIEWS.values()
        if rt.group == group and rt.version == version
    ]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}", "resources": resources}


def openapi_v3(gv_parts: list[str], served: Iterable[ResourceType] = RESOURCES) -> dict[str, Any]:
    """OpenAPI v3 stubs: the root index and, per group-version, each kind's PATCH with ``fieldValidation``.

    NB: kubectl ≥1.27 validates manifests client-side from OpenAPI schemas unless the server declares that it
    validates fields itself; these stubs declare it (and ``check_fields`` honours it). No schemas are served.
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
