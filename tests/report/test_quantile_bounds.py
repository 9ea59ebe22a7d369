"""The pooled-quantile bound of report/quantile_bounds.py: never below numpy's exact quantile of the pooled samples
(random parts, the counterexample to "the largest part's quantile"), exact for one part, and close when the levels
are dense."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscale.report.quantile_bounds import Part, pooled_quantile_bound

LEVELS = (0.25, 0.5, 0.75, 0.9, 0.95, 0.99)


def parts_of(samples: list[np.ndarray], levels) -> list[Part]:
    lv = np.asarray(levels)
    return [
        Part(s.size, lv, np.quantile(s, lv), float(s.max()))
        if s.size
        else Part(0, lv, np.full(lv.size, np.nan), np.nan)
        for s in samples
    ]


def test_the_largest_part_quantile_is_no_bound_but_this_is():
    parts = [np.array([0.0, 1.0]), np.array([0.0, 1.0])]
    exact = np.quantile(np.concatenate(parts), 0.9)
    assert max(np.quantile(p, 0.9) for p in parts) < exact  # the trap: 0.9 < 1
    assert pooled_quantile_bound(0.9, parts_of(parts, LEVELS)) >= exact


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(0, 1, allow_nan=False).map(lambda v: round(v, 3)), min_size=0, max_size=40),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(LEVELS),
)
def test_never_below_the_exact_pooled_quantile(samples, q):
    arrays = [np.array(s, dtype=np.float64) for s in samples]
    pooled = np.concatenate(arrays)
    bound = pooled_quantile_bound(q, parts_of(arrays, LEVELS))
    if pooled.size == 0:
        assert bound is None
        return
    assert bound >= np.quantile(pooled, q) - 1e-12
    assert bound <= pooled.max()
    higher = pooled_quantile_bound(q, parts_of(arrays, LEVELS), at_or_above=True)
    assert higher >= np.quantile(pooled, q, method="higher") - 1e-12


@pytest.mark.parametrize("q", LEVELS)
def test_one_part_is_its_own_exact_quantile(q):
    s = np.random.default_rng(1).random(1000)
    assert pooled_quantile_bound(q, parts_of([s], LEVELS)) == np.quantile(s, q)


def test_dense_levels_keep_a_hundred_bursty_parts_within_a_point():
    rng = np.random.default_rng(2)
    levels = np.round(np.arange(0.9, 0.9995, 0.0025), 4)
    parts = [np.where(rng.random(1440) < 0.1, rng.uniform(0.6, 1.0, 1440), 0.02) for _ in range(100)]
    exact = np.quantile(np.concatenate(parts), 0.95)
    bound = pooled_quantile_bound(0.95, parts_of(parts, levels))
    assert exact <= bound <= exact + 0.01
    assert max(np.quantile(p, 0.95) for p in parts) > exact + 0.02  # the largest part's would be off by more


def test_the_sample_at_or_above_p99_of_one_part_with_its_spikes_cut_by_a_gap():
    """Three spikes of 0.9 in 300 samples: the linear p99 is 0.0585, the sample at or above it 0.9 (raw mode's
    safety share); the bound asked for the latter gives 0.9 from the dense levels, so both modes call it busy."""
    from gpuscale.sources.summary_fetch import DENSE_LEVELS

    s = np.full(300, 0.05)
    s[-3:] = 0.9
    parts = parts_of([s], DENSE_LEVELS)
    assert pooled_quantile_bound(0.99, parts) == pytest.approx(np.quantile(s, 0.99))
    assert np.quantile(s, 0.99) == pytest.approx(0.0585)
    assert pooled_quantile_bound(0.99, parts, at_or_above=True) == 0.9
