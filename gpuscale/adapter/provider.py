"""The metrics provider: "give me metric M for these objects", answered from the store.

This is custom-metrics-apiserver's provider interface (by name, by selector, external) over the
in-memory store and the Kubernetes watch cache: every answer is dictionary lookups plus, at most, a
merge of a few per-label-set partials. Nothing here does I/O.

Freshness: a value whose samples are older than the metric's max-age is never served. Items that went
stale are left out of a list (the HPA treats missing pods conservatively); if nothing fresh is left the
answer is MetricStale (503), distinct from "never had a value" (404).
"""

from __future__ import annotations

import copy
import time
import weakref
from collections.abc import Callable, Collection, Hashable, Sequence
from itertools import compress, repeat
from operator import is_not, itemgetter
from typing import Any, NamedTuple

from gpuscale.adapter.forecasts import METRICS as FORECAST_METRICS
from gpuscale.adapter.forecasts import RESOURCES as FORECAST_RESOURCES
from gpuscale.adapter.forecasts import WorkloadForecasts
from gpuscale.errors import MetricNotFound, MetricStale, ObjectNotFound, SelectorError
from gpuscale.metrics.aggregation import finish_parts, mean_of
from gpuscale.metrics.catalogue import Catalogue, MetricDefinition
from gpuscale.metrics.store import LabelledPart, MetricPoint, MetricsReader
from gpuscale.model import DEPLOYMENT, NAMESPACE, NODE, POD, RESOURCE_CLAIM, STATEFULSET, ObjectRef
from gpuscale.selectors import LabelSelector
from gpuscale.sources.cluster_index import ClusterObjects

# NB: selections (and positions) kept per (metric, namespace, selector): beyond a cluster's distinct HPA queries,
# 1,000 HPAs × 4 metrics = 4,000, whose selections were otherwise all forgotten and found again every few refreshes
SELECTIONS_KEPT = 16384
WORKLOAD_KINDS = {"deployments.apps": DEPLOYMENT, "statefulsets.apps": STATEFULSET}
CLAIMS = "resourceclaims.resource.k8s.io"


class Item(NamedTuple):
    """One value of an answer. NB: a NamedTuple, built in C: an answer over 100 pods makes 100 of them."""

    obj: ObjectRef | None  # None for external metrics
    point: MetricPoint
    labels: dict[str, str] | None = None


class Values(NamedTuple):
    """A custom-metrics answer as parallel sequences (what the encoder reads), without an Item per value."""

    objs: Collection[ObjectRef]
    points: Collection[MetricPoint]
    oldest: float  # the oldest point's timestamp (0.0 when there are none): when the answer turns stale
    stamps: Collection[float] | None = None  # the points' distinct timestamps, when known (the encoder needs them)

    @classmethod
    def of(cls, items: list[Item]) -> Values:
        points = [i.point for i in items]
        return cls([i.obj for i in items], points, min((p.timestamp for p in points), default=0.0))  # type: ignore[misc]


_STALE, _TIMESTAMP = itemgetter(3), itemgetter(1)  # MetricPoint.stale and .timestamp, read in C


class _Layout:
    """One metric's stored objects in the store's order. Snapshots that store the same objects in the same order
    (every refresh while no pod comes or goes) share one, so positions found in it stay valid across refreshes."""

    __slots__ = ("_index", "kept", "keys")

    def __init__(self, keys: list[ObjectRef]) -> None:
        self.keys = keys
        self.kept = False  # seen in a second snapshot: worth finding positions in (else they are read by key)
        self._index: dict[ObjectRef, int] | None = None

    def reader(self, objs: Collection[ObjectRef]) -> Callable[[list], Sequence[MetricPoint]] | None:
        """What reads ``objs``' points by position from a snapshot's points in this order (None: not all stored)."""
        if self._index is None:
            self._index = {k: i for i, k in enumerate(self.keys)}
        positions = [self._index.get(o) for o in objs]
        if not positions or None in positions:
            return None
        if len(positions) == 1:
            only = positions[0]
            return lambda points: (points[only],)
        return itemgetter(*positions)


