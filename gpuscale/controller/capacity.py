"""The capacity planners as the controller's loop runs them: ``plan(view, telemetry, *, now) -> writes``.

``GangCapacityPlanner`` ("gangs") plans ProvisioningRequests for pending gangs (``provisioning.py``) and the
NVLink-domain warnings (``cliques.py``); ``ExpanderPlanner`` ("expander") plans the cluster-autoscaler priority
expander ConfigMap (``expander.py``) from the pool activity the loop measures; ``NodePoolWeightsPlanner``
("nodepool-weights") writes the same ranking as the ``spec.weight`` of the Karpenter NodePools it is told to manage
(``nodepool_weights.py``). Both read only ``view`` (whose
caches must hold ``CAPACITY_KINDS``) and their policy, bound here; neither keeps state between reconciles.

NB for the caches: the expander must see the ConfigMap ``expander.namespace``/``expander.name`` (default
``kube-system/cluster-autoscaler-priority-expander``) and both planners the Events they emitted (to say each
warning once); a cache restricted to other ConfigMaps or without Events makes the expander re-create (answered
AlreadyExists) and the warnings repeat (folded into one Event's count by the actuator).

The loop feeds ``ExpanderPlanner`` with pool activity from its telemetry, e.g.
``lambda view, t: mean_activity_by_pool(view.objects("v1", "Node"), mean_activity_by_node(t), policy=policy)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from gpuscale.controller.cliques import NODE, plan_clique_warnings
from gpuscale.controller.events import EVENT
from gpuscale.controller.expander import CONFIG_MAP, plan_expander
from gpuscale.controller.gangs import GANG_KINDS, gangs_of
from gpuscale.controller.nodepool_weights import plan_nodepool_weights
from gpuscale.controller.pools import PoolsPolicy, pools_of
from gpuscale.controller.provisioning import PROVISIONING_KINDS, plan_provisioning
from gpuscale.controller.telemetry import ClusterTelemetry
from gpuscale.controller.writes import ClusterView, Write
from gpuscale.pricing import PriceTable

__all__ = ["CAPACITY_KINDS", "ExpanderPlanner", "GangCapacityPlanner", "NodePoolWeightsPlanner", "PoolActivity"]

CAPACITY_KINDS: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys((*GANG_KINDS, *PROVISIONING_KINDS, NODE, EVENT, CONFIG_MAP))
)
"""(apiVersion, kind) of everything these planners read; kinds whose CRD is absent are simply empty."""

PoolActivity = Callable[[ClusterView, Any], Mapping[str, float]]
"""(view, telemetry) → pool name → mean GPU activity 0–1 over the window (pools without a figure left out)."""


class GangCapacityPlanner:
    name = "gangs"

    def __init__(self, policy: PoolsPolicy, *, prices: PriceTable | None = None) -> None:
        self.policy = policy
        self.prices = prices

    def plan(self, view: ClusterView, telemetry: Any = None, *, now: float) -> list[Write]:
        gangs = gangs_of(view, gpu_resource=self.policy.gpu_resource)
        pools = pools_of(view.objects(*NODE), policy=self.policy, prices=self.prices)
        return [
            *plan_provisioning(view, now=now, policy=self.policy, gangs=gangs),
            *plan_clique_warnings(view, gangs=gangs, pools=pools),
        ]


class ExpanderPlanner:
    name = "expander"

    def __init__(self, policy: PoolsPolicy, *, prices: PriceTable, activity: PoolActivity) -> None:
        self.policy = policy
        self.prices = prices
        self.activity = activity

    def plan(self, view: ClusterView, telemetry: Any = None, *, now: float) -> list[Write]:
        pools = pools_of(view.objects(*NODE), policy=self.policy, prices=self.prices)
        pending = [g for g in gangs_of(view, gpu_resource=self.policy.gpu_resource) if g.state == "pending"]
        activity = self.activity(view, telemetry)
        return plan_expander(view, pools=pools, activity=activity, pending=pending, policy=self.policy)


class NodePoolWeightsPlanner:
    name = "nodepool-weights"

    def __init__(
        self, policy: PoolsPolicy, *, prices: PriceTable, activity: PoolActivity, managed: Collection[str]
    ) -> None:
        self.policy = policy
        self.prices = prices
        self.activity = activity
        self.managed = frozenset(managed)

    def plan(self, view: ClusterView, telemetry: Any = None, *, now: float) -> list[Write]:
        pools = pools_of(view.objects(*NODE), policy=self.policy, prices=self.prices)
        pending = [g for g in gangs_of(view, gpu_resource=self.policy.gpu_resource) if g.state == "pending"]
        activity = self.activity(view, _observed_for(telemetry, self.policy.expander.karpenter_min_observed))
        return plan_nodepool_weights(
            view, managed=self.managed, pools=pools, activity=activity, pending=pending, policy=self.policy
        )


def _observed_for(telemetry: Any, seconds: float) -> Any:
    """``telemetry`` with only the nodes whose every GPU has been watched for ``seconds``: a node that has just
    joined reads 0 % until its pods start, which is no measurement of how busy its pool keeps a GPU."""
    if not isinstance(telemetry, ClusterTelemetry) or seconds <= 0:
        return telemetry
    kept = {
        name: node
        for name, node in telemetry.nodes.items()
        if node.gpus and min(g.observed_seconds for g in node.gpus.values()) >= seconds
    }
    return dataclasses.replace(telemetry, nodes=kept)
