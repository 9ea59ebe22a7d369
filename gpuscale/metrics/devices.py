"""Devices: DCGM series → one typed record per GPU (or MIG instance), each with its diagnosis.

The per-GPU view of ``gpuscale top`` and the input of its pod and node roll-ups (``metrics/rollups.py``)::

    MetricsSource.read(TermQuery(DEVICE_SERIES))   one gauge query naming every DCGM field it maps
        │  attribution.attribute → Device (key, physical GPU, pod, node)
        ▼
    read_devices(read, attribute)  → [DeviceReading]   the latest value per DCGM field, per device
        │  diagnosis.signals_from_dcgm → diagnose
        ▼
    gpu_statuses(readings, policy) → [GpuStatus]       signals + verdict + identity, ready to print

Contracts:

- Pure: no I/O, no clock. ``read`` is a source's ``read`` (or several sources' reads chained) and
  ``attribute`` an ``Attributor``; the same values give the same records.
- A device is what attribution says it is (``Device.key``): one physical GPU, or one MIG instance
  (``GPU_I_ID``), so MIG instances are separate records; ``physical`` keys the parent GPU so roll-ups can
  count parent-level values (power) once.
- The fields read are exactly the DCGM fields ``diagnosis.signals_from_dcgm`` understands
  (``DEVICE_SERIES``): a source constructed with ``series=DEVICE_SERIES`` keeps everything needed here and
  nothing more. A field the exporter does not report is ``None`` in the signals, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from gpuscale.metrics.attribution import Device, dcgm_placement

# NB: the private name is the single source of truth for the DCGM fields diagnosis maps (incl. the older
# aliases and the windowed Xid count); copying the list here would let the two drift apart.
from gpuscale.metrics.diagnosis import KNOWN_DCGM_NAMES as _DIAGNOSIS_FIELDS
from gpuscale.metrics.diagnosis import (
    DiagnosisPolicy,
    GpuSignals,
    Verdict,
    decode_clock_events,
    diagnose,
    signals_from_dcgm,
    trusted,
)
from gpuscale.metrics.series import SeriesValue, TermQuery
from gpuscale.model import rfc3339

__all__ = [
    "DEVICE_SERIES",
    "DeviceReading",
    "GpuStatus",
    "Timestamp",
    "clock_event_names",
    "device_id",
    "device_queries",
    "gpu_status",
    "gpu_statuses",
    "read_devices",
    "reading_signals",
    "rfc3339",
]

XID_WINDOW = "DCGM_EXP_XID_ERRORS_COUNT"

DEVICE_SERIES: tuple[str, ...] = tuple(sorted(_DIAGNOSIS_FIELDS))
"""Every DCGM series the per-GPU records read (all gauges, read as the latest value)."""

Reader = Callable[[TermQuery], list[SeriesValue]]
Attribute = Callable[[str, dict[str, str], str], Device]

_UUID_LABELS = ("UUID", "uuid", "gpu_uuid")
_CONTAINER_LABELS = ("exported_container", "container", "container_name")


def _epoch(value: object) -> object:
    """RFC 3339 text (as written by ``rfc3339``) → seconds since the epoch; anything else unchanged."""
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return value  # NB: pydantic then reports it as not a number
    return value


Timestamp = Annotated[float, BeforeValidator(_epoch), PlainSerializer(rfc3339, return_type=str, when_used="json")]
"""Seconds since the epoch in Python; an RFC 3339 string in JSON/YAML output (and read back from one)."""


def device_queries(series: Iterable[str] = DEVICE_SERIES) -> list[TermQuery]:
    """What a source must answer for ``read_devices``: one gauge query naming every DCGM field.

    NB: one query for all fields, not one per field: the scrape source then answers target by target,
    so the few GPUs of one exporter stay in the CPU cache while their fields are grouped (at 10,000 GPUs
    a third less time than field by field). A Prometheus source still sends one plain PromQL query per
    field (sources/prometheus.py: "One query per series").
    """
    return [TermQuery(series=tuple(series))]


# --- reading ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class DeviceReading:
    """One device's latest DCGM values as read from a source, before diagnosis.

    ``values`` maps DCGM field name → value; ``xid_counts`` the windowed Xid counts (Xid → count; ``{}``
    when the window was reported without any Xid, None when the exporter does not report the window);
    ``labels`` the label set of the first series seen (identity labels: ``gpu``, ``UUID``, ``modelName``,
    ``GPU_I_PROFILE``, ``GPU_I_ID``, the pod labels); ``sampled_at`` the oldest sample time (s) among them.
    """

    device: Device
    labels: Mapping[str, str]
    target: str
    sampled_at: float
    values: dict[str, float] = field(default_factory=dict)
    xid_counts: dict[int, float] | None = None


def read_devices(
    read: Reader,
    attribute: Attribute,
    *,
    series: Iterable[str] = DEVICE_SERIES,
    keep: Callable[[Device], bool] | None = None,
) -> list[DeviceReading]:
    """Group the DCGM series a source holds into devices, in the order they were first seen.

    Only series attribution places on a GPU are kept (``Device.key[0] == "gpu"``), and of those only the
    devices ``keep`` accepts (all when None): a caller that shows only some GPUs (the pods view: GPUs held
    by pods in scope) skips the others' values as they come. When two targets report the same device
    (one exporter scraped under two URLs) the values merge into one reading, whose ``device`` (pod, node)
    is the first placement seen; ``keep`` judges that one, so the result equals filtering afterwards.
    """
    by_key: dict[tuple[str, ...], DeviceReading | None] = {}  # None: a device ``keep`` rejected
    # NB: this runs once per series (25 fields × 10,000 GPUs), so it works in three tiers of cost. Fastest:
    # the exposition parser shares one read-only mapping between the samples of a page with the same label
    # text, so most series are recognised by the identity of their labels. Next: a label set not seen yet
    # is placed by the few label values attribution reads (dcgm_placement), which dcgm-exporter repeats on
    # every field of a GPU even where a field adds labels of its own. Only a new placement is attributed.
    by_placement: dict[tuple[str | None, ...], DeviceReading | None] = {}
    by_identity: dict[int, tuple[Mapping[str, str], str, DeviceReading | None]] = {}

    def place(name: str, labels: Mapping[str, str], target: str, timestamp: float) -> DeviceReading | None:
        placement = (target, *dcgm_placement(labels))
        if placement in by_placement:
            reading = by_placement[placement]
        else:
            device = attribute(name, labels, target)
            reading = None
            if device.key[0] == "gpu":
                if device.key in by_key:
                    reading = by_key[device.key]
                elif keep is None or keep(device):
                    reading = by_key[device.key] = DeviceReading(device, labels, target, timestamp)
                else:
                    # NB: the first placement of a device decides, as when readings were filtered after
                    # merging: a later placement of the same GPU (another URL, another pod label) is
                    # dropped with it rather than shown as a device of its own.
                    by_key[device.key] = None
            by_placement[placement] = reading
        by_identity[id(labels)] = (labels, target, reading)
        return reading

    for query in device_queries(series):
        # NB: tuple unpacking, not attribute access: SeriesValue's fields are properties.
        for name, labels, value, timestamp, target, _ in read(query):
            hit = by_identity.get(id(labels))
            if hit is not None and hit[0] is labels and hit[1] == target:
                reading = hit[2]
            else:
                reading = place(name, labels, target, timestamp)
            if reading is None:
                continue
            if timestamp < reading.sampled_at:
                reading.sampled_at = timestamp
            if name == XID_WINDOW:
                counts = reading.xid_counts if reading.xid_counts is not None else {}
                reading.xid_counts = counts
                xid = labels.get("xid", "")
                if xid.isdigit() and math.isfinite(value):
                    counts[int(xid)] = counts.get(int(xid), 0.0) + value
            else:
                reading.values[name] = value
    return [reading for reading in by_key.values() if reading is not None]


# --- records ---------------------------------------------------------------------------------------


class GpuStatus(BaseModel):
    """One GPU or MIG instance: where it is, who holds it, what it reports and what that means.

    ``gpu`` is dcgm-exporter's ``gpu`` label (the index on the node; a MIG instance carries its parent's);
    ``mig_instance`` the ``GPU_I_ID`` and ``mig_profile`` the ``GPU_I_PROFILE`` of a MIG instance (else
    None). ``namespace``/``pod``/``container`` are the workload holding the device (None when idle or not
    labelled). ``signals`` are the DCGM values (ratios 0–1, GPU_UTIL in percent, MiB, W, °C, MHz);
    ``clock_events`` the names of the bits set in ``signals.clock_event_reasons``. ``sampled_at`` is the
    oldest sample time behind the record; ``source`` the target (exporter URL) it was read from.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str | None
    gpu: str
    uuid: str | None = None
    model: str | None = None
    mig_profile: str | None = None
    mig_instance: str | None = None
    namespace: str | None = None
    pod: str | None = None
    container: str | None = None
    signals: GpuSignals
    clock_events: list[str] = Field(default_factory=list)
    verdict: Verdict
    sampled_at: Timestamp
    source: str
    physical: tuple[str, ...] = Field(default=(), exclude=True)
    """The parent GPU's attribution key (not serialised): MIG instances of one GPU share it."""

    @property
    def device_id(self) -> str:
        """``<gpu>`` or ``<gpu>/<GPU_I_ID>`` — unique on a node."""
        return f"{self.gpu}/{self.mig_instance}" if self.mig_instance else self.gpu