class _Columns:
    """Points read by position instead of by key: ``map(values.get, objs)`` hashes every ObjectRef (a tuple of
    three strings, its hash not cached), which in a refresh's preparation (cold caches) was most of the cost of
    reading a 100-pod answer; a position is an index into one list per snapshot and metric."""

    def __init__(self) -> None:
        self._recent: dict[str, list[tuple[weakref.ref, int, _Layout, list[MetricPoint]]]] = {}
        self._layouts: dict[str, _Layout] = {}
        self._readers: dict[Hashable, tuple[_Layout, Callable[[list], Sequence[MetricPoint]] | None]] = {}

    def points(
        self, store: MetricsReader, metric: str, selection: Hashable, objs: Collection[ObjectRef]
    ) -> Sequence[MetricPoint] | None:
        """``objs``' points in ``store`` (``selection`` names ``objs`` for as long as it is this list); None when
        some are not stored (the caller reads by key)."""
        # NB: per store and version, the latest two per metric: the event loop's store and the one a refresh is
        # preparing answers from. Held weakly: an entry keeps its metric's points alive, never a whole snapshot.
        values, version = store.values(metric), store.version
        recent = self._recent.get(metric, [])
        entry = next((e for e in recent if e[0]() is store and e[1] == version), None)
        if entry is None:
            keys = list(values)
            layout = self._layouts.get(metric)
            if layout is not None and layout.keys == keys:
                layout.kept = True
            else:
                layout = self._layouts[metric] = _Layout(keys)
            try:
                held = weakref.ref(store)
            except TypeError:  # NB: a store that cannot be referenced weakly is read by key
                return None
            entry = (held, version, layout, list(values.values()))
            others = [e for e in recent if e[0]() not in (None, store)]
            self._recent[metric] = [*others[-1:], entry]
        _, _, layout, points = entry
        if not layout.kept:
            return None  # NB: a source whose order changes every refresh would rebuild positions every time
        kept = self._readers.get(selection)
        if kept is None or kept[0] is not layout:
            if len(self._readers) > SELECTIONS_KEPT:
                self._readers.clear()
            kept = self._readers[selection] = (layout, layout.reader(objs))
        reader = kept[1]
        return reader(points) if reader is not None else None


