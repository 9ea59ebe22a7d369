"""Values outside a field's physical range are taken out before any figure and reported; bounds always nest."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscale.report.build import build_report
from gpuscale.report.policy import load_report_policy
from gpuscale.report.ranges import PHYSICAL_RANGES, screen
from gpuscale.report.stats import PERCENT, DecayingHistogram, estimate
from tests.report.histories import add_pod, history


def test_screen_takes_out_what_a_gpu_cannot_report_and_says_how_much():
    h = history(hours=1)
    values = {"gpu_util_percent": [40.0, 150.0, -1.0, np.nan], "sm_active": [0.4, 150.0, 1.0, 0.0]}
    add_pod(h, pod="p", values=lambda g, t: {k: np.resize(v, t.shape) for k, v in values.items()})
    rejected = screen(h)
    assert {k: (r.count, r.lowest, r.highest) for k, r in rejected.items()} == {
        "gpu_util_percent": (30, -1.0, 150.0),
        "sm_active": (15, 150.0, 150.0),
    }
    util = h.gpus[0].values["gpu_util_percent"]
    assert np.nanmax(util) == 40.0 and np.isnan(util).sum() == 45


def test_every_history_field_has_a_range():
    from gpuscale.metrics.history import FIELDS

    assert set(PHYSICAL_RANGES) == set(FIELDS)


def test_a_report_on_impossible_values_keeps_its_bounds_inside_the_range():
    h = history(hours=6)
    add_pod(h, pod="p", values=lambda g, t: {"gpu_util_percent": np.where(t % 120 < 60, 100.0, 150.0)})
    report = build_report(h, policy=load_report_policy(None), generated_at=0.0)
    (w,) = report.workloads
    s = w.signals["gpu_util_percent"]
    assert s.max == 100 and 0 <= s.lower_bound <= s.target <= s.upper_bound <= 100
    assert [(o.field, o.count, o.highest_seen) for o in report.out_of_range] == [("gpu_util_percent", 180, 150.0)]
    assert any("180 value(s) of gpu_util_percent outside" in g for g in report.gaps)


@pytest.mark.parametrize("conf", [0.0, 0.5, 7.0])
def test_a_workload_at_100_percent_has_bounds_that_nest_under_the_cap(conf):
    hist = DecayingHistogram(PERCENT, half_life_seconds=86400, reference=0)
    hist.add(np.full(1000, 100.0, np.float32), weights=np.ones(1000))
    est = estimate(hist, conf=conf, margin=0.15, cap=100.0)
    assert est is not None
    assert est.lower <= est.target <= est.upper <= 100.0 and not math.isnan(est.lower)
