"""Aggregation: series values → one value per (metric, object), once per refresh.

For every catalogue metric, each series value is attributed to a device, then folded into a Partial
for its pod, its node and its namespace — once for the object as a whole and once per metric label
set, so metric label selectors can be applied at request time. Values older than the metric's max-age
are left out when fresher ones exist for the same object; when only stale ones exist the object gets a
stale marker, so readers answer 503 instead of serving an old number as new.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

from gpuscale.metrics.attribution import Device
from gpuscale.metrics.catalogue import Catalogue, MetricDefinition, Term
from gpuscale.metrics.store import LabelledPart, MetricPoint, Partial, Snapshot
from gpuscale.model import NAMESPACE, NODE, ObjectRef
from gpuscale.sources.base import SeriesValue, TermQuery

Reader = Callable[[TermQuery], list[SeriesValue]]
Attribute = Callable[[str, dict[str, str], str], Device]


def term_query(term: Term, *, window_seconds: float) -> TermQuery:
    return TermQuery(
        series=tuple(term.series),
        input=term.input,
        window_seconds=window_seconds,
        match=tuple(sorted(term.match.items())),
        promql=term.prometheus,
    )


def queries(catalogue: Catalogue) -> list[TermQuery]:
    """Every distinct term query the catalogue needs (what a source must be able to answer)."""
    out: dict[TermQuery, None] = {}
    for metric in catalogue:
        for term in metric.terms:
            if term is not None:
                out[term_query(term, window_seconds=catalogue.window(metric))] = None
    return list(out)


Labels = tuple[tuple[str, str], ...]


class _Fold:
    """Per-metric accumulation state for one refresh."""

    def __init__(self, metric: MetricDefinition, *, now: float, max_age: float) -> None:
        self.metric = metric
        self.now = now
        self.max_age = max_age
        self.objects: dict[ObjectRef, Partial] = defaultdict(Partial)
        self.labelled: dict[ObjectRef, dict[Labels, Partial]] = defaultdict(lambda: defaultdict(Partial))
        # NB: dedupe per (object, side, physical GPU): MIG instances repeat the parent GPU's power.
        self._seen: set[tuple[ObjectRef, int, tuple[str, ...]]] = set()
        self._devices: set[tuple[ObjectRef, Labels | None, tuple[str, ...]]] = set()

    def add(self, value: SeriesValue, device: Device, side: int) -> None:
        if not math.isfinite(value.value):
            return  # NaN/Inf from an exporter never becomes a number
        keys: list[ObjectRef] = []
        if device.pod is not None:
            keys.append(device.pod)
            keys.append(ObjectRef(NAMESPACE, device.pod.namespace or ""))
        if device.node:
            keys.append(ObjectRef(NODE, device.node))
        stale = self.now - value.timestamp > self.max_age
        for key in keys:
            if stale:
                for partial in (self.objects[key], self.labelled[key][device.labels]):
                    partial.stale_newest = max(partial.stale_newest, value.timestamp)
                continue
            if self.metric.dedupe == "physical_gpu":
                seen_key = (key, side, device.physical)
                if seen_key in self._seen:
                    continue
                self._seen.add(seen_key)
            self._apply(self.objects[key], value, device, side, (key, None, device.key))
            self._apply(self.labelled[key][device.labels], value, device, side, (key, device.labels, device.key))

    def _apply(
        self,
        partial: Partial,
        value: SeriesValue,
        device: Device,
        side: int,
        device_key: tuple[ObjectRef, Labels | None, tuple[str, ...]],
    ) -> None:
        partial.oldest = min(partial.oldest, value.timestamp)
        if value.window_seconds is not None:
            partial.window_seconds = max(partial.window_seconds or 0.0, value.window_seconds)
        if side == 0:
            partial.numerator += value.value
            partial.maximum = max(partial.maximum, value.value)
            partial.has_numerator = True
            if device_key not in self._devices:  # a mean counts devices, not series
                self._devices.add(device_key)
                partial.devices += 1
        else:
            partial.denominator += value.value
            partial.has_denominator = True


def build_snapshot(catalogue: Catalogue, read: Reader, attribute: Attribute, *, now: float) -> Snapshot:
    """Run every catalogue metric over the source's current values. Pure given ``read``/``attribute``."""
    snapshot = Snapshot(taken_at=now)
    devices: set[tuple[str, ...]] = set()
    series = 0
    for metric in catalogue:
        fold = _Fold(metric, now=now, max_age=catalogue.max_age(metric))
        window = catalogue.window(metric)
        for side, term in enumerate(metric.terms):
            if term is None:
                continue
            for value in read(term_query(term, window_seconds=window)):
                device = attribute(value.name, value.labels, value.target)
                devices.add(device.physical)
                series += 1
                fold.add(value, device, side)
        floor = metric.denominator.floor if metric.denominator else 0.0
        finished: dict[ObjectRef, MetricPoint] = {}
        for obj, partial in fold.objects.items():
            point = partial.finish(metric.aggregate, scale=metric.scale, floor=floor)
            if point is not None:
                finished[obj] = point
        snapshot.values[metric.name] = finished
        snapshot.parts[metric.name] = {
            obj: [LabelledPart(labels, partial) for labels, partial in by_labels.items()]
            for obj, by_labels in fold.labelled.items()
        }
    snapshot.device_count = len(devices)
    snapshot.series_count = series
    return snapshot


def finish_parts(metric: MetricDefinition, parts: list[LabelledPart]) -> MetricPoint | None:
    """Merge the partials a request's metric label selector chose and finish them into one value."""
    merged = Partial()
    for part in parts:
        merged.merge(part.partial)
    floor = metric.denominator.floor if metric.denominator else 0.0
    return merged.finish(metric.aggregate, scale=metric.scale, floor=floor)


def mean_of(points: list[MetricPoint]) -> MetricPoint | None:
    """Deployment/StatefulSet values: the mean over their pods' values (stale pods left out)."""
    fresh = [p for p in points if not p.stale]
    if not fresh:
        return MetricPoint(math.nan, max(p.timestamp for p in points), stale=True) if points else None
    windows = [p.window_seconds for p in fresh if p.window_seconds is not None]
    return MetricPoint(
        sum(p.value for p in fresh) / len(fresh),
        min(p.timestamp for p in fresh),
        max(windows) if windows else None,
    )
