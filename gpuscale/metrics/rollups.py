"""Roll-ups: per-GPU records → one record per pod and one per node, with verdicts.

What ``gpuscale top pods`` and ``top nodes`` show, computed from the per-GPU records of
``metrics/devices.py`` (and, for pods, the Triton values of the adapter's catalogue)::

    [GpuStatus] ──┬─ pod_statuses(…, inference=…) → [PodStatus]   combine() over the pod's GPUs → diagnose
                  └─ node_statuses(…)             → [NodeStatus]  combined signals + counts of GPU verdicts
    [DeviceReading] ─ pod_statuses_of_readings(…)  → [PodStatus]   the same, without a GpuStatus per GPU

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
from typing import NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.metrics.devices import (
    DeviceReading,
    GpuStatus,
    Timestamp,
    clock_event_names,
    device_id,
    reading_signals,
)
from gpuscale.metrics.diagnosis import (
    DiagnosisPolicy,
    GpuSignals,
    ServingSignals,
    ServingVerdict,
    Severity,
    Verdict,
    VerdictCode,
    combine,
    diagnose,
    diagnose_serving,
    trusted,
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
    "pod_statuses_of_readings",
    "verdict_rank",
]

# InferenceStats field → catalogue metric (policies/metrics.yaml) it is read from.
# NB: inference_queue_time_seconds is left out on purpose: the ratio says the same relative to compute time,
# and each metric costs a pass over every Triton series (≈ 0.1 s per pass with 2,900 Triton pods).
INFERENCE_METRICS: dict[str, str] = {
    "queue_depth": "inference_queue_depth",
    "queue_compute_ratio": "inference_queue_compute_ratio",
    "requests_per_second": "inference_requests_per_second",
    # LLM servers (vLLM, SGLang, TGI, NIM); a Triton-only fleet has none of their series, so each costs little.
    "batch_size": "inference_batch_size",
    "kv_cache_usage": "inference_kv_cache_usage",
    "ttft_p95_seconds": "inference_ttft_p95_seconds",
    "preemptions_per_second": "inference_preemptions_per_second",
}

_VERDICT_ORDER = {code: i for i, code in enumerate(VerdictCode)}


def verdict_rank(verdict: Verdict) -> tuple[int, int]:
    """Sort key, most urgent first: higher severity, then the verdict priority (unhealthy before idle)."""
    return (-verdict.severity.rank, _VERDICT_ORDER[verdict.code])


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class InferenceStats(_Record):
    """Inference-server values of one pod (Triton, vLLM, SGLang, TGI, NIM; catalogue metrics; None = no value yet).

    ``queue_depth`` requests pending (gauge); ``queue_compute_ratio`` time queued per time computing over
    the window (> 1: requests wait longer than they compute); ``requests_per_second`` successful requests.
    Rates and the ratio need two scrapes.
    """

    queue_depth: float | None = None
    queue_compute_ratio: float | None = None
    requests_per_second: float | None = None
    batch_size: float | None = None  # requests running (LLM servers)
    kv_cache_usage: float | None = None  # percent, the fullest engine
    ttft_p95_seconds: float | None = None
    preemptions_per_second: float | None = None
    sampled_at: Timestamp | None = None

    @property
    def serves_llm(self) -> bool:
        """Whether an LLM server's own signals are reported (the serving verdicts are about those)."""
        return self.batch_size is not None or self.kv_cache_usage is not None

    def serving(self) -> ServingSignals:
        return ServingSignals(
            queue_depth=self.queue_depth,
            batch_size=self.batch_size,
            kv_cache_usage_percent=self.kv_cache_usage,
            preemptions_per_second=self.preemptions_per_second,
        )


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
            out[name] = float(point.value)
            out["sampled_at"] = min(out.get("sampled_at", math.inf), float(point.timestamp))
    return {obj: _new_inference(f) for obj, f in fields.items()}  # NB: floats only: trusted (2,881 Triton pods)


_new_inference = trusted(InferenceStats)


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
    serving: ServingVerdict | None = None  # the inference server's own signals (queue, batch, KV cache)
    inference: InferenceStats | None = None
    sampled_at: Timestamp | None = None


_new_pod = trusted(PodStatus)


def power_once(gpus: Sequence[GpuStatus]) -> list[GpuSignals]:
    """The GPUs' signals with parent-level power dropped from every MIG instance but the first per GPU."""
    return _power_once((gpu.physical, gpu.signals) for gpu in gpus)


def _power_once(devices: Iterable[tuple[tuple[str, ...], GpuSignals]]) -> list[GpuSignals]:
    seen: set[tuple[str, ...]] = set()
    out: list[GpuSignals] = []
    for physical, signals in devices:
        if physical and physical in seen:
            signals = signals.model_copy(update={"power_watts": None, "power_limit_watts": None})
        seen.add(physical)
        out.append(signals)
    return out


