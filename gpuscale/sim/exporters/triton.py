"""Triton Inference Server's ``/metrics`` text (prometheus-cpp: counters then gauges, labels sorted, per-instance
series with ``gpu_uuid`` plus model-level series without it, NaN printed ``Nan``) and the cumulative state it
is rendered from."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from gpuscale.sim.device_gauges import SimGpuGauges
from gpuscale.sim.serving_queue import ModelRates, TritonModel

FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")


@dataclass(slots=True)
class TritonCounters:
    """Cumulative per-instance counters of one model on one GPU (µs for durations)."""

    success: float = 0.0
    failure_backend: float = 0.0
    inference_count: float = 0.0
    exec_count: float = 0.0
    request_duration_us: float = 0.0
    queue_duration_us: float = 0.0
    compute_input_duration_us: float = 0.0
    compute_infer_duration_us: float = 0.0
    compute_output_duration_us: float = 0.0


@dataclass(slots=True)
class TritonModelLevel:
    """Model-level values: scheduler failures (cumulative) and the pending-request gauge."""

    rejected: float = 0.0
    canceled: float = 0.0
    pending: float = 0.0


@dataclass(slots=True)
class TritonState:
    """Everything one Triton server reports: cumulative counters, its queue backlog, and gauges.

    ``gpu_uuids`` are the GPUs its model instances run on (empty on MIG, where Triton reports no GPU
    metrics, triton#5324 — counters then live on the model-level series). ``gpus`` holds the latest
    signals of those GPUs for the ``nv_gpu_*`` gauges; ``energy_j`` joules since the server started.
    """

    gpu_uuids: tuple[str, ...] = ()
    instance: dict[tuple[str, str, str], TritonCounters] = field(default_factory=dict)
    model_level: dict[tuple[str, str], TritonModelLevel] = field(default_factory=dict)
    backlog: float = 0.0
    energy_j: dict[str, float] = field(default_factory=dict)
    gpus: dict[str, SimGpuGauges] = field(default_factory=dict)
    cpu_utilization: float = 0.0937
    cpu_memory_total_bytes: int = 2199023255552
    cpu_memory_used_bytes: int = 412316860416
    pinned_memory_pool_total_bytes: int = 268435456
    pinned_memory_pool_used_bytes: int = 0

    def counters(self, model: TritonModel, gpu_uuid: str) -> TritonCounters:
        return self.instance.setdefault((model.name, str(model.version), gpu_uuid), TritonCounters())

    def level(self, model: TritonModel) -> TritonModelLevel:
        return self.model_level.setdefault((model.name, str(model.version)), TritonModelLevel())

    def integrate(self, models: Sequence[TritonModel], rates: Mapping[tuple[str, str], ModelRates], dt: float) -> None:
        """Add ``dt`` seconds of ``rates`` (one replica) to the counters, split evenly over its GPUs."""
        uuids = self.gpu_uuids or ("",)
        for model in models:
            r = rates.get((model.name, str(model.version)))
            if r is None:
                continue
            share = dt / len(uuids)
            for gpu_uuid in uuids:
                c = self.counters(model, gpu_uuid)
                c.success += r.success * share
                c.inference_count += r.inference_count * share
                c.exec_count += r.exec_count * share
                c.request_duration_us += r.request_duration_us * share
                c.queue_duration_us += r.queue_duration_us * share
                c.compute_input_duration_us += r.compute_input_duration_us * share
                c.compute_infer_duration_us += r.compute_infer_duration_us * share
                c.compute_output_duration_us += r.compute_output_duration_us * share
            level = self.level(model)
            level.rejected += r.rejected * dt
            level.canceled += r.canceled * dt


def _cpp_number(value: float) -> str:
    """prometheus-cpp's number formatting: 16 significant digits, ``Nan``, ``+Inf``/``-Inf``."""
    if math.isnan(value):
        return "Nan"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.16g}"


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


# (name, type, help) in prometheus-cpp's output order: counters, then gauges.
TRITON_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    (
        "nv_inference_count",
        "counter",
        "Number of inferences performed (does not include cached requests)",
    ),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    (
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_queue_duration_us",
        "counter",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
    ),
    ("nv_energy_consumption", "counter", "GPU energy consumption in joules since the Triton Server started"),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
    ("nv_model_load_duration_secs", "gauge", "Model load time in seconds"),
    ("nv_pinned_memory_pool_total_bytes", "gauge", "Pinned memory pool total memory size, in bytes"),
    ("nv_pinned_memory_pool_used_bytes", "gauge", "Pinned memory pool used memory size, in bytes"),
    ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)"),
    ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes"),
    ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes"),
    ("nv_gpu_power_usage", "gauge", "GPU power usage in watts"),
    ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts"),
    ("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]"),
    ("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes"),
    ("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes"),
)

