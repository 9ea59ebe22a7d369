"""The metrics store: the latest value per (metric, object), ready for in-memory lookups.

The store is the seam every consumer reads (adapter, top, report, controller). It is replaced whole,
atomically, once per refresh (``update``); reads never wait on a source and never do I/O. Each value
keeps the time of the samples it came from, so a reader can refuse to serve a stale value as fresh.

Beside the finished value, every object keeps one mergeable partial per metric label set (e.g. per
Triton model), so a request's metric label selector (``metricLabelSelector``, or the external metrics'
``labelSelector``) is applied at request time by merging the few partials it selects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from gpuscale.model import ObjectRef


class MetricPoint(NamedTuple):
    """One metric value for one object. ``timestamp`` = the oldest sample time it was computed from."""

    value: float
    timestamp: float
    window_seconds: float | None = None
    stale: bool = False  # no fresh sample contributed; ``value`` must not be served

    def age(self, now: float) -> float:
        return now - self.timestamp


@dataclass(slots=True)
class Partial:
    """A mergeable aggregate: enough to finish mean, sum, max or ratio after merging."""

    numerator: float = 0.0
    denominator: float = 0.0
    devices: int = 0
    maximum: float = -math.inf
    has_numerator: bool = False
    has_denominator: bool = False
    oldest: float = math.inf
    window_seconds: float | None = None
    stale_newest: float = -math.inf  # newest timestamp among stale contributions, if any were skipped

    def merge(self, other: Partial) -> None:
        self.numerator += other.numerator
        self.denominator += other.denominator
        self.devices += other.devices
        self.maximum = max(self.maximum, other.maximum)
        self.has_numerator |= other.has_numerator
        self.has_denominator |= other.has_denominator
        self.oldest = min(self.oldest, other.oldest)
        if other.window_seconds is not None:
            self.window_seconds = max(self.window_seconds or 0.0, other.window_seconds)
        self.stale_newest = max(self.stale_newest, other.stale_newest)

    def finish(self, aggregate: str, *, scale: float, floor: float) -> MetricPoint | None:
        """The value, a stale marker, or None when nothing contributed at all."""
        complete = self.has_numerator and (aggregate != "ratio" or self.has_denominator)
        if not complete:
            if self.stale_newest > -math.inf:
                return MetricPoint(math.nan, self.stale_newest, self.window_seconds, stale=True)
            return None
        if aggregate == "mean":
            value = self.numerator / self.devices
        elif aggregate == "sum":
            value = self.numerator
        elif aggregate == "max":
            value = self.maximum
        else:
            denominator = max(self.denominator, floor)
            if denominator <= 0:
                return None
            value = self.numerator / denominator
        value *= scale
        if not math.isfinite(value):
            return None  # NB: never store NaN/Inf as a number; the reader sees "no value"
        return MetricPoint(value, self.oldest, self.window_seconds)


class LabelledPart(NamedTuple):
    labels: tuple[tuple[str, str], ...]
    partial: Partial
    physical: tuple[str, ...] = ()  # the physical GPU, for metrics counted once per GPU


class DeviceColumns:
    """One metric's per-device sums, as numpy columns indexed like the refresh's device list.

    ``get(id(device))`` returns that device's Partial (or None when the metric has no series for it): the
    per-label parts a metric label selector merges are built from these columns only when asked for.
    """

    FIELDS = (
        "numerator",
        "denominator",
        "devices",
        "maximum",
        "has_numerator",
        "has_denominator",
        "oldest",
        "window_seconds",
        "stale_newest",
    )

    def __init__(self, index: Mapping[int, int], present: Any, columns: Mapping[str, Any]) -> None:
        self._index = index
        self.present = present
        self.columns = columns

    def get(self, key: int) -> Partial | None:
        i = self._index.get(key)
        if i is None or not self.present[i]:
            return None
        c = self.columns
        window = float(c["window_seconds"][i])
        return Partial(
            float(c["numerator"][i]),
            float(c["denominator"][i]),
            int(c["devices"][i]),
            float(c["maximum"][i]),
            bool(c["has_numerator"][i]),
            bool(c["has_denominator"][i]),
            float(c["oldest"][i]),
            window if window > -math.inf else None,
            float(c["stale_newest"][i]),
        )

    def __bool__(self) -> bool:
        return bool(self.present.any())


# Why a value was left out of the store or an answer: a small fixed set, a metric label (selfmetrics).
NOT_FINITE = "not_finite"  # NaN or ±Inf from the source
OUT_OF_RANGE = "out_of_range"  # outside the catalogue's range, or beyond what a Kubernetes quantity can hold
BAD_TIMESTAMP = "bad_timestamp"  # a sample time that is not a finite time after the epoch
FUTURE_TIMESTAMP = "future_timestamp"  # a sample time ahead of the adapter's clock by more than the skew allowed
DROP_REASONS = (NOT_FINITE, OUT_OF_RANGE, BAD_TIMESTAMP, FUTURE_TIMESTAMP)


@dataclass(slots=True)
class Snapshot:
    """Everything one refresh computed. Built by ``aggregation.build_snapshot``; immutable once stored."""

    taken_at: float
    values: dict[str, dict[ObjectRef, MetricPoint]] = field(default_factory=dict)
    # For metric label selectors: which devices count towards each object (shared by all metrics), and
    # each metric's per-device partials keyed by id(device). Parts are assembled only when asked for.
    members: dict[ObjectRef, list[Any]] = field(default_factory=dict)
    device_partials: dict[str, DeviceColumns] = field(default_factory=dict)
    device_count: int = 0  # physical GPUs
    series_count: int = 0  # series read from the source (each distinct term once)
    # (metric, reason) → values this refresh left out (reason: one of DROP_REASONS); a series a term of several
    # metrics reads counts once for each
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)

    def parts(self, metric: str, obj: ObjectRef) -> list[LabelledPart]:
        partials = self.device_partials.get(metric)
        if not partials:
            return []
        return [
            LabelledPart(device.labels, partial, device.physical)
            for device in self.members.get(obj, ())
            if (partial := partials.get(id(device))) is not None
        ]


class MetricsReader(Protocol):
    """What consumers may ask of the store."""

    @property
    def ready(self) -> bool: ...

    @property
    def refreshed_at(self) -> float | None: ...

    @property
    def version(self) -> int: ...

    def point(self, metric: str, obj: ObjectRef) -> MetricPoint | None: ...

    def points(self, metric: str, objs: Iterable[ObjectRef]) -> dict[ObjectRef, MetricPoint]: ...

    def values(self, metric: str) -> Mapping[ObjectRef, MetricPoint]:
        """Every object's point of ``metric`` (read-only; for lookups run by C, e.g. ``map(values.get, objs)``)."""
        ...

    def objects(self, metric: str, kind: str | None = None) -> list[ObjectRef]: ...

    def parts(self, metric: str, obj: ObjectRef) -> list[LabelledPart]: ...


