"""Serving never waits on a refresh: a snapshot build held half-way on purpose, and HPA requests still answered.

The build runs on the event loop in time slices (pipeline.run_sliced). Here it is held after its first step — it
keeps yielding without going on, as a 10,000-GPU build's ~0.5 s of steps would — so a request is answered between
two of its slices, from the snapshot already served; once let go, the new snapshot is swapped in whole.
"""

from __future__ import annotations

import asyncio

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.exposition import parse_samples
from gpuscale.pipeline import Pipeline
from gpuscale.sources.scrape import ScrapeSource
from tests.adapter.test_api import CUSTOM, NOW, make_cluster, store  # noqa: F401  (store is a fixture)
from tests.helpers import H100, T0

URL = f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization"
STALL_LIMIT = 10.0  # NB: only a bound so that a regression fails instead of hanging the suite


def _source() -> ScrapeSource:
    catalogue = load_catalogue()
    source = ScrapeSource([], series=catalogue.series_names, windowed_series=catalogue.windowed_series)
    source.ingest("http://dcgm:9400/metrics", parse_samples(H100.read_text(), source=str(H100)), timestamp=T0 + 60)
    return source


def _held(pipeline: Pipeline, entered: asyncio.Event, release: asyncio.Event) -> None:
    """The pipeline's build, paused after its first step until ``release``: it keeps yielding meanwhile."""
    build = pipeline._build

    def held(*, now: float):
        steps = build(now=now)
        next(steps)
        entered.set()
        while not release.is_set():
            yield
        return (yield from steps)

    pipeline._build = held  # type: ignore[method-assign]


async def test_requests_are_answered_while_a_build_is_stalled(aiohttp_client, store):  # noqa: F811
    catalogue = load_catalogue()
    pipeline = Pipeline(catalogue, _source(), store, Attributor(lambda url: Target(url)), clock=lambda: NOW)
    await pipeline.refresh_once()
    provider = MetricsProvider(catalogue, store, make_cluster(), clock=lambda: NOW)
    client = await aiohttp_client(
        make_app(provider, Discovery(catalogue), AdapterMetrics(lambda: []), ready=lambda: (True, ""))
    )
    before = store.snapshot
    entered, release = asyncio.Event(), asyncio.Event()
    _held(pipeline, entered, release)
    refresh = asyncio.create_task(pipeline.refresh_once())
    try:
        await asyncio.wait_for(entered.wait(), STALL_LIMIT)
        resp = await asyncio.wait_for(client.get(URL), STALL_LIMIT / 2)
        body = await resp.json()
        answered_during_stall = not refresh.done()
        served_during_stall = store.snapshot
    finally:
        release.set()
    snapshot = await refresh
    await pipeline.source.close()
    assert resp.status == 200, body
    assert answered_during_stall, "the request waited for the stalled build"
    assert [i["describedObject"]["name"] for i in body["items"]] == ["llm-finetune-worker-0"]
    # NB: the old snapshot served during the stall, the new one swapped in whole afterwards
    assert served_during_stall is before and store.snapshot is snapshot is not before
