"""Histories with known answers, built sample by sample (no fetching): the report core's test inputs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuscale.metrics.history import History, Owner, PodRef

H100 = "NVIDIA H100 80GB HBM3"
START = 1_780_000_000.0  # a fixed epoch second: the report is pure, so no clock is needed


def history(*, hours: float, step: float = 60.0) -> History:
    return History(start=START, step_seconds=step, steps=int(hours * 3600 / step), source="test")


def add_pod(
    h: History,
    *,
    namespace: str = "ml",
    pod: str,
    owner: tuple[str, str] | None = ("Deployment", "app"),
    requests: float | None = None,
    gpus: int = 1,
    node: str = "node-a",
    product: str | None = H100,
    values: Callable[[int, np.ndarray], dict[str, np.ndarray]],
    held: slice = slice(None),
    first_gpu: int = 0,
) -> list[str]:
    """A pod holding ``gpus`` GPUs over ``held`` steps; ``values(gpu_index, t)`` gives each field's samples
    (t = seconds since the start, for every step; NaN where a field is not sampled)."""
    ref = PodRef(namespace, pod)
    index = h.pod_index(ref)
    if owner is not None:
        h.owners[ref] = Owner(*owner)
    if requests is not None:
        h.requests[ref] = requests
    t = np.arange(h.steps) * h.step_seconds
    keys = []
    for g in range(gpus):
        key = f"GPU-{node}-{first_gpu + g}"
        gpu = next((x for x in h.gpus if x.key == key), None) or h.new_gpu(key, node=node, product=product)
        gpu.pod[held] = index
        for name, arr in values(g, t).items():
            current = gpu.values.setdefault(name, h.empty_field())
            current[held] = np.asarray(arr, dtype=np.float32)[held]
        keys.append(key)
    return keys


def constant(**fields: float) -> Callable[[int, np.ndarray], dict[str, np.ndarray]]:
    return lambda g, t: {k: np.full(t.shape, v) for k, v in fields.items()}
