"""Right-sizing statistics, the VPA recommender's way: decaying histograms, a target with a margin, confidence.

Pure numpy. One streaming pass per chunk of samples (``DecayingHistogram.add``): bucket indices by arithmetic
(linear buckets) or a logarithm (exponential buckets), then one weighted ``np.bincount``; memory is the
buckets, whatever the number of samples. Constants follow kubernetes/autoscaler's VPA recommender
(``vertical-pod-autoscaler/pkg/recommender/{util/decaying_histogram.go,logic/estimator.go}``):

* a sample's weight is ``2 ** ((t - reference) / half_life)``: recent samples count more (half-life 24 h);
* a percentile is the *end* of the bucket where the cumulative weight crosses it (conservative; never above
  the exact maximum, which is tracked on the side);
* confidence ``= min(history days, samples / samples-per-day)``; with it the bounds widen:
  ``upper = target · (1 + 1/confidence)``, ``lower = target · (1 + 0.001/confidence) ** -2``
  (×3 at 12 h of history, ×2 at 24 h, ×1.14 at a week).

Exactness: ``max`` and counts are exact; percentiles are exact to one bucket (0.5 percentage point for
percentages and ratios, 5 % for memory), and weighted by recency, as VPA's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DAY_SECONDS = 86400.0


@dataclass(frozen=True, slots=True)
class Buckets:
    """Linear (``ratio`` None: width ``first``) or exponential (each bucket ``ratio`` × the one before) buckets
    covering [0, ``maximum``]; values above the maximum land in the last bucket."""

    first: float
    maximum: float
    ratio: float | None = None
    discrete: bool = False  # integer values (counts): a bucket's value is its start, exactly

    @property
    def count(self) -> int:
        if self.ratio is None:
            return math.ceil(self.maximum / self.first) + 1
        return math.ceil(math.log(self.maximum / self.first, self.ratio)) + 2

    def index(self, values: np.ndarray, *, scale: float = 1.0) -> np.ndarray:
        """The bucket of each of ``values`` × ``scale`` (no NaN); one pass of arithmetic for linear buckets."""
        if self.ratio is None:
            i = (values * np.float32(scale / self.first)).astype(np.intp)
            np.clip(i, 0, self.count - 1, out=i)
            return i
        # bucket 0 is [0, first); bucket k ≥ 1 is [first·r^(k-1), first·r^k)
        v = np.maximum(values * np.float32(scale / self.first), np.float32(1.0))
        i = (np.log(v) * np.float32(1.0 / math.log(self.ratio))).astype(np.intp) + 1
        i[v <= 1.0] = 0
        np.clip(i, 0, self.count - 1, out=i)
        return i

    def end(self, i: int) -> float:
        """The upper end of bucket ``i``."""
        if self.ratio is None:
            return (i + (0 if self.discrete else 1)) * self.first
        return self.first * self.ratio**i


PERCENT = Buckets(first=0.5, maximum=100.0)  # 0.5 percentage point
MEMORY_MIB = Buckets(first=16.0, maximum=4.0 * 1024 * 1024, ratio=1.05)  # VPA's 5 % growth
COUNT = Buckets(first=1.0, maximum=64.0, discrete=True)  # GPUs in use at once


class DecayingHistogram:
    """A histogram whose samples lose half their weight every ``half_life_seconds`` before ``reference``."""

    __slots__ = ("buckets", "count", "half_life", "maximum", "reference", "weights")

    def __init__(self, buckets: Buckets, *, half_life_seconds: float, reference: float) -> None:
        self.buckets = buckets
        self.half_life = half_life_seconds
        self.reference = reference
        self.weights = np.zeros(buckets.count, dtype=np.float64)
        self.count = 0
        self.maximum = -math.inf

    def decay(self, times: np.ndarray) -> np.ndarray:
        """The weight of a sample at each of ``times`` (epoch seconds)."""
        return np.exp2((np.asarray(times, dtype=np.float64) - self.reference) / self.half_life)

    def add(
        self,
        values: np.ndarray,
        *,
        weights: np.ndarray,
        scale: float = 1.0,
        clean: bool = False,
        maximum: float | None = None,
    ) -> tuple[np.ndarray, int, float]:
        """Add ``values`` × ``scale`` with their weights (broadcast to the values' shape; from ``decay``). NaN
        samples are skipped; ``clean`` says there are none (and ``maximum`` what the largest is) when the caller
        already knows. Returns what was added (bucket weights, count, maximum) for ``add_counts``."""
        values = np.asarray(values)
        nan = None if clean else np.isnan(values)
        if nan is not None and nan.any():
            ok = ~nan
            values = values[ok]
            weights = np.broadcast_to(weights, ok.shape)[ok]
        else:
            weights = np.broadcast_to(weights, values.shape)
        if values.size == 0:
            return np.zeros(self.buckets.count), 0, -math.inf
        counts = np.bincount(
            self.buckets.index(values, scale=scale).ravel(), weights=weights.ravel(), minlength=self.buckets.count
        )
        top = maximum if maximum is not None else float(values.max())
        added = (counts, int(values.size), top * scale)
        self.add_counts(*added)
        return added

    def add_counts(self, counts: np.ndarray, count: int, maximum: float) -> None:
        self.weights += counts
        self.count += count
        self.maximum = max(self.maximum, maximum)

    def merge(self, other: DecayingHistogram) -> None:
        self.weights += other.weights
        self.count += other.count
        self.maximum = max(self.maximum, other.maximum)

    @property
    def empty(self) -> bool:
        return self.count == 0

    def percentile(self, p: float) -> float | None:
        """The end of the bucket where the cumulative weight reaches ``p`` (0–1), capped at the exact maximum."""
        total = float(self.weights.sum())
        if self.count == 0 or total <= 0:
            return None
        cumulative = np.cumsum(self.weights)
        i = int(np.searchsorted(cumulative, p * total, side="left"))
        i = min(i, self.buckets.count - 1)
        return min(self.buckets.end(i), self.maximum)


def confidence(*, history_seconds: float, samples: int, step_seconds: float) -> float:
    """VPA's confidence: ``min(history days, sample-days)``; a sample stands for ``step_seconds`` (VPA: 1 min)."""
    return max(0.0, min(history_seconds / DAY_SECONDS, samples * step_seconds / DAY_SECONDS))


def scaled(value: float, *, conf: float, multiplier: float, exponent: float) -> float:
    """``value · (1 + multiplier / confidence) ** exponent`` — ∞ (or 0) with no confidence."""
    if conf <= 0:
        return math.inf if exponent > 0 else 0.0
    return value * (1.0 + multiplier / conf) ** exponent


@dataclass(frozen=True, slots=True)
class Estimate:
    """VPA-style estimate of one signal: target (p90 + margin), lower (p50 + margin), upper (p95 + margin)
    scaled by confidence; the plain percentiles and the exact maximum beside them."""

    p50: float
    p90: float
    p95: float
    maximum: float
    target: float
    lower: float
    upper: float
    confidence: float
    samples: int


def estimate(
    hist: DecayingHistogram,
    *,
    conf: float,
    margin: float,
    target_p: float = 0.9,
    lower_p: float = 0.5,
    upper_p: float = 0.95,
    cap: float | None = None,
) -> Estimate | None:
    """The estimate of ``hist`` (None when empty). ``cap`` bounds target and both bounds (100 % of a GPU, its
    memory): a workload at 100 % has a target of 100 %, not 115 %, and lower ≤ target ≤ upper always holds."""
    if hist.empty:
        return None
    p50, p90, p95 = (hist.percentile(p) for p in (0.5, 0.9, 0.95))
    assert p50 is not None and p90 is not None and p95 is not None
    t, lo, up = (hist.percentile(p) or 0.0 for p in (target_p, lower_p, upper_p))
    target = t * (1 + margin)
    upper = scaled(up * (1 + margin), conf=conf, multiplier=1.0, exponent=1.0)
    lower = scaled(lo * (1 + margin), conf=conf, multiplier=0.001, exponent=-2.0)
    if cap is not None:
        target, upper = min(target, cap), min(upper, cap)
    # NB: with percentiles asked out of order (a policy's lower_p above its upper_p) the bounds still nest
    upper = max(upper, target)
    lower = min(lower, target)
    return Estimate(
        p50=p50,
        p90=p90,
        p95=p95,
        maximum=hist.maximum,
        target=target,
        lower=lower,
        upper=upper,
        confidence=conf,
        samples=hist.count,
    )
