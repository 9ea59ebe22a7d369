"""The HPA controller's reading of metrics API responses, as a test client.

Mirrors kubernetes/kubernetes pkg/controller/podautoscaler/metrics/client.go: values are read with
Quantity.MilliValue() (ceil(q × 1000)); pod metrics are keyed by describedObject.name and an empty list
is an error; object metrics must return exactly one item; external metrics are summed. Written
independently of gpuscale's own quantity code so it can catch a wrong encoding.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


class HPAError(Exception):
    pass


def milli_value(quantity: str) -> int:
    if not isinstance(quantity, str):
        raise HPAError(f"quantity must be a string, got {quantity!r}")
    m = _QUANTITY.match(quantity)
    if not m:
        raise HPAError(f"quantities must match the regular expression: {quantity!r}")
    number, suffix = Decimal(m.group(1)), m.group(2) or ""
    value = number * Decimal(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else number * _SUFFIX[suffix]
    return math.ceil(value * 1000)


def pod_metrics(body: dict) -> dict[str, int]:
    """GetRawMetric: {pod name: milli value}; empty is an error."""
    if body.get("kind") != "MetricValueList":
        raise HPAError(f"unexpected kind {body.get('kind')!r}")
    if not body["items"]:
        raise HPAError("no metrics returned from custom metrics API")
    out: dict[str, int] = {}
    for item in body["items"]:
        out[item["describedObject"]["name"]] = milli_value(item["value"])
    return out


def object_metric(body: dict) -> int:
    """GetObjectMetric: exactly one item."""
    if len(body["items"]) != 1:
        raise HPAError(f"unable to get metric: returned {len(body['items'])} results when we asked for exactly one")
    return milli_value(body["items"][0]["value"])


def external_metric(body: dict) -> int:
    """GetExternalMetric: the sum of every item's MilliValue; empty is an error."""
    if body.get("kind") != "ExternalMetricValueList":
        raise HPAError(f"unexpected kind {body.get('kind')!r}")
    if not body["items"]:
        raise HPAError("no metrics returned from external metrics API")
    return sum(milli_value(i["value"]) for i in body["items"])


def usage_ratio(metrics: dict[str, int], target_milli: int) -> float:
    """GetMetricUsageRatio: mean over every returned item / target."""
    return sum(metrics.values()) / len(metrics) / target_milli
