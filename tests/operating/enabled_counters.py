"""Every field deploy/dcgm-exporter/counters.csv enables, with the value a healthy, busy GPU reports for it.

The rule tests and the exporters the cluster tests scrape serve the whole set, as a GPU Operator deployed with that
file does: a rule that only misbehaves beside a field nobody fed (GPUNVLinkErrors over four NVLink error counters
once could not be evaluated at all) then fails here. A field enabled without a healthy value here is an error that
names it, so enabling a field means saying what it reads when nothing is wrong.

``fill(case)`` adds to a promtool test case, for every GPU its series name, each enabled field the case does not set
for that GPU; ``exposition(gpus)`` is dcgm-exporter's /metrics for GPUs, with any field set per GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COUNTERS = ROOT / "deploy" / "dcgm-exporter" / "counters.csv"
WINDOW = {"window_size_in_ms": "300000"}
# Labels of one series that are not the GPU's (dcgm-exporter's per-field labels); the rest name the GPU and its pod.
PER_SERIES = {"err_code", "err_msg", "xid", "clock_event", "window_size_in_ms"}


@dataclass(frozen=True)
class Healthy:
    """A field's value on a healthy GPU at work: ``start``, growing by ``per_minute`` (counters), with ``labels``."""

    start: float
    per_minute: float = 0.0
    labels: Mapping[str, str] | None = None


