"""``--sort-by``: a registry of sort keys per view (krr-style); an unknown key fails with the valid ones."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gpuscale.errors import ConfigError
from gpuscale.metrics.devices import GpuStatus
from gpuscale.metrics.rollups import NodeStatus, PodStatus, verdict_rank
from gpuscale.top.document import View, WorkloadStatus

__all__ = ["SORT_KEYS", "sort_items"]

_I = TypeVar("_I", GpuStatus, PodStatus, NodeStatus, WorkloadStatus)
SortKey = Callable[[Any], Any]


def _desc(value: float | None) -> tuple[bool, float]:
    """Largest first, unknown last."""
    return (value is None, -(value or 0.0))


def _signal(name: str) -> SortKey:
    return lambda item: _desc(getattr(item.signals, name))


def _gpu_order(g: GpuStatus) -> tuple[Any, ...]:
    index = int(g.gpu) if g.gpu.isdigit() else 1 << 30
    instance = int(g.mig_instance) if g.mig_instance and g.mig_instance.isdigit() else -1
    return (g.node or "", index, g.gpu, instance)


_COMMON_KEYS: dict[str, SortKey] = {
    "util": _signal("gpu_util_percent"),
    "sm": _signal("sm_active"),
    "occupancy": _signal("sm_occupancy"),
    "tensor": _signal("tensor_active"),
    "dram": _signal("dram_active"),
    "memory": _signal("fb_used_mib"),
    "power": _signal("power_watts"),
    "temp": _signal("gpu_temp_c"),
}

SORT_KEYS: dict[View, dict[str, SortKey]] = {
    "gpus": {
        "name": _gpu_order,
        "node": _gpu_order,
        "pod": lambda g: (g.pod is None, g.namespace or "", g.pod or "", _gpu_order(g)),
        **_COMMON_KEYS,
        "verdict": lambda g: verdict_rank(g.verdict),
    },
    "pods": {
        "name": lambda p: (p.namespace, p.name),
        "node": lambda p: (p.node is None, p.node or "", p.namespace, p.name),
        "gpus": lambda p: _desc(p.gpus),
        **_COMMON_KEYS,
        "queue": lambda p: _desc(p.inference.queue_depth if p.inference else None),
        "ratio": lambda p: _desc(p.inference.queue_compute_ratio if p.inference else None),
        "rps": lambda p: _desc(p.inference.requests_per_second if p.inference else None),
        "batch": lambda p: _desc(p.inference.batch_size if p.inference else None),
        "kv": lambda p: _desc(p.inference.kv_cache_usage if p.inference else None),
        "ttft": lambda p: _desc(p.inference.ttft_p95_seconds if p.inference else None),
        "verdict": lambda p: verdict_rank(p.verdict),
    },
    "nodes": {
        "name": lambda n: n.name,
        "gpus": lambda n: _desc(n.gpus),
        "pods": lambda n: _desc(n.pods),
        **_COMMON_KEYS,
        "verdict": lambda n: verdict_rank(n.worst) if n.worst else (1, 0),
    },
    "workloads": {
        "name": lambda w: (w.namespace, w.name, w.kind),
        "rps": lambda w: _desc(w.requests_per_second),
        "forecast": lambda w: _desc(w.forecast_requests_per_second),
        "p90": lambda w: _desc(w.forecast_p90_requests_per_second),
        "replicas": lambda w: _desc(w.forecast_replicas),
    },
}


def sort_items(view: View, items: Sequence[_I], key: str | None) -> list[_I]:
    """Items sorted by a named key (default ``name``); numbers largest first, names A→Z; ties by name."""
    keys = SORT_KEYS[view]
    if key is None:
        return sorted(items, key=keys["name"])
    chosen = keys.get(key)
    if chosen is None:
        raise ConfigError(f"--sort-by {key!r}: not a sort key for {view}; valid: {', '.join(keys)}")
    by_name = keys["name"]
    return sorted(items, key=lambda i: (chosen(i), by_name(i)))
