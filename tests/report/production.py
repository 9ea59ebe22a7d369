"""A production-shaped fleet for the report's end-to-end check: not a textbook history but the shapes that fooled
an earlier report on a real trace (about 140 inference pods over a day).

Over ``hours`` at 1-minute samples, every pod holding one H100 and requesting it (kube-state-metrics), owned
by a Deployment through a ReplicaSet:

* ``gen`` — a pooled Deployment of ``pooled`` pods (100 unless asked), each busy in rare bursts (10 % of minutes at
  60–100 % SM activity, else 2 %); the last fifth (pods 80–99 of 100) come and go (each alive 2–4 h somewhere in the
  window).
* ``svc-00`` … ``svc-34`` — one pod each, in eight shapes: idle, moderate, the production case (30 % most of the
  time, p95 ≈ 65 %, p99 ≈ 93 %), constant high, rare spikes (5 % baseline, 1.5 % of minutes at 90 %: p95 says
  idle, p99 says busy), idle with three one-minute wake-ups, idle with one, and near the busy line but under it. Every third one has a scrape
  gap of 30–90 minutes (no samples at all: the TSDBs fill it from their lookback, the report must not).

``ProductionFleet.raw`` keeps, per workload, the sampled activity of every pod-minute, so a test computes hours,
exact percentiles and the busy verdict independently (numpy over the raw samples).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tests.report.fleet import H100, Series

SHAPES = ("idle", "moderate", "production", "high", "spikes", "wakeups", "under-the-line", "rare-wakeup")


@dataclass
class ProductionFleet:
    series: list[Series] = field(default_factory=list)
    raw: dict[str, list[np.ndarray]] = field(default_factory=dict)  # workload → each pod's sampled activity
    demand: dict[str, np.ndarray] = field(default_factory=dict)  # workload → GPU-equivalents busy per minute
    shapes: dict[str, str] = field(default_factory=dict)
    gpus: int = 0


def _activity(shape: str, steps: int, rng: np.random.Generator) -> np.ndarray:
    if shape == "idle":
        a = rng.uniform(0.0, 0.05, steps)
    elif shape == "moderate":
        a = rng.uniform(0.15, 0.35, steps)
    elif shape == "production":
        a = np.full(steps, 0.3)
        blocks = a.reshape(-1, 6)  # peaks come in 6-minute bursts, as a real service's do
        order = rng.permutation(len(blocks))
        top, mid = max(1, round(len(blocks) * 0.02)), max(1, round(len(blocks) * 0.04))
        blocks[order[:top]], blocks[order[top : top + mid]] = 0.93, 0.65
        a = blocks.reshape(-1)
    elif shape == "high":
        a = rng.uniform(0.75, 0.9, steps)
    elif shape == "spikes":
        a = np.full(steps, 0.05)
        a[rng.choice(steps, size=max(4, round(steps * 0.015)), replace=False)] = 0.9
    elif shape == "wakeups":
        a = np.zeros(steps)
        a[[steps // 8, 5 * steps // 8, 11 * steps // 12]] = 0.8  # three one-minute wake-ups after long idle
    elif shape == "rare-wakeup":
        a = np.zeros(steps)
        a[2 * steps // 3] = 0.8  # one
    elif shape == "under-the-line":
        a = rng.uniform(0.2, 0.42, steps)
    else:
        raise ValueError(shape)
    return np.round(a, 4)


def production_fleet(*, end: float, hours: int, seed: int = 7, pooled: int = 100) -> ProductionFleet:
    rng = np.random.default_rng(seed)
    steps = hours * 60
    start = end - hours * 3600
    times = np.array([start + i * 60.0 for i in range(steps)])
    out = ProductionFleet()

    def pod(workload: str, name: str, node: str, index: int, activity: np.ndarray, alive: np.ndarray) -> None:
        labels = {"Hostname": node, "UUID": f"GPU-{name}", "gpu": str(index), "modelName": H100, "pod": name,
                  "namespace": "serve"}  # fmt: skip
        ts = times[alive]
        acts = activity[alive]
        fb = np.round(6000 + 30000 * acts, 0)
        util = np.where(acts > 0.01, 100.0, 0.0)
        for metric, values in (
            ("DCGM_FI_DEV_GPU_UTIL", util),
            ("DCGM_FI_PROF_SM_ACTIVE", acts),
            ("DCGM_FI_DEV_FB_USED", fb),
        ):
            out.series.append((metric, labels, [(float(t), float(v)) for t, v in zip(ts, values, strict=True)]))
        owner = {"namespace": "serve", "pod": name, "owner_kind": "ReplicaSet", "owner_name": f"{workload}-5d8c"}
        out.series.append(("kube_pod_owner", owner, [(t, 1.0) for t in ts]))
        requests = {"namespace": "serve", "pod": name, "container": "main", "resource": "nvidia_com_gpu",
                    "unit": "integer"}  # fmt: skip
        out.series.append(("kube_pod_container_resource_requests", requests, [(t, 1.0) for t in ts]))
        out.raw.setdefault(workload, []).append(acts.astype(np.float64))
        out.demand[workload] = out.demand.get(workload, np.zeros(steps)) + np.where(alive, activity, 0.0)
        out.gpus += 1

    def deployment(workload: str) -> None:
        rs = {"namespace": "serve", "replicaset": f"{workload}-5d8c", "owner_kind": "Deployment",
              "owner_name": workload}  # fmt: skip
        out.series.append(("kube_replicaset_owner", rs, [(t, 1.0) for t in times]))

    everywhere = np.ones(steps, dtype=bool)
    for i in range(pooled):
        activity = np.round(np.where(rng.random(steps) < 0.1, rng.uniform(0.6, 1.0, steps), 0.02), 4)
        alive = everywhere
        if i >= pooled * 4 // 5:
            span = int(rng.integers(120, 241))
            begin = int(rng.integers(0, steps - span + 1))
            alive = (np.arange(steps) >= begin) & (np.arange(steps) < begin + span)
        pod("gen", f"gen-5d8c-{i:05d}", f"node-g{i // 8:02d}", i % 8, activity, alive)
    deployment("gen")
    out.shapes["gen"] = "pooled"

    for k in range(35):
        shape = SHAPES[k % len(SHAPES)]
        name = f"svc-{k:02d}"
        alive = everywhere.copy()
        if k % 3 == 0:
            length = int(rng.integers(30, 91))
            begin = int(rng.integers(60, steps - length - 60))
            alive[begin : begin + length] = False
        pod(name, f"{name}-5d8c-abcde", f"node-s{k // 8:02d}", k % 8, _activity(shape, steps, rng), alive)
        deployment(name)
        out.shapes[name] = shape
    return out