_COUNTER_FIELDS = {
    "nv_inference_request_success": "success",
    "nv_inference_count": "inference_count",
    "nv_inference_exec_count": "exec_count",
    "nv_inference_request_duration_us": "request_duration_us",
    "nv_inference_queue_duration_us": "queue_duration_us",
    "nv_inference_compute_input_duration_us": "compute_input_duration_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_duration_us",
    "nv_inference_compute_output_duration_us": "compute_output_duration_us",
}

_MIB = 1024 * 1024


def _triton_family(name: str, models: Sequence[TritonModel], state: TritonState) -> Iterator[str]:
    uuids = state.gpu_uuids
    if name in _COUNTER_FIELDS:
        attr = _COUNTER_FIELDS[name]
        for m in models:
            version = str(m.version)
            for u in uuids:
                value = getattr(state.instance.get((m.name, version, u)) or TritonCounters(), attr)
                yield f"{name}{_labels(gpu_uuid=u, model=m.name, version=version)} {_cpp_number(math.floor(value))}"
            level_value = 0.0 if uuids else getattr(state.instance.get((m.name, version, "")) or TritonCounters(), attr)
            yield f"{name}{_labels(model=m.name, version=version)} {_cpp_number(math.floor(level_value))}"
    elif name == "nv_inference_request_failure":
        for m in models:
            version = str(m.version)
            level = state.model_level.get((m.name, version)) or TritonModelLevel()
            for u in uuids:
                backend = (state.instance.get((m.name, version, u)) or TritonCounters()).failure_backend
                for reason in FAILURE_REASONS:
                    value = backend if reason == "BACKEND" else 0.0
                    yield (
                        f"{name}{_labels(gpu_uuid=u, model=m.name, reason=reason, version=version)}"
                        f" {_cpp_number(math.floor(value))}"
                    )
            own_backend = (
                0.0 if uuids else (state.instance.get((m.name, version, "")) or TritonCounters()).failure_backend
            )
            values = {"OTHER": 0.0, "BACKEND": own_backend, "CANCELED": level.canceled, "REJECTED": level.rejected}
            for reason in FAILURE_REASONS:
                yield (
                    f"{name}{_labels(model=m.name, reason=reason, version=version)}"
                    f" {_cpp_number(math.floor(values[reason]))}"
                )
    elif name == "nv_energy_consumption":
        for u in uuids:
            yield f"{name}{_labels(gpu_uuid=u)} {_cpp_number(round(state.energy_j.get(u, 0.0), 3))}"
    elif name in ("nv_inference_pending_request_count", "nv_model_load_duration_secs"):
        for m in models:
            version = str(m.version)
            for u in uuids:
                yield f"{name}{_labels(gpu_uuid=u, model=m.name, version=version)} 0"
            if name == "nv_inference_pending_request_count":
                level = state.model_level.get((m.name, version)) or TritonModelLevel()
                gauge: float = round(level.pending)
            else:
                gauge = m.load_duration_s
            yield f"{name}{_labels(model=m.name, version=version)} {_cpp_number(gauge)}"
    elif name == "nv_pinned_memory_pool_total_bytes":
        yield f"{name} {_cpp_number(state.pinned_memory_pool_total_bytes)}"
    elif name == "nv_pinned_memory_pool_used_bytes":
        yield f"{name} {_cpp_number(state.pinned_memory_pool_used_bytes)}"
    elif name.startswith("nv_gpu_"):
        for u in uuids:
            s = state.gpus.get(u)
            if s is None:
                continue
            value = {
                "nv_gpu_utilization": s.gpu_util_pct / 100.0,
                "nv_gpu_memory_total_bytes": (s.fb_used_mib + s.fb_free_mib + s.fb_reserved_mib) * _MIB,
                "nv_gpu_memory_used_bytes": s.fb_used_mib * _MIB,
                "nv_gpu_power_usage": s.power_w,
                "nv_gpu_power_limit": s.power_limit_w,
            }[name]
            yield f"{name}{_labels(gpu_uuid=u)} {_cpp_number(value)}"
    elif name == "nv_cpu_utilization":
        yield f"{name} {_cpp_number(round(state.cpu_utilization, 4))}"
    elif name == "nv_cpu_memory_total_bytes":
        yield f"{name} {_cpp_number(state.cpu_memory_total_bytes)}"
    elif name == "nv_cpu_memory_used_bytes":
        yield f"{name} {_cpp_number(state.cpu_memory_used_bytes)}"


def render_triton(models: Sequence[TritonModel], state: TritonState) -> str:
    """Triton's ``/metrics`` text (default metric flags: counters and gauges, no histograms/summaries).

    Integer-valued counters print their floor, so they only ever step up while ``state`` integrates.
    Families without series are omitted, as prometheus-cpp does.
    """
    lines: list[str] = []
    for name, kind, help_text in TRITON_FAMILIES:
        samples = list(_triton_family(name, models, state))
        if samples:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)
    return "\n".join(lines) + "\n" if lines else ""
