"""The priority expander ConfigMap: pools ranked by cost per useful GPU-hour and by what pending gangs need.

Scope: the ranking (price / activity, unmeasured and unpriced pools, pools that cannot host a pending gang), the
``priorities`` text CA reads (distinct integers, higher = preferred, regexes matching node-group names), and
the writes: created once, patched only when the content changes, someone else's ConfigMap left alone.
"""

from __future__ import annotations

import re

import pytest
import yaml

from gpuscale.controller.expander import CONFIG_MAP, keep_order, plan_expander, rank_pools, read_priorities
from gpuscale.controller.gangs import GANG_KINDS, gangs_of
from gpuscale.controller.pools import PoolsPolicy, load_pools_policy, pools_of
from gpuscale.controller.writes import Create, Emit, Patch, StaticClusterView
from gpuscale.pricing import load_prices
from gpuscale.sim.kubeapi import SimKubeApi

from .kube import apply_in_process, sim_view
from .objects import gpu_node
from .test_provisioning import gpu_pod

NODES = [
    gpu_node("h100-a", pool="h100", product="NVIDIA-H100-80GB-HBM3", gpus=8),
    gpu_node("a100-a", pool="a100", product="NVIDIA-A100-SXM4-80GB", gpus=8),
    gpu_node("l4-a", pool="l4", product="NVIDIA-L4", gpus=4, memory_mib=23034),
    gpu_node("odd-a", pool="odd", product="Tesla-V100-SXM2-16GB", gpus=8),  # not in prices.yaml
]
# measured mean activity: H100 well used, A100 mostly idle; L4 and the odd pool not measured
ACTIVITY = {"h100": 0.9, "a100": 0.2}
# every pool with nodes measured (what a write needs): L4 at the others' mean, so the ranking is ACTIVITY's
MEASURED = {**ACTIVITY, "l4": 0.55, "odd": 0.5}


@pytest.fixture
def policy() -> PoolsPolicy:
    return load_pools_policy()


@pytest.fixture
def pools(policy):
    return pools_of(NODES, policy=policy, prices=load_prices())


def test_pools_rank_by_cost_per_useful_gpu_hour(pools, policy) -> None:
    ranks = rank_pools(pools, activity=ACTIVITY, pending=[], policy=policy)
    assert [r.pool.name for r in ranks] == ["l4", "h100", "a100", "odd"]
    by_name = {r.pool.name: r for r in ranks}
    prices = load_prices()
    assert by_name["h100"].cost_per_useful_gpu_hour == pytest.approx(prices.per_gpu_hour("NVIDIA-H100-80GB-HBM3") / 0.9)
    assert by_name["a100"].cost_per_useful_gpu_hour == pytest.approx(prices.per_gpu_hour("NVIDIA-A100-SXM4-80GB") / 0.2)
    # unmeasured: costed at the measured pools' mean activity (0.55)
    assert by_name["l4"].cost_per_useful_gpu_hour == pytest.approx(prices.per_gpu_hour("NVIDIA-L4") / 0.55)
    assert by_name["odd"].cost_per_useful_gpu_hour is None and by_name["odd"].activity is None
    # an idle pool's cost is large but finite (activity floored)
    idle = rank_pools(pools, activity={"h100": 0.0}, pending=[], policy=policy)
    assert {r.pool.name: r.cost_per_useful_gpu_hour for r in idle}["h100"] == pytest.approx(
        prices.per_gpu_hour("NVIDIA-H100-80GB-HBM3") / 0.01
    )


def test_pools_that_cannot_host_a_pending_gang_rank_out(pools, policy, batch_sim) -> None:
    sim = batch_sim
    sim.create(
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "tp", "namespace": "ml"},
            "spec": {"minMember": 2},
        }
    )
    for i in range(2):  # 8 H100s per pod: only the h100 pool fits
        sim.create(gpu_pod(f"tp-{i}", gpus=8, group={"scheduling.x-k8s.io/pod-group": "tp"}))
    pending = [g for g in gangs_of(sim_view(sim, GANG_KINDS)) if g.state == "pending"]
    assert [g.key.name for g in pending] == ["tp"]
    ranks = rank_pools(pools, activity=ACTIVITY, pending=pending, policy=policy)
    assert [(r.pool.name, r.hosts_pending) for r in ranks] == [
        ("h100", True),
        ("l4", False),
        ("a100", False),
        ("odd", False),
    ]


