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
from collections.abc import Callable, Iterator
from itertools import compress, repeat

import numpy as np

from gpuscale.metrics.attribution import Device
from gpuscale.metrics.catalogue import Catalogue, MetricDefinition, Term
from gpuscale.metrics.series import SeriesValue, TermQuery
from gpuscale.metrics.store import DeviceColumns, LabelledPart, MetricPoint, Partial, Snapshot
from gpuscale.model import ObjectRef

Reader = Callable[[TermQuery], list[SeriesValue]]
Attribute = Callable[[str, dict[str, str], str], Device]


def term_query(term: Term, *, window_seconds: float) -> TermQuery:
    return TermQuery(
        series=tuple(term.series),
        input=term.input,
        window_seconds=window_seconds,
        match=tuple(sorted(term.match.items())),
        promql=term.prometheus,
        quantile=term.quantile,
    )


def queries(catalogue: Catalogue) -> list[TermQuery]:
    """Every distinct term query the catalogue needs (what a source must be able to answer)."""
    out: dict[TermQuery, None] = {}
    for metric in catalogue:
        for term in metric.terms:
            if term is not None:
                out[term_query(term, window_seconds=catalogue.window(metric))] = None
    return list(out)


class _Columns:
    """One term's finite series values as arrays: device index, value, sample time, window (NaN: none)."""

    def __init__(
        self, values: list[SeriesValue], attribute: Attribute, index: dict[int, int], devices: list[Device]
    ) -> None:
        # NB: column-wise (zip, map, numpy) rather than one Python loop over the series: this runs for each
        # of ~100,000 series per refresh at 10,000 GPUs, and the attribute call is then the only per-series
        # Python frame left.
        names, labels, val, ts, targets, win = zip(*values, strict=True) if values else ((),) * 6
        self.val = np.array(val, dtype=float)
        finite = np.isfinite(self.val)
        if not finite.all():  # NaN/Inf from an exporter never becomes a number, nor a device
            keep = finite.tolist()
            names, labels, ts, targets, win = (tuple(compress(c, keep)) for c in (names, labels, ts, targets, win))
            self.val = self.val[finite]
        found = list(map(attribute, names, labels, targets))
        ids = list(map(id, found))
        # New devices are numbered in order of first appearance, as the series come.
        for key, device in dict(zip(ids, found, strict=True)).items():
            if key not in index:
                index[key] = len(devices)
                devices.append(device)
        self.dev = np.fromiter(map(index.__getitem__, ids), dtype=np.intp, count=len(ids))
        self.ts = np.array(ts, dtype=float)
        self.win = np.array(win, dtype=float)  # NB: numpy reads None (a gauge's window) as NaN


def _device_columns(
    terms: list[_Columns | None], n: int, index: dict[int, int], *, oldest_fresh: float
) -> DeviceColumns:
    """Fold a metric's terms into per-device sums (numerator = term 0, denominator = term 1)."""
    c = {
        "numerator": np.zeros(n),
        "denominator": np.zeros(n),
        "devices": np.zeros(n),
        "maximum": np.full(n, -np.inf),
        "has_numerator": np.zeros(n, dtype=bool),
        "has_denominator": np.zeros(n, dtype=bool),
        "oldest": np.full(n, np.inf),
        "window_seconds": np.full(n, -np.inf),
        "stale_newest": np.full(n, -np.inf),
    }
    present = np.zeros(n, dtype=bool)
    for side, cols in enumerate(terms):
        if cols is None or not len(cols.dev):
            continue
        fresh = cols.ts >= oldest_fresh
        dev, val = cols.dev[fresh], cols.val[fresh]
        present[cols.dev] = True
        np.maximum.at(c["stale_newest"], cols.dev[~fresh], cols.ts[~fresh])
        np.minimum.at(c["oldest"], dev, cols.ts[fresh])
        np.maximum.at(c["window_seconds"], dev, np.nan_to_num(cols.win[fresh], nan=-np.inf))
        if side == 0:
            c["numerator"] += np.bincount(dev, weights=val, minlength=n)
            np.maximum.at(c["maximum"], dev, val)
            c["has_numerator"][dev] = True
        else:
            c["denominator"] += np.bincount(dev, weights=val, minlength=n)
            c["has_denominator"][dev] = True
    c["devices"] = c["has_numerator"].astype(float)  # a mean counts devices, not series
    return DeviceColumns(index, present, c)


