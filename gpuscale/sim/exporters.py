"""Simulated dcgm-exporter and Triton metrics endpoints: renderers, the simulation state, HTTP servers.

Layers, from pure to I/O:

- ``render_dcgm`` / ``render_triton`` — pure functions producing text in the exact upstream exposition
  format of ``tests/fixtures/dcgm/dcgm-exporter-h100-8gpu.prom`` (dcgm-exporter 4.4.x: families in DCGM
  field-ID order, HELP/TYPE from the counters CSV, label order from ``render_metrics.go``, INT64 as ``%d``,
  DOUBLE as ``%f``, idle GPUs without pod labels, MIG instances repeating device-level values) and of
  ``tests/fixtures/triton/triton.prom`` (prometheus-cpp: counters then gauges, labels sorted, per-instance
  series with ``gpu_uuid`` plus model-level series without it, NaN printed ``Nan``).
- ``ClusterSim`` — the in-memory simulation of a ``Scenario``: current placements, load models, and the
  cumulative state (energy, throttling time, Triton counters and queue backlogs) integrated over simulated
  time in steps of at most one second. Time is always passed in; nothing here reads a clock.
- ``ExporterServer`` — one aiohttp runner serving any number of endpoints, each on its own 127.0.0.1 port
  at ``/metrics``, rendering on every GET, with per-endpoint fault knobs (``Faults``).
- ``SimExporters`` — wires a scenario to an ``ExporterServer``: one dcgm-exporter per node and one Triton
  endpoint per running Triton pod, rendered from the load model at ``clock()``; run-time knobs
  ``set_load`` and ``set_replicas`` (for an HPA replay), fault injection, and ``kube_objects()`` with the
  real ports for the simulated Kubernetes API.

Load models see *seconds since the simulation started* (``clock()`` at ``start``), so a ``StepLoad`` at
60 s means one minute into the run whatever the clock's epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import re
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from aiohttp import web

from gpuscale.metrics.diagnosis import CLOCK_EVENT_BITS
from gpuscale.sim.llm import LlmFleet, LlmServer, LlmState, with_llm_endpoints
from gpuscale.sim.load import (
    Activity,
    GpuSignals,
    InstanceLoad,
    InstanceSignals,
    LoadModel,
    ModelRates,
    QueueState,
    TritonModel,
    activity,
    advance_backlog,
    device_signals,
    replica_queue,
    smooth_noise,
    triton_rates,
    unit_hash,
)
from gpuscale.sim.scenario import (
    ContainerRef,
    GpuSlot,
    Placement,
    PodKey,
    Scenario,
    SimNode,
    SimWorkload,
)

__all__ = [
    "DCGM_FAMILIES",
    "TRITON_FAMILIES",
    "ClusterSim",
    "DcgmFamily",
    "ExporterServer",
    "Faults",
    "ManualClock",
    "SimExporters",
    "TritonState",
    "render_dcgm",
    "render_triton",
]

log = logging.getLogger(__name__)

Clock = Callable[[], float]
LabelStyle = Literal["default", "pod_name"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ManualClock:
    """A clock for tests: returns ``now`` seconds until told to ``advance``."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


# --- DCGM rendering ----------------------------------------------------------------------------------

# Text of DCGM_FI_DEV_XID_ERRORS' err_msg, from dcgm-exporter collector/xid_errors.go (subset).
XID_MESSAGES: dict[int, str] = {
    0: "No Error",
    8: "GPU stopped processing",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    140: "Unrecovered ECC Error",
    154: "GPU Recovery Action Changed",
}

# Label values of DCGM_EXP_CLOCK_EVENTS_COUNT per bit (collector/clock_events_collector.go).
CLOCK_EVENT_NAMES = CLOCK_EVENT_BITS

WINDOW_SIZE_MS = "300000"

MigMode = Literal["device", "instance"] | None


class _Series(NamedTuple):
    labels: tuple[tuple[str, str], ...]  # extra "Labels" (sorted with DCGM_FI_DRIVER_VERSION)
    attributes: tuple[tuple[str, str], ...]  # extra "Attributes" (sorted with container/namespace/pod)
    value: float


@dataclass(frozen=True, slots=True)
class DcgmFamily:
    """One dcgm-exporter metric family: name, TYPE, HELP (from the counters CSV) and how to read it.

    ``double`` selects ``%f`` over ``%d``. ``mig`` says what a MIG instance series shows: the parent's
    device-level value (``"device"``), the instance's own (``"instance"``), or nothing (None).
    """

    name: str
    type: str
    help: str
    value: Callable[[GpuSignals, InstanceSignals | None], float] | None
    double: bool = False
    mig: MigMode = "device"
    kind: Literal["plain", "xid", "xid_count", "clock_events"] = "plain"


def _dev(attr: str) -> Callable[[GpuSignals, InstanceSignals | None], float]:
    return lambda s, _i: getattr(s, attr)


def _inst(attr: str, device_attr: str | None = None) -> Callable[[GpuSignals, InstanceSignals | None], float]:
    device_attr = device_attr or attr
    return lambda s, i: getattr(i, attr) if i is not None else getattr(s, device_attr)


