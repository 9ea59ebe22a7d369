"""The disruption controller and the eviction checks of kube-apiserver v1.37, for gpuscale/sim (pure functions).

gpuscale/sim runs no kube-controller-manager, so SimKubeApi keeps each PodDisruptionBudget's ``status`` itself
with ``budget_status`` whenever a pod or a budget of its namespace changes — what the disruption controller
does within a second on a real cluster (observedGeneration, expectedPods, desiredHealthy, currentHealthy,
disruptionsAllowed and the ``DisruptionAllowed`` condition). ``eviction_verdict`` is the eviction
subresource's decision for one pod (pkg/registry/core/pod/storage/eviction.go): which pods may ignore their
budgets, when an unready pod may go, and the 429 cause kube-apiserver words from the budget's status.

The arithmetic is gpuscale.disruption's (the product's drain planner uses the same); it counts the pods a
budget selects as its expected pods — kube's controller asks the pods' controllers for their scale instead,
which is the same number for a settled workload.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.disruption import is_ready, pdb_selects

__all__ = ["EvictionVerdict", "budget_status", "can_ignore_budgets", "eviction_verdict"]


def _desired_healthy(spec: Mapping[str, Any], expected: int) -> int:
    def scaled(value: Any) -> int:
        if isinstance(value, str) and value.endswith("%"):
            return math.ceil(float(value[:-1]) * expected / 100.0)
        return int(value)

    if spec.get("minAvailable") is not None:
        return scaled(spec["minAvailable"])
    if spec.get("maxUnavailable") is not None:
        return max(0, expected - scaled(spec["maxUnavailable"]))
    return expected


def budget_status(
    pdb: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], *, now: str, previous: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``status`` the disruption controller writes for ``pdb`` given the pods of its namespace; the
    condition's lastTransitionTime is kept from ``previous`` unless the condition changes."""
    selected = [p for p in pods if pdb_selects(pdb, p)]
    expected = len(selected)
    healthy = sum(1 for p in selected if is_ready(p) and not (p.get("metadata") or {}).get("deletionTimestamp"))
    desired = _desired_healthy(pdb.get("spec") or {}, expected)
    allowed = max(0, healthy - desired)
    generation = (pdb.get("metadata") or {}).get("generation", 1)
    allowed_now = allowed > 0
    condition = {
        "type": "DisruptionAllowed",
        "status": "True" if allowed_now else "False",
        "observedGeneration": generation,
        "lastTransitionTime": now,
        "reason": "SufficientPods" if allowed_now else "InsufficientPods",
        "message": "",
    }
    for old in (previous or {}).get("conditions") or []:
        if old.get("type") == "DisruptionAllowed" and old.get("status") == condition["status"]:
            condition["lastTransitionTime"] = old.get("lastTransitionTime", now)
    return {
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [condition],
    }


def can_ignore_budgets(pod: Mapping[str, Any]) -> bool:
    """canIgnorePDB: a pod that is Pending, finished or already being deleted disrupts nothing by going."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Pending", "Succeeded", "Failed") or bool((pod.get("metadata") or {}).get("deletionTimestamp"))


@dataclass(frozen=True, slots=True)
class EvictionVerdict:
    """``allowed``, or the 429 kube-apiserver answers: its DisruptionBudget cause and its Retry-After (0: none)."""

    allowed: bool
    cause: str = ""
    retry_after_seconds: int = 0


def eviction_verdict(pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> EvictionVerdict:
    """May ``pod``, which ``pdb`` (its only budget) selects, be evicted now? From the budget's status, as the
    eviction subresource decides (an unready pod under an IfHealthyBudget policy may go while the budget is
    met; AlwaysAllow lets every unready pod go)."""
    name = pdb["metadata"]["name"]
    spec = pdb.get("spec") or {}
    status = pdb.get("status") or {}
    current, desired = int(status.get("currentHealthy") or 0), int(status.get("desiredHealthy") or 0)
    if not is_ready(pod):
        if spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return EvictionVerdict(True)
        if current >= desired > 0:
            return EvictionVerdict(True)
    if int(status.get("observedGeneration") or 0) < int((pdb.get("metadata") or {}).get("generation") or 1):
        return EvictionVerdict(False, f"The disruption budget {name} is still being processed by the server.", 10)
    if int(status.get("disruptionsAllowed") or 0) > 0:
        return EvictionVerdict(True)
    condition = next((c for c in status.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
    failed = condition is not None and condition.get("status") == "False" and condition.get("message")
    if failed and condition.get("reason") == "SyncFailed":
        why = condition["message"]
        cause = f"The disruption budget {name} does not allow evicting pods currently because it failed sync: {why}"
    elif current <= desired:
        cause = f"The disruption budget {name} needs {desired} healthy pods and has {current} currently"
    elif failed:
        why = f"({condition.get('reason')}): {condition['message']}"
        cause = f"The disruption budget {name} does not allow evicting pods currently {why}"
    else:
        cause = f"The disruption budget {name} does not allow evicting pods currently"
    return EvictionVerdict(False, cause)
