"""Custom resources: what an established CustomResourceDefinition serves, and serving it (or, once the CRD is
deleted, no longer serving it and deleting its objects, as the CRD finalizer does)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpuscale.sim.kubeapi.storage import Commit, ObjectStore
from gpuscale.sim.resources import (
    GROUPS,
    RESOURCES,
    ResourceType,
    resource_for,
)


def custom_resource_types(crd: Mapping[str, Any]) -> list[ResourceType]:
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


class CustomResources:
    """The resources established CustomResourceDefinitions serve, beside the built-in ones."""

    def __init__(self) -> None:
        self.by_path: dict[tuple[str, str, str], ResourceType] = {}
        """(group, version, plural) → the resource an established CustomResourceDefinition serves."""

    def resource_for(self, api_version: str, kind: str) -> ResourceType:
        for rt in self.by_path.values():
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        return resource_for(api_version, kind)

    def served(self) -> list[ResourceType]:
        """Every resource served now: the built-in ones, then those of established CustomResourceDefinitions."""
        return [*RESOURCES, *self.by_path.values()]

    def groups(self) -> dict[str, list[str]]:
        groups = {g: list(v) for g, v in GROUPS.items()}
        for rt in self.by_path.values():
            if rt.version not in groups.setdefault(rt.group, []):
                groups[rt.group].append(rt.version)
        return groups

    def changed(
        self,
        kind: str,
        crd: Mapping[str, Any],
        store: ObjectStore,
        commit: Commit,
    ) -> None:
        """Serve (or stop serving, deleting its objects as the CRD finalizer does) what a CRD defines."""
        storage = f"{(crd.get('spec') or {}).get('names', {}).get('plural')}.{(crd.get('spec') or {}).get('group')}"
        for path in [p for p, rt in self.by_path.items() if rt.storage == storage]:
            del self.by_path[path]
        if kind != "DELETED":
            if storage not in store.storage_floor and not any(rt.storage == storage for rt in self.by_path.values()):
                # NB: like the watch cache kube-apiserver starts for a newly served resource, no history from before
                # now: a watch from an older resourceVersion gets 410 Expired.
                store.storage_floor[storage] = store.rv
            for rt in custom_resource_types(crd):
                self.by_path[(rt.group, rt.version, rt.plural)] = rt
            return
        store.storage_floor.pop(storage, None)
        types = custom_resource_types(crd)
        if types:
            for _, stored in sorted(store.of(types[0]).items()):
                commit(types[0], "DELETED", copy.deepcopy(stored), stored)
        store.objects.pop(storage, None)
