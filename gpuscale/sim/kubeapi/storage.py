"""Storage: the objects by resource, one global resourceVersion counter, and the change history that watches
replay and paged lists read their snapshot from (older than ``floor``: 410 Expired)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.errors import SelectorError
from gpuscale.selectors import FieldSelector, LabelSelector, field_value
from gpuscale.sim.api_errors import (
    bad_request,
    not_found,
)
from gpuscale.sim.resources import (
    ResourceType,
)

# stores a change (ADDED, MODIFIED or DELETED: new state, state before) and tells whoever listens
Commit = Callable[[ResourceType, str, dict[str, Any], dict[str, Any] | None], dict[str, Any]]


@dataclass(slots=True)
class Change:
    rv: int
    storage: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]  # stored form, new state (last state for DELETED)
    prev: dict[str, Any] | None  # stored form before the change


@dataclass(frozen=True, slots=True)
class Filter:
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
        return self.fields.is_empty or self.fields.matches_fields(field_set(self.rt, stored))

    def event_for(self, change: Change) -> tuple[str, dict[str, Any]] | None:
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


def field_set(rt: ResourceType, stored: Mapping[str, Any]) -> dict[str, str]:
    """The apiserver's field set for an object: supported field label → value (defaults for unset fields)."""
    fields = {}
    for label, path in rt.field_labels.items():
        value = field_value(stored, path)
        fields[label] = value if value else rt.field_defaults.get(label, "")
    return fields


class ObjectStore:
    """Every stored object, per storage (``ResourceType.storage``), keyed by (namespace, name).

    ``history_limit`` is how many changes a watch can replay (older resourceVersions get 410 Expired).
    """

    def __init__(self, *, history_limit: int) -> None:
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self.rv = 0
        self.history: deque[Change] = deque(maxlen=history_limit)
        self.floor = 0  # every change with rv > floor is in the history
        self.storage_floor: dict[str, int] = {}  # per storage, a later floor (a newly served custom resource)
        self.storage_rv: dict[str, int] = {}  # per storage, the resourceVersion of its newest change

    def oldest(self, rt: ResourceType) -> int:
        """The oldest resourceVersion a watch or a paged list of ``rt`` can start from."""
        return max(self.floor, self.storage_floor.get(rt.storage, 0))

    def record(self, rt: ResourceType, kind: str, new: dict[str, Any], prev: dict[str, Any] | None) -> Change:
        """Write (or, for DELETED, remove) an object at a fresh resourceVersion and keep the change."""
        meta = new["metadata"]
        for omitempty in ("labels", "annotations", "finalizers", "ownerReferences"):
            if omitempty in meta and not meta[omitempty]:
                del meta[omitempty]  # NB: kube-apiserver stores and serves an empty one as no field at all
        self.rv += 1
        new["metadata"]["resourceVersion"] = str(self.rv)
        key = (new["metadata"].get("namespace", ""), new["metadata"]["name"])
        store = self.of(rt)
        if kind == "DELETED":
            store.pop(key, None)
        else:
            store[key] = new
        self.storage_rv[rt.storage] = self.rv
        change = Change(self.rv, rt.storage, kind, new, prev)
        if len(self.history) == self.history.maxlen:
            self.floor = self.history[0].rv
        self.history.append(change)
        return change

    def compact(self) -> None:
        """Forget the change history: a watch from any resourceVersion before now gets 410 Expired."""
        self.history.clear()
        self.floor = self.rv

    def of(self, rt: ResourceType) -> dict[tuple[str, str], dict[str, Any]]:
        return self.objects.setdefault(rt.storage, {})

    def stored(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        return self.of(rt).get((namespace, name))

    def require(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        stored = self.stored(rt, namespace, name)
        if stored is None:
            raise not_found(rt, name)
        return stored

    def select(
        self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldSelector
    ) -> list[dict[str, Any]]:
        selection = Filter(rt, namespace, labels, fields)
        return [o for _, o in sorted(self.of(rt).items()) if selection.passes(o)]

    def snapshot(self, rt: ResourceType, rv: int) -> dict[tuple[str, str], dict[str, Any]] | None:
        """The stored objects of ``rt`` as they were at resourceVersion ``rv`` (the current ones with the newer
        changes undone), or None when the history no longer reaches back that far."""
        if rv < max(self.floor, self.storage_floor.get(rt.storage, 0)):
            return None
        state = dict(self.of(rt))
        for change in reversed(self.history):
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


def parse_field_selector(rt: ResourceType, text: str) -> FieldSelector:
    selector = FieldSelector.parse(text)
    unsupported = sorted(selector.fields - set(rt.field_labels))
    if unsupported:
        raise SelectorError(f"field label not supported: {unsupported[0]}")
    return selector


def parse_selectors(rt: ResourceType, query: Mapping[str, str]) -> tuple[LabelSelector, FieldSelector]:
    try:
        return LabelSelector.parse(query.get("labelSelector", "")), parse_field_selector(
            rt, query.get("fieldSelector", "")
        )
    except SelectorError as e:
        raise bad_request(str(e)) from e
