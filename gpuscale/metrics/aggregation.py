"""Aggregation: series values → one value per (metric, object), once per refresh.

For every catalogue metric, each series value is attributed to a device and folded into that device's
Partial; each device's Partial is then merged into its pod, its namespace and its node, and kept with
its labels so metric label selectors can be applied at request time by merging the selected ones.
Values older than the metric's max-age are left out when fresher ones exist for the same object; when
only stale ones exist the object gets a stale marker, so readers answer 503 instead of serving an old
number as new.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from gpuscale.metrics.attribution import Device
from gpuscale.metrics.catalogue import Catalogue, MetricDefinition, Term
from gpuscale.metrics.store import LabelledPart, MetricPoint, Partial, Snapshot
from gpuscale.model import ObjectRef
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


Attributed = list[tuple[SeriesValue, Device]]


def _fold(
    metric: MetricDefinition, terms: list[Attributed | None], *, now: float, max_age: float
) -> dict[int, tuple[Device, Partial]]:
    """Fold each attributed series of the metric's terms into its device's Partial (one per Device object)."""
    devices: dict[int, tuple[Device, Partial]] = {}
    oldest_fresh = now - max_age
    for side, attributed in enumerate(terms):
        for value, device in attributed or ():
            if not math.isfinite(value.value):
                continue  # NaN/Inf from an exporter never becomes a number
            entry = devices.get(id(device))
            if entry is None:
                entry = devices[id(device)] = (device, Partial())
            partial = entry[1]
            if value.timestamp < oldest_fresh:
                partial.stale_newest = max(partial.stale_newest, value.timestamp)
                continue
            if value.timestamp < partial.oldest:
                partial.oldest = value.timestamp
            if value.window_seconds is not None:
                partial.window_seconds = max(partial.window_seconds or 0.0, value.window_seconds)
            if side == 0:
                partial.numerator += value.value
                if value.value > partial.maximum:
                    partial.maximum = value.value
                partial.has_numerator = True
                partial.devices = 1  # a mean counts devices, not series
            else:
                partial.denominator += value.value
                partial.has_denominator = True
    return devices


class _Membership:
    """Which devices count towards which object, as index arrays shared by every metric of a refresh.

    ``pairs`` are (object, device) memberships grouped by object (``starts`` opens each object's run),
    so per-object sums are one ``np.add.reduceat``. ``first_of_physical`` marks, per pair, the first
    device of its physical GPU within the object (MIG instances repeat the parent GPU's power).
    """

    def __init__(self, members: dict[ObjectRef, list[Device]], devices: list[Device]) -> None:
        index = {id(d): i for i, d in enumerate(devices)}
        self.objects = list(members)
        pair_devices: list[int] = []
        starts: list[int] = []
        first: list[bool] = []
        for obj_devices in members.values():
            starts.append(len(pair_devices))
            seen: set[tuple[str, ...]] = set()
            for device in obj_devices:
                pair_devices.append(index[id(device)])
                first.append(device.physical not in seen)
                seen.add(device.physical)
        self.index = index
        self.pair_devices = np.asarray(pair_devices, dtype=np.intp)
        self.starts = np.asarray(starts, dtype=np.intp)
        self.first_of_physical = np.asarray(first, dtype=bool)
        self.size = len(devices)


def build_snapshot(catalogue: Catalogue, read: Reader, attribute: Attribute, *, now: float) -> Snapshot:
    """Run every catalogue metric over the source's current values. Pure given ``read``/``attribute``.

    Per metric, series are folded into one Partial per device (Python, one pass over the series); then
    every object's total is the sum of its member devices' partials, computed for all objects at once
    with numpy over a membership built once per refresh and shared by all metrics (the Attributor hands
    out one Device object per series identity). See benchmarks/bench_refresh.py for the cost at 10,000 GPUs.
    """
    snapshot = Snapshot(taken_at=now)
    per_metric: list[tuple[MetricDefinition, dict[int, tuple[Device, Partial]]]] = []
    all_devices: dict[int, Device] = {}
    # NB: several metrics read the same term (FB_USED feeds two); read and attribute each term once.
    attributed: dict[TermQuery, Attributed] = {}
    for metric in catalogue:
        terms: list[Attributed | None] = []
        for term in metric.terms:
            if term is None:
                terms.append(None)
                continue
            query = term_query(term, window_seconds=catalogue.window(metric))
            if query not in attributed:
                values = read(query)
                attributed[query] = [(v, attribute(v.name, v.labels, v.target)) for v in values]
                snapshot.series_count += len(values)
            terms.append(attributed[query])
        devices = _fold(metric, terms, now=now, max_age=catalogue.max_age(metric))
        for key, (device, _) in devices.items():
            all_devices[key] = device
        per_metric.append((metric, devices))
    members: dict[ObjectRef, list[Device]] = {}
    for device in all_devices.values():
        for obj in device.objects:
            members.setdefault(obj, []).append(device)
    snapshot.members = members
    membership = _Membership(members, list(all_devices.values()))
    for metric, devices in per_metric:
        partials = {key: partial for key, (_, partial) in devices.items()}
        snapshot.device_partials[metric.name] = partials
        snapshot.values[metric.name] = _totals(metric, membership, partials) if members else {}
    snapshot.device_count = len({d.physical for d in all_devices.values() if d.physical[0] == "gpu"})
    return snapshot


def _totals(metric: MetricDefinition, m: _Membership, partials: dict[int, Partial]) -> dict[ObjectRef, MetricPoint]:
    """Each object's value: the sum of its member devices' partials, finished per the catalogue."""
    n = m.size
    present = np.zeros(n, dtype=bool)
    num, den, count = np.zeros(n), np.zeros(n), np.zeros(n)
    maximum, stale = np.full(n, -np.inf), np.full(n, -np.inf)
    oldest, window = np.full(n, np.inf), np.full(n, -np.inf)
    has_num, has_den = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    idx = np.fromiter((m.index[k] for k in partials), dtype=np.intp, count=len(partials))
    ps = list(partials.values())
    present[idx] = True
    num[idx] = [p.numerator for p in ps]
    den[idx] = [p.denominator for p in ps]
    count[idx] = [p.devices for p in ps]
    maximum[idx] = [p.maximum for p in ps]
    stale[idx] = [p.stale_newest for p in ps]
    oldest[idx] = [p.oldest for p in ps]
    window[idx] = [p.window_seconds if p.window_seconds is not None else -np.inf for p in ps]
    has_num[idx] = [p.has_numerator for p in ps]
    has_den[idx] = [p.has_denominator for p in ps]

    d = m.pair_devices
    use = present[d] & (m.first_of_physical if metric.dedupe == "physical_gpu" else True)
    s = m.starts

    def total(values: np.ndarray, ufunc: np.ufunc, neutral: float) -> np.ndarray:
        return ufunc.reduceat(np.where(use, values[d], neutral), s)

    found = np.logical_or.reduceat(use, s)
    t_num, t_den, t_count = total(num, np.add, 0.0), total(den, np.add, 0.0), total(count, np.add, 0.0)
    t_has_num = np.logical_or.reduceat(use & has_num[d], s)
    t_has_den = np.logical_or.reduceat(use & has_den[d], s)
    t_oldest, t_window = total(oldest, np.minimum, np.inf), total(window, np.maximum, -np.inf)
    t_stale = total(stale, np.maximum, -np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric.aggregate == "mean":
            value = t_num / t_count
        elif metric.aggregate == "sum":
            value = t_num.copy()
        elif metric.aggregate == "max":
            value = total(maximum, np.maximum, -np.inf)
        else:
            floor = metric.denominator.floor if metric.denominator else 0.0
            denominator = np.maximum(t_den, floor)
            value = np.where(denominator > 0, t_num / denominator, np.nan)
        value = value * metric.scale
    complete = found & t_has_num & (t_has_den if metric.aggregate == "ratio" else True)
    out: dict[ObjectRef, MetricPoint] = {}
    objects = m.objects
    # NB: NaN/Inf (e.g. a ratio with a zero denominator) never becomes a value: the reader sees "no value".
    for i in np.flatnonzero(complete & np.isfinite(value)).tolist():
        w = t_window[i]
        out[objects[i]] = MetricPoint(float(value[i]), float(t_oldest[i]), float(w) if w > -np.inf else None)
    for i in np.flatnonzero(found & ~complete & (t_stale > -np.inf)).tolist():
        out[objects[i]] = MetricPoint(math.nan, float(t_stale[i]), None, True)
    return out


def finish_parts(metric: MetricDefinition, parts: list[LabelledPart]) -> MetricPoint | None:
    """Merge the partials a request's metric label selector chose and finish them into one value."""
    merged = Partial()
    seen: set[tuple[str, ...]] = set()
    for part in parts:
        if metric.dedupe == "physical_gpu":
            if part.physical in seen:
                continue
            seen.add(part.physical)
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