# NB: the order is the DCGM field-ID order of dcgm-exporter's output (text/template over a map sorted by
# counter, FieldID first), as in the 8×H100 fixture; the EXP families come last.
DCGM_FAMILIES: tuple[DcgmFamily, ...] = (
    DcgmFamily("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", _dev("sm_clock_mhz")),
    DcgmFamily("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", _dev("mem_clock_mhz")),
    DcgmFamily(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
        _dev("clock_event_mask"),
    ),
    DcgmFamily("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", _dev("memory_temp_c")),
    DcgmFamily("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", _dev("gpu_temp_c")),
    DcgmFamily("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _dev("power_w"), double=True),
    DcgmFamily(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        _dev("total_energy_mj"),
    ),
    DcgmFamily(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).", _dev("power_limit_w"), double=True
    ),
    DcgmFamily(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", _dev("pcie_replay_count")
    ),
    DcgmFamily("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", _dev("gpu_util_pct"), mig=None),
    DcgmFamily("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", _dev("mem_copy_util_pct"), mig=None),
    DcgmFamily("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", _dev("enc_util_pct"), mig=None),
    DcgmFamily("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", _dev("dec_util_pct"), mig=None),
    DcgmFamily(
        "DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", _dev("last_xid"), kind="xid"
    ),
    DcgmFamily(
        "DCGM_FI_DEV_POWER_VIOLATION",
        "counter",
        "Throttling duration due to power constraints (in ns).",
        _dev("power_violation_ns"),
    ),
    DcgmFamily(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "counter",
        "Throttling duration due to thermal constraints (in ns).",
        _dev("thermal_violation_ns"),
    ),
    DcgmFamily(
        "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _inst("fb_free_mib"), mig="instance"
    ),
    DcgmFamily(
        "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _inst("fb_used_mib"), mig="instance"
    ),
    DcgmFamily(
        "DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", _dev("fb_reserved_mib"), mig=None
    ),
    DcgmFamily(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        _dev("ecc_sbe_vol_total"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        _dev("ecc_dbe_vol_total"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "counter",
        "Total number of single-bit persistent ECC errors.",
        _dev("ecc_sbe_agg_total"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "counter",
        "Total number of double-bit persistent ECC errors.",
        _dev("ecc_dbe_agg_total"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        _dev("uncorrectable_remapped_rows"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        _dev("correctable_remapped_rows"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        _dev("row_remap_failure"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        _dev("nvlink_bandwidth_total"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", _dev("vgpu_license_status"), mig=None
    ),
    DcgmFamily(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        _inst("gr_engine_active"),
        double=True,
        mig="instance",
    ),
    DcgmFamily(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        _inst("sm_active"),
        double=True,
        mig="instance",
    ),
    DcgmFamily(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        _inst("sm_occupancy"),
        double=True,
        mig="instance",
    ),
    DcgmFamily(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        _inst("tensor_active"),
        double=True,
        mig="instance",
    ),
    DcgmFamily(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        _inst("dram_active"),
        double=True,
        mig="instance",
    ),
    DcgmFamily(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
        _dev("pcie_tx_bytes"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads"
        " - in bytes per second.",
        _dev("pcie_rx_bytes"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data not including protocol headers transmitted over NVLink (in B/s).",
        _dev("nvlink_tx_bytes"),
        mig=None,
    ),
    DcgmFamily(
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data not including protocol headers received over NVLink (in B/s).",
        _dev("nvlink_rx_bytes"),
        mig=None,
    ),
    DcgmFamily("DCGM_EXP_XID_ERRORS_COUNT", "counter", "reported XIDs during last window", None, kind="xid_count"),
    DcgmFamily("DCGM_EXP_CLOCK_EVENTS_COUNT", "counter", "reported clock events", None, kind="clock_events"),
)


def _family_series(family: DcgmFamily, signals: GpuSignals, instance: InstanceSignals | None) -> list[_Series]:
    if family.kind == "xid_count":
        if not signals.xid_window:
            return [_Series((("window_size_in_ms", WINDOW_SIZE_MS),), (), 0)]
        return [
            _Series((("window_size_in_ms", WINDOW_SIZE_MS), ("xid", str(xid))), (), count)
            for xid, count in signals.xid_window
        ]
    if family.kind == "clock_events":
        # NB: no series at all for a GPU whose mask stayed 0 (expcollector.go).
        return [
            _Series((("clock_event", name), ("window_size_in_ms", WINDOW_SIZE_MS)), (), signals.clock_events_in_window)
            for bit, name in CLOCK_EVENT_NAMES
            if signals.clock_event_mask & bit
        ]
    assert family.value is not None
    value = family.value(signals, instance)
    if family.kind == "xid":
        xid = int(signals.last_xid)
        message = XID_MESSAGES.get(xid, "Unknown Error")
        return [_Series((), (("err_code", str(xid)), ("err_msg", message)), value)]
    return [_Series((), (), value)]


def _go_number(value: float, *, double: bool) -> str:
    """Go's ``%f`` (DOUBLE fields) or ``%d`` (INT64 fields), including NaN/Inf spelling."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if double:
        return f"{value:.6f}"
    return str(round(value))


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", version)
    return tuple(int(p) for p in parts) or (0,)


def _pod_for(pods_by_gpu: Mapping[Any, Any], gpu: int, instance: int | None) -> tuple[str, str, str] | None:
    ref = pods_by_gpu.get(GpuSlot(gpu, instance))
    if ref is None and instance is None:
        ref = pods_by_gpu.get(gpu)
    if ref is None:
        return None
    namespace, pod, container = ref
    return str(namespace), str(pod), str(container)


def render_dcgm(
    node: SimNode,
    signals_by_gpu: Mapping[int, GpuSignals],
    *,
    pods_by_gpu: Mapping[Any, ContainerRef | tuple[str, str, str]],
    version: str = "4.4",
    label_style: LabelStyle = "default",
    hostname_label: str | None = "Hostname",
) -> str:
    """dcgm-exporter's ``/metrics`` text for ``node``.

    ``signals_by_gpu``: GPU index → its signals (a GPU without an entry is not reported).
    ``pods_by_gpu``: ``GpuSlot(gpu, instance)`` (or a bare GPU index) → ``(namespace, pod, container)``;
    devices without an entry are idle and carry no pod labels (dcgm-exporter ≥ 4.0).

    Variants: ``version`` ≥ "4.5.3" drops the empty ``pod_uid``; ``label_style="pod_name"`` is ``-o``
    (``uuid``, ``pod_name``/``pod_namespace``/``container_name``); ``hostname_label="hostname"`` is the
    post-4.8.2 rename and ``None`` is ``-n`` (no hostname label).
    """
    old_names = label_style == "pod_name"
    uuid_label = "uuid" if old_names else "UUID"
    pod_attr = ("container_name", "pod_namespace", "pod_name") if old_names else ("container", "namespace", "pod")
    with_pod_uid = _version_tuple(version) < (4, 5, 3)

    entities: list[tuple[str, dict[str, str], GpuSignals, bool, InstanceSignals | None]] = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        signals = signals_by_gpu.get(gpu.index)
        if signals is None:
            continue
        base = (
            f'gpu="{gpu.index}",{uuid_label}="{gpu.uuid}",pci_bus_id="{gpu.pci_bus_id}",'
            f'device="{gpu.device}",modelName="{gpu.model_name}"'
        )
        instances: list[tuple[int | None, str]] = (
            [
                (inst.instance_id, f'{base},GPU_I_PROFILE="{inst.profile}",GPU_I_ID="{inst.instance_id}"')
                for inst in gpu.mig
            ]
            if gpu.mig
            else [(None, base)]
        )
        for instance_id, prefix in instances:
            if hostname_label:
                prefix = f'{prefix},{hostname_label}="{node.name}"'
            attributes: dict[str, str] = {}
            pod = _pod_for(pods_by_gpu, gpu.index, instance_id)
            if pod is not None:
                namespace, pod_name, container = pod
                attributes = {pod_attr[0]: container, pod_attr[1]: namespace, pod_attr[2]: pod_name}
                if with_pod_uid:
                    attributes["pod_uid"] = ""
            instance_signals = signals.instances.get(instance_id) if instance_id is not None else None
            entities.append((prefix, attributes, signals, instance_id is not None, instance_signals))

    lines: list[str] = []
    driver = node.driver_version
    for family in DCGM_FAMILIES:
        rendered: list[str] = []
        for prefix, attributes, signals, is_instance, instance_signals in entities:
            if is_instance and family.mig is None:
                continue
            for series in _family_series(family, signals, instance_signals):
                labels = sorted([("DCGM_FI_DRIVER_VERSION", driver), *series.labels])
                attrs = sorted([*attributes.items(), *series.attributes])
                tail = "".join(f',{k}="{v}"' for k, v in (*labels, *attrs))
                rendered.append(f"{family.name}{{{prefix}{tail}}} {_go_number(series.value, double=family.double)}")
        if rendered:
            lines.append(f"# HELP {family.name} {family.help}")
            lines.append(f"# TYPE {family.name} {family.type}")
            lines.extend(rendered)
    return "\n".join(lines) + "\n" if lines else ""


# --- Triton rendering --------------------------------------------------------------------------------

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
    gpus: dict[str, GpuSignals] = field(default_factory=dict)
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


# --- the simulation ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _GpuCounters:
    energy_mj: float
    power_violation_ns: float = 0.0
    thermal_violation_ns: float = 0.0


_GPU_SIGNAL_FIELDS = frozenset(f.name for f in dataclasses.fields(GpuSignals))


class _Instant(NamedTuple):
    signals: dict[str, dict[int, GpuSignals]]  # node → GPU index → gauges (no cumulative values)
    queues: dict[PodKey, QueueState]  # Triton pods only


class ClusterSim:
    """A scenario running in simulated time: placements, loads, and everything cumulative.

    Every method that observes or changes the cluster takes ``now`` (seconds on the caller's clock) and
    first integrates the elapsed time under the old conditions, so changing load or replicas never rewrites
    the past. A ``now`` earlier than the last one integrates nothing (counters never go down).
    """

    max_step_s = 1.0
    max_steps = 240

    def __init__(self, scenario: Scenario, *, start: float) -> None:
        self.scenario = scenario
        self.start = float(start)
        self._t = float(start)
        self._placements = scenario.placements()
        self._retired: set[PodKey] = set()
        self._gpu_counters: dict[tuple[str, int], _GpuCounters] = {}
        self._overrides: dict[tuple[str, int], dict[str, Any]] = {}
        self._vanished: set[tuple[str, int]] = set()
        self._triton: dict[PodKey, TritonState] = {}
        self._gpu_by_uuid = {gpu.uuid: (node.name, gpu.index) for node in scenario.nodes for gpu in node.gpus}
        for node in scenario.nodes:
            for gpu in node.gpus:
                # NB: "since boot" — start every GPU at a plausible, deterministic number of mJ.
                energy = (1.0 + 8.0 * unit_hash(scenario.seed, gpu.uuid, "energy")) * 1e11
                self._gpu_counters[(node.name, gpu.index)] = _GpuCounters(energy_mj=energy)
        for p in self._placements:
            self._start_pod(p)

    # state -----------------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The simulated time integrated up to."""
        return self._t

    @property
    def placements(self) -> list[Placement]:
        return list(self._placements)

    def triton_pods(self) -> list[Placement]:
        """Running pods that serve Triton metrics."""
        return [p for p in self._placements if p.scheduled and p.key in self._triton]

    def triton_state(self, key: PodKey) -> TritonState:
        try:
            return self._triton[key]
        except KeyError:
            valid = ", ".join(f"{ns}/{pod}" for ns, pod in self._triton)
            raise KeyError(f"no running Triton pod {key[0]}/{key[1]}; running: {valid}") from None

    def pods_by_gpu(self) -> dict[str, dict[GpuSlot, ContainerRef]]:
        return self.scenario.pods_by_gpu(self._placements)

    def kube_objects(
        self, *, triton_ports: Mapping[PodKey, int] | None = None, exporter_ports: Mapping[str, int] | None = None
    ) -> list[dict[str, Any]]:
        return self.scenario.kube_objects(
            triton_ports=triton_ports, exporter_ports=exporter_ports, placements=self._placements
        )

    def _start_pod(self, p: Placement) -> None:
        w = self.scenario.workload(p.workload_key)
        if not (p.scheduled and w.triton_models) or p.node is None:
            return
        node = self.scenario.node(p.node)
        uuids = tuple(node.gpu(s.gpu).uuid for s in p.slots if s.instance is None)
        self._triton[p.key] = TritonState(gpu_uuids=uuids)

    # run-time changes ------------------------------------------------------------------------------

    def set_load(self, ref: str | SimWorkload, load: LoadModel, *, now: float) -> None:
        """From ``now`` on, ``ref`` is offered ``load`` (a ``LoadModel``)."""
        self.advance(now)
        self.scenario = self.scenario.with_load(ref, load)

    def set_replicas(
        self, ref: str | SimWorkload, replicas: int, *, now: float
    ) -> tuple[list[Placement], list[Placement]]:
        """Scale ``ref`` to ``replicas``; returns the pods that started and stopped running."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        self.advance(now)
        old = {p.key: p for p in self._placements}
        self.scenario = self.scenario.with_replicas(ref, replicas)
        new_list = self.scenario.placements(keep=self._placements, retired=self._retired)
        new = {p.key: p for p in new_list}
        self._retired.update(k for k in old if k not in new)
        started = [p for p in new_list if p.scheduled and not (p.key in old and old[p.key].scheduled)]
        stopped = [p for p in old.values() if p.scheduled and not (p.key in new and new[p.key].scheduled)]
        self._placements = new_list
        for p in stopped:
            self._triton.pop(p.key, None)
        for p in started:
            self._start_pod(p)
        return started, stopped

    def override_gpu(self, node: str, index: int, **fields: Any) -> None:
        """Force ``GpuSignals`` fields of one GPU (e.g. ``last_xid=79, xid_window=((79, 1),)``)."""
        unknown = set(fields) - _GPU_SIGNAL_FIELDS
        if unknown:
            raise ValueError(
                f"unknown GpuSignals fields {sorted(unknown)}; valid: {', '.join(sorted(_GPU_SIGNAL_FIELDS))}"
            )
        self.scenario.node(node).gpu(index)
        self._overrides.setdefault((node, index), {}).update(fields)

    def clear_overrides(self) -> None:
        self._overrides.clear()
        self._vanished.clear()

    def vanish_gpu(self, node: str, index: int) -> None:
        """Drop one GPU from its node's dcgm-exporter output (as after Xid 79, "fallen off the bus"), until
        ``restore_gpu`` or ``clear_overrides``."""
        self.scenario.node(node).gpu(index)
        self._vanished.add((node, index))

    def restore_gpu(self, node: str, index: int) -> None:
        self._vanished.discard((node, index))

    # time ------------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Integrate counters and queues from the last time to ``now``."""
        dt = now - self._t
        if dt <= 0:
            return
        steps = min(self.max_steps, max(1, math.ceil(dt / self.max_step_s)))
        h = dt / steps
        for i in range(steps):
            tm = self._t + (i + 0.5) * h
            instant = self._instant(tm)
            self._integrate(instant, tm, h)
        self._t = now

    def _integrate(self, instant: _Instant, t: float, h: float) -> None:
        for node_name, by_gpu in instant.signals.items():
            for index, s in by_gpu.items():
                c = self._gpu_counters[(node_name, index)]
                c.energy_mj += s.power_w * h * 1000.0
                if s.clock_event_mask & 0x4:
                    c.power_violation_ns += h * 1e9 * 0.85
                if s.clock_event_mask & 0x68:  # hw_slowdown | sw_thermal | hw_thermal
                    c.thermal_violation_ns += h * 1e9 * 0.5
        for key, queue in instant.queues.items():
            state = self._triton[key]
            w = self._workload_of(key)
            state.integrate(w.triton_models, triton_rates(w.triton_models, queue), h)
            state.backlog = advance_backlog(queue, h)
            for gpu_uuid in state.gpu_uuids:
                power = self._signals_of(instant, gpu_uuid).power_w
                state.energy_j[gpu_uuid] = state.energy_j.get(gpu_uuid, 0.0) + power * h

    def _workload_of(self, key: PodKey) -> SimWorkload:
        for p in self._placements:
            if p.key == key:
                return self.scenario.workload(p.workload_key)
        raise KeyError(f"no pod {key[0]}/{key[1]}")

    def _signals_of(self, instant: _Instant, gpu_uuid: str) -> GpuSignals:
        node, index = self._gpu_by_uuid[gpu_uuid]
        return instant.signals[node][index]

    def _variation(self, gpu_uuid: str, t: float) -> float:
        return 0.6 * (2.0 * unit_hash(self.scenario.seed, gpu_uuid) - 1.0) + 0.4 * smooth_noise(t, gpu_uuid)

    def _instant(self, t: float) -> _Instant:
        """Gauges and queues at time ``t`` given the current backlogs (no side effects)."""
        elapsed = t - self.start
        running: dict[str, list[Placement]] = {}
        for p in self._placements:
            if p.scheduled:
                running.setdefault(p.workload_key, []).append(p)
        queues: dict[PodKey, QueueState] = {}
        pod_util: dict[PodKey, tuple[SimWorkload, float]] = {}
        for w in self.scenario.workloads:
            pods = running.get(w.key, [])
            if not pods:
                continue
            per_replica = w.offered_load.rate_at(elapsed) / len(pods)
            for p in pods:
                if p.key in self._triton:
                    q = replica_queue(
                        per_replica,
                        capacity_rps=w.capacity_rps,
                        backlog=self._triton[p.key].backlog,
                        timeout_s=w.queue_timeout_s,
                    )
                    queues[p.key] = q
                    pod_util[p.key] = (w, q.utilisation)
                else:
                    u = per_replica / w.capacity_rps if w.capacity_rps > 0 else 0.0
                    pod_util[p.key] = (w, min(1.0, u))
        holders: dict[tuple[str, GpuSlot], PodKey] = {}
        for p in self._placements:
            if p.node is not None:
                for slot in p.slots:
                    holders[(p.node, slot)] = p.key

        def act_of(node: str, slot: GpuSlot, variation: float) -> Activity | None:
            key = holders.get((node, slot))
            if key is None:
                return None
            w, u = pod_util[key]
            return activity(w.profile, u, variation=variation)

        signals: dict[str, dict[int, GpuSignals]] = {}
        for node in self.scenario.nodes:
            by_gpu: dict[int, GpuSignals] = {}
            for gpu in node.gpus:
                v = self._variation(gpu.uuid, t)
                if gpu.mig:
                    instances = {
                        inst.instance_id: InstanceLoad(
                            inst.slices / 7.0,
                            inst.fb_total_mib,
                            act_of(node.name, GpuSlot(gpu.index, inst.instance_id), v),
                        )
                        for inst in gpu.mig
                    }
                    by_gpu[gpu.index] = device_signals(gpu.hardware, None, variation=v, instances=instances)
                else:
                    by_gpu[gpu.index] = device_signals(
                        gpu.hardware, act_of(node.name, GpuSlot(gpu.index), v), variation=v
                    )
            signals[node.name] = by_gpu
        return _Instant(signals, queues)

    # observation -----------------------------------------------------------------------------------

    def _with_counters(self, node: str, index: int, s: GpuSignals) -> GpuSignals:
        c = self._gpu_counters[(node, index)]
        s = dataclasses.replace(
            s,
            total_energy_mj=round(c.energy_mj),
            power_violation_ns=round(c.power_violation_ns),
            thermal_violation_ns=round(c.thermal_violation_ns),
        )
        overrides = self._overrides.get((node, index))
        return dataclasses.replace(s, **overrides) if overrides else s

    def gpu_signals(self, node: str, *, now: float) -> dict[int, GpuSignals]:
        """Every GPU of ``node`` at ``now``: gauges at that instant plus the integrated counters."""
        self.advance(now)
        self.scenario.node(node)
        instant = self._instant(max(now, self._t))
        return {i: self._with_counters(node, i, s) for i, s in instant.signals[node].items()}

    def render_dcgm(
        self,
        node: str,
        *,
        now: float,
        version: str = "4.4",
        label_style: LabelStyle = "default",
        hostname_label: str | None = "Hostname",
    ) -> str:
        signals = {i: s for i, s in self.gpu_signals(node, now=now).items() if (node, i) not in self._vanished}
        return render_dcgm(
            self.scenario.node(node),
            signals,
            pods_by_gpu=self.pods_by_gpu()[node],
            version=version,
            label_style=label_style,
            hostname_label=hostname_label,
        )

    def render_triton(self, key: PodKey, *, now: float) -> str:
        self.advance(now)
        state = self.triton_state(key)
        w = self._workload_of(key)
        instant = self._instant(max(now, self._t))
        queue = instant.queues.get(key)
        if queue is not None:
            rates = triton_rates(w.triton_models, queue)
            for m in w.triton_models:
                r = rates.get((m.name, str(m.version)))
                state.level(m).pending = r.pending if r is not None else 0.0
            state.cpu_utilization = 0.05 + 0.2 * queue.utilisation
        for gpu_uuid in state.gpu_uuids:
            node, index = self._gpu_by_uuid[gpu_uuid]
            state.gpus[gpu_uuid] = self._with_counters(node, index, instant.signals[node][index])
        return render_triton(w.triton_models, state)


# --- HTTP servers ------------------------------------------------------------------------------------


@dataclass(slots=True)
class Faults:
    """Fault knobs of one endpoint, checked on every request in this order.

    - ``hang``: accept the request and never answer (until the server stops).
    - ``delay_s``: answer normally after this many seconds.
    - ``status``: answer with this HTTP status and a short text body.
    - ``stream_bytes``: stream a chunked body of this many bytes (valid exposition: comment lines).
    - ``body``: answer 200 with this body instead of the rendering (e.g. malformed text).
    - ``nan``: render normally, then replace every sample value with NaN.
    """

    hang: bool = False
    delay_s: float = 0.0
    status: int | None = None
    stream_bytes: int | None = None
    body: str | bytes | None = None
    nan: bool = False


_SAMPLE_VALUE = re.compile(r"^([^#\s][^\n]*?) (\S+)$", re.MULTILINE)


def _nan_values(text: str, literal: str) -> str:
    return _SAMPLE_VALUE.sub(lambda m: f"{m.group(1)} {literal}", text)


@dataclass(slots=True)
class _Endpoint:
    name: str
    render: Callable[[], str]
    port: int
    nan_literal: str
    site: web.SockSite
    faults: Faults = field(default_factory=Faults)
    requests: int = 0
    last_body: str = ""  # NB: what a retiring endpoint serves in its grace period (its pod's state is gone)


class ExporterServer:
    """Many ``/metrics`` endpoints served from one process, each on its own port of ``host``.

    ``await add(name, render)`` binds a new port (0 = any free one) and returns it; every GET calls
    ``render()`` for a fresh body. Use ``async with ExporterServer() as server`` or ``start``/``stop``;
    ``stop`` releases hung requests first, so it returns promptly.
    """

    def __init__(self, *, host: str = "127.0.0.1", shutdown_timeout: float = 1.0) -> None:
        self.host = host
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None
        self._endpoints: dict[str, _Endpoint] = {}
        self._by_port: dict[int, _Endpoint] = {}
        self._closing = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ExporterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=self._shutdown_timeout)
        await runner.setup()
        self._closing = asyncio.Event()
        self._runner = runner

    async def stop(self) -> None:
        """Stop every endpoint; requests in flight (including hung ones) are released first."""
        self._closing.set()
        for task in self._retiring:
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        runner, self._runner = self._runner, None
        self._endpoints.clear()
        self._by_port.clear()
        if runner is not None:
            await runner.cleanup()

    async def add(self, name: str, render: Callable[[], str], *, port: int = 0, nan_literal: str = "NaN") -> int:
        """Serve ``render()`` at ``http://host:<port>/metrics`` under ``name``; returns the port."""
        if self._runner is None:
            raise RuntimeError("ExporterServer is not started")
        if name in self._endpoints:
            raise ValueError(f"endpoint {name!r} already exists")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        bound = int(sock.getsockname()[1])
        site = web.SockSite(self._runner, sock)
        await site.start()
        endpoint = _Endpoint(name=name, render=render, port=bound, nan_literal=nan_literal, site=site)
        self._endpoints[name] = endpoint
        self._by_port[bound] = endpoint
        return bound

    async def remove(self, name: str) -> None:
        endpoint = self._endpoint(name)
        del self._endpoints[name]
        self._by_port.pop(endpoint.port, None)
        await endpoint.site.stop()

    async def retire(self, name: str, *, after_s: float) -> None:
        """Stop ``name`` as a pod in its termination grace period stops: the name is free at once (a new endpoint
        may take it), its port serves the last body for ``after_s`` more seconds (a scraper that listed it just
        before it went finishes its round), then closes."""
        endpoint = self._endpoint(name)
        del self._endpoints[name]
        last = endpoint.last_body
        endpoint.render = lambda: last
        task = asyncio.create_task(self._close_later(endpoint, after_s))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_later(self, endpoint: _Endpoint, after_s: float) -> None:
        await asyncio.sleep(after_s)
        if self._by_port.get(endpoint.port) is endpoint:
            del self._by_port[endpoint.port]
        await endpoint.site.stop()

    def _endpoint(self, name: str) -> _Endpoint:
        try:
            return self._endpoints[name]
        except KeyError:
            raise KeyError(f"unknown endpoint {name!r}; endpoints: {', '.join(sorted(self._endpoints))}") from None

    @property
    def names(self) -> list[str]:
        return sorted(self._endpoints)

    def port(self, name: str) -> int:
        return self._endpoint(name).port

    def url(self, name: str) -> str:
        return f"http://{self.host}:{self.port(name)}/metrics"

    def requests(self, name: str) -> int:
        """How many requests ``name`` has received (faulty ones included)."""
        return self._endpoint(name).requests

    def faults(self, name: str) -> Faults:
        """The live fault knobs of ``name`` (mutate them, or use ``set_faults``)."""
        return self._endpoint(name).faults

    def set_faults(self, name: str, **knobs: Any) -> Faults:
        """Replace ``name``'s faults with ``Faults(**knobs)`` (no knobs = healthy again)."""
        endpoint = self._endpoint(name)
        endpoint.faults = Faults(**knobs)
        return endpoint.faults

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
        endpoint = self._by_port.get(sockname[1]) if sockname else None
        if endpoint is None:
            return web.Response(status=404, text="404 page not found\n")
        endpoint.requests += 1
        if request.path != "/metrics":
            return web.Response(status=404, text="404 page not found\n")
        faults = endpoint.faults
        if faults.hang:
            await self._closing.wait()
            return web.Response(status=503, text="exporter stopped\n")
        if faults.delay_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), faults.delay_s)
        if faults.status is not None:
            return web.Response(status=faults.status, text=f"simulated failure: HTTP {faults.status}\n")
        if faults.stream_bytes is not None:
            return await self._stream(request, faults.stream_bytes)
        if faults.body is not None:
            body = faults.body.encode() if isinstance(faults.body, str) else faults.body
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
        text = endpoint.last_body = endpoint.render()
        if faults.nan:
            text = _nan_values(text, endpoint.nan_literal)
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _stream(self, request: web.Request, size: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        response.enable_chunked_encoding()
        await response.prepare(request)
        line = b"# padding " + b"x" * 53 + b"\n"  # 64-byte valid comment lines
        chunk = line * 1024  # 64 KiB
        remaining = max(0, size)
        try:
            while remaining > 0 and not self._closing.is_set():
                piece = chunk[: min(len(chunk), remaining)]
                await response.write(piece)
                remaining -= len(piece)
            await response.write_eof()
        except (ConnectionError, RuntimeError) as e:  # the client gave up (e.g. its size limit)
            log.debug("stream to %s aborted: %s", request.remote, e)
        return response


# --- wiring ------------------------------------------------------------------------------------------

Listener = Callable[[list[dict[str, Any]]], Awaitable[None] | None]


def _dcgm_name(node: str) -> str:
    return f"dcgm/{node}"


def _llm_name(key: PodKey) -> str:
    return f"llm/{key[0]}/{key[1]}"


def _triton_name(key: PodKey) -> str:
    return f"triton/{key[0]}/{key[1]}"


class SimExporters:
    """Simulated exporters for a whole scenario: one dcgm-exporter per node, one Triton per Triton pod.

    ``await start(scenario, clock=...)`` binds every endpoint on 127.0.0.1 and starts the simulation at
    ``clock()``; each GET renders at the current ``clock()``. The constructor's ``dcgm_version``,
    ``label_style`` and ``hostname_label`` select a dcgm-exporter output variant (see ``render_dcgm``).
    ``async with SimExporters() as exporters:`` stops everything on exit (``start`` is still explicit).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        dcgm_version: str = "4.4",
        label_style: LabelStyle = "default",
        hostname_label: str | None = "Hostname",
        llm: Mapping[str, LlmServer] | None = None,
        termination_grace_s: float = 0.0,
    ) -> None:
        """``llm``: workload (``namespace/name``) → the LLM server its pods run; each running pod then serves
        that server's ``/metrics`` (vLLM, SGLang, TGI or NIM format, ``gpuscale.sim.llm``).
        ``termination_grace_s``: how long a scaled-down pod's endpoint keeps serving (``ExporterServer.retire``)."""
        self._llm_servers = dict(llm or {})
        self._grace_s = termination_grace_s
        self._llm: LlmFleet | None = None
        self._server = ExporterServer(host=host)
        self._dcgm_style: dict[str, Any] = {
            "version": dcgm_version,
            "label_style": label_style,
            "hostname_label": hostname_label,
        }
        self._sim: ClusterSim | None = None
        self._clock: Clock = time.time
        self._listeners: list[Listener] = []

    async def __aenter__(self) -> SimExporters:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, scenario: Scenario, *, clock: Clock = time.time) -> None:
        if self._sim is not None:
            raise RuntimeError("SimExporters already started")
        self._clock = clock
        self._sim = ClusterSim(scenario, start=clock())
        await self._server.start()
        try:
            for node in scenario.nodes:
                await self._server.add(_dcgm_name(node.name), self._dcgm_renderer(node.name), nan_literal="NaN")
            for p in self._sim.triton_pods():
                await self._add_triton(p.key)
            if self._llm_servers:
                for key in self._llm_servers:
                    scenario.workload(key)  # NB: an unknown workload fails here, naming the valid ones
                self._llm = LlmFleet(self._llm_servers, start=self._sim.start)
                self._llm.sync(self._sim)
                for p in self._llm.pods(self._sim):
                    await self._add_llm(p.key)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await self._server.stop()
        self._sim = None
        self._llm = None

    # state -----------------------------------------------------------------------------------------

    @property
    def sim(self) -> ClusterSim:
        if self._sim is None:
            raise RuntimeError("SimExporters is not started")
        return self._sim

    @property
    def scenario(self) -> Scenario:
        return self.sim.scenario

    @property
    def server(self) -> ExporterServer:
        return self._server

    @property
    def dcgm_urls(self) -> dict[str, str]:
        """Node name → dcgm-exporter URL."""
        return {n.name: self._server.url(_dcgm_name(n.name)) for n in self.scenario.nodes}

    @property
    def triton_urls(self) -> dict[PodKey, str]:
        """``(namespace, pod)`` → Triton metrics URL, for running Triton pods."""
        return {p.key: self._server.url(_triton_name(p.key)) for p in self.sim.triton_pods()}

    @property
    def dcgm_ports(self) -> dict[str, int]:
        return {n.name: self._server.port(_dcgm_name(n.name)) for n in self.scenario.nodes}

    @property
    def triton_ports(self) -> dict[PodKey, int]:
        return {p.key: self._server.port(_triton_name(p.key)) for p in self.sim.triton_pods()}

    @property
    def ports(self) -> dict[str, int]:
        """Every endpoint name (``dcgm/<node>``, ``triton/<ns>/<pod>``) → port."""
        return {name: self._server.port(name) for name in self._server.names}

    @property
    def llm_urls(self) -> dict[PodKey, str]:
        """``(namespace, pod)`` → LLM server metrics URL, for running LLM server pods."""
        return {p.key: self._server.url(_llm_name(p.key)) for p in self._llm_pods()}

    @property
    def llm_ports(self) -> dict[PodKey, int]:
        return {p.key: self._server.port(_llm_name(p.key)) for p in self._llm_pods()}

    def llm_state(self, key: PodKey) -> LlmState:
        """The ``LlmState`` of a running LLM server pod (counters, histograms, latest gauges)."""
        if self._llm is None:
            raise KeyError(f"no LLM servers configured; {key[0]}/{key[1]} serves none")
        return self._llm.state(key)

    def _llm_pods(self) -> list[Placement]:
        return self._llm.pods(self.sim) if self._llm is not None else []

    def kube_objects(self) -> list[dict[str, Any]]:
        """The cluster's Kubernetes objects, with the ports the exporters really listen on."""
        objects = self.sim.kube_objects(triton_ports=self.triton_ports, exporter_ports=self.dcgm_ports)
        return with_llm_endpoints(objects, self.llm_ports) if self._llm is not None else objects

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(kube_objects())`` after every change of pods (``set_replicas``)."""
        self._listeners.append(listener)

    # run-time knobs --------------------------------------------------------------------------------

    def set_load(self, workload: str | SimWorkload, load: LoadModel) -> None:
        """From now on ``workload`` (``namespace/name``) is offered ``load`` (a ``LoadModel``)."""
        self.sim.set_load(workload, load, now=self._clock())

    async def set_replicas(self, workload: str | SimWorkload, replicas: int) -> None:
        """Scale ``workload``; Triton endpoints start and stop with their pods, listeners are told."""
        now = self._clock()
        if self._llm is not None:
            self._llm.advance(self.sim, now)  # NB: the past under the old replicas
        started, stopped = self.sim.set_replicas(workload, replicas, now=now)
        for p in stopped:
            for name in (_triton_name(p.key), _llm_name(p.key)):
                if name in self._server.names and self._grace_s:
                    await self._server.retire(name, after_s=self._grace_s)
                elif name in self._server.names:
                    await self._server.remove(name)
        if self._llm is not None:
            self._llm.sync(self.sim)
            for p in started:
                if p.workload_key in self._llm_servers and p.scheduled:
                    await self._add_llm(p.key)
        for p in started:
            if p.key in {t.key for t in self.sim.triton_pods()}:
                await self._add_triton(p.key)
        if started or stopped or self._listeners:
            objects = self.kube_objects()
            for listener in self._listeners:
                result = listener(objects)
                if asyncio.iscoroutine(result):
                    await result

    def _target(self, target: str | PodKey) -> str:
        if isinstance(target, tuple):
            return _llm_name(target) if _llm_name(target) in self._server.names else _triton_name(target)
        if target in self._server.names:
            return target
        return _dcgm_name(target)

    def faults(self, target: str | PodKey) -> Faults:
        """Live fault knobs of a node's dcgm-exporter (node name) or a Triton pod (``(ns, pod)``)."""
        return self._server.faults(self._target(target))

    def set_faults(self, target: str | PodKey, **knobs: Any) -> Faults:
        """``set_faults("node-a", hang=True)``; ``set_faults(("ns", "pod"))`` heals."""
        return self._server.set_faults(self._target(target), **knobs)

    def requests(self, target: str | PodKey) -> int:
        return self._server.requests(self._target(target))

    # endpoints -------------------------------------------------------------------------------------

    def _dcgm_renderer(self, node: str) -> Callable[[], str]:
        def render() -> str:
            return self.sim.render_dcgm(node, now=self._clock(), **self._dcgm_style)

        return render

    async def _add_triton(self, key: PodKey) -> None:
        def render() -> str:
            return self.sim.render_triton(key, now=self._clock())

        await self._server.add(_triton_name(key), render, nan_literal="Nan")

    async def _add_llm(self, key: PodKey) -> None:
        fleet = self._llm
        assert fleet is not None

        def render() -> str:
            return fleet.render(self.sim, key, now=self._clock())

        await self._server.add(_llm_name(key), render, nan_literal="NaN")
