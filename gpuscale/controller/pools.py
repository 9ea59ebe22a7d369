"""GPU node pools: which pool a node belongs to, and what each pool offers (GPU product, count, memory, price).

Pure. A node's pool is the value of the first of ``policy.pool_labels`` it carries (Karpenter, GKE, EKS, AKS
node-pool labels, then the instance type). What a pool offers comes from the GPU Feature Discovery labels of
its nodes (``nvidia.com/gpu.product``, ``.count``, ``.memory`` in MiB, ``nvidia.com/gpu.clique`` for the NVLink
domain), falling back to the node's allocatable GPUs for the count; pools declared in ``policies/pools.yaml``
add pools with no node now (a node group scaled to zero) and correct what the labels say. The price comes from
``policies/prices.yaml``; a product it does not know has no price, never a made-up one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.backoff import doubling_delay
from gpuscale.config import Regex, Seconds, read_yaml, validate
from gpuscale.model import parse_quantity
from gpuscale.policy_files import POOLS_FILE, policy_file
from gpuscale.pricing import PriceTable

__all__ = [
    "DEFAULT_POOL_LABELS",
    "GPU_CLIQUE_LABEL",
    "GPU_COUNT_LABEL",
    "GPU_MEMORY_LABEL",
    "GPU_PRODUCT_LABEL",
    "DeclaredPool",
    "ExpanderPolicy",
    "GangPolicy",
    "NodeGpus",
    "Pool",
    "PoolsPolicy",
    "gpus_of_node",
    "load_pools_policy",
    "mean_activity_by_pool",
    "pool_of",
    "pools_of",
]

DEFAULT_POOL_LABELS = (
    "karpenter.sh/nodepool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "node.kubernetes.io/instance-type",
)
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_CLIQUE_LABEL = "nvidia.com/gpu.clique"


class DeclaredPool(BaseModel):
    """A pool named in ``pools.yaml``: known even with no node, and overriding what its nodes' labels say."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    gpu_product: str | None = None
    gpus_per_node: int | None = Field(default=None, ge=0)
    gpu_memory_mib: int | None = Field(default=None, ge=0)
    node_groups: tuple[Regex, ...] = ()


class ExpanderPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    namespace: str = Field(default="kube-system", min_length=1)
    name: str = Field(default="cluster-autoscaler-priority-expander", min_length=1)
    unmeasured_activity: float | None = Field(default=None, gt=0, le=1)
    min_activity: float = Field(default=0.01, gt=0, le=1)
    reorder_margin: float = Field(default=0.1, ge=0, lt=1)
    karpenter_min_observed: Seconds = Field(default=60.0, ge=0)


class GangPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    provisioning_class: str = Field(default="best-effort-atomic-scale-up.autoscaling.x-k8s.io", min_length=1)
    valid_until: Seconds = Field(default=600.0, gt=0)
    backoff_base: Seconds = Field(default=60.0, gt=0)
    backoff_max: Seconds = Field(default=1800.0, gt=0)
    max_attempts: int = Field(default=0, ge=0)

    def backoff_seconds(self, failures: int) -> float:
        """The wait before the request after ``failures`` failed ones: base, 2×base, 4×base… up to the max."""
        return doubling_delay(failures - 1, initial_seconds=self.backoff_base, max_seconds=self.backoff_max)


class PoolsPolicy(BaseModel):
    """``policies/pools.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    pool_labels: tuple[str, ...] = Field(default=DEFAULT_POOL_LABELS, min_length=1)
    gpu_resource: str = Field(default="nvidia.com/gpu", min_length=1)
    pools: tuple[DeclaredPool, ...] = ()
    expander: ExpanderPolicy = ExpanderPolicy()
    gangs: GangPolicy = GangPolicy()


def load_pools_policy(path_dir: str | Path | None = None) -> PoolsPolicy:
    """``pools.yaml`` from ``path_dir`` when it holds one, else the shipped file; ConfigError names file and field."""
    path = policy_file(POOLS_FILE, path_dir)
    return validate(PoolsPolicy, read_yaml(path), path)


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def pool_of(node: Mapping[str, Any], *, labels: Iterable[str] = DEFAULT_POOL_LABELS) -> str | None:
    """The pool ``node`` belongs to: the value of the first pool label it carries, or None."""
    node_labels = _labels(node)
    for label in labels:
        value = node_labels.get(label)
        if value:
            return value
    return None


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """What one node's GPUs are, from its GPU Feature Discovery labels (count: allocatable as a fallback)."""

    product: str | None
    count: int
    memory_mib: int | None
    clique: str | None


