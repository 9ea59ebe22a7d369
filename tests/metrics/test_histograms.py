"""Histogram quantiles: Prometheus' histogram_quantile rules, pinned against hand-computed values."""

from __future__ import annotations

import math

import pytest

from gpuscale.errors import ConfigError
from gpuscale.metrics.catalogue import parse_catalogue
from gpuscale.metrics.histograms import bucket_quantile, quantiles
from gpuscale.sources.base import SeriesValue

INF = math.inf
# Bucket increases of one window: 200 requests, cumulative per upper bound.
TTFT = [(0.04, 10), (0.06, 40), (0.08, 90), (0.1, 140), (0.25, 180), (0.5, 196), (0.75, 200), (INF, 200)]


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.95, TTFT, 0.25 + 0.25 * 10 / 16),  # rank 190 in (0.25, 0.5]: 10 of its 16
        (0.5, TTFT, 0.08 + 0.02 * 10 / 50),  # rank 100 in (0.08, 0.1]: 10 of its 50
        (0.01, TTFT, 0.0 + 0.04 * 2 / 10),  # rank 2 in the first bucket: from 0
        (0.99, [(1.0, 5), (2.0, 9), (INF, 10)], 2.0),  # rank 9.9 in +Inf: the highest finite bound
        (0.5, list(reversed(TTFT)), 0.084),  # order of the input does not matter
        (0.5, [(-1.0, 5), (0.0, 5), (INF, 10)], -1.0),  # first bucket with bound <= 0 answers that bound
        (0.5, [(1.0, 0), (INF, 0)], math.nan),  # no observation in the window: no value
        (0.5, [(1.0, 3), (2.0, 4)], math.nan),  # no +Inf bucket
        (0.5, [(INF, 4)], math.nan),  # fewer than two buckets
        (0.5, [(1.0, 6), (2.0, 4), (INF, 10)], 1.0 * 5 / 6),  # non-monotonic (a reset) is made monotonic
        (0.5, [(1.0, 2), (1.0, 2), (2.0, 8), (INF, 8)], 1.0),  # equal bounds merge: (1.0, 4); rank 4
        (-0.1, TTFT, -INF),
        (1.5, TTFT, INF),
    ],
)
def test_bucket_quantile_follows_prometheus(q, buckets, expected):
    got = bucket_quantile(q, buckets)
    if math.isnan(expected):
        assert math.isnan(got)
    else:
        assert got == pytest.approx(expected)


def test_quantiles_answer_one_value_per_histogram_series_without_le():
    def bucket(le: str, count: float, engine: str, ts: float = 100.0) -> SeriesValue:
        labels = {"engine": engine, "le": le, "model_name": "m"}
        return SeriesValue("vllm:ttft_seconds_bucket", labels, count, ts, "http://a/metrics", 60.0)

    values = [bucket("0.5", 1, "0"), bucket("1.0", 4, "0"), bucket("+Inf", 4, "0", ts=101.0)]
    values += [bucket("0.5", 3, "1"), bucket("+Inf", 3, "1"), bucket("oops", 9, "1")]
    out = {v.labels["engine"]: v for v in quantiles(values, q=0.5)}
    assert out["0"].name == "vllm:ttft_seconds" and out["0"].labels == {"engine": "0", "model_name": "m"}
    assert out["0"].value == pytest.approx(0.5 + 0.5 * 1 / 3)  # rank 2 in (0.5, 1.0]: 1 of its 3
    assert out["0"].timestamp == 101.0 and out["0"].window_seconds == 60.0
    assert out["1"].value == pytest.approx(0.5 * 1.5 / 3)  # the unparsable bucket is left out


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({"input": "histogram_quantile"}, "needs a 'quantile' between 0 and 1"),
        ({"input": "histogram_quantile", "quantile": 1.5}, "needs a 'quantile' between 0 and 1"),
        ({"input": "rate", "quantile": 0.5}, "'quantile' is only allowed with input 'histogram_quantile'"),
    ],
)
def test_a_bad_quantile_term_fails_at_load_naming_the_entry(entry, reason):
    data = {"metrics": [{"name": "ttft", "aggregate": "max", "series": ["vllm:ttft_seconds"], **entry}]}
    with pytest.raises(ConfigError, match=reason) as raised:
        parse_catalogue(data, path="metrics.yaml")
    assert "metrics.yaml" in str(raised.value) and "metrics[0]" in str(raised.value)


def test_a_quantile_term_keeps_the_bucket_counters_with_a_window():
    data = {
        "metrics": [
            {"name": "ttft", "aggregate": "max", "series": ["x"], "input": "histogram_quantile", "quantile": 0.9}
        ]
    }
    catalogue = parse_catalogue(data)
    assert catalogue.series_names == catalogue.windowed_series == {"x_bucket"}