def test_the_configmap_is_written_once_and_patched_only_when_it_changes(pools, policy) -> None:
    sim = SimKubeApi()
    writes = plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=MEASURED, pending=[], policy=policy)
    assert [type(w) for w in writes] == [Create] and "l4 (" in writes[0].why
    apply_in_process(sim, writes)
    cm = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
    priorities = yaml.safe_load(cm["data"]["priorities"])
    assert priorities == {40: [r".*l4.*"], 30: [r".*h100.*"], 20: [r".*a100.*"], 10: [r".*odd.*"]}
    # the regexes match the node-group names the clouds give a node pool's group
    assert re.fullmatch(priorities[30][0], "gke-prod-h100-5f2a9c1e-grp")
    assert re.fullmatch(priorities[40][0], "eks-l4-20c6b6a2-91ab-4c0e-aa7c")
    # unchanged ranking: no write; the same ranking from other activity figures: no write either
    assert plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=MEASURED, pending=[], policy=policy) == []
    nudged = {**MEASURED, "h100": 0.91, "a100": 0.21}
    assert plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=nudged, pending=[], policy=policy) == []
    # the A100s got busy and the H100s idle: the order changes, one patch
    flipped = {**MEASURED, "h100": 0.1, "a100": 0.95}
    writes = plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=flipped, pending=[], policy=policy)
    assert [type(w) for w in writes] == [Patch]
    apply_in_process(sim, writes)
    cm = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
    assert list(yaml.safe_load(cm["data"]["priorities"]).values())[:2] == [[r".*l4.*"], [r".*a100.*"]]


def test_someone_elses_configmap_is_left_alone_with_one_event(pools, policy) -> None:
    sim = SimKubeApi()
    sim.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cluster-autoscaler-priority-expander", "namespace": "kube-system"},
            "data": {"priorities": "10:\n  - .*\n"},
        }
    )
    writes = plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=MEASURED, pending=[], policy=policy)
    assert [type(w) for w in writes] == [Emit] and writes[0].reason == "ExpanderNotManaged"
    apply_in_process(sim, writes)
    assert plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=MEASURED, pending=[], policy=policy) == []
    cm = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
    assert cm["data"]["priorities"] == "10:\n  - .*\n"


def test_expander_settings(tmp_path, pools) -> None:
    (tmp_path / "pools.yaml").write_text("expander: {namespace: autoscaler, unmeasured_activity: 0.05}\n")
    policy = load_pools_policy(tmp_path)
    ranks = rank_pools(pools, activity=ACTIVITY, pending=[], policy=policy)
    assert [r.pool.name for r in ranks][:3] == ["h100", "l4", "a100"]  # L4 assumed 5% busy: 19.6/useful GPU-h
    empty = StaticClusterView()
    writes = plan_expander(empty, pools=pools, activity=MEASURED, pending=[], policy=policy)
    assert writes[0].key.namespace == "autoscaler"
    off = PoolsPolicy.model_validate({"expander": {"enabled": False}})
    assert plan_expander(empty, pools=pools, activity=ACTIVITY, pending=[], policy=off) == []


def test_activity_wobbling_around_a_tie_does_not_reorder(pools, policy) -> None:
    sim = SimKubeApi()

    def order(activity: dict[str, float]) -> list[list[str]]:
        apply_in_process(
            sim,
            plan_expander(
                sim_view(sim, [CONFIG_MAP]), pools=pools, activity={"odd": 0.5, **activity}, pending=[], policy=policy
            ),
        )
        cm = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
        return [groups[0] for groups in yaml.safe_load(cm["data"]["priorities"]).values()]

    # L4 12.25/useful GPU-h, H100 13.67: L4 first
    assert order({"h100": 0.9, "a100": 0.2, "l4": 0.08})[:2] == [".*l4.*", ".*h100.*"]
    rv = sim.resource_version
    # H100 now cheaper by under 10 % (12.95 vs 13.07): the written order stays, nothing is written
    assert order({"h100": 0.95, "a100": 0.2, "l4": 0.075})[:2] == [".*l4.*", ".*h100.*"]
    assert sim.resource_version == rv
    # cheaper by more than 10 % (12.95 vs 19.6): H100 moves up
    assert order({"h100": 0.95, "a100": 0.2, "l4": 0.05})[:2] == [".*h100.*", ".*l4.*"]
    # with a margin of 0 every crossing reorders
    written = "20:\n- .*l4.*\n10:\n- .*h100.*\n"
    close = rank_pools(pools, activity={"h100": 0.95, "a100": 0.2, "l4": 0.075}, pending=[], policy=policy)
    order = read_priorities(written)[0]
    assert [r.pool.name for r in keep_order(close, current=order, margin=0.1)][:2] == ["l4", "h100"]
    assert [r.pool.name for r in keep_order(close, current=order, margin=0.0)][:2] == ["h100", "l4"]


