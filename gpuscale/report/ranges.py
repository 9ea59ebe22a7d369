"""What a DCGM field can physically hold, and the screening that keeps impossible values out of the statistics.

Pure. The catalogue (policies/metrics.yaml) says how a series becomes an HPA metric, not what range a raw DCGM
field has, so the ranges live here, once. A value outside its field's range is no measurement — a broken
exporter, a unit mix-up (SM activity exported as a percentage: 15,000 "%"), a counter gone negative — so it is
taken out of the History (NaN: not a sample, counted nowhere) before any percentile, GPU-hour or verdict is
computed, and the report says how many, of which field, and the extremes seen (``Report.out_of_range`` and a gap
line, in every format). Taken out in place: a copy of the grid would double raw mode's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuscale.metrics.history import History
from gpuscale.report.schema import OutOfRange

_MAX_FB_MIB = 4.0 * 1024 * 1024  # 4 TiB: the memory histogram's top; no GPU comes within 20x of it
_MAX_COUNT = float(2**32)  # Xid codes, ECC counts and the clock-event bit mask are 32-bit integers in DCGM


@dataclass(frozen=True, slots=True)
class PhysicalRange:
    low: float
    high: float
    unit: str


# History field → what it can hold (DCGM field reference: GPU_UTIL is a percentage, the PROF_* activities ratios).
PHYSICAL_RANGES: dict[str, PhysicalRange] = {
    "gpu_util_percent": PhysicalRange(0.0, 100.0, "%"),
    "sm_active": PhysicalRange(0.0, 1.0, "ratio"),
    "tensor_active": PhysicalRange(0.0, 1.0, "ratio"),
    "dram_active": PhysicalRange(0.0, 1.0, "ratio"),
    "gr_engine_active": PhysicalRange(0.0, 1.0, "ratio"),
    "fb_used_mib": PhysicalRange(0.0, _MAX_FB_MIB, "MiB"),
    "last_xid": PhysicalRange(0.0, _MAX_COUNT, "Xid"),
    "ecc_dbe_volatile": PhysicalRange(0.0, _MAX_COUNT, "errors"),
    "clock_event_reasons": PhysicalRange(0.0, _MAX_COUNT, "bit mask"),
}


@dataclass(slots=True)
class Rejected:
    """The values of one field outside its range: how many, and the lowest and highest of them."""

    count: int = 0
    lowest: float = np.inf
    highest: float = -np.inf

    def add(self, values: np.ndarray) -> None:
        self.count += int(values.size)
        self.lowest = min(self.lowest, float(values.min()))
        self.highest = max(self.highest, float(values.max()))


def screen(history: History) -> dict[str, Rejected]:
    """Sets every out-of-range value of ``history`` to NaN, in place; what was taken out, per field."""
    rejected: dict[str, Rejected] = {}
    for gpu in history.gpus:
        for name, values in gpu.values.items():
            bounds = PHYSICAL_RANGES.get(name)
            if bounds is None:
                continue
            with np.errstate(invalid="ignore"):  # NB: NaN compares False: no sample is no violation
                bad = (values < bounds.low) | (values > bounds.high)
            if bad.any():
                rejected.setdefault(name, Rejected()).add(values[bad])
                values[bad] = np.nan
    return rejected


def gap_line(name: str, rejected: Rejected) -> str:
    bounds = PHYSICAL_RANGES[name]
    return (
        f"{rejected.count} value(s) of {name} outside its physical range {bounds.low:g}–{bounds.high:g} "
        f"{bounds.unit} (seen {rejected.lowest:g} to {rejected.highest:g}) were not counted: a broken exporter or "
        "a unit mix-up, not a measurement"
    )


def out_of_range(rejected: dict[str, Rejected]) -> list[OutOfRange]:
    """The report's structured form of what ``screen`` took out."""
    return [
        OutOfRange(
            field=name,
            count=r.count,
            low=PHYSICAL_RANGES[name].low,
            high=PHYSICAL_RANGES[name].high,
            unit=PHYSICAL_RANGES[name].unit,
            lowest_seen=r.lowest,
            highest_seen=r.highest,
        )
        for name, r in sorted(rejected.items())
    ]
