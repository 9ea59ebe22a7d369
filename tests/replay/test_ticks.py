"""gpuscale.replay.ticks: axis ticks are equal steps of 1, 2 or 5 × 10^k that cover the range, as few as fit.

Properties over many ranges (hypothesis), then the cases the simulate page showed: a queue axis of 44.4, 88.8 …
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpuscale.replay.chart import _tick
from gpuscale.replay.ticks import nice_step, nice_step_for, nice_ticks

MAGNITUDES = st.floats(min_value=1e-6, max_value=1e12, allow_nan=False, allow_infinity=False)
LOWS = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


def mantissa(step: float) -> int | None:
    """The step's one significant digit, read from its shortest decimal form (0.2 → 2, 50.0 → 5); None if more."""
    digits = Decimal(repr(step)).normalize().as_tuple().digits
    return digits[0] if len(digits) == 1 else None


def places(x: float) -> int:
    """Decimal places of the shortest form of x (0.30000000000000004 → 17, 0.3 → 1, 500.0 → 0)."""
    return max(0, -Decimal(repr(x)).normalize().as_tuple().exponent)


def is_nice(step: float) -> bool:
    return mantissa(step) in (1, 2, 5)


def steps_of(ticks: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(ticks)]


def assert_equal_nice_steps(ticks: list[float]) -> float:
    steps = steps_of(ticks)
    step = nice_step(steps[0] * (1 - 1e-6))  # the nice number the first difference is, float noise aside
    assert is_nice(step), ticks
    for s in steps:
        assert math.isclose(s, step, rel_tol=1e-6), ticks
    for t in ticks:  # every tick a multiple of the step, printed without float noise
        assert math.isclose(t / step, round(t / step), abs_tol=1e-6), (t, step)
        assert places(t) <= places(step), (t, step)
    return step


@given(MAGNITUDES)
def test_nice_step_is_the_smallest_nice_number_at_least_the_input(x):
    step = nice_step(x)
    assert is_nice(step), step
    assert step >= x * (1 - 1e-9)
    assert step < 2.5 * x * (1 + 1e-12)  # 1 → 2 → 5 → 10: never more than 2.5 × the input
    below = step * 2 / 5 if mantissa(step) == 5 else step / 2  # the nice number below it is below x
    assert below < x * (1 + 1e-9)


@given(LOWS, MAGNITUDES, st.integers(min_value=2, max_value=20))
def test_ticks_cover_the_range_in_equal_nice_steps_and_no_more_than_allowed(low, span, most):
    assume(span >= abs(low) * 1e-6)  # NB: floats near 1e9 are 1e-7 apart: no axis of 1e-6 there
    high = low + span
    ticks = nice_ticks(low, high, most=most)
    assert 2 <= len(ticks) <= most, ticks
    step = assert_equal_nice_steps(ticks)
    assert ticks[0] <= low + step * 1e-6 and ticks[-1] >= high - step * 1e-6, (low, high, ticks)
    # as few as fit: the next smaller nice step would need more than `most` ticks
    smaller = step * 2 / 5 if mantissa(step) == 5 else step / 2
    need = math.ceil(high / smaller - 1e-9) - math.floor(low / smaller + 1e-9) + 1
    assert need > most, (low, high, step, need)


@given(MAGNITUDES)
def test_an_axis_from_zero_starts_at_zero_and_its_labels_never_repeat(high):
    ticks = nice_ticks(0.0, high)
    assert ticks[0] == 0.0
    labels = [_tick(t) for t in ticks]
    assert len(set(labels)) == len(labels), labels
    assert_equal_nice_steps(ticks)


@given(st.integers(min_value=0, max_value=100_000))
def test_integer_axes_have_whole_steps(top):
    ticks = nice_ticks(0.0, float(top), integer=True)
    assert all(t == int(t) for t in ticks), ticks
    assert ticks[-1] >= top and len(ticks) <= 11
    assert steps_of(ticks)[0] >= 1


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False), st.integers(min_value=1, max_value=20))
def test_a_second_axis_on_the_first_axis_gridlines_gets_nice_labels_reaching_its_peak(peak, intervals):
    step = nice_step_for(peak, intervals=intervals, integer=True)
    assert is_nice(step) and step >= 1
    labels = [k * step for k in range(intervals + 1)]
    assert labels[-1] >= peak
    assert_equal_nice_steps(labels)


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0, 400, [0, 50, 100, 150, 200, 250, 300, 350, 400]),  # not 44.4, 88.8 …
        (0, 100, [0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100]),
        (0, 1, [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1]),
        (0, 0.37, [0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4]),
        (0, 3009, [0, 500, 1000, 1500, 2000, 2500, 3000, 3500]),
        (0, 0, [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1]),
        (-3, 7, [-3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7]),
        (12.3, 12.9, [12.3, 12.4, 12.5, 12.6, 12.7, 12.8, 12.9]),
    ],
)
def test_ticks_as_a_reader_would_draw_them(low, high, expected):
    assert nice_ticks(low, high) == expected


def test_the_queue_axis_of_nine_gridlines_is_in_fifties_not_forty_four_point_four():
    assert [k * nice_step_for(400, intervals=9) for k in range(10)] == [k * 50 for k in range(10)]


@pytest.mark.parametrize(("low", "high", "most"), [(1, 0, 11), (0, math.inf, 11), (math.nan, 1, 11), (0, 1, 1)])
def test_a_range_that_has_no_ticks_is_refused(low, high, most):
    with pytest.raises(ValueError):
        nice_ticks(low, high, most=most)