def _first(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    get = labels.get
    for key in keys:
        value = get(key)
        if value:
            return value
    return None


def reading_signals(reading: DeviceReading) -> GpuSignals:
    """The GpuSignals of one device reading (a MIG instance's profile from its ``GPU_I_PROFILE`` label)."""
    mig_profile = reading.labels.get("GPU_I_PROFILE") or None
    return signals_from_dcgm(reading.values, xid_counts=reading.xid_counts, mig_profile=mig_profile)


def clock_event_names(signals: GpuSignals) -> list[str]:
    return decode_clock_events(signals.clock_event_reasons) if signals.clock_event_reasons else []


def device_id(labels: Mapping[str, str]) -> str:
    """``GpuStatus.device_id`` from a reading's labels: ``<gpu>`` or ``<gpu>/<GPU_I_ID>``."""
    gpu = labels.get("gpu", "") or "?"
    instance = labels.get("GPU_I_ID")
    return f"{gpu}/{instance}" if instance else gpu


def gpu_status(reading: DeviceReading, policy: DiagnosisPolicy) -> GpuStatus:
    """Diagnose one device reading."""
    labels = reading.labels
    signals = reading_signals(reading)
    device = reading.device
    owner = device.pod
    # NB: trusted construction (every value below is of its field's type): this runs per GPU.
    return _new_gpu(
        {
            "node": device.node,
            "gpu": labels.get("gpu", "") or "?",
            "uuid": _first(labels, _UUID_LABELS),
            "model": labels.get("modelName") or None,
            "mig_profile": signals.mig_profile,
            "mig_instance": labels.get("GPU_I_ID") or None,
            "namespace": owner.namespace if owner else None,
            "pod": owner.name if owner else None,
            "container": _first(labels, _CONTAINER_LABELS) if owner else None,
            "signals": signals,
            "clock_events": clock_event_names(signals),
            "verdict": diagnose(signals, policy),
            "sampled_at": float(reading.sampled_at),
            "source": reading.target,
            "physical": device.physical,
        }
    )


_new_gpu = trusted(GpuStatus)


def gpu_statuses(readings: Iterable[DeviceReading], policy: DiagnosisPolicy) -> list[GpuStatus]:
    """Diagnose every device reading; the order is kept."""
    return [gpu_status(r, policy) for r in readings]
