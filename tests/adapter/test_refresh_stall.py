"""Serving never waits on a refresh: a snapshot build stalled on purpose, and HPA requests still answered.

The stall sits where the ~1 s of a 10,000-GPU build sits — inside ``build_snapshot``, in a synchronous
``read`` of the source — so a build run on the event loop would hold the request until the stall ends.
"""

from __future__ import annotations

import asyncio
import threading

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


class StalledSource:
    """A real ScrapeSource whose first ``read`` of a refresh blocks until the test releases it."""

    name = "stalled"

    def __init__(self) -> None:
        catalogue = load_catalogue()
        self.inner = ScrapeSource(
            [], series=catalogue.series_names, windowed_series=catalogue.windowed_series, history_seconds=600
        )
        self.inner.ingest(
            "http://dcgm:9400/metrics", parse_samples(H100.read_text(), source=str(H100)), timestamp=T0 + 60
        )
        self.entered = threading.Event()
        self.release = threading.Event()
        self.left = threading.Event()

    async def refresh(self, *, now: float) -> None:
        return None

    def read(self, query):
        if not self.entered.is_set():
            self.entered.set()
            self.release.wait(STALL_LIMIT)
            self.left.set()
        return self.inner.read(query)

    def health(self):
        return self.inner.health()

    async def close(self) -> None:
        return None


async def test_requests_are_answered_while_a_build_is_stalled(aiohttp_client, store):  # noqa: F811
    catalogue = load_catalogue()
    source = StalledSource()
    pipeline = Pipeline(catalogue, source, store, Attributor(lambda url: Target(url)), clock=lambda: NOW)
    provider = MetricsProvider(catalogue, store, make_cluster(), clock=lambda: NOW)
    client = await aiohttp_client(
        make_app(provider, Discovery(catalogue), AdapterMetrics(lambda: []), ready=lambda: (True, ""))
    )
    before = store.snapshot
    refresh = asyncio.create_task(pipeline.refresh_once())
    try:
        assert await asyncio.to_thread(source.entered.wait, STALL_LIMIT), "the build never started"
        resp = await asyncio.wait_for(client.get(URL), STALL_LIMIT / 2)
        body = await resp.json()
        answered_during_stall = not source.left.is_set()
    finally:
        source.release.set()
    snapshot = await refresh
    assert resp.status == 200, body
    assert answered_during_stall, "the request waited for the stalled build"
    assert [i["describedObject"]["name"] for i in body["items"]] == ["llm-finetune-worker-0"]
    # NB: the old snapshot served during the stall, the new one swapped in whole afterwards
    assert store.snapshot is snapshot is not before
