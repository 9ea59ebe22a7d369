"""Kubernetes objects as the API serves them, for the controller's planner tests (small builders, no logic)."""

from __future__ import annotations

from typing import Any


def gpu_node(
    name: str,
    *,
    pool: str | None = None,
    pool_label: str = "karpenter.sh/nodepool",
    product: str | None = "NVIDIA-H100-80GB-HBM3",
    gpus: int = 8,
    memory_mib: int | None = 81559,
    clique: str | None = None,
    count_label: bool = True,
) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if pool is not None:
        labels[pool_label] = pool
    if product is not None:
        labels["nvidia.com/gpu.product"] = product
    if count_label:
        labels["nvidia.com/gpu.count"] = str(gpus)
    if memory_mib is not None:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    if clique is not None:
        labels["nvidia.com/gpu.clique"] = clique
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96"},
            "capacity": {"nvidia.com/gpu": str(gpus)},
        },
    }