class _Membership:
    """Which devices count towards which object, as index arrays shared by every metric of a refresh.

    ``pair_devices`` are (object, device) memberships grouped by object (``starts`` opens each object's
    run), so per-object sums are one ``np.add.reduceat``. ``pair_keys`` number each (object, physical GPU)
    so metrics counted once per physical GPU (MIG instances repeat the parent's power) can keep one
    device per key — chosen per metric among the devices that have a fresh value for it.
    """

    def __init__(self, members: dict[ObjectRef, list[Device]], index: dict[int, int], devices: list[Device]) -> None:
        self.objects = list(members)
        sizes = [len(obj_devices) for obj_devices in members.values()]
        self.pair_devices = np.fromiter(
            (index[id(device)] for obj_devices in members.values() for device in obj_devices),
            dtype=np.intp,
            count=sum(sizes),
        )
        self.starts = np.cumsum([0, *sizes[:-1]], dtype=np.intp) if sizes else np.zeros(0, dtype=np.intp)
        # NB: one physical number per device (not per pair): each device belongs to up to three objects.
        physical_ids: dict[tuple[str, ...], int] = {}
        numbers = (physical_ids.setdefault(d.physical, len(physical_ids)) for d in devices)
        physical = np.fromiter(numbers, dtype=np.int64, count=len(devices))
        objects = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        self.pair_keys = objects * (1 << 32) + physical[self.pair_devices]

    def one_per_physical(self, candidate: np.ndarray) -> np.ndarray:
        """Of the candidate pairs, the first per (object, physical GPU)."""
        chosen = np.zeros(len(candidate), dtype=bool)
        idx = np.flatnonzero(candidate)
        if len(idx):
            _, first = np.unique(self.pair_keys[idx], return_index=True)
            chosen[idx[first]] = True
        return chosen


def build_snapshot(catalogue: Catalogue, read: Reader, attribute: Attribute, *, now: float) -> Snapshot:
    """Run every catalogue metric over the source's current values. Pure given ``read``/``attribute``.

    Each distinct term is read and attributed once into arrays (column-wise, see _Columns); per
    metric, numpy folds them into per-device sums, and every object's total is a ``reduceat`` over a
    device membership built once per refresh and shared by all metrics (the Attributor hands out one
    Device object per series identity). See benchmarks/bench_refresh.py for the cost at 10,000 GPUs.
    """
    snapshot = Snapshot(taken_at=now)
    index: dict[int, int] = {}
    devices: list[Device] = []
    # NB: several metrics read the same term (FB_USED feeds two); read and attribute each term once.
    columns: dict[TermQuery, _Columns] = {}
    per_metric: list[tuple[MetricDefinition, list[_Columns | None]]] = []
    for metric in catalogue:
        terms: list[_Columns | None] = []
        for term in metric.terms:
            if term is None:
                terms.append(None)
                continue
            query = term_query(term, window_seconds=catalogue.window(metric))
            if query not in columns:
                values = read(query)
                snapshot.series_count += len(values)
                columns[query] = _Columns(values, attribute, index, devices)
            terms.append(columns[query])
        per_metric.append((metric, terms))
    members: dict[ObjectRef, list[Device]] = {}
    for device in devices:
        for obj in device.objects:
            members.setdefault(obj, []).append(device)
    snapshot.members = members
    membership = _Membership(members, index, devices)
    for metric, terms in per_metric:
        if all(cols is None or not len(cols.dev) for cols in terms):
            # NB: no series at all (e.g. the LLM servers' names in a Triton fleet): nothing to fold, nothing stale.
            snapshot.values[metric.name] = {}
            continue
        oldest_fresh = now - catalogue.max_age(metric)
        device_columns = _device_columns(terms, len(devices), index, oldest_fresh=oldest_fresh)
        snapshot.device_partials[metric.name] = device_columns
        snapshot.values[metric.name] = _totals(metric, membership, device_columns) if members else {}
    snapshot.device_count = len({d.physical for d in devices if d.physical[0] == "gpu"})
    return snapshot


