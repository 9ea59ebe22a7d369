"""JSON shapes of the metrics APIs, per version (k8s.io/metrics pkg/apis/*/types.go).

Field names and order as the Go structs serialise them: v1beta1 has ``metricName``/``selector``
(no omitempty, so ``null`` appears) and ``window``; v1beta2 nests ``metric{name, selector}`` and says
``windowSeconds``; external v1beta1 has ``metricName``/``metricLabels`` and ``window`` (not
``windowSeconds``). Values are canonical quantity strings, never bare floats.
"""

from __future__ import annotations

import json
from functools import lru_cache
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


class ItemEncoder:
    """Encoded list items, memoised per (version, metric, object, point, echoed selector).

    Points are immutable and replaced on every refresh, so an item's JSON never changes while its
    point lives; ``reset`` drops the memo when the store moves to a new snapshot.
    """

    def __init__(self) -> None:
        self._memo: dict[tuple, str] = {}
        self.token: object = None  # the snapshot the memo belongs to

    def reset(self) -> None:
        self._memo.clear()

    def custom(self, version: str, metric: str, items: list, selector: dict | None) -> bytes:
        echoed = json.dumps(selector, sort_keys=True) if selector else None
        memo = self._memo
        parts = []
        for i in items:
            key = (version, metric, i.obj, i.point, echoed)
            text = memo.get(key)
            if text is None:
                text = memo[key] = json.dumps(
                    custom_item(version, metric, i.obj, i.point, selector), separators=(",", ":")
                )
            parts.append(text)
        head = f'{{"kind":"MetricValueList","apiVersion":"{CUSTOM_GROUP}/{version}","metadata":{{}},"items":['
        return (head + ",".join(parts) + "]}").encode()