class _PodGpus(NamedTuple):
    """What a pod record takes from its GPUs: combined signals, their verdict, and where they are."""

    signals: GpuSignals
    verdict: Verdict
    clock_events: list[str]
    devices: list[str]  # <node>/<device id>
    nodes: list[str]
    sampled_at: float


def _of_statuses(gpus: list[GpuStatus], policy: DiagnosisPolicy) -> _PodGpus:
    if len(gpus) == 1:  # NB: combine() of one GPU is that GPU; reuse its verdict (the common case, and fast)
        only = gpus[0]
        signals, verdict, clock_events = only.signals, only.verdict, only.clock_events
    else:
        signals = combine(power_once(gpus), policy=policy)
        verdict = diagnose(signals, policy)
        clock_events = list(dict.fromkeys(name for g in gpus for name in g.clock_events))
    return _PodGpus(
        signals,
        verdict,
        clock_events,
        [f"{g.node or '?'}/{g.device_id}" for g in gpus],
        list(dict.fromkeys(g.node for g in gpus if g.node)),
        min(g.sampled_at for g in gpus),
    )


def _of_readings(readings: list[DeviceReading], policy: DiagnosisPolicy) -> _PodGpus:
    signals_each = [reading_signals(r) for r in readings]
    if len(readings) == 1:
        signals = signals_each[0]
        clock_events = clock_event_names(signals)
    else:
        physical = [r.device.physical for r in readings]
        signals = combine(_power_once(zip(physical, signals_each, strict=True)), policy=policy)
        clock_events = list(dict.fromkeys(name for s in signals_each for name in clock_event_names(s)))
    return _PodGpus(
        signals,
        diagnose(signals, policy),
        clock_events,
        [f"{r.device.node or '?'}/{device_id(r.labels)}" for r in readings],
        list(dict.fromkeys(r.device.node for r in readings if r.device.node)),
        min(r.sampled_at for r in readings),
    )


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
    return _pod_records(held, _of_statuses, policy, inference, node_of)


def pod_statuses_of_readings(
    readings: Iterable[DeviceReading],
    policy: DiagnosisPolicy,
    *,
    inference: Mapping[ObjectRef, InferenceStats] | None = None,
    node_of: Callable[[str, str], str | None] | None = None,
) -> list[PodStatus]:
    """``pod_statuses(gpu_statuses(readings), …)``, without a diagnosed GpuStatus per GPU: what a view of pods
    needs. A pod of several GPUs is diagnosed once, on their combined signals (in ``gpu_statuses`` each GPU
    is diagnosed too, for nothing here: 2,000 of 7,000 GPUs of a busy cluster's pods are in training pods).
    """
    held: dict[tuple[str, str], list[DeviceReading]] = {}
    for reading in readings:
        owner = reading.device.pod
        if owner is not None and owner.namespace is not None:
            held.setdefault((owner.namespace, owner.name), []).append(reading)
    return _pod_records(held, _of_readings, policy, inference, node_of)


_M = TypeVar("_M", GpuStatus, DeviceReading)


def _pod_records(
    held: dict[tuple[str, str], list[_M]],
    summarise: Callable[[list[_M], DiagnosisPolicy], _PodGpus],
    policy: DiagnosisPolicy,
    inference: Mapping[ObjectRef, InferenceStats] | None,
    node_of: Callable[[str, str], str | None] | None,
) -> list[PodStatus]:
    inference = inference or {}
    keys = set(held) | {(o.namespace or "", o.name) for o in inference}
    out: list[PodStatus] = []
    no_gpus: Verdict | None = None
    for namespace, name in sorted(keys):
        members = held.get((namespace, name))
        stats = inference.get(ObjectRef(POD, name, namespace)) if inference else None
        node: str | None = None
        sampled_at: float | None = None
        if members:
            gpus = summarise(members, policy)
            signals, verdict, clock_events, devices = gpus.signals, gpus.verdict, gpus.clock_events, gpus.devices
            node = ",".join(gpus.nodes) or None
            sampled_at = gpus.sampled_at
        else:
            signals, clock_events, devices = GpuSignals(), [], []
            no_gpus = verdict = no_gpus or diagnose(signals, policy)
        if node is None and node_of is not None:
            node = node_of(namespace, name)
        if stats is not None and stats.sampled_at is not None:
            sampled_at = stats.sampled_at if sampled_at is None else min(sampled_at, stats.sampled_at)
        # NB: trusted construction (every value below is of its field's type): this runs per pod.
        out.append(
            _new_pod(
                {
                    "namespace": namespace,
                    "name": name,
                    "node": node,
                    "gpus": len(devices),
                    "devices": devices,
                    "signals": signals,
                    "clock_events": clock_events,
                    "verdict": verdict,
                    "inference": stats,
                    "serving": diagnose_serving(stats.serving(), signals, policy)
                    if stats is not None and stats.serves_llm
                    else None,
                    "sampled_at": None if sampled_at is None else float(sampled_at),
                }
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
