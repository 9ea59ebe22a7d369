"""The capacity planners as the loop runs them: both together reach a fixed point on the simulated cluster."""

from __future__ import annotations

import yaml

from gpuscale.controller.capacity import CAPACITY_KINDS, ExpanderPlanner, GangCapacityPlanner
from gpuscale.controller.pools import load_pools_policy, pool_of
from gpuscale.controller.provisioning import PROVISIONING_REQUEST
from gpuscale.pricing import load_prices

from .kube import apply_in_process, sim_view
from .objects import gpu_node
from .test_provisioning import T0, volcano_group


def test_gang_and_expander_planners_reach_a_fixed_point(batch_sim) -> None:
    sim = batch_sim
    sim.create(gpu_node("h-1", pool="h100"))
    sim.create(gpu_node("l-1", pool="l4", product="NVIDIA-L4", gpus=4))
    sim.create(volcano_group())  # 2 pods × 8 GPUs: only the h100 pool can host them
    policy, prices = load_pools_policy(), load_prices()
    seen_views = []

    def activity(view, telemetry):
        seen_views.append(view)
        return {pool_of(n): 0.5 for n in view.objects("v1", "Node")}

    planners = [GangCapacityPlanner(policy, prices=prices), ExpanderPlanner(policy, prices=prices, activity=activity)]
    assert [p.name for p in planners] == ["gangs", "expander"]
    for _ in range(2):
        writes = [w for p in planners for w in p.plan(sim_view(sim, CAPACITY_KINDS), None, now=T0)]
        apply_in_process(sim, writes)
    assert writes == []
    assert len(sim.list(*PROVISIONING_REQUEST, namespace="ml")) == 1
    cm = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
    assert list(yaml.safe_load(cm["data"]["priorities"]).values()) == [[".*h100.*"], [".*l4.*"]]
    assert len(seen_views) == 2