def _totals(metric: MetricDefinition, m: _Membership, columns: DeviceColumns) -> dict[ObjectRef, MetricPoint]:
    """Each object's value: the sum of its member devices' partials, finished per the catalogue."""
    c = columns.columns
    d = m.pair_devices
    use = columns.present[d]
    if metric.dedupe == "physical_gpu":
        # NB: the representative of a physical GPU must have a fresh value for this metric; devices without
        # one still pass on their stale marker (their sums are zero).
        fresh = use & c["has_numerator"][d]
        use = (use & ~fresh) | m.one_per_physical(fresh)
    s = m.starts

    def total(values: np.ndarray, ufunc: np.ufunc, neutral: float) -> np.ndarray:
        return ufunc.reduceat(np.where(use, values[d], neutral), s)

    found = np.logical_or.reduceat(use, s)
    t_num, t_den, t_count = (total(c[k], np.add, 0.0) for k in ("numerator", "denominator", "devices"))
    t_has_num = np.logical_or.reduceat(use & c["has_numerator"][d], s)
    t_has_den = np.logical_or.reduceat(use & c["has_denominator"][d], s)
    t_oldest = total(c["oldest"], np.minimum, np.inf)
    t_window = total(c["window_seconds"], np.maximum, -np.inf)
    t_stale = total(c["stale_newest"], np.maximum, -np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric.aggregate == "mean":
            value = t_num / t_count
        elif metric.aggregate == "sum":
            value = t_num.copy()
        elif metric.aggregate == "max":
            value = total(c["maximum"], np.maximum, -np.inf)
        else:
            floor = metric.denominator.floor if metric.denominator else 0.0
            denominator = np.maximum(t_den, floor)
            value = np.where(denominator > 0, t_num / denominator, np.nan)
        value = value * metric.scale
    complete = found & t_has_num & (t_has_den if metric.aggregate == "ratio" else True)
    objects = m.objects
    # NB: NaN/Inf (e.g. a ratio with a zero denominator) never becomes a value: the reader sees "no value".
    good = np.flatnonzero(complete & np.isfinite(value))
    windows = [w if w > -math.inf else None for w in t_window[good].tolist()]
    points = _points(value[good], t_oldest[good], windows)
    out = dict(zip(map(objects.__getitem__, good.tolist()), points, strict=True))
    for i in np.flatnonzero(found & ~complete & (t_stale > -np.inf)).tolist():
        out[objects[i]] = MetricPoint(math.nan, float(t_stale[i]), None, True)
    return out


def _points(values: np.ndarray, timestamps: np.ndarray, windows: list[float | None]) -> Iterator[MetricPoint]:
    """Fresh MetricPoints, built without a Python frame each (~55,000 per refresh at 10,000 GPUs).

    NB: ``tuple.__new__`` is what MetricPoint's generated ``__new__`` calls after filling in the defaults,
    so every field is given here.
    """
    fields = zip(values.tolist(), timestamps.tolist(), windows, repeat(False))
    return map(tuple.__new__, repeat(MetricPoint), fields)


def finish_parts(metric: MetricDefinition, parts: list[LabelledPart]) -> MetricPoint | None:
    """Merge the partials a request's metric label selector chose and finish them into one value."""
    merged = Partial()
    seen: set[tuple[str, ...]] = set()
    for part in parts:
        if metric.dedupe == "physical_gpu" and part.partial.has_numerator:
            # A physical GPU counts once, through a device with a fresh value (MIG instances repeat it).
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
