"""Draining a node through the Eviction API: which pods to evict, gangs together or not at all. Pure.

As ``kubectl drain`` does: DaemonSet pods and mirror (static) pods are skipped, finished pods too; every other
pod on the node is evicted through ``pods/eviction``, so PodDisruptionBudgets are respected by the API server.

Gangs: a pod that belongs to a gang (a pod-group label or annotation, ``DrainPolicy.gang_keys``) is evicted with
every running pod of its gang, on any node — a gang that lost one member is broken anyway, and holding the others
only wastes their GPUs. Before evicting any of a gang, the PDBs covering its pods are checked (see
``gpuscale.disruption``): if one would refuse, none of the gang is evicted this reconcile, and a Warning Event
``GangDrainHeld`` on the node says which budget (once: the Events cache holds this controller's own Events).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.controller.events import already_reported
from gpuscale.controller.writes import ClusterView, Emit, Evict, ObjectKey, Write
from gpuscale.disruption import disruptions_allowed, pdb_selects

__all__ = ["DrainPolicy", "gang_of", "plan_drain"]

DEFAULT_GANG_KEYS = (
    "scheduling.x-k8s.io/pod-group",  # coscheduling (a label)
    "scheduling.k8s.io/group-name",  # Volcano (an annotation)
    "scheduling.volcano.sh/group-name",
    "kueue.x-k8s.io/workload",
)


@dataclass(frozen=True, slots=True)
class DrainPolicy:
    """``gang_keys``: label or annotation keys whose value names a pod's gang (first present wins)."""

    gang_keys: tuple[str, ...] = DEFAULT_GANG_KEYS


def gang_of(pod: Mapping[str, Any], keys: tuple[str, ...] = DEFAULT_GANG_KEYS) -> tuple[str, str] | None:
    """(namespace, gang name) of a pod, or None."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    for key in keys:
        value = labels.get(key) or annotations.get(key)
        if value:
            return meta.get("namespace", ""), value
    return None


def _evictable(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    return not any(
        ref.get("kind") == "DaemonSet" and ref.get("controller") for ref in meta.get("ownerReferences") or []
    )


def plan_drain(view: ClusterView, node: str, *, policy: DrainPolicy, why: str) -> list[Write]:
    """Evictions emptying ``node`` (gangs whole, or held back whole when a PDB would refuse part of one)."""
    pods = view.objects("v1", "Pod")
    on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node and _evictable(p)]
    if not on_node:
        return []
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    for pod in on_node:
        gang = gang_of(pod, policy.gang_keys)
        if gang is None:
            groups[("pod", pod["metadata"].get("namespace"), pod["metadata"]["name"])] = [pod]
        elif ("gang", *gang) not in groups:
            groups[("gang", *gang)] = [p for p in pods if gang_of(p, policy.gang_keys) == gang and _evictable(p)]
    pdbs = view.objects("policy/v1", "PodDisruptionBudget")
    writes: list[Write] = []
    for key, members in groups.items():
        blocking = _blocking_budget(members, pdbs, pods) if key[0] == "gang" else None
        if blocking is not None:
            # NB: all or nothing; a later reconcile tries again. Said once (an Event on the node).
            regarding = ObjectKey("v1", "Node", node)
            message = (
                f"gang {key[1]}/{key[2]} ({len(members)} pods) not drained: PodDisruptionBudget {blocking} "
                "allows fewer disruptions than the gang has pods"
            )
            if not already_reported(view, regarding, "GangDrainHeld", message):
                writes.append(Emit(regarding, "Warning", "GangDrainHeld", message))
            continue
        for pod in members:
            meta = pod["metadata"]
            gang = f" (gang {key[1]}/{key[2]})" if key[0] == "gang" else ""
            writes.append(Evict(meta.get("namespace", ""), meta["name"], f"{why}{gang}"))
    return writes


def _blocking_budget(
    members: list[Mapping[str, Any]], pdbs: list[Mapping[str, Any]], pods: list[Mapping[str, Any]]
) -> str | None:
    """The first PDB that would refuse part of the gang (``namespace/name``), or None when all may go."""
    for pdb in pdbs:
        covered = sum(1 for p in members if pdb_selects(pdb, p))
        if covered and covered > disruptions_allowed(pdb, pods):
            meta = pdb.get("metadata") or {}
            return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return None
