"""Roll-ups: per-GPU records → one record per pod and one per node, with verdicts.

What ``gpuscale top pods`` and ``top nodes`` show, computed from the per-GPU records of
``metrics/devices.py`` (and, for pods, the Triton values of the adapter's catalogue)::

    [GpuStatus] ──┬─ pod_statuses(…, inference=…) → [PodStatus]   combine() over the pod's GPUs → diagnose
                  └─ node_statuses(…)             → [NodeStatus]  combined signals + counts of GPU verdicts

Contracts:

- Pure: no I/O, no clock; records in, records out (pydantic, so the CLI prints them as JSON/YAML as is).
- A pod's verdict is ``diagnose(combine(its GPUs))``: means of ratios, sums of memory and power, the worst
  health signal. MIG instances of one physical GPU repeat the parent's power, so power is counted once
  per physical GPU (gpu-metrics.md §6) before combining.
- A node has no workload verdict of its own (its GPUs may run unrelated pods): it carries the count of
  each GPU verdict and the most severe GPU (``worst``).
- ``None`` means "not known": e.g. ``gpus`` of a pod read from the custom metrics API, which serves
  values per pod but not per GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.metrics.devices import GpuStatus, Timestamp
from gpuscale.metrics.diagnosis import (
    DiagnosisPolicy,
    GpuSignals,
    Severity,
    Verdict,
    VerdictCode,
    combine,
    diagnose,
)
from gpuscale.metrics.store import MetricPoint
from gpuscale.model import POD, ObjectRef

__all__ = [
    "INFERENCE_METRICS",
    "InferenceStats",
    "NodeStatus",
    "PodStatus",
    "WorstGpu",
    "inference_stats",
    "node_statuses",
    "pod_statuses",
    "verdict_rank",
]

# InferenceStats field → catalogue metric (policies/metrics.yaml) it is read from.
# NB: inference_queue_time_seconds is left out on purpose: the ratio says the same relative to compute time,
# and each metric costs a pass over every Triton series (≈ 0.1 s per pass with 2,900 Triton pods).
INFERENCE_METRICS: dict[str, str] = {
    "queue_depth": "inference_queue_depth",
    "queue_compute_ratio": "inference_queue_compute_ratio",
    "requests_per_second": "inference_requests_per_second",
}

_VERDICT_ORDER = {code: i for i, code in enumerate(VerdictCode)}


def verdict_rank(verdict: Verdict) -> tuple[int, int]:
    """Sort key, most urgent first: higher severity, then the verdict priority (unhealthy before idle)."""
    return (-verdict.severity.rank, _VERDICT_ORDER[verdict.code])


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class InferenceStats(_Record):
    """Triton values of one pod, summed over its models (catalogue metrics; None = no value yet).

    ``queue_depth`` requests pending (gauge); ``queue_compute_ratio`` time queued per time computing over
    the window (> 1: requests wait longer than they compute); ``requests_per_second`` successful requests.
    Rates and the ratio need two scrapes.
    """

    queue_depth: float | None = None
    queue_compute_ratio: float | None = None
    requests_per_second: float | None = None
    sampled_at: Timestamp | None = None


def inference_stats(
    values: Mapping[str, Mapping[ObjectRef, MetricPoint]], *, now: float, max_age_seconds: float
) -> dict[ObjectRef, InferenceStats]:
    """Per pod, the inference values of a snapshot (``Snapshot.values``); stale or missing points are None."""
    fields: dict[ObjectRef, dict[str, float]] = {}
    for name, metric in INFERENCE_METRICS.items():
        for obj, point in values.get(metric, {}).items():
            if obj.kind != POD or point.stale or not math.isfinite(point.value):
                continue
            if now - point.timestamp > max_age_seconds:
                continue
            out = fields.setdefault(obj, {})
            out[name] = point.value
            out["sampled_at"] = min(out.get("sampled_at", point.timestamp), point.timestamp)
    return {obj: InferenceStats(**f) for obj, f in fields.items()}


# --- pods ------------------------------------------------------------------------------------------


class PodStatus(_Record):
    """One pod: its GPUs' signals combined, the verdict on them, and its Triton values if any.

    ``gpus`` counts devices (a MIG instance counts as one; None = unknown); ``devices`` names them as
    ``<node>/<gpu>`` or ``<node>/<gpu>/<GPU_I_ID>``. ``signals`` are the combined values (see
    ``diagnosis.combine``); ``verdict`` the diagnosis of those. ``sampled_at`` is the oldest sample behind it.
    """

    namespace: str
    name: str
    node: str | None = None
    gpus: int | None = None
    devices: list[str] = Field(default_factory=list)
    signals: GpuSignals
    clock_events: list[str] = Field(default_factory=list)
    verdict: Verdict
    inference: InferenceStats | None = None
    sampled_at: Timestamp | None = None


def power_once(gpus: Sequence[GpuStatus]) -> list[GpuSignals]:
    """The GPUs' signals with parent-level power dropped from every MIG instance but the first per GPU."""
    seen: set[tuple[str, ...]] = set()
    out: list[GpuSignals] = []
    for gpu in gpus:
        signals = gpu.signals
        if gpu.physical and gpu.physical in seen:
            signals = signals.model_copy(update={"power_watts": None, "power_limit_watts": None})
        seen.add(gpu.physical)
        out.append(signals)
    return out


