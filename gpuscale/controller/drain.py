"""Draining a node through the Eviction API: which pods to evict, gangs together or not at all. Pure.

As ``kubectl drain`` does: DaemonSet pods and mirror (static) pods are skipped, finished pods too; every other
pod on the node is evicted through ``pods/eviction``, so PodDisruptionBudgets are respected by the API server.

Gangs: a pod that belongs to a gang (a pod-group label or annotation, ``DrainPolicy.gang_keys``: coscheduling,
Volcano, Kueue, JobSet, LeaderWorkerSet groups, Kubeflow training jobs, indexed Jobs) is evicted with every running
pod of its gang, on any node — a gang that lost one member is broken anyway, and holding the others only wastes
their GPUs. Before evicting any of a gang, every PDB over every pod of it is checked (see ``gpuscale.disruption``):
if one would refuse, or a pod is covered by more than one PDB (the Eviction API answers 500 for such a pod,
whatever the budgets allow), none of the gang is evicted this reconcile, and a Warning Event ``GangDrainHeld`` on
the node names the blocking pod and budget(s) (once: the Events cache holds this controller's own Events). The
gang's evictions carry one ``group``: should one still not apply (a race with the budgets), the rest are not sent.
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
    "jobset.sigs.k8s.io/jobset-name",  # JobSet: the whole JobSet restarts when one pod fails
    "leaderworkerset.sigs.k8s.io/name",  # LeaderWorkerSet: a group (with its index, below) is the gang
    "training.kubeflow.org/job-name",  # Kubeflow training operator (PyTorchJob, MPIJob…)
)
_LWS = "leaderworkerset.sigs.k8s.io/name"
_LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
_INDEXED_JOB = ("batch.kubernetes.io/job-name", "batch.kubernetes.io/job-completion-index")


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
            if key == _LWS and labels.get(_LWS_GROUP):
                value = f"{value}/group-{labels[_LWS_GROUP]}"
            return meta.get("namespace", ""), value
    # NB: an indexed Job's pods (completion index set) run one distributed job together, e.g. torchrun ranks
    if labels.get(_INDEXED_JOB[0]) and (labels.get(_INDEXED_JOB[1]) or annotations.get(_INDEXED_JOB[1])):
        return meta.get("namespace", ""), f"job/{labels[_INDEXED_JOB[0]]}"
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
        blocking = _blocking(members, pdbs, pods) if key[0] == "gang" else None
        if blocking is not None:
            # NB: all or nothing; a later reconcile tries again. Said once (an Event on the node).
            regarding = ObjectKey("v1", "Node", node)
            message = f"gang {key[1]}/{key[2]} ({len(members)} pods) not drained, no pod of it evicted: {blocking}"
            if not already_reported(view, regarding, "GangDrainHeld", message):
                writes.append(Emit(regarding, "Warning", "GangDrainHeld", message))
            continue
        for pod in members:
            meta = pod["metadata"]
            gang = f" (gang {key[1]}/{key[2]})" if key[0] == "gang" else ""
            group = f"{key[1]}/{key[2]}" if key[0] == "gang" else ""
            writes.append(Evict(meta.get("namespace", ""), meta["name"], f"{why}{gang}", group=group))
    return writes


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _blocking(
    members: list[Mapping[str, Any]], pdbs: list[Mapping[str, Any]], pods: list[Mapping[str, Any]]
) -> str | None:
    """Why evicting the whole gang would not go through (naming the pod and budget), or None when all may go."""
    for pod in members:
        over = [pdb for pdb in pdbs if pdb_selects(pdb, pod)]
        if len(over) > 1:
            names = ", ".join(_ref(p) for p in over)
            return (
                f"pod {_ref(pod)} is covered by {len(over)} PodDisruptionBudgets ({names}); "
                "the Eviction API refuses such a pod"
            )
    for pdb in pdbs:
        covered = [p for p in members if pdb_selects(pdb, p)]
        allowed = disruptions_allowed(pdb, pods)
        if covered and len(covered) > allowed:
            return (
                f"PodDisruptionBudget {_ref(pdb)} allows {allowed} disruption(s) and covers {len(covered)} of its "
                f"pods (first: pod {_ref(covered[0])})"
            )
    return None
