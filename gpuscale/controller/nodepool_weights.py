"""Karpenter's version of the priority expander: the pools' ranking written as NodePool ``spec.weight``. A pure planner.

Karpenter tries NodePools in descending ``spec.weight`` (1-100) when it provisions for pending pods: the pool of
highest weight that can host them wins, whatever the others cost. gpuscale ranks the GPU pools exactly as for the
cluster-autoscaler ConfigMap (``expander.rank_pools``: cost per useful GPU-hour, pools hosting a pending gang
first, the written order kept unless a pool is clearly better) and writes the ranking as weights, 100 for the best
and evenly lower for the rest, so no two managed pools tie.

Guards, as for the ConfigMap, and narrower:

- Only the NodePools named with ``--karpenter-nodepool`` are ever written; every other NodePool is read for
  nothing and left alone. A managed NodePool with no GPU node and not declared in pools.yaml has no pool to rank
  (its GPU product is unknown) and keeps its weight.
- Evidence first: nothing is written while a managed pool with nodes has no fresh activity figure (one Warning
  Event ``NodePoolWeightsHeld`` per NodePool says so), nor before any managed pool has been measured at all — a
  first ranking from price alone would steer Karpenter for no measured reason. A node counts as measured once its
  GPUs have been watched for ``expander.karpenter_min_observed`` (the planner in capacity.py filters the
  telemetry): a node that has just joined reads 0 % until its pods start.
- Each write is a merge patch of ``spec.weight`` alone, conditional on the NodePool's ``resourceVersion`` as read:
  if someone changed the NodePool meanwhile the API answers 409 and the loop re-reads it and plans again.
- The weights already written are the memory of the order (restart-safe): they are read back as the current order,
  so activity wobbling around a tie does not rewrite them every reconcile.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gpuscale.controller.events import already_reported
from gpuscale.controller.expander import PoolRank, explain_ranks, keep_order, rank_pools, unmeasured_pools
from gpuscale.controller.gangs import Gang
from gpuscale.controller.pools import Pool, PoolsPolicy
from gpuscale.controller.writes import ClusterView, Emit, ObjectKey, Patch, Write

__all__ = ["MAX_WEIGHT", "NODEPOOL", "plan_nodepool_weights", "weights_of"]

NODEPOOL = ("karpenter.sh/v1", "NodePool")
MAX_WEIGHT = 100  # the NodePool CRD's bound (1-100)


def weights_of(ranks: Sequence[PoolRank]) -> dict[str, int]:
    """pool name → weight: ``MAX_WEIGHT`` for the first, then evenly lower, every one distinct and at least 1."""
    step = max(1, MAX_WEIGHT // max(1, len(ranks)))
    return {rank.pool.name: max(1, MAX_WEIGHT - step * i) for i, rank in enumerate(ranks)}


def _weight(nodepool: Mapping[str, Any]) -> int | None:
    value = (nodepool.get("spec") or {}).get("weight")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _current_order(pools: Sequence[Pool], nodepools: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, ...]]:
    """The order the weights now on the NodePools express (highest first), or [] when they express none (a weight
    missing or two equal): then the ranking alone decides."""
    weights = {p.name: _weight(nodepools[p.name]) for p in pools}
    if any(w is None for w in weights.values()) or len(set(weights.values())) != len(weights):
        return []
    ordered = sorted(pools, key=lambda p: -(weights[p.name] or 0))
    return [p.node_groups for p in ordered]


def plan_nodepool_weights(
    view: ClusterView,
    *,
    managed: Collection[str],
    pools: Sequence[Pool],
    activity: Mapping[str, float],
    pending: Sequence[Gang],
    policy: PoolsPolicy,
) -> list[Write]:
    """The patches that make Karpenter prefer the cheapest useful of the ``managed`` NodePools (none if unchanged).

    ``pools`` from ``pools.pools_of`` (a pool is a NodePool when its nodes carry ``karpenter.sh/nodepool``);
    ``activity`` pool → mean GPU activity 0-1; ``pending`` the pending gangs.
    """
    nodepools = {
        name: obj
        for name in sorted(managed)
        if (obj := view.get(*NODEPOOL, name)) is not None  # NB: a NodePool not created yet is nothing to weigh
    }
    ranked_pools = [p for p in pools if p.name in nodepools]
    if not ranked_pools:
        return []
    missing = unmeasured_pools(ranked_pools, activity)
    if missing:
        watched = f"{policy.expander.karpenter_min_observed:g}s"
        return _held(view, missing, f"no fresh GPU telemetry for its nodes (watched for {watched} at least)")
    if not any(p.name in activity for p in ranked_pools):
        return []  # NB: nothing measured yet (no pool has a node): no ranking on price alone
    settings = policy.expander
    ranks = rank_pools(ranked_pools, activity=activity, pending=pending, policy=policy)
    ranks = keep_order(ranks, current=_current_order(ranked_pools, nodepools), margin=settings.reorder_margin)
    why = explain_ranks(ranks)
    writes: list[Write] = []
    for name, weight in weights_of(ranks).items():
        nodepool = nodepools[name]
        if _weight(nodepool) == weight:
            continue
        meta = nodepool.get("metadata") or {}
        writes.append(
            Patch(
                ObjectKey(*NODEPOOL, name),
                {"spec": {"weight": weight}},
                f"weight {weight}: {why}",
                resource_version=meta.get("resourceVersion"),
            )
        )
    return writes


def _held(view: ClusterView, names: Sequence[str], reason: str) -> list[Write]:
    writes: list[Write] = []
    for name in names:
        key = ObjectKey(*NODEPOOL, name)
        message = f"NodePool weights not updated: {reason}; the weights stay as they are"
        if not already_reported(view, key, "NodePoolWeightsHeld", message):
            writes.append(Emit(key, "Warning", "NodePoolWeightsHeld", message))
    return writes
