"""Karpenter NodePool weights from the pool ranking: only the NodePools named, only on evidence, guarded writes.

Scope: the weights (100 for the best, distinct, ≥ 1), which NodePools are written (managed ones that differ),
the resourceVersion each patch is conditional on, the evidence rules (a managed pool with nodes but no telemetry
holds every write, with one Event; nothing before any measurement), and the written order kept within the margin.
The real Karpenter following the weights: tests/cluster/test_karpenter_box.py.
"""

from __future__ import annotations

import pytest

from gpuscale.cli.controller import pool_activity
from gpuscale.controller.capacity import NodePoolWeightsPlanner
from gpuscale.controller.expander import rank_pools
from gpuscale.controller.nodepool_weights import NODEPOOL, plan_nodepool_weights, weights_of
from gpuscale.controller.pools import DeclaredPool, PoolsPolicy, load_pools_policy, pools_of
from gpuscale.controller.telemetry import ClusterTelemetry, GpuTelemetry, NodeGpuTelemetry
from gpuscale.controller.writes import Emit, Patch, StaticClusterView
from gpuscale.metrics.diagnosis import GpuSignals
from gpuscale.pricing import load_prices

from .objects import gpu_node

NODES = [
    gpu_node("h100-a", pool="h100", product="NVIDIA-H100-80GB-HBM3", gpus=8),
    gpu_node("a100-a", pool="a100", product="NVIDIA-A100-SXM4-80GB", gpus=8),
    gpu_node("l4-a", pool="l4", product="NVIDIA-L4", gpus=4, memory_mib=23034),
]
# H100 well used, A100 mostly idle: H100 is the cheaper useful GPU-hour (12.30/0.9 < 5.12/0.1)
ACTIVITY = {"h100": 0.9, "a100": 0.1, "l4": 0.5}


def nodepool(name: str, weight: int | None = None, version: str = "7") -> dict:
    spec = {"template": {"spec": {}}} | ({"weight": weight} if weight is not None else {})
    return {
        "apiVersion": NODEPOOL[0],
        "kind": NODEPOOL[1],
        "metadata": {"name": name, "resourceVersion": version},
        "spec": spec,
    }


@pytest.fixture
def policy() -> PoolsPolicy:
    return load_pools_policy()


def plan(policy, nodepools, *, managed, activity=ACTIVITY, nodes=NODES, events=()):
    view = StaticClusterView([*nodes, *nodepools, *events])
    pools = pools_of(nodes, policy=policy, prices=load_prices())
    return plan_nodepool_weights(view, managed=managed, pools=pools, activity=activity, pending=[], policy=policy)


@pytest.mark.parametrize(
    ("count", "weights"),
    [(1, [100]), (2, [100, 50]), (3, [100, 67, 34]), (150, None)],
)
def test_weights_are_distinct_within_the_crd_bounds(policy, count, weights) -> None:
    nodes = [gpu_node(f"n{i}", pool=f"p{i:03}", product="NVIDIA-L4", gpus=1) for i in range(count)]
    ranks = rank_pools(pools_of(nodes, policy=policy, prices=load_prices()), activity={}, pending=[], policy=policy)
    got = list(weights_of(ranks).values())
    assert all(1 <= w <= 100 for w in got) and got[0] == 100
    if weights is not None:
        assert got == weights and len(set(got)) == count


def test_only_the_managed_nodepools_are_patched_each_guarded_by_its_resource_version(policy) -> None:
    writes = plan(
        policy,
        [nodepool("h100", version="11"), nodepool("a100", version="12"), nodepool("l4", weight=5)],
        managed=["h100", "a100"],
    )
    assert all(isinstance(w, Patch) for w in writes)
    patched = {w.key.name: (w.patch, w.resource_version) for w in writes}
    assert patched == {"h100": ({"spec": {"weight": 100}}, "11"), "a100": ({"spec": {"weight": 50}}, "12")}
    assert all(w.key.api_version == "karpenter.sh/v1" and w.key.kind == "NodePool" for w in writes)
    assert "h100" in writes[0].why and "useful GPU-h" in writes[0].why


def test_weights_already_right_write_nothing(policy) -> None:
    assert plan(policy, [nodepool("h100", 100), nodepool("a100", 50)], managed=["h100", "a100"]) == []


