"""A pooled quantile from the quantiles of its parts, never below the exact one. Pure.

Summary mode asks the TSDB, per series and chunk (a *part*), for its sample count ``n`` and its quantiles at a
set of levels (``quantile_over_time(q, F[C])``); a workload's p95 is over the samples of every part pooled. That
pooled quantile is not a function of the parts' quantiles, so it is bounded from above, and shown as the bound.

The definition (numpy's default, Prometheus' and VictoriaMetrics' ``quantile_over_time``): of ``n`` sorted samples
``s_0 ≤ … ≤ s_{n-1}``, ``Q(q) = s_⌊h⌋ + (h - ⌊h⌋)(s_⌊h⌋+1 - s_⌊h⌋)`` with rank ``h = q(n - 1)``.

Why "the largest of the parts' quantiles" is not a bound: with interpolation a part's quantile can sit below the
samples it interpolates towards. Two parts {0, 1} each have ``Q(0.9) = 0.9``; pooled, {0, 0, 1, 1} has
``h = 2.7`` and ``Q(0.9) = 1``.

The bound. (1) A part's ``Q(q_j) ≥ s_⌊h_j⌋``, so at least ``c_j = ⌊q_j(n - 1)⌋ + 1`` of its samples are ``≤ Q(q_j)``,
and all ``n`` are ``≤`` its maximum. So for any ``x``, the part has at least ``LB(x) = max{c_j : Q(q_j) ≤ x}``
samples ``≤ x`` (0 when no level is). (2) Pooled over ``N`` samples, the exact ``Q(q)`` is at most
``u_⌈H⌉`` (the upper of the two samples it interpolates, numpy's ``method="higher"``), ``H = q(N - 1)``: the
(⌈H⌉ + 1)-th smallest. (3) If
``Σ LB(x) ≥ ⌈H⌉ + 1`` then at least that many pooled samples are ``≤ x``, so ``u_⌈H⌉ ≤ x`` and ``Q(q) ≤ x``. The
bound is the smallest such ``x`` among the parts' quantiles and maxima (``Σ LB`` only changes there); it bounds
``u_⌈H⌉`` as well, the sample at or above the quantile. ∎

How far above: each part loses at most the samples between two asked levels plus one (the interpolated rank),
so with levels ``δ`` apart near ``q`` the bound is at most the exact quantile at ``q + δ + parts / N``.
A single part asked at level ``q`` is its own exact quantile, returned as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Part:
    """One series-chunk: its sample count, its quantiles at ``levels`` (ascending; NaN where not answered) and its
    maximum."""

    count: int
    levels: np.ndarray
    quantiles: np.ndarray
    maximum: float


def pooled_quantile_bound(q: float, parts: Sequence[Part], *, at_or_above: bool = False) -> float | None:
    """An upper bound of the quantile ``q`` of every part's samples pooled (the module docstring proves it);
    None without a sample. ``at_or_above``: a bound of the sample at or above the quantile (numpy's
    ``method="higher"``, what safety decisions read), so a single part is not returned as the TSDB gave it."""
    live = [p for p in parts if p.count > 0 and math.isfinite(p.maximum)]
    if not live:
        return None
    if len(live) == 1 and not at_or_above:
        hit = np.flatnonzero(np.isclose(live[0].levels, q, rtol=0.0, atol=1e-12))
        if hit.size and math.isfinite(live[0].quantiles[hit[0]]):
            return float(live[0].quantiles[hit[0]])
    total = sum(p.count for p in live)
    need = math.ceil(q * (total - 1) - 1e-9) + 1
    xs: list[np.ndarray] = []
    steps: list[np.ndarray] = []
    for p in live:
        ok = np.isfinite(p.quantiles)
        ranks = np.floor(np.asarray(p.levels)[ok] * (p.count - 1) + 1e-9) + 1  # c_j: samples at or below Q(q_j)
        values = np.maximum.accumulate(p.quantiles[ok])  # NB: raised past float noise only: still a bound
        x = np.append(values, p.maximum)
        c = np.maximum.accumulate(np.append(ranks, p.count))  # NB: a step function in x: LB rises with each level
        xs.append(x)
        steps.append(np.diff(c, prepend=0.0))
    x = np.concatenate(xs)
    inc = np.concatenate(steps)
    order = np.argsort(x, kind="stable")
    x, covered = x[order], np.cumsum(inc[order])
    # NB: quantiles are monotone in their level, so each part's increments are met in level order; equal x values
    # all count together, which only the last of a run of equal x shows: its cumulative sum is the one compared.
    last = np.append(x[1:] != x[:-1], True)
    reached = np.flatnonzero(last & (covered >= need - 1e-9))
    return float(x[reached[0]]) if reached.size else float(x[-1])
