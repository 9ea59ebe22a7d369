"""The Prometheus source's cap on label sets kept (``max_label_sets``, the adapter's --prometheus-max-label-sets).

Scope, in both decode modes: a refresh with more distinct label sets than the cap keeps the first ones, leaves the
rest out, counts them in health's ``dropped_series`` (``gpuscale_source_dropped_series`` on /metrics), says so in
``degraded`` and in one log line when it starts (and one when it ends); series churn (new pods every refresh) never
holds more sets than the cap on either side of the decoder process and never drops a series while each refresh
alone fits; a Prometheus that always answers partially cannot pile up old series past the cap.
"""

from __future__ import annotations

import logging

import pytest

from gpuscale.sources.base import TermQuery
from gpuscale.sources.prom_answer import LabelSets, PlannedQuery, read_answer
from gpuscale.sources.prometheus import OVER_CAP, PrometheusSource
from tests.helpers import T0
from tests.sources.test_prometheus import FakePrometheus

NAME = "DCGM_FI_DEV_GPU_UTIL"
GAUGE = TermQuery(series=(NAME,))
OTHER = TermQuery(series=("DCGM_FI_DEV_FB_USED",))


def pods(n: int, prefix: str = "p", name: str = NAME) -> list[tuple[dict[str, str], str]]:
    return [({"__name__": name, "pod": f"{prefix}{i}", "namespace": "ml"}, str(i)) for i in range(n)]


@pytest.fixture(params=["thread", "process"])
def decode_in(request):
    return request.param


@pytest.fixture
async def prom():
    fake = await FakePrometheus().start()
    yield fake
    await fake.stop()


def source_for(prom: FakePrometheus, decode_in: str, cap: int, *terms: TermQuery) -> PrometheusSource:
    return PrometheusSource(
        prom.url,
        queries=terms or (GAUGE,),
        clock=lambda: T0,
        decode_in=decode_in,
        off_loop=decode_in == "process",
        max_label_sets=cap,
        max_label_sets_flag="--prometheus-max-label-sets",
    )


def test_read_answer_leaves_out_series_past_the_limit_and_counts_them():
    sets = LabelSets(limit=3)
    result = [{"metric": dict(labels), "value": [T0, v]} for labels, v in pods(5)]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    answer = read_answer(body, PlannedQuery(NAME, NAME), source="http://p", label_sets=sets)
    assert [v.labels["pod"] for v in answer.values] == ["p0", "p1", "p2"] and answer.over_cap == 2
    # A set already held is still read when the table is full; only new ones are left out.
    again = [{"metric": dict(labels), "value": [T0, v]} for labels, v in reversed(pods(5))]
    body["data"]["result"] = again
    answer = read_answer(body, PlannedQuery(NAME, NAME), source="http://p", label_sets=sets)
    assert [v.labels["pod"] for v in answer.values] == ["p2", "p1", "p0"] and answer.over_cap == 2


async def test_series_past_the_cap_are_left_out_counted_and_logged_once(prom, decode_in, caplog):
    caplog.set_level(logging.INFO, logger="gpuscale.sources.prometheus")
    prom.answers[NAME] = pods(8)
    prom.answers["DCGM_FI_DEV_FB_USED"] = pods(8, name="DCGM_FI_DEV_FB_USED")  # NB: the same 8 label sets
    source = source_for(prom, decode_in, 5, GAUGE, OTHER)
    try:
        for refresh in (1, 2):
            await source.refresh(now=T0)
            assert [v.labels["pod"] for v in source.read(GAUGE)] == [f"p{i}" for i in range(5)]
            assert [v.labels["pod"] for v in source.read(OTHER)] == [f"p{i}" for i in range(5)]
            (health,) = source.health()
            assert health.healthy and health.dropped_series == {OVER_CAP: 6 * refresh}
            assert health.degraded == (
                "6 series left out: more than 5 distinct label sets in one refresh (--prometheus-max-label-sets)"
            )
        prom.answers[NAME] = pods(4)
        prom.answers["DCGM_FI_DEV_FB_USED"] = pods(4, name="DCGM_FI_DEV_FB_USED")
        await source.refresh(now=T0)
        (health,) = source.health()
        assert health.degraded is None and health.dropped_series == {OVER_CAP: 12}  # NB: a counter
        assert len(source.read(GAUGE)) == 4
    finally:
        await source.close()
    said = [r.getMessage() for r in caplog.records if "label" in r.getMessage()]
    assert len(said) == 2 and "6 series left out" in said[0] and "no series left out" in said[1], said


async def test_churn_never_holds_more_sets_than_the_cap_and_drops_nothing_that_fits(prom, decode_in):
    """Every refresh 60 new pods under a cap of 100: each refresh fits, so nothing is dropped, and the sets of earlier
    refreshes are forgotten as room is needed (decoder process: on both sides)."""
    source = source_for(prom, decode_in, 100)
    try:
        for r in range(30):
            prom.answers[NAME] = pods(60, prefix=f"r{r}-")
            await source.refresh(now=T0)
            assert [v.labels["pod"] for v in source.read(GAUGE)] == [f"r{r}-{i}" for i in range(60)]
            if decode_in == "process":
                assert len(source._decoder._sets) <= 100
        (health,) = source.health()
        assert health.healthy and health.degraded is None and health.dropped_series == {}
    finally:
        await source.close()


async def test_answers_that_are_always_partial_cannot_pile_up_old_series_past_the_cap(prom, decode_in):
    prom.extra = {"warnings": ["store eu-1 unreachable"]}
    source = source_for(prom, decode_in, 100)
    try:
        for r in range(10):
            prom.answers[NAME] = pods(30, prefix=f"r{r}-")
            await source.refresh(now=T0)
            kept = source.read(GAUGE)
            assert [v.labels["pod"] for v in kept[:30]] == [f"r{r}-{i}" for i in range(30)]  # NB: the new first
            assert len(kept) == min(100, 30 * (r + 1))
        assert source.health()[0].dropped_series == {OVER_CAP: 30 * 10 - 100}
    finally:
        await source.close()


async def test_what_is_left_out_and_what_failed_is_on_the_adapters_metrics(prom, decode_in):
    from prometheus_client import generate_latest

    from gpuscale.adapter.selfmetrics import AdapterMetrics
    from tests.sources.test_prometheus import answer

    prom.answers[NAME] = pods(7)
    prom.faults["DCGM_FI_DEV_FB_USED"] = answer(200, {"status": "error", "errorType": "bad_data", "error": "x"})
    source = source_for(prom, decode_in, 5, GAUGE, OTHER)
    try:
        await source.refresh(now=T0)
        await source.refresh(now=T0)
        text = generate_latest(AdapterMetrics(lambda: [source]).registry).decode()
    finally:
        await source.close()
    where = f'source="prometheus",target="{prom.url}"'
    assert f'gpuscale_source_dropped_series_total{{reason="{OVER_CAP}",{where}}} 4.0' in text, text
    assert f'gpuscale_source_failed_reads_total{{kind="query_error",{where}}} 2.0' in text, text


def test_a_cap_below_one_is_refused():
    from gpuscale.errors import ConfigError

    with pytest.raises(ConfigError, match="at least 1"):
        PrometheusSource("http://p:9090", queries=[GAUGE], max_label_sets=0)