def _combined(gpus: Sequence[GpuStatus], policy: DiagnosisPolicy) -> tuple[GpuSignals, Verdict, list[str]]:
    if len(gpus) == 1:  # NB: combine() of one GPU is that GPU; reuse its verdict (the common case, and fast)
        only = gpus[0]
        return only.signals, only.verdict, only.clock_events
    signals = combine(power_once(gpus), policy=policy)
    names = list(dict.fromkeys(name for g in gpus for name in g.clock_events))
    return signals, diagnose(signals, policy), names


def _device_name(gpu: GpuStatus) -> str:
    return f"{gpu.node or '?'}/{gpu.device_id}"


def pod_statuses(
    gpus: Iterable[GpuStatus],
    policy: DiagnosisPolicy,
    *,
    inference: Mapping[ObjectRef, InferenceStats] | None = None,
    node_of: Callable[[str, str], str | None] | None = None,
) -> list[PodStatus]:
    """One record per pod holding a GPU or serving inference metrics, sorted by namespace and name.

    ``node_of(namespace, name)`` places pods without GPU records (Triton only), e.g. from the Kubernetes API.
    """
    held: dict[tuple[str, str], list[GpuStatus]] = {}
    for gpu in gpus:
        if gpu.pod is not None and gpu.namespace is not None:
            held.setdefault((gpu.namespace, gpu.pod), []).append(gpu)
    inference = inference or {}
    keys = set(held) | {(o.namespace or "", o.name) for o in inference}
    out: list[PodStatus] = []
    for namespace, name in sorted(keys):
        devices = held.get((namespace, name), [])
        stats = inference.get(ObjectRef(POD, name, namespace))
        if devices:
            signals, verdict, clock_events = _combined(devices, policy)
            nodes = list(dict.fromkeys(g.node for g in devices if g.node))
            node = ",".join(nodes) or None
            sampled_at: float | None = min(g.sampled_at for g in devices)
        else:
            signals = GpuSignals()
            verdict, clock_events = diagnose(signals, policy), []
            node = None
            sampled_at = None
        if node is None and node_of is not None:
            node = node_of(namespace, name)
        if stats is not None and stats.sampled_at is not None:
            sampled_at = stats.sampled_at if sampled_at is None else min(sampled_at, stats.sampled_at)
        out.append(
            PodStatus(
                namespace=namespace,
                name=name,
                node=node,
                gpus=len(devices),
                devices=[_device_name(g) for g in devices],
                signals=signals,
                clock_events=clock_events,
                verdict=verdict,
                inference=stats,
                sampled_at=sampled_at,
            )
        )
    return out


# --- nodes -----------------------------------------------------------------------------------------


class WorstGpu(_Record):
    """The node's most urgent GPU: highest severity, then verdict priority."""

    gpu: str
    code: VerdictCode
    severity: Severity
    explanation: str


class NodeStatus(_Record):
    """One node: its GPUs' signals combined, and how many GPUs got each verdict.

    ``gpus`` counts physical GPUs and ``devices`` GPUs plus MIG instances (both None = unknown);
    ``pods`` the pods holding them. ``verdict_counts`` maps verdict code → number of devices, most urgent
    code first; ``worst`` is the most urgent device (None when nothing is known per GPU).
    """

    name: str
    gpus: int | None = None
    devices: int | None = None
    pods: int | None = None
    signals: GpuSignals
    clock_events: list[str] = Field(default_factory=list)
    verdict_counts: dict[VerdictCode, int] = Field(default_factory=dict)
    worst: WorstGpu | None = None
    sampled_at: Timestamp | None = None


def node_statuses(gpus: Iterable[GpuStatus], policy: DiagnosisPolicy) -> list[NodeStatus]:
    """One record per node that reported a GPU, sorted by name. Devices without a node are left out."""
    by_node: dict[str, list[GpuStatus]] = {}
    for gpu in gpus:
        if gpu.node:
            by_node.setdefault(gpu.node, []).append(gpu)
    out: list[NodeStatus] = []
    for name in sorted(by_node):
        devices = by_node[name]
        counts: dict[VerdictCode, int] = {}
        for g in sorted(devices, key=lambda g: verdict_rank(g.verdict)):
            counts[g.verdict.code] = counts.get(g.verdict.code, 0) + 1
        worst = min(devices, key=lambda g: verdict_rank(g.verdict))
        out.append(
            NodeStatus(
                name=name,
                gpus=len({g.physical for g in devices}),
                devices=len(devices),
                pods=len({(g.namespace, g.pod) for g in devices if g.pod}),
                signals=combine(power_once(devices), policy=policy),
                clock_events=list(dict.fromkeys(n for g in devices for n in g.clock_events)),
                verdict_counts=counts,
                worst=WorstGpu(
                    gpu=worst.device_id,
                    code=worst.verdict.code,
                    severity=worst.verdict.severity,
                    explanation=worst.verdict.explanation,
                ),
                sampled_at=min(g.sampled_at for g in devices),
            )
        )
    return out
