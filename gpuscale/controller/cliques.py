"""Warnings when work that needs one NVLink domain is, or must be, split across ``nvidia.com/gpu.clique`` values.

Pure planner. What it can know, and how (kept honest):

* A pod's GPUs are on its node, and GPU Feature Discovery labels a node with one NVLink domain
  (``nvidia.com/gpu.clique``, e.g. one GB200 NVL72 rack). So the domain of a *bound* pod is its node's label;
  a node without the label tells nothing and is reported as unknown, never guessed. One pod's GPUs cannot be
  seen split across domains from labels (its node carries one value), so that case is not reported; what can
  be split is a group of pods on several nodes.
* A **gang that needs one NVLink domain** (``gangs.Gang.needs_one_nvlink_domain``):
  - ``GangSpansNVLinkDomains`` when its bound pods sit in more than one domain;
  - ``GangExceedsNVLinkDomain`` while it is pending, when it asks for more GPUs than the largest domain of any
    pool that can host its pods holds in all (it cannot fit in one, whatever the scheduler does; free capacity
    is not counted, so this warns only when splitting is certain).
* A **multi-node tensor-parallel group**: the pods of one LeaderWorkerSet group
  (``leaderworkerset.sigs.k8s.io/group-key``: vLLM/SGLang multi-node serving, one model replica across nodes) —
  ``TensorParallelSpansNVLinkDomains`` on the group's leader when its running pods sit in more than one domain.

Each Event is planned once: an Event with the same reason and message about the same object in the view means
it was said already.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuscale.controller.events import already_reported
from gpuscale.controller.gangs import POD, Gang
from gpuscale.controller.pools import GPU_CLIQUE_LABEL, Pool
from gpuscale.controller.writes import ClusterView, Emit, ObjectKey, Write

__all__ = ["LWS_GROUP_LABEL", "LWS_WORKER_INDEX_LABEL", "NODE", "plan_clique_warnings"]

NODE = ("v1", "Node")
LWS_GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
_UNKNOWN = "<no clique label>"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _domains(pods: Iterable[Mapping[str, Any]], clique_of_node: Mapping[str, str | None]) -> dict[str, list[str]]:
    """NVLink domain → names of the bound pods in it (``_UNKNOWN`` for nodes without the label)."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            out.setdefault(clique_of_node.get(node) or _UNKNOWN, []).append(_meta(pod).get("name", ""))
    return {k: sorted(v) for k, v in sorted(out.items())}


def _split(domains: Mapping[str, list[str]]) -> bool:
    return len([d for d in domains if d != _UNKNOWN]) > 1


def _describe(domains: Mapping[str, list[str]]) -> str:
    return "; ".join(f"{GPU_CLIQUE_LABEL}={d}: {', '.join(pods)}" for d, pods in domains.items())


def _emit(view: ClusterView, regarding: ObjectKey, reason: str, message: str) -> list[Write]:
    return [] if already_reported(view, regarding, reason, message) else [Emit(regarding, "Warning", reason, message)]


def _largest_domain(gang: Gang, pools: Sequence[Pool]) -> tuple[int, str] | None:
    """(GPUs, "pool/clique") of the largest NVLink domain among pools able to host every pod of ``gang``."""
    best: tuple[int, str] | None = None
    for pool in pools:
        fits = all(
            pool.can_host(gpus_per_pod=s.gpus_per_pod, product=s.gpu_product) for s in gang.pod_sets if s.gpus_per_pod
        )
        for clique, gpus in pool.cliques.items() if fits else ():
            if best is None or gpus > best[0]:
                best = (gpus, f"{pool.name}/{clique}")
    return best


def plan_clique_warnings(view: ClusterView, *, gangs: Sequence[Gang], pools: Sequence[Pool]) -> list[Write]:
    """Warnings for NVLink-bound gangs and tensor-parallel groups split (or bound to be split) across domains."""
    clique_of_node = {
        _meta(n).get("name", ""): (_meta(n).get("labels") or {}).get(GPU_CLIQUE_LABEL) for n in view.objects(*NODE)
    }
    writes: list[Write] = []
    for gang in gangs:
        if not gang.needs_one_nvlink_domain or gang.state not in ("pending", "done"):
            continue
        domains = _domains(gang.pods, clique_of_node)
        if _split(domains):
            message = f"gang {gang} needs one NVLink domain but its pods run in several: {_describe(domains)}"
            writes.extend(_emit(view, gang.key, "GangSpansNVLinkDomains", message))
        if gang.state == "pending":
            largest = _largest_domain(gang, pools)
            if largest is not None and gang.gpus > largest[0]:
                message = (
                    f"gang {gang} needs {gang.gpus} GPUs in one NVLink domain; the largest domain of a pool that "
                    f"can host its pods has {largest[0]} ({largest[1]}): it would span {GPU_CLIQUE_LABEL} values"
                )
                writes.extend(_emit(view, gang.key, "GangExceedsNVLinkDomain", message))
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for pod in view.objects(*POD):
        labels = _meta(pod).get("labels") or {}
        if labels.get(LWS_GROUP_LABEL) and (pod.get("status") or {}).get("phase") == "Running":
            groups.setdefault((_meta(pod).get("namespace", ""), labels[LWS_GROUP_LABEL]), []).append(pod)
    for (_, group), pods in sorted(groups.items()):
        domains = _domains(pods, clique_of_node)
        if not _split(domains):
            continue
        leader = min(
            pods, key=lambda p: ((_meta(p).get("labels") or {}).get(LWS_WORKER_INDEX_LABEL) != "0", _meta(p)["name"])
        )
        message = (
            f"tensor-parallel group {group} ({len(pods)} pods) runs across NVLink domains: {_describe(domains)}; "
            "its GPUs talk over the network instead of NVLink"
        )
        writes.extend(_emit(view, ObjectKey.of(leader), "TensorParallelSpansNVLinkDomains", message))
    return writes
