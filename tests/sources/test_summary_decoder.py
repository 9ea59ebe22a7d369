"""Summary mode's quantile answers placed on each series as they arrive (sources/summary_decoder.py): levels in order
whatever order they are answered in, a level asked again answered by its last answer, chunks left NaN where the TSDB
gave nothing, and no row for a level never answered. (Values a float32 holds exactly: the decoder cleans through one.)
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from gpuscale.metrics.history import SummaryHistory
from gpuscale.sources.summary_decoder import SummaryDecoder

FIRST, CHUNK = 3599.999, 3600.0


def answer(gpu: int, level: float, values: dict[int, float]) -> list[dict]:
    labels = {"__name__": "DCGM_FI_PROF_SM_ACTIVE", "Hostname": "node-a", "UUID": f"GPU-{gpu}", "gpu": str(gpu)}
    labels |= {"modelName": "NVIDIA H100 80GB HBM3", "namespace": "ml", "pod": f"app-{gpu}", "gpuscale_q": repr(level)}
    return [{"metric": labels, "values": [[FIRST + c * CHUNK, str(v)] for c, v in values.items()]}]


def decoded(answers: list[tuple[int, float, dict[int, float]]], *, together: bool = False) -> SummaryHistory:
    """``together``: every answer in one query's result, in order (else one result each)."""
    h = SummaryHistory(start=0.0, step_seconds=60.0, chunk_seconds=CHUNK, chunks=3)
    d = SummaryDecoder(h, re.compile("dcgm-exporter.*"))
    results = [answer(gpu, level, values) for gpu, level, values in answers]
    for result in [[e for r in results for e in r]] if together else results:
        d.add("quantiles", "sm_active", result, first=FIRST, every=CHUNK)
    d.add(
        "stat",
        "fb_used_mib:count",
        [{"metric": {**answer(2, 0.5, {})[0]["metric"], "__name__": "DCGM_FI_DEV_FB_USED"}, "values": [[FIRST, "60"]]}],
        first=FIRST,
        every=CHUNK,
    )
    d.finish()
    return h


ANSWERS = [
    (0, 0.9, {0: 0.75, 2: 0.8125}),
    (1, 0.5, {0: 0.125, 1: 0.25, 2: 0.375}),
    (0, 0.5, {0: 0.5, 1: 0.5625}),
    (1, 0.9, {0: 0.5, 1: 0.625, 2: 0.75}),
    (0, 0.99, {0: 0.9375}),
    (0, 0.9, {2: 0.875}),  # asked again: the last answer wins
    (1, 0.99, {}),  # nothing answered: no row
]


@pytest.mark.parametrize("together", [False, True])
def test_answers_in_any_order_land_on_their_level_and_chunk(together):
    h = decoded(ANSWERS, together=together)
    by_gpu = {(s.gpu, s.field): s for s in h.series}
    zero, one = by_gpu[("GPU-0", "sm_active")], by_gpu[("GPU-1", "sm_active")]
    assert zero.levels == (0.5, 0.9, 0.99)
    np.testing.assert_array_equal(
        zero.quantiles, [[0.5, 0.5625, np.nan], [0.75, np.nan, 0.875], [0.9375, np.nan, np.nan]]
    )
    assert one.levels == (0.5, 0.9)
    np.testing.assert_array_equal(one.quantiles, [[0.125, 0.25, 0.375], [0.5, 0.625, 0.75]])
    fb = by_gpu[("GPU-2", "fb_used_mib")]
    assert fb.levels == () and fb.quantiles.shape == (0, 3)


def test_series_answered_at_the_same_levels_share_one_tuple_of_them():
    h = decoded([(g, q, {0: q}) for q in (0.99, 0.5, 0.9) for g in range(4)])
    asked = [s for s in h.series if s.field == "sm_active"]
    assert len(asked) == 4 and len({id(s.levels) for s in asked}) == 1
    assert asked[0].levels == (0.5, 0.9, 0.99)