def test_a_managed_pool_without_telemetry_holds_every_weight_and_says_so_once(policy) -> None:
    nodepools = [nodepool("h100"), nodepool("a100")]
    writes = plan(policy, nodepools, managed=["h100", "a100"], activity={"h100": 0.9})
    assert [(type(w), w.regarding.name, w.reason) for w in writes] == [(Emit, "a100", "NodePoolWeightsHeld")]
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "e", "namespace": "default"},
        "involvedObject": {"apiVersion": NODEPOOL[0], "kind": NODEPOOL[1], "name": "a100"},
        "reason": "NodePoolWeightsHeld",
        "message": writes[0].message,
        "source": {"component": "gpuscale-controller"},
    }
    assert plan(policy, nodepools, managed=["h100", "a100"], activity={"h100": 0.9}, events=[event]) == []


def test_nothing_is_written_before_any_managed_pool_was_measured(policy) -> None:
    declared = policy.model_copy(update={"pools": (DeclaredPool(name="h100", gpu_product="NVIDIA-H100-80GB-HBM3"),)})
    # the NodePool exists but has no node yet: nothing measured, no ranking from price alone
    assert plan(declared, [nodepool("h100")], managed=["h100"], nodes=[], activity={}) == []


def test_unnamed_or_missing_nodepools_are_never_written(policy) -> None:
    assert plan(policy, [nodepool("h100"), nodepool("a100")], managed=[]) == []
    writes = plan(policy, [nodepool("h100")], managed=["h100", "gone"])
    assert [w.key.name for w in writes] == ["h100"]


def test_the_written_order_holds_within_the_margin(policy) -> None:
    # h100 costs 12.30/0.9 = 13.7 per useful GPU-h and a100 5.12/0.35 = 14.6: h100 ranks first, but cheaper by
    # only 6 %, within the 10 % margin, so the order the weights already express (a100 above h100) stays
    close = {"h100": 0.9, "a100": 0.35}
    pools = [p for p in pools_of(NODES, policy=policy, prices=load_prices()) if p.name != "l4"]
    assert rank_pools(pools, activity=close, pending=[], policy=policy)[0].pool.name == "h100"
    nodepools = [nodepool("h100", 50), nodepool("a100", 100)]
    assert plan(policy, nodepools, managed=["h100", "a100"], activity=close) == []
    # clearly better (A100 idle): the order flips
    writes = plan(policy, nodepools, managed=["h100", "a100"], activity={"h100": 0.9, "a100": 0.1})
    assert {w.key.name: w.patch["spec"]["weight"] for w in writes} == {"h100": 100, "a100": 50}


def _telemetry(observed: dict[str, tuple[float, float]]) -> ClusterTelemetry:
    """node → (activity 0-1, seconds watched), one GPU each."""
    nodes = {}
    for name, (activity, seconds) in observed.items():
        gpu = GpuTelemetry(name, "0", None, GpuSignals(sm_active=activity), 0.0, observed_seconds=seconds)
        nodes[name] = NodeGpuTelemetry(name, True, {"0": gpu})
    return ClusterTelemetry(at=0.0, window_seconds=600.0, nodes=nodes)


def test_a_node_that_has_just_joined_is_no_measurement_yet(policy) -> None:
    """A node's first seconds read 0 % (its pods not started): its pool is held until its GPUs have been watched
    for expander.karpenter_min_observed (1 min by default), then ranked on what they show."""
    nodes = NODES[:2]
    view = StaticClusterView([*nodes, nodepool("h100"), nodepool("a100")])
    planner = NodePoolWeightsPlanner(
        policy, prices=load_prices(), activity=pool_activity(policy), managed=["h100", "a100"]
    )
    young = _telemetry({"h100-a": (0.0, 5.0), "a100-a": (0.1, 300.0)})
    held = planner.plan(view, young, now=0.0)
    assert [(type(w), w.regarding.name) for w in held] == [(Emit, "h100")] and "60s" in held[0].message
    grown = _telemetry({"h100-a": (0.9, 61.0), "a100-a": (0.1, 300.0)})
    weights = {w.key.name: w.patch["spec"]["weight"] for w in planner.plan(view, grown, now=0.0)}
    assert weights == {"h100": 100, "a100": 50}
