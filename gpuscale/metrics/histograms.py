"""Quantiles from Prometheus histograms over a window, as PromQL's ``histogram_quantile`` computes them.

A catalogue term with ``input: histogram_quantile`` names a histogram (``vllm:time_to_first_token_seconds``);
a source reads the increase of its ``_bucket`` counters over the term's window and hands the bucket
increases to ``quantiles``, which answers one value per histogram series (its labels without ``le``):
``histogram_quantile(q, increase(X_bucket[w]))`` in PromQL, which the Prometheus source sends verbatim.

The rules are Prometheus' own (promql/quantile.go, classic buckets), so both sources agree:

* buckets are sorted by upper bound; equal bounds are merged; the highest must be ``+Inf`` (else NaN);
* cumulative counts are made monotonic (a reset of one bucket inside the window must not give a
  negative share); fewer than two buckets, or no observation in the window, gives NaN;
* rank = q × observations; the answer interpolates linearly inside the first bucket whose count reaches
  the rank, from the previous bound (0 for the first bucket) to its own; a rank in the ``+Inf`` bucket
  answers the highest finite bound; a first bucket with an upper bound ≤ 0 answers that bound.

NaN means "no value" downstream (aggregation drops it): an idle server has no latency, not a latency of 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpuscale.metrics.series import SeriesValue, series_value

BUCKET_SUFFIX = "_bucket"


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The ``q`` quantile (0 ≤ q ≤ 1) of (upper bound, cumulative count) pairs; NaN when undefined."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for upper, count in buckets:
        merged[upper] = merged.get(upper, 0.0) + count
    ordered = sorted(merged.items())
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return math.nan
    bounds = [b for b, _ in ordered]
    counts: list[float] = []
    highest = 0.0
    for _, count in ordered:
        highest = max(highest, count)  # NB: monotonic, as Prometheus' ensureMonotonic
        counts.append(highest)
    observations = counts[-1]
    if not observations > 0:
        return math.nan
    rank = q * observations
    b = next(i for i, c in enumerate(counts) if c >= rank)
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * (rank / count)


def quantiles(buckets: Iterable[SeriesValue], *, q: float) -> list[SeriesValue]:
    """One SeriesValue per histogram series: ``q`` of its bucket increases (``X_bucket`` values with ``le``).

    The series is named after the histogram (``X``), keeps every label but ``le``, the newest sample time
    of its buckets and the longest span they covered. A bucket without a parsable ``le`` is left out.
    """
    groups: dict[tuple[str, str, tuple[tuple[str, str], ...]], list[SeriesValue]] = {}
    for value in buckets:
        key = (value.target, value.name, tuple((k, v) for k, v in value.labels.items() if k != "le"))
        groups.setdefault(key, []).append(value)
    out: list[SeriesValue] = []
    for (target, name, labels), values in groups.items():
        pairs = []
        for v in values:
            try:
                pairs.append((float(v.labels["le"]), v.value))
            except (KeyError, ValueError):
                continue
        spans = [v.window_seconds for v in values if v.window_seconds is not None]
        base = name.removesuffix(BUCKET_SUFFIX)
        value = bucket_quantile(q, pairs)
        newest = max(v.timestamp for v in values)
        out.append(series_value((base, dict(labels), value, newest, target, max(spans) if spans else None)))
    return out
