"""Axis ticks a reader can count along: equal steps of 1, 2 or 5 × 10^k, never 44.4 and 88.8.

The classic "nice numbers" rule of chart axes: among the steps 1, 2, 5, 10, 20, 50, … (and 0.1, 0.2, 0.5, …) take the
smallest that covers the range in at most ``most`` ticks, and put the ticks on its multiples, so the first is at or
below the range and the last at or above it. Pure arithmetic; the chart module hands the ticks to pygal.
"""

from __future__ import annotations

import math

MANTISSAS = (1, 2, 5)


def _decimals(step: float) -> int:
    """Digits after the point a multiple of ``step`` needs (0.05 → 2, 20 → 0): ticks rounded to them carry no float
    noise (0.30000000000000004)."""
    return max(0, -math.floor(math.log10(step) + 1e-9))


def nice_step(at_least: float) -> float:
    """The smallest 1, 2 or 5 × 10^k that is at least ``at_least`` (a positive, finite number)."""
    if not (at_least > 0 and math.isfinite(at_least)):
        raise ValueError(f"a tick step must be positive and finite, not {at_least!r}")
    exponent = math.floor(math.log10(at_least))
    for power in (exponent - 1, exponent, exponent + 1):
        for mantissa in MANTISSAS:
            # NB: 5 / 10 is 0.5 exactly, where 5 * 10 ** -1 is 0.5000000000000001
            step = mantissa * 10.0**power if power >= 0 else mantissa / 10.0**-power
            if step >= at_least * (1 - 1e-9):  # NB: float noise (0.1 + 0.2) is no reason for the next step
                return step
    raise AssertionError("unreachable: 10^(exponent+1) exceeds at_least")


def nice_ticks(low: float, high: float, *, most: int = 11, integer: bool = False) -> list[float]:
    """Ticks at the multiples of the smallest nice step that covers [low, high] in at most ``most`` of them
    (``integer``: a step of at least 1, for counts such as replicas).

    A range of one value is widened to one unit above it. ``most`` ≥ 2.
    """
    if most < 2:
        raise ValueError(f"an axis needs at least 2 ticks, not {most}")
    if not (math.isfinite(low) and math.isfinite(high)) or high < low:
        raise ValueError(f"ticks need a finite range low ≤ high, not [{low!r}, {high!r}]")
    if high == low:
        high = low + 1
    step = nice_step(max((high - low) / (most - 1), 1 if integer else 0))
    while True:
        first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
        if last - first + 1 <= most:
            digits = _decimals(step)
            return [round(k * step, digits) + 0.0 for k in range(first, last + 1)]
        step = nice_step(step * 1.5)  # the next nice step: 1 → 2 → 5 → 10


def nice_step_for(high: float, *, intervals: int, integer: bool = False) -> float:
    """The smallest nice step whose ``intervals`` multiples reach ``high`` from 0: a second axis that shares the
    first one's gridlines (``integer``: at least 1); 1 when ``high`` is not above 0."""
    return nice_step(max(high / intervals, 1 if integer else 0)) if high > 0 else 1.0