class MetricsStore:
    """The in-memory implementation of MetricsReader, updated by the refresh loop."""

    def __init__(self) -> None:
        self._snapshot: Snapshot | None = None
        self._version = 0

    def update(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot  # one reference swap: readers see the old or the new, never a mix
        self._version += 1

    @property
    def version(self) -> int:
        """Increases with every update: answers derived from the store can be cached per version.

        NB: not ``id(snapshot)`` — a freed snapshot's address is soon reused by a newer one.
        """
        return self._version

    @property
    def ready(self) -> bool:
        return self._snapshot is not None

    @property
    def refreshed_at(self) -> float | None:
        return self._snapshot.taken_at if self._snapshot else None

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def _values(self, metric: str) -> Mapping[ObjectRef, MetricPoint]:
        return self._snapshot.values.get(metric, {}) if self._snapshot else {}

    def point(self, metric: str, obj: ObjectRef) -> MetricPoint | None:
        return self._values(metric).get(obj)

    def values(self, metric: str) -> Mapping[ObjectRef, MetricPoint]:
        return self._values(metric)

    def points(self, metric: str, objs: Iterable[ObjectRef]) -> dict[ObjectRef, MetricPoint]:
        values = self._values(metric)
        return {o: p for o in objs if (p := values.get(o)) is not None}

    def objects(self, metric: str, kind: str | None = None) -> list[ObjectRef]:
        return sorted(o for o in self._values(metric) if kind is None or o.kind == kind)

    def parts(self, metric: str, obj: ObjectRef) -> list[LabelledPart]:
        if not self._snapshot:
            return []
        return self._snapshot.parts(metric, obj)
