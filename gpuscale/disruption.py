"""PodDisruptionBudget arithmetic, as Kubernetes' disruption controller computes ``status.disruptionsAllowed``.

Shared by the two places that need the same answer: the simulated API server's Eviction subresource (which has no
disruption controller to keep a PDB's status) and the controller's drain planner (which checks that a gang's pods
can all be evicted before evicting any).

    expected  = pods the selector matches (standing in for the controllers' scale, which the rule uses when a
                PDB names a workload's pods)
    healthy   = those that are Ready and not being deleted
    desired   = minAvailable (an int, or a percentage of expected, rounded up)
                or expected − maxUnavailable (an int, or a percentage of expected, rounded up)
    allowed   = max(0, healthy − desired)

An empty selector (``{}``) selects every pod of the namespace (policy/v1); a missing selector selects none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from gpuscale.errors import SelectorError
from gpuscale.selectors import LabelSelector

__all__ = ["disruptions_allowed", "is_ready", "pdb_selects"]


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Ready and not being deleted (what the disruption controller counts as healthy)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pdb_selects(pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    pdb_meta, pod_meta = pdb.get("metadata") or {}, pod.get("metadata") or {}
    if pdb_meta.get("namespace") != pod_meta.get("namespace"):
        return False
    raw = (pdb.get("spec") or {}).get("selector")
    if raw is None:
        return False
    try:
        return LabelSelector.from_dict(raw).matches(pod_meta.get("labels") or {})
    except SelectorError:
        return False


def _scaled(value: Any, expected: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        try:
            return math.ceil(float(value[:-1]) * expected / 100.0)
        except ValueError:
            return expected
    try:
        return int(value)
    except (TypeError, ValueError):
        return expected


def disruptions_allowed(pdb: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> int:
    """How many of the PDB's pods may be evicted now; ``pods`` may hold others (they are filtered)."""
    selected = [p for p in pods if pdb_selects(pdb, p)]
    expected = len(selected)
    healthy = sum(1 for p in selected if is_ready(p))
    spec = pdb.get("spec") or {}
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected)
    elif spec.get("maxUnavailable") is not None:
        desired = expected - _scaled(spec["maxUnavailable"], expected)
    else:
        desired = expected  # NB: neither set is rejected by validation; treat as "no disruption"
    return max(0, healthy - desired)
