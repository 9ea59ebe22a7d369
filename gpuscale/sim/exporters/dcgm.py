"""dcgm-exporter's ``/metrics`` text, rendered from GPU signals in the exact upstream format (dcgm-exporter
4.4.x: families in DCGM field-ID order, HELP/TYPE from the counters CSV, label order from ``render_metrics.go``,
INT64 as ``%d``, DOUBLE as ``%f``, idle GPUs without pod labels, MIG instances repeating device-level values)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from gpuscale.metrics.diagnosis import CLOCK_EVENT_BITS
from gpuscale.sim.device_gauges import InstanceSignals, SimGpuGauges
from gpuscale.sim.gpu_nodes import GpuSlot, SimNode
from gpuscale.sim.workloads import ContainerRef

LabelStyle = Literal["default", "pod_name"]


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
    value: Callable[[SimGpuGauges, InstanceSignals | None], float] | None
    double: bool = False
    mig: MigMode = "device"
    kind: Literal["plain", "xid", "xid_count", "clock_events"] = "plain"


def _dev(attr: str) -> Callable[[SimGpuGauges, InstanceSignals | None], float]:
    return lambda s, _i: getattr(s, attr)


def _inst(attr: str, device_attr: str | None = None) -> Callable[[SimGpuGauges, InstanceSignals | None], float]:
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


def _family_series(family: DcgmFamily, signals: SimGpuGauges, instance: InstanceSignals | None) -> list[_Series]:
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
    signals_by_gpu: Mapping[int, SimGpuGauges],
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

    entities: list[tuple[str, dict[str, str], SimGpuGauges, bool, InstanceSignals | None]] = []
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