# An H100 busy with a healthy job: clocks up, power under its cap (clock-event reason 0x4, which dcgm-exporter also
# counts in DCGM_EXP_CLOCK_EVENTS_COUNT), no Xid, no ECC or remap, no NVLink error; energy and NVLink bandwidth grow.
HEALTHY: dict[str, Healthy] = {
    "DCGM_FI_DEV_SM_CLOCK": Healthy(1980),
    "DCGM_FI_DEV_MEM_CLOCK": Healthy(2619),
    "DCGM_FI_DEV_MEMORY_TEMP": Healthy(48),
    "DCGM_FI_DEV_GPU_TEMP": Healthy(55),
    "DCGM_FI_DEV_POWER_USAGE": Healthy(480.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": Healthy(9e9, 480 * 60 * 1000),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": Healthy(700.0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": Healthy(0),
    "DCGM_FI_DEV_GPU_UTIL": Healthy(75),
    "DCGM_FI_DEV_MEM_COPY_UTIL": Healthy(35),
    "DCGM_FI_DEV_ENC_UTIL": Healthy(0),
    "DCGM_FI_DEV_DEC_UTIL": Healthy(0),
    "DCGM_FI_DEV_XID_ERRORS": Healthy(0, labels={"err_code": "0", "err_msg": "No Error"}),
    "DCGM_FI_DEV_POWER_VIOLATION": Healthy(0),
    "DCGM_FI_DEV_THERMAL_VIOLATION": Healthy(0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": Healthy(4),
    "DCGM_EXP_CLOCK_EVENTS_COUNT": Healthy(0, labels={"clock_event": "power_cap", **WINDOW}),
    "DCGM_EXP_XID_ERRORS_COUNT": Healthy(0, labels=WINDOW),
    "DCGM_FI_DEV_FB_FREE": Healthy(41000),
    "DCGM_FI_DEV_FB_USED": Healthy(40000),
    "DCGM_FI_DEV_FB_RESERVED": Healthy(559),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": Healthy(0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": Healthy(0),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": Healthy(0),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": Healthy(0),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": Healthy(0),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": Healthy(0),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": Healthy(0),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": Healthy(0),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": Healthy(5e12, 60 * 2e9),
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": Healthy(0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": Healthy(0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": Healthy(0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": Healthy(0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": Healthy(0.72),
    "DCGM_FI_PROF_SM_ACTIVE": Healthy(0.65),
    "DCGM_FI_PROF_SM_OCCUPANCY": Healthy(0.4),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": Healthy(0.35),
    "DCGM_FI_PROF_DRAM_ACTIVE": Healthy(0.45),
    "DCGM_FI_PROF_PCIE_TX_BYTES": Healthy(2e8),
    "DCGM_FI_PROF_PCIE_RX_BYTES": Healthy(3e8),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": Healthy(1.5e9),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": Healthy(1.5e9),
}
# Fields of type "label" ride on every series as a label (dcgm-exporter adds them), not as series of their own.
HEALTHY_LABELS: dict[str, str] = {"DCGM_FI_DRIVER_VERSION": "570.133.20"}


def enabled() -> dict[str, tuple[str, str]]:
    """field → (type, help) as counters.csv enables them (tests/deploy/test_deploy.py reads the file)."""
    from tests.deploy.test_deploy import _enabled_counters

    return _enabled_counters(COUNTERS.read_text())


def series_fields() -> dict[str, tuple[str, str]]:
    """The enabled fields that are series (not labels), each checked to have a healthy value."""
    fields = enabled()
    unknown = sorted(f for f, (kind, _) in fields.items() if f not in (HEALTHY_LABELS if kind == "label" else HEALTHY))
    if unknown:
        raise AssertionError(f"counters.csv enables fields without a healthy value in {__name__}: {unknown}")
    return {f: v for f, v in fields.items() if v[0] != "label"}


def label_fields() -> dict[str, str]:
    return {f: HEALTHY_LABELS[f] for f, (kind, _) in enabled().items() if kind == "label"}


_SERIES = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\}$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    """A promtool ``series:`` string → (name, labels)."""
    m = _SERIES.match(text.strip())
    assert m, f"not a series: {text!r}"
    return m.group(1), dict(_LABEL.findall(m.group(2)))


def _series(name: str, labels: Mapping[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _promtool_values(value: Healthy, points: int) -> str:
    return f"{value.start:g}+{value.per_minute:g}x{points}" if value.per_minute else f"{value.start:g}x{points}"


def _points(values: str) -> int:
    """How many samples a promtool ``values:`` string expands to ('0x5 3x10' → 6 + 11)."""
    return sum(int(t.rsplit("x", 1)[1]) + 1 if "x" in t else 1 for t in values.split())


def fill(case: dict) -> dict:
    """``case`` (a promtool test with a 1-minute interval) with every enabled field of every GPU it names.

    A GPU is a UUID on a DCGM series; its identity labels (node, index, model, MIG instance, pod) are those of the
    first series that names it. A field the case sets for a GPU is left alone, so each case still decides what is
    wrong; the rest read healthy for as long as the case's longest series. Label fields (the driver version) are left out: the case's own
    series do not carry them, and a label on only some of a GPU's series would split it in two.
    """
    assert case.get("interval", "1m") == "1m", case.get("name")
    gpus: dict[str, dict[str, str]] = {}
    have: set[tuple[str, str]] = set()
    for entry in case.get("input_series", []):
        name, labels = parse_series(entry["series"])
        if name.startswith("DCGM_") and "UUID" in labels:
            gpus.setdefault(labels["UUID"], {k: v for k, v in labels.items() if k not in PER_SERIES})
            have.add((name, labels["UUID"]))
    minutes = max(_points(entry["values"]) for entry in case.get("input_series", [])) - 1 if gpus else 0
    extra = []
    for uuid, identity in gpus.items():
        for field in series_fields():
            if (field, uuid) in have:
                continue
            value = HEALTHY[field]
            labels = {**identity, **(value.labels or {})}
            extra.append({"series": _series(field, labels), "values": _promtool_values(value, minutes)})
    return {**case, "input_series": [*case.get("input_series", []), *extra]}


def exposition(gpus: Mapping[str, Mapping[str, str]], *, values: Mapping[tuple[str, str], float] | None = None) -> str:
    """dcgm-exporter's /metrics for ``gpus`` (UUID → identity labels: gpu, Hostname, modelName, pod …): every enabled
    field, HELP and TYPE from counters.csv, label fields on every series; ``values[(field, UUID)]`` overrides the
    healthy value (counters are served at their start value unless overridden)."""
    values = values or {}
    riders = label_fields()
    lines = []
    for field, (kind, help_text) in series_fields().items():
        lines += [f"# HELP {field} {help_text}", f"# TYPE {field} {kind}"]
        healthy = HEALTHY[field]
        for uuid, identity in gpus.items():
            labels = {**identity, "UUID": uuid, **riders, **(healthy.labels or {})}
            lines.append(f"{_series(field, labels)} {values.get((field, uuid), healthy.start):g}")
    return "\n".join(lines) + "\n"