def test_no_ranking_is_written_without_telemetry_for_every_pool_it_ranks(pools, policy) -> None:
    """A Prometheus or exporter outage leaves the pools unmeasured: ranking them by price alone would flip the
    autoscaler's preference, so the last ranking stays and one Event says why."""
    sim = SimKubeApi()
    apply_in_process(
        sim, plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=MEASURED, pending=[], policy=policy)
    )
    before = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
    for activity in ({}, {"h100": 0.1, "a100": 0.95}):  # nothing at all; two of four pools
        writes = plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=activity, pending=[], policy=policy)
        assert [(type(w), w.reason) for w in writes] == [(Emit, "ExpanderHeld")], writes
        assert "l4" in writes[0].message and "odd" in writes[0].message and "last ranking stays" in writes[0].message
        apply_in_process(sim, writes)
        again = plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=activity, pending=[], policy=policy)
        assert again == [], "said once"
    after = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
    assert (
        after["data"] == before["data"]
        and after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    )


def _hostile_tables() -> list[tuple[str, str, str]]:
    """(id, the priorities text someone else wrote into gpuscale's ConfigMap, what the Event says)."""
    from tests.hostile.test_simulate_inputs import _laughs, _merge_bomb

    return [
        ("billion laughs", _laughs() + "10: [a0]\n", "nodes once its aliases are expanded"),
        ("merge-key bomb", _merge_bomb() + "10: [m0]\n", "nodes"),
        ("recursive alias", "10: &a [*a]\n", "recursive alias"),
        ("nested 10,000 deep", "10: " + "[" * 10_000 + "]" * 10_000 + "\n", "nesting depth"),
        ("duplicate priority", "10:\n- .*a.*\n10:\n- .*b.*\n", "appears twice"),
        ("two documents", "10: [.*]\n---\n20: [.*]\n", "not one YAML mapping"),
        ("a list", "- 10\n- .*\n", "not one YAML mapping"),
        ("not YAML", "10: [.*\n", "invalid YAML"),
        ("5 MiB of one scalar", "10: [" + "a" * (5 * 2**20) + "]\n", "larger than"),
        ("int of 5,000 digits", "1" * 5000 + ": [.*]\n", "invalid YAML"),
    ]


HOSTILE_TABLES = _hostile_tables()


@pytest.mark.parametrize(("text", "says"), [t[1:] for t in HOSTILE_TABLES], ids=[t[0] for t in HOSTILE_TABLES])
def test_an_unreadable_table_is_replaced_with_one_event(pools, policy, text: str, says: str) -> None:
    """gpuscale's ConfigMap edited by someone else into a YAML bomb or junk: read within the config limits (no
    gigabytes, no exception out of the reconcile), replaced by the ranking, and one Warning Event says why."""
    import time

    sim = SimKubeApi()
    apply_in_process(
        sim, plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=MEASURED, pending=[], policy=policy)
    )
    written = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
    sim.patch("v1", "ConfigMap", written["metadata"]["name"], {"data": {"priorities": text}}, namespace="kube-system")
    start = time.perf_counter()
    writes = plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=MEASURED, pending=[], policy=policy)
    assert time.perf_counter() - start < 1.0
    assert [(type(w), getattr(w, "reason", None)) for w in writes] == [(Emit, "ExpanderTableUnreadable"), (Patch, None)]
    assert says in writes[0].message and len(writes[0].message) < 400, writes[0].message
    apply_in_process(sim, writes)
    after = sim.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
    assert after["data"]["priorities"] == written["data"]["priorities"], "the ranking is back"
    assert plan_expander(sim_view(sim, [CONFIG_MAP]), pools=pools, activity=MEASURED, pending=[], policy=policy) == []


def test_an_unreadable_table_is_no_order_to_keep(pools, policy) -> None:
    ranks = rank_pools(pools, activity=MEASURED, pending=[], policy=policy)
    for _, text, _ in HOSTILE_TABLES:
        assert read_priorities(text)[0] == []
        assert keep_order(ranks, current=read_priorities(text)[0], margin=0.1) == ranks
    assert read_priorities("20: [.*l4.*]\n10: [.*h100.*, .*a100.*]\nx: [.*]\n") == (
        [(".*l4.*",), (".*h100.*", ".*a100.*")],
        "",
    )
