"""Core value types shared by every layer: object references and Kubernetes quantities.

Kept free of I/O and of any layer above ``metrics/`` so sources, store and consumers can all import it.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from functools import lru_cache
from typing import NamedTuple

# Kinds the store indexes values by. Deployments and StatefulSets are derived (mean over their pods).
POD = "Pod"
NODE = "Node"
NAMESPACE = "Namespace"
DEPLOYMENT = "Deployment"
RESOURCE_CLAIM = "ResourceClaim"  # resource.k8s.io: a DRA claim a GPU is allocated through
STATEFULSET = "StatefulSet"


class ObjectRef(NamedTuple):
    """A Kubernetes object a metric value describes. ``namespace`` is None for cluster-scoped kinds.

    A NamedTuple (C-level hash and equality): the store's dictionaries are keyed by these, hundreds of
    thousands of lookups per refresh on a large cluster.
    """

    kind: str
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        return (
            f"{self.kind.lower()} {self.namespace}/{self.name}"
            if self.namespace
            else f"{self.kind.lower()} {self.name}"
        )


def pod(namespace: str, name: str) -> ObjectRef:
    return ObjectRef(POD, name, namespace)


def node(name: str) -> ObjectRef:
    return ObjectRef(NODE, name)


def namespace(name: str) -> ObjectRef:
    return ObjectRef(NAMESPACE, name)


# --- quantities -------------------------------------------------------------------------------------

_MAX_MILLI = 2**63 - 1
_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")
_MILLI = Decimal(1000)
# NB: the largest float whose milli value fits int64 (9223372036854774.0; the float above it, ...776, is past
# 2⁶³ / 1000), so one comparison decides whether a value can be served, in Python or numpy alike.
QUANTITY_MAX = math.nextafter(2**63 / 1000, 0.0)


def representable(value: float) -> bool:
    """Whether ``value`` can be served as a Kubernetes quantity (``milli_value`` would not raise); False for NaN."""
    return -QUANTITY_MAX <= value <= QUANTITY_MAX


class QuantityError(ValueError):
    """A value cannot be represented as a Kubernetes quantity (NaN, infinite, or out of int64 range)."""


def milli_value(value: float) -> int:
    """``ceil(value * 1000)`` as an int, like apimachinery's ``Quantity.MilliValue()``.

    Raises QuantityError for NaN/Inf and magnitudes beyond int64 — a value we refuse to serve rather
    than wrap around (prometheus-adapter #280 served NaN as -9223372036854775808).
    """
    if not math.isfinite(value):
        raise QuantityError(f"{value!r} is not a finite number")
    # NB: go through repr() so 87.5 stays 87.5 and 0.1 stays 0.1 (not 0.1000000000000000055…).
    milli = (Decimal(repr(value)) * _MILLI).to_integral_value(rounding=ROUND_CEILING)
    if abs(milli) > _MAX_MILLI:
        raise QuantityError(f"{value!r} is out of range for a quantity")
    return int(milli)


def format_quantity(value: float) -> str:
    """Canonical DecimalSI quantity string: 87.5 → "87500m", 87 → "87", 1.5e6 → "1500k".

    Rounds up to milli precision (Kubernetes allows at most 3 decimals) and uses the largest suffix that
    loses no precision, as ``Quantity.String()`` does.
    """
    milli = milli_value(value)
    if milli % 1000:
        return f"{milli}m"
    units = milli // 1000
    exponent = 0
    while units and units % 1000 == 0 and exponent < len(_DECIMAL_SUFFIXES) - 1:
        units //= 1000
        exponent += 1
    return f"{units}{_DECIMAL_SUFFIXES[exponent]}"


def parse_duration(text: str | int | float) -> float:
    """Parse a duration like "5s", "1m30s", "250ms", "2h", "7d" or a bare number of seconds → seconds.

    Raises ValueError naming the text when it does not parse.
    """
    if isinstance(text, int | float):
        if text < 0 or not math.isfinite(text):
            raise ValueError(f"invalid duration {text!r}")
        return float(text)
    s = text.strip()
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    total = 0.0
    i = 0
    if not s:
        raise ValueError("empty duration")
    try:
        return float(s)
    except ValueError:
        pass
    while i < len(s):
        j = i
        while j < len(s) and (s[j].isdigit() or s[j] == "."):
            j += 1
        if j == i:
            raise ValueError(f"invalid duration {text!r}: expected a number at {s[i:]!r}")
        number = float(s[i:j])
        k = j
        while k < len(s) and s[k].isalpha():
            k += 1
        unit = s[j:k]
        if unit not in units:
            raise ValueError(f"invalid duration {text!r}: unknown unit {unit!r} (use ms, s, m, h or d)")
        total += number * units[unit]
        i = k
    return total


def format_duration(seconds: float) -> str:
    """Seconds → the way durations are written on the command line: 5.0 → "5s", 90 → "1m30s", 0.25 → "250ms"."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    out = ""
    rest = seconds
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if rest >= size:
            whole = int(rest // size)
            out += f"{whole}{unit}"
            rest -= whole * size
    if rest or not out:
        out += f"{rest:g}s"
    return out


_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?$")
_SUFFIX_VALUE = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_SUFFIX_VALUE |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity string ("87500m", "1500k", "12Gi") → float, the inverse of ``format_quantity``.

    Raises ValueError naming the text when it is not a quantity.
    """
    m = _QUANTITY.match(text.strip())
    if m is None:
        raise ValueError(f"not a quantity: {text!r}")
    suffix = m.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return float(m.group(1)) * 10.0 ** int(suffix[1:])
    return float(m.group(1)) * _SUFFIX_VALUE.get(suffix, 1.0)


@lru_cache(maxsize=4096)
def rfc3339(ts: float) -> str:
    """Seconds since the epoch → ``2026-01-05T08:00:00Z`` (UTC, whole seconds, as Kubernetes writes times).

    Cached: every value of one refresh shares a handful of sample times.
    """
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
