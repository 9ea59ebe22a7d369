"""JSON shapes of the metrics APIs, per version (k8s.io/metrics pkg/apis/*/types.go).

Field names and order as the Go structs serialise them: v1beta1 has ``metricName``/``selector``
(no omitempty, so ``null`` appears) and ``window``; v1beta2 nests ``metric{name, selector}`` and says
``windowSeconds``; external v1beta1 has ``metricName``/``metricLabels`` and ``window`` (not
``windowSeconds``). Values are canonical quantity strings, never bare floats.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from functools import lru_cache
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from gpuscale.metrics.store import MetricPoint
from gpuscale.model import DEPLOYMENT, RESOURCE_CLAIM, STATEFULSET, ObjectRef, format_quantity, rfc3339

CUSTOM_GROUP = "custom.metrics.k8s.io"
EXTERNAL_GROUP = "external.metrics.k8s.io"
CUSTOM_VERSIONS = ("v1beta1", "v1beta2")
EXTERNAL_VERSIONS = ("v1beta1",)

_API_VERSION = {DEPLOYMENT: "apps/v1", STATEFULSET: "apps/v1", RESOURCE_CLAIM: "resource.k8s.io/v1"}


quantity = lru_cache(maxsize=65536)(format_quantity)


def described_object(obj: ObjectRef) -> dict[str, str]:
    out = {"kind": obj.kind}
    if obj.namespace:
        out["namespace"] = obj.namespace
    out["name"] = obj.name
    # NB: custom-metrics-apiserver builds this as Group + "/" + Version, hence "/v1" for the core group.
    out["apiVersion"] = _API_VERSION.get(obj.kind, "/v1")
    return out


def _window(point: MetricPoint) -> int | None:
    return round(point.window_seconds) if point.window_seconds else None


def custom_item(version: str, metric: str, obj: ObjectRef, point: MetricPoint, selector: dict | None) -> dict:
    item: dict[str, Any] = {"describedObject": described_object(obj)}
    window = _window(point)
    if version == "v1beta1":
        item["metricName"] = metric
        item["timestamp"] = rfc3339(point.timestamp)
        if window is not None:
            item["window"] = window
        item["value"] = quantity(point.value)
        item["selector"] = selector
    else:
        item["metric"] = {"name": metric, "selector": selector}
        item["timestamp"] = rfc3339(point.timestamp)
        if window is not None:
            item["windowSeconds"] = window
        item["value"] = quantity(point.value)
    return item


def external_item(metric: str, labels: dict[str, str] | None, point: MetricPoint) -> dict:
    item: dict[str, Any] = {"metricName": metric, "metricLabels": labels or None, "timestamp": rfc3339(point.timestamp)}
    window = _window(point)
    if window is not None:
        item["window"] = window
    item["value"] = quantity(point.value)
    return item


def external_list(items: list[dict]) -> dict:
    return {
        "kind": "ExternalMetricValueList",
        "apiVersion": f"{EXTERNAL_GROUP}/v1beta1",
        "metadata": {},
        "items": items,
    }


@lru_cache(maxsize=4096)
def _timestamp_json(ts: float) -> str:
    return json.dumps(rfc3339(ts))


@lru_cache(maxsize=65536)
def _value_json(value: float) -> str:
    return json.dumps(quantity(value))


class _Memo(dict):
    """``fn(key)`` per key, computed on the first lookup (``__getitem__`` is C: a hit runs no Python), at most
    ``size`` kept (then it starts afresh)."""

    __slots__ = ("_fn", "_size")

    def __init__(self, fn: Callable[[Any], Any], size: int) -> None:
        super().__init__()
        self._fn = fn
        self._size = size

    def __missing__(self, key: Any) -> Any:
        value = self._fn(key)
        if len(self) >= self._size:
            self.clear()
        self[key] = value
        return value


_VALUE, _TIMESTAMP, _WINDOW = itemgetter(0), itemgetter(1), itemgetter(2)  # MetricPoint's fields, read in C


class ItemEncoder:
    """Custom-metrics list bodies, byte for byte what ``json.dumps`` of ``custom_item`` dicts gives.

    An item's JSON is a part fixed by (version, metric, object, echoed selector) — described object, names,
    selector — then the point's timestamp, window and value. The fixed parts are kept across snapshots
    (objects outlive refreshes), one table per (version, metric, selector), and per selection as a list; the
    point's fields are written from small tables keyed by their values. When all values of an answer share
    one timestamp and window — every value of one Prometheus query does — the part between head and value is
    written once per answer, so N values are N lookups in one table and one ``bytes.join``, run by C (``map``,
    ``zip``; no Python bytecode per value once the table knows the value). All parts are bytes (JSON text is
    ASCII here), so the join is the only copy of the body. Safe to share between the event loop and a refresh
    thread (dict reads and writes only); bounded by ``max_heads`` per table and ``max_tables``.
    """

    def __init__(self, *, max_heads: int = 200_000, max_tables: int = 16384) -> None:
        self._tables: dict[tuple[str, str, str], _Memo] = {}
        self._max_heads = max_heads
        self._max_tables = max_tables
        self._timestamps = _Memo(lambda ts: _timestamp_json(ts).encode(), 4096)
        self._windows = {
            version: _Memo(lambda w, key=key: (f'{key}{round(w)},"value":' if w else ',"value":').encode(), 1024)  # type: ignore[misc]
            for version, key in (("v1beta1", ',"window":'), ("v1beta2", ',"windowSeconds":'))
        }
        self._values: dict[bytes, _Memo] = {}  # what follows an item's value (its tail) → value → its text
        # (version, metric, echoed, id(objs)) → (objs, their heads): a selection's heads while it is the same list
        self._selections: dict[tuple[str, str, str, int], tuple[Collection[ObjectRef], list[bytes]]] = {}

    def _table(self, version: str, metric: str, echoed: str) -> _Memo:
        key = (version, metric, echoed)
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= self._max_tables:
                self._tables.clear()
            metric_json = json.dumps(metric)
            if version == "v1beta1":
                middle = f',"metricName":{metric_json},"timestamp":'
            else:
                middle = f',"metric":{{"name":{metric_json},"selector":{echoed}}},"timestamp":'

            def head(obj: ObjectRef) -> bytes:
                return (
                    f'{{"describedObject":{json.dumps(described_object(obj), separators=(",", ":"))}{middle}'.encode()
                )

            table = self._tables[key] = _Memo(head, self._max_heads)
        return table

    def _valued(self, tail: bytes) -> _Memo:
        table = self._values.get(tail)
        if table is None:
            if len(self._values) >= self._max_tables:
                self._values.clear()
            table = self._values[tail] = _Memo(lambda v: _value_json(v).encode() + tail, 65536)
        return table

    def _heads(self, version: str, metric: str, echoed: str, objs: Collection[ObjectRef]) -> list[bytes]:
        """Each object's head, every one but the first after the comma that ends the item before it."""
        # NB: the provider hands the same list for a selection until the watch cache changes: its heads are kept
        # with it (a lookup per object by ObjectRef was half the cost of a 100-pod answer), keyed by its id while
        # the entry holds the list itself (so the id is not reused meanwhile). One-object answers (by name) are
        # not kept: their list is new every time.
        key = (version, metric, echoed, id(objs))
        kept = self._selections.get(key)
        if kept is not None and kept[0] is objs:
            return kept[1]
        heads = list(map(self._table(version, metric, echoed).__getitem__, objs))
        heads[1:] = map(b",".__add__, heads[1:])
        if len(heads) > 1:
            if len(self._selections) >= self._max_tables:
                self._selections.clear()
            self._selections[key] = (objs, heads)
        return heads

    def custom(self, version: str, metric: str, items: list, selector: dict | None) -> bytes:
        """The body for these items (anything with ``obj`` and ``point``)."""
        echoed = json.dumps(selector, separators=(",", ":"))  # NB: None → null, as the Go struct has no omitempty
        return self.values(version, metric, [i.obj for i in items], [i.point for i in items], echoed)

    def values(
        self,
        version: str,
        metric: str,
        objs: Collection[ObjectRef],
        points: Collection[MetricPoint],
        echoed: str,
        *,
        stamps: Collection[float] | None = None,
    ) -> bytes:
        """The body for ``objs`` and their ``points`` (same order); ``echoed``: the selector's JSON (``null``);
        ``stamps``: the points' distinct timestamps, when the caller has them."""
        tail = f',"selector":{echoed}}}'.encode() if version == "v1beta1" else b"}"
        heads = self._heads(version, metric, echoed, objs)
        values = map(self._valued(tail).__getitem__, map(_VALUE, points))
        windows = self._windows[version]
        timestamps = set(stamps) if stamps is not None else set(map(_TIMESTAMP, points))
        spans = set(map(_WINDOW, points))
        if len(timestamps) == 1 and len(spans) == 1:
            middle = self._timestamps[timestamps.pop()] + windows[spans.pop()]
            pieces = zip(heads, repeat(middle), values)
        else:
            stamps = map(self._timestamps.__getitem__, map(_TIMESTAMP, points))
            windowed = map(windows.__getitem__, map(_WINDOW, points))
            pieces = zip(heads, stamps, windowed, values, strict=True)  # type: ignore[assignment]
        head = f'{{"kind":"MetricValueList","apiVersion":"{CUSTOM_GROUP}/{version}","metadata":{{}},"items":['
        return b"".join(chain((head.encode(),), chain.from_iterable(pieces), (b"]}",)))
