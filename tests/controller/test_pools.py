"""Pools: a node's pool from the first pool label it carries; what a pool offers from GFD labels and pools.yaml."""

from __future__ import annotations

import pytest

from gpuscale.controller.pools import DEFAULT_POOL_LABELS, load_pools_policy, mean_activity_by_pool, pool_of, pools_of
from gpuscale.errors import ConfigError
from gpuscale.pricing import load_prices

from .objects import gpu_node


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"karpenter.sh/nodepool": "a", "node.kubernetes.io/instance-type": "p5.48xlarge"}, "a"),
        ({"cloud.google.com/gke-nodepool": "g"}, "g"),
        ({"eks.amazonaws.com/nodegroup": "e", "node.kubernetes.io/instance-type": "p5"}, "e"),
        ({"kubernetes.azure.com/agentpool": "z"}, "z"),
        ({"node.kubernetes.io/instance-type": "p5.48xlarge"}, "p5.48xlarge"),
        ({"kubernetes.io/hostname": "n"}, None),
    ],
)
def test_pool_of_takes_the_first_pool_label_present(labels, expected) -> None:
    assert pool_of({"metadata": {"name": "n", "labels": labels}}) == expected


def test_pool_labels_are_configurable(tmp_path) -> None:
    (tmp_path / "pools.yaml").write_text("pool_labels: [example.com/rack]\n")
    policy = load_pools_policy(tmp_path)
    node = {"metadata": {"name": "n", "labels": {"example.com/rack": "r7", "karpenter.sh/nodepool": "a"}}}
    assert pool_of(node, labels=policy.pool_labels) == "r7"
    assert load_pools_policy().pool_labels == DEFAULT_POOL_LABELS


def test_pools_group_gpu_nodes_with_product_count_memory_cliques_and_price() -> None:
    nodes = [
        gpu_node("h-1", pool="h100", clique="cl-a"),
        gpu_node("h-2", pool="h100", clique="cl-a"),
        gpu_node("h-3", pool="h100", clique="cl-b"),
        # no GFD count label: the allocatable count stands in
        gpu_node("l-1", pool="l4", product="NVIDIA-L4", gpus=4, memory_mib=23034, count_label=False),
        gpu_node("cpu-1", pool="general", product=None, gpus=0, memory_mib=None),
        gpu_node("stray", pool=None),
    ]
    pools = pools_of(nodes, policy=load_pools_policy(), prices=load_prices())
    assert [p.name for p in pools] == ["h100", "l4"]
    h100, l4 = pools
    assert (h100.gpu_product, h100.gpus_per_node, h100.gpu_memory_mib) == ("NVIDIA-H100-80GB-HBM3", 8, 81559)
    assert h100.nodes == ("h-1", "h-2", "h-3") and h100.gpus == 24
    assert h100.cliques == {"cl-a": 16, "cl-b": 8}
    assert h100.price_per_gpu_hour == load_prices().per_gpu_hour("NVIDIA-H100-80GB-HBM3")
    assert (l4.gpus_per_node, l4.gpu_memory_mib, l4.cliques) == (4, 23034, {})
    assert l4.can_host(gpus_per_pod=4) and not l4.can_host(gpus_per_pod=8)
    assert not l4.can_host(gpus_per_pod=1, product="NVIDIA-H100-80GB-HBM3")


def test_declared_pools_exist_without_nodes_and_override_labels(tmp_path) -> None:
    (tmp_path / "pools.yaml").write_text(
        "pools:\n"
        "  - {name: b200-zero, gpu_product: NVIDIA-B200, gpus_per_node: 8, node_groups: ['eks-b200-.*']}\n"
        "  - {name: h100, gpus_per_node: 4}\n"
    )
    pools = pools_of([gpu_node("h-1", pool="h100")], policy=load_pools_policy(tmp_path), prices=None)
    by_name = {p.name: p for p in pools}
    assert by_name["b200-zero"].nodes == () and by_name["b200-zero"].node_groups == ("eks-b200-.*",)
    assert by_name["b200-zero"].gpu_product == "NVIDIA-B200"
    assert by_name["h100"].gpus_per_node == 4  # declared wins over the label's 8
    assert by_name["h100"].node_groups == (r".*h100.*",)
    assert by_name["h100"].price_per_gpu_hour is None  # no price table given: no price, not a guess


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("pool_labels: []\n", "pool_labels"),
        ("pools:\n  - {name: a, node_groups: ['(']}\n", "pools[0] (a).node_groups[0]"),
        ("expander: {min_activity: 0}\n", "expander.min_activity"),
        ("gangs: {backoff_base: soon}\n", "gangs.backoff_base"),
        ("gangs: {retries: 3}\n", "gangs.retries: unknown key"),
    ],
)
def test_bad_pools_file_names_file_and_field(tmp_path, body: str, named: str) -> None:
    (tmp_path / "pools.yaml").write_text(body)
    with pytest.raises(ConfigError) as e:
        load_pools_policy(tmp_path)
    assert "pools.yaml" in str(e.value) and named in str(e.value), str(e.value)


def test_gang_backoff_doubles_up_to_the_max() -> None:
    gangs = load_pools_policy().gangs
    assert [gangs.backoff_seconds(n) for n in (1, 2, 3, 7)] == [60.0, 120.0, 240.0, 1800.0]


def test_pool_activity_is_the_gpu_weighted_mean_of_measured_nodes() -> None:
    nodes = [
        gpu_node("h-1", pool="h100", gpus=8),
        gpu_node("h-2", pool="h100", gpus=4),
        gpu_node("h-3", pool="h100", gpus=8),  # no figure: not counted as idle
        gpu_node("l-1", pool="l4", product="NVIDIA-L4", gpus=4),  # no figure at all: the pool is left out
    ]
    activity = mean_activity_by_pool(nodes, {"h-1": 0.9, "h-2": 0.3}, policy=load_pools_policy())
    assert activity == {"h100": pytest.approx((0.9 * 8 + 0.3 * 4) / 12)}
