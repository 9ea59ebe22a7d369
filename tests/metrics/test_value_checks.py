"""What the snapshot build leaves out, per metric and reason (metrics/aggregation.py's checks): the catalogue's
range fields, a ratio's terms, a sum that overflows a quantity, and a histogram quantile's NaN (no value, uncounted).
"""

from __future__ import annotations

import math
import re

import pytest

from gpuscale.errors import ConfigError
from gpuscale.metrics.aggregation import build_snapshot
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import parse_catalogue
from gpuscale.metrics.series import SeriesValue
from gpuscale.model import QUANTITY_MAX, pod

NOW = 1_764_806_400.0
URL = "http://ns.p:8000/metrics"


def _catalogue(**entry):
    return parse_catalogue({"metrics": [{"name": "m", "aggregate": "sum", "series": ["s"], **entry}]})


def _build(catalogue, *values, series="s", **labels):
    read = [SeriesValue(series, {"i": str(i), **labels}, v, NOW - 1, URL) for i, v in enumerate(values)]
    attributor = Attributor(lambda url: Target(url, pod("ns", "p"), "node-a"))
    return build_snapshot(catalogue, lambda query: [v for v in read if v.name in query.series], attributor, now=NOW)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"minimum": 5, "maximum": 1}, "'minimum' (5) is above 'maximum' (1)"),
        ({"minimum": float("nan")}, "'minimum' must be a finite number"),
        ({"maximum": float("inf")}, "'maximum' must be a finite number"),
    ],
)
def test_a_range_that_is_no_range_fails_at_start_naming_the_field(entry, says):
    with pytest.raises(ConfigError, match=re.escape(f"metrics[0] (m): {says}")):
        _catalogue(**entry)


def test_a_sum_of_in_range_series_past_a_quantity_is_left_out_and_counted_per_object():
    snapshot = _build(_catalogue(minimum=0), QUANTITY_MAX, 8.0)
    assert snapshot.values["m"] == {}  # pod, namespace and node: each edge + 8
    assert snapshot.dropped == {("m", "out_of_range"): 3}
    served = _build(_catalogue(minimum=0), QUANTITY_MAX, 0.0)
    assert served.values["m"][pod("ns", "p")].value == QUANTITY_MAX and not served.dropped


def test_a_negative_term_of_a_metric_that_cannot_be_negative_is_left_out_not_netted():
    ratio = parse_catalogue(
        {
            "metrics": [
                {
                    "name": "m",
                    "aggregate": "ratio",
                    "minimum": 0,
                    "numerator": {"series": ["s"]},
                    "denominator": {"series": ["d"]},
                }
            ]
        }
    )
    read = [
        SeriesValue("s", {}, 5.0, NOW - 1, URL),
        SeriesValue("s", {"x": "1"}, -3.0, NOW - 1, URL),
        SeriesValue("d", {}, 10.0, NOW - 1, URL),
    ]
    attributor = Attributor(lambda url: Target(url, pod("ns", "p"), "node-a"))
    snapshot = build_snapshot(ratio, lambda q: [v for v in read if v.name in q.series], attributor, now=NOW)
    assert snapshot.values["m"][pod("ns", "p")].value == 0.5  # 5 / 10, not (5 - 3) / 10
    assert snapshot.dropped == {("m", "out_of_range"): 1}


def test_a_metric_without_a_range_serves_negatives_within_a_quantity():
    snapshot = _build(_catalogue(), -301.0, -QUANTITY_MAX / 2)
    assert snapshot.values["m"][pod("ns", "p")].value == -301.0 - QUANTITY_MAX / 2 and not snapshot.dropped


def test_a_histogram_quantiles_nan_is_no_value_and_not_a_fault():
    catalogue = _catalogue(input="histogram_quantile", quantile=0.5, aggregate="max", minimum=0)
    snapshot = _build(catalogue, math.nan, 0.25, series="s")
    assert snapshot.values["m"][pod("ns", "p")].value == 0.25 and not snapshot.dropped
    snapshot = _build(catalogue, math.inf, 0.25, series="s")
    assert snapshot.dropped == {("m", "not_finite"): 1}