def _int_label(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None  # NB: a malformed label is no fact; the allocatable count still is


def _resource_count(node: Mapping[str, Any], resource: str) -> int:
    status = node.get("status") or {}
    for source in ("allocatable", "capacity"):
        raw = (status.get(source) or {}).get(resource)
        if raw is not None:
            try:
                return int(parse_quantity(str(raw)))
            except ValueError:
                return 0
    return 0


def gpus_of_node(node: Mapping[str, Any], *, gpu_resource: str = "nvidia.com/gpu") -> NodeGpus:
    labels = _labels(node)
    count = _int_label(labels.get(GPU_COUNT_LABEL))
    return NodeGpus(
        product=labels.get(GPU_PRODUCT_LABEL) or None,
        count=count if count is not None else _resource_count(node, gpu_resource),
        memory_mib=_int_label(labels.get(GPU_MEMORY_LABEL)),
        clique=labels.get(GPU_CLIQUE_LABEL) or None,
    )


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool of GPU nodes. ``gpu_product``/``gpus_per_node``/``gpu_memory_mib`` are what most of its nodes
    carry (a declared pool's values win); ``price_per_gpu_hour`` is None when prices.yaml does not know the
    product; ``node_groups`` are regexes for the autoscaler's node-group names."""

    name: str
    gpu_product: str | None
    gpus_per_node: int
    gpu_memory_mib: int | None
    nodes: tuple[str, ...]
    gpus: int
    cliques: Mapping[str, int]
    """NVLink domain (``nvidia.com/gpu.clique``) → GPUs of this pool's nodes in it."""
    node_groups: tuple[str, ...]
    price_per_gpu_hour: float | None

    def can_host(self, *, gpus_per_pod: int, product: str | None = None) -> bool:
        """Whether one node of this pool can run a pod asking for ``gpus_per_pod`` GPUs of ``product``
        (None = any). A pool whose product is unknown cannot promise a specific one."""
        if gpus_per_pod > self.gpus_per_node:
            return False
        return product is None or (self.gpu_product is not None and self.gpu_product == product)


def _most_common(values: Iterable[Any]) -> Any:
    counted = Counter(v for v in values if v is not None)
    # NB: ties go to the first value in node-name order, so the answer does not depend on dict order.
    return counted.most_common(1)[0][0] if counted else None


def pools_of(
    nodes: Iterable[Mapping[str, Any]], *, policy: PoolsPolicy, prices: PriceTable | None = None
) -> list[Pool]:
    """The GPU pools of ``nodes`` plus the declared ones, sorted by name. Nodes without a GPU, or without a pool
    label, are in no pool."""
    members: dict[str, list[tuple[str, NodeGpus]]] = {}
    for node in sorted(nodes, key=lambda n: (n.get("metadata") or {}).get("name", "")):
        gpus = gpus_of_node(node, gpu_resource=policy.gpu_resource)
        name = pool_of(node, labels=policy.pool_labels)
        if gpus.count > 0 and name is not None:
            members.setdefault(name, []).append((node["metadata"]["name"], gpus))
    declared = {p.name: p for p in policy.pools}
    out = []
    for name in sorted(set(members) | set(declared)):
        found = members.get(name, [])
        spec = declared.get(name)
        product = (spec and spec.gpu_product) or _most_common(g.product for _, g in found)
        per_node = spec.gpus_per_node if spec and spec.gpus_per_node is not None else None
        memory = spec.gpu_memory_mib if spec and spec.gpu_memory_mib is not None else None
        cliques: Counter[str] = Counter()
        for _, g in found:
            if g.clique:
                cliques[g.clique] += g.count
        out.append(
            Pool(
                name=name,
                gpu_product=product,
                gpus_per_node=per_node if per_node is not None else (_most_common(g.count for _, g in found) or 0),
                gpu_memory_mib=memory if memory is not None else _most_common(g.memory_mib for _, g in found),
                nodes=tuple(n for n, _ in found),
                gpus=sum(g.count for _, g in found),
                cliques=dict(sorted(cliques.items())),
                node_groups=(spec.node_groups if spec and spec.node_groups else (f".*{re.escape(name)}.*",)),
                price_per_gpu_hour=prices.per_gpu_hour(product) if prices is not None else None,
            )
        )
    return out


def mean_activity_by_pool(
    nodes: Iterable[Mapping[str, Any]], node_activity: Mapping[str, float], *, policy: PoolsPolicy
) -> dict[str, float]:
    """pool → mean GPU activity (0–1) of its nodes that have a figure, weighted by their GPU count.

    ``node_activity`` is node name → mean activity of its GPUs (the controller's telemetry); a pool none of whose
    nodes has a figure is left out (the expander then costs it as unmeasured, never as idle).
    """
    totals: dict[str, tuple[float, int]] = {}
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        pool = pool_of(node, labels=policy.pool_labels)
        activity = node_activity.get(name)
        gpus = gpus_of_node(node, gpu_resource=policy.gpu_resource).count
        if pool is None or activity is None or gpus <= 0:
            continue
        weighted, count = totals.get(pool, (0.0, 0))
        totals[pool] = (weighted + activity * gpus, count + gpus)
    return {pool: weighted / count for pool, (weighted, count) in sorted(totals.items())}