class MetricsProvider:
    def __init__(
        self,
        catalogue: Catalogue,
        store: MetricsReader,
        cluster: ClusterObjects | None,
        *,
        clock: Callable[[], float] = time.time,
        retry_after_seconds: int = 5,
        forecasts: WorkloadForecasts | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.forecasts = forecasts
        self.store = store
        self.cluster = cluster
        self.clock = clock
        self.retry_after_seconds = retry_after_seconds
        self._selections: dict[tuple[str, LabelSelector, int], list[ObjectRef]] = {}
        # NB: selections as the store's own key objects, and those keys per metric (_stored_selection says why)
        self._stored_selections: dict[tuple[str, str, LabelSelector, int], list[ObjectRef]] = {}
        self._store_keys: dict[str, dict[ObjectRef, ObjectRef]] = {}
        self._columns = _Columns()

    # --- helpers -----------------------------------------------------------------------------------

    def _metric(self, name: str, resource: str, *, external: bool = False) -> MetricDefinition:
        metric = self.catalogue.get(name)
        if metric is None or (external and not metric.external) or (not external and resource not in metric.resources):
            raise MetricNotFound(f"the server could not find the metric {name} for {resource}")
        return metric

    def _value(self, metric: MetricDefinition, obj: ObjectRef, metric_selector: LabelSelector) -> MetricPoint | None:
        if metric_selector.is_empty:
            return self.store.point(metric.name, obj)
        parts = self.store.parts(metric.name, obj)
        return _select(metric, parts, metric_selector)

    def _collect(
        self, metric: MetricDefinition, candidates: list[tuple[ObjectRef, MetricPoint | None]], what: str
    ) -> list[Item]:
        items: list[Item] = []
        stale = 0
        oldest_fresh = self.clock() - self.catalogue.max_age(metric)
        for obj, point in candidates:
            if point is None:
                continue
            if point.stale or point.timestamp < oldest_fresh:
                stale += 1
            else:
                items.append(Item(obj, point))
        if not items:
            if stale:
                raise MetricStale(
                    f"the metric {metric.name} for {what} is older than its max-age of "
                    f"{self.catalogue.max_age(metric):g}s (its source is failing); not serving a stale value",
                    retry_after_seconds=self.retry_after_seconds,
                )
            raise MetricNotFound(f"the server could not find the metric {metric.name} for {what}")
        return items

    def _check_namespace(self, namespace: str) -> None:
        if self.cluster is not None and self.cluster.synced and namespace not in self.cluster.namespaces():
            raise ObjectNotFound(f'namespaces "{namespace}" not found')

    def _workload_value(
        self, metric: MetricDefinition, kind: str, namespace: str, name: str, metric_selector: LabelSelector
    ) -> MetricPoint | None:
        if self.cluster is None:
            raise MetricNotFound(
                f"the server could not find the metric {metric.name} for {kind.lower()} {namespace}/{name}: "
                "workload metrics need the Kubernetes API (start the adapter with --kubeconfig)"
            )
        workload = self.cluster.workload(kind, namespace, name)
        if workload is None:
            raise ObjectNotFound(f'{kind.lower()}s.apps "{name}" not found in namespace {namespace}')
        points = [
            p
            for pod in self.cluster.pods_of(workload)
            if (p := self._value(metric, ObjectRef(POD, pod.name, pod.namespace), metric_selector)) is not None
        ]
        oldest_fresh = self.clock() - self.catalogue.max_age(metric)
        fresh = [p for p in points if not p.stale and p.timestamp >= oldest_fresh]
        return mean_of(fresh) if fresh else mean_of(points)

    def state_token(self) -> tuple[int, int | None, bool]:
        """Identifies everything an answer depends on besides the request and the clock: the store's
        version and the watch cache's generation and sync state. Equal tokens ⇒ equal answers (until expiry)."""
        return (self.store.version, *self.cluster_state())

    def cluster_state(self) -> tuple[int | None, bool]:
        """The watch cache's part of ``state_token``: its generation and whether it is synced."""
        if self.cluster is None:
            return (None, False)
        return (self.cluster.generation, self.cluster.synced)

    def reading(self, store: MetricsReader) -> MetricsProvider:
        """This provider over another store (a snapshot not swapped in yet), sharing everything else."""
        other = copy.copy(self)
        other.store = store
        return other

    def expiry(self, metric_name: str, items: list[Item]) -> float:
        """When the first of these items would turn stale (an answer built from them is valid until then)."""
        return self.expires(metric_name, min((i.point.timestamp for i in items), default=0.0))

    def expires(self, metric_name: str, oldest: float) -> float:
        """When a value of ``metric_name`` sampled at ``oldest`` turns stale."""
        metric = self.catalogue.get(metric_name)
        max_age = self.catalogue.max_age(metric) if metric else 0.0
        if self._forecast(metric_name):
            assert self.forecasts is not None
            max_age = self.forecasts.max_age_s
        return oldest + max_age

    def is_forecast(self, metric_name: str) -> bool:
        """Served from the workloads' forecasts (adapter/forecasts.py), not the store."""
        return self.forecasts is not None and metric_name in FORECAST_METRICS

    def _forecast(self, metric_name: str, resource: str | None = None) -> bool:
        """Is this a forecast metric (served by adapter/forecasts.py, not the catalogue)?"""
        if not self.is_forecast(metric_name):
            return False
        if resource is not None and resource not in FORECAST_RESOURCES:
            raise MetricNotFound(f"the server could not find the metric {metric_name} for {resource}")
        return True

    # --- the provider interface ---------------------------------------------------------------------

    def by_name(
        self, resource: str, namespace: str | None, name: str, metric_name: str, metric_selector: LabelSelector
    ) -> list[Item]:
        if self._forecast(metric_name, resource):
            assert self.forecasts is not None and namespace is not None
            self._check_namespace(namespace)
            return [Item(*self.forecasts.object_point(resource, namespace, name, metric_name))]
        metric = self._metric(metric_name, resource)
        if resource == "namespaces":
            self._check_namespace(name)
            obj = ObjectRef(NAMESPACE, name)
            return self._collect(metric, [(obj, self._value(metric, obj, metric_selector))], f"namespace {name}")
        if resource == "nodes":
            obj = ObjectRef(NODE, name)
            if self.cluster is not None and self.cluster.synced and name not in self.cluster.nodes():
                raise ObjectNotFound(f'nodes "{name}" not found')
            return self._collect(metric, [(obj, self._value(metric, obj, metric_selector))], f"node {name}")
        assert namespace is not None
        self._check_namespace(namespace)
        if resource == "pods":
            obj = ObjectRef(POD, name, namespace)
            if self.cluster is not None and self.cluster.synced and self.cluster.pod(namespace, name) is None:
                raise ObjectNotFound(f'pods "{name}" not found in namespace {namespace}')
            return self._collect(metric, [(obj, self._value(metric, obj, metric_selector))], f"pod {namespace}/{name}")
        if resource == CLAIMS:
            # NB: a claim is known from the DRA labels of the GPUs allocated through it (not watched).
            obj = ObjectRef(RESOURCE_CLAIM, name, namespace)
            what = f"resourceclaim {namespace}/{name}"
            return self._collect(metric, [(obj, self._value(metric, obj, metric_selector))], what)
        kind = WORKLOAD_KINDS[resource]
        point = self._workload_value(metric, kind, namespace, name, metric_selector)
        obj = ObjectRef(kind, name, namespace)
        return self._collect(metric, [(obj, point)], f"{resource} {namespace}/{name}")

    def by_selector(
        self,
        resource: str,
        namespace: str | None,
        selector: LabelSelector,
        metric_name: str,
        metric_selector: LabelSelector,
    ) -> list[Item]:
        if self._forecast(metric_name, resource):
            assert self.forecasts is not None and namespace is not None
            self._check_namespace(namespace)
            return [Item(o, p) for o, p in self.forecasts.object_points(resource, namespace, selector, metric_name)]
        metric = self._metric(metric_name, resource)
        what = (
            f"{resource}"
            + (f" in namespace {namespace}" if namespace else "")
            + (f" with selector {selector}" if not selector.is_empty else "")
        )
        if resource == "pods":
            assert namespace is not None
            self._check_namespace(namespace)
            objs = self._select_pods(namespace, selector)
        elif resource == "nodes":
            objs = self._select_nodes(selector)
        elif resource == "namespaces":
            objs = [o for o in self.store.objects(metric.name, NAMESPACE)]
        elif resource == CLAIMS:
            if not selector.is_empty:
                raise SelectorError("resourceclaims are known from GPU series' DRA labels, not by labels: no selector")
            assert namespace is not None
            self._check_namespace(namespace)
            objs = [o for o in self.store.objects(metric.name, RESOURCE_CLAIM) if o.namespace == namespace]
        else:
            assert namespace is not None
            self._check_namespace(namespace)
            kind = WORKLOAD_KINDS[resource]
            if self.cluster is None:
                raise MetricNotFound(f"the server could not find the metric {metric.name} for {what}")
            items = []
            for w in self.cluster.workloads(kind, namespace):
                if selector.matches(w.labels):
                    point = self._workload_value(metric, kind, namespace, w.name, metric_selector)
                    items.append((ObjectRef(kind, w.name, namespace), point))
            return self._collect(metric, items, what)
        if metric_selector.is_empty:
            # NB: in the order of objs, without those that have no value (which _collect would skip)
            return self._collect(metric, list(self.store.points(metric.name, objs).items()), what)
        return self._collect(metric, [(o, self._value(metric, o, metric_selector)) for o in objs], what)

    def values_by_selector(self, metric_name: str, *args: Any) -> Values:
        """``by_selector(resource, namespace, selector, metric_name, metric_selector)``'s answer as ``Values``
        (``args``: the other four, in that order). For pods without a metricLabelSelector — every HPA's Pods
        metric — read without a Python step per pod when every selected pod's value is fresh (checked in C);
        anything else is ``by_selector``'s answer (which filters stale values and raises)."""
        resource, namespace, selector, metric_selector = args
        plain = resource == "pods" and metric_selector.is_empty and namespace is not None
        if plain and not self.is_forecast(metric_name):
            assert namespace is not None
            metric = self._metric(metric_name, resource)
            self._check_namespace(namespace)
            objs: Collection[ObjectRef] = self._stored_selection(metric.name, namespace, selector)
            values = self.store.values(metric.name)
            points: Collection[MetricPoint | None] | None = None
            if self.cluster is not None:
                selection = (metric.name, namespace, selector, self.cluster.generation)
                points = self._columns.points(self.store, metric.name, selection, objs)
            if points is None:
                points = list(map(values.get, objs))
                if not all(points):  # NB: pods without a value (None) are left out, as by_selector leaves them out
                    present = list(map(is_not, points, repeat(None)))
                    objs, points = list(compress(objs, present)), list(compress(points, present))
            if points and not any(map(_STALE, points)):
                stamps = set(map(_TIMESTAMP, points))
                oldest = min(stamps)
                if oldest >= self.clock() - self.catalogue.max_age(metric):
                    return Values(objs, points, oldest, stamps)  # type: ignore[arg-type]
        return Values.of(self.by_selector(resource, namespace, selector, metric_name, metric_selector))

    def _stored_selection(self, metric: str, namespace: str, selector: LabelSelector) -> list[ObjectRef]:
        """``_select_pods``, each pod as the very ObjectRef the store keys ``metric``'s values by, where it has one.

        A dictionary lookup whose key *is* the stored key skips comparing the two; reading 100 pods' values from a
        5,000-pod snapshot took 45 µs with equal keys and 17 µs with the same objects (cold caches, as in a
        refresh's preparation). The snapshot's keys outlive refreshes (attribution keeps them), so this is done
        once per selection and watch-cache generation; keys the store does not have yet are taken as they are
        (equal, so the answer is the same, only the lookup slower).
        """
        if self.cluster is None:
            return self._select_pods(namespace, selector)
        key = (metric, namespace, selector, self.cluster.generation)
        cached = self._stored_selections.get(key)
        if cached is None:
            objs = self._select_pods(namespace, selector)
            values = self.store.values(metric)
            keys = self._store_keys.get(metric)
            if keys is None or any(o in values and o not in keys for o in objs):
                keys = self._store_keys[metric] = {k: k for k in values}
            if len(self._stored_selections) > SELECTIONS_KEPT:
                self._stored_selections.clear()
            cached = self._stored_selections[key] = [keys.get(o, o) for o in objs]
        return cached

    def _select_pods(self, namespace: str, selector: LabelSelector) -> list[ObjectRef]:
        if self.cluster is None:
            if not selector.is_empty:
                raise SelectorError(
                    "labelSelector needs pod labels from the Kubernetes API; start the adapter with --kubeconfig"
                )
            return sorted(
                {o for m in self.catalogue for o in self.store.objects(m.name, POD) if o.namespace == namespace}
            )
        # NB: only pods the selector matches, never extra ones: the HPA averages over every item returned.
        key = (namespace, selector, self.cluster.generation)
        cached = self._selections.get(key)
        if cached is None:
            if len(self._selections) > SELECTIONS_KEPT:
                self._selections.clear()
            cached = self._selections[key] = [
                ObjectRef(POD, p.name, p.namespace) for p in self.cluster.select_pods(namespace, selector)
            ]
        return cached

    def _select_nodes(self, selector: LabelSelector) -> list[ObjectRef]:
        if self.cluster is None or not self.cluster.synced:
            if not selector.is_empty:
                raise SelectorError("a node labelSelector needs node labels from the Kubernetes API (--kubeconfig)")
            return sorted({o for m in self.catalogue for o in self.store.objects(m.name, NODE)})
        return [ObjectRef(NODE, n) for n in self.cluster.select_nodes(selector)]

    def external(self, namespace: str, metric_name: str, selector: LabelSelector) -> list[Item]:
        if self._forecast(metric_name):
            assert self.forecasts is not None
            self._check_namespace(namespace)
            return [
                Item(None, p, labels) for labels, p in self.forecasts.external_points(namespace, metric_name, selector)
            ]
        metric = self._metric(metric_name, "external metrics", external=True)
        self._check_namespace(namespace)
        parts = self.store.parts(metric.name, ObjectRef(NAMESPACE, namespace))
        point = _select(metric, parts, selector)
        what = f"namespace {namespace}" + (f" with selector {selector}" if not selector.is_empty else "")
        items = self._collect(metric, [(ObjectRef(NAMESPACE, namespace), point)], what)
        labels = dict((selector.to_dict() or {}).get("matchLabels") or {}) or None
        return [Item(None, i.point, labels) for i in items]


def _select(metric: MetricDefinition, parts: list[LabelledPart], selector: LabelSelector) -> MetricPoint | None:
    chosen = [p for p in parts if selector.matches(dict(p.labels))]
    return finish_parts(metric, chosen) if chosen else None
