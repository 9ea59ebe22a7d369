"""The forecast update runs off the event loop and goes live whole (adapter/forecasts.py).

``WorkloadForecasts.prepare`` runs in the refresh's worker thread (the pipeline's prepare hook) and returns what
publishes its result at the swap. Pinned here: a request during an update stalled on purpose is answered from
the last published forecasts; updates never overlap and never go backwards; a failed update leaves the last
forecasts serving and is counted on /metrics.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.forecasts import METRICS, ForecastCollector, WorkloadForecasts
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.demand import DemandBook, DemandSettings
from gpuscale.metrics.steps import finish
from gpuscale.metrics.store import MetricPoint, MetricsStore, Snapshot
from gpuscale.metrics.workload_demand import WorkloadDemand
from gpuscale.model import POD, ObjectRef
from tests.adapter import hpa
from tests.adapter.test_forecast_api import CUSTOM, RATE, T0, _cluster

STALL_LIMIT = 10.0  # NB: only a bound so that a regression fails instead of hanging the suite
LLM = ObjectRef("Deployment", "llm", "serving")


class StallingCluster:
    """The watch cache, whose pod listing blocks while ``stall`` is set (where an update spends its time)."""

    def __init__(self) -> None:
        self.inner = _cluster()
        self.stall = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.inside = 0
        self.most_inside = 0
        self.fail: Exception | None = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def synced(self) -> bool:
        return True

    def pods(self, namespace=None):
        if self.fail is not None:
            raise self.fail
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        try:
            if self.stall:
                self.entered.set()
                self.release.wait(STALL_LIMIT)
            return self.inner.pods(namespace)
        finally:
            self.inside -= 1


def _snapshot(t: float, llm_rps: float = 10.0) -> Snapshot:
    rates = {"llm-0": llm_rps * 0.6, "llm-1": llm_rps * 0.4, "img-0": 3.0}
    return Snapshot(
        t, values={RATE: {ObjectRef(POD, p, "serving"): MetricPoint(v, t - 1, 60.0) for p, v in rates.items()}}
    )


@pytest.fixture
async def served(aiohttp_client):
    """Forecasts with 12 minutes of a steady 10 req/s published, served over HTTP at T0 + 720 s."""
    clock = {"now": T0}
    cluster = StallingCluster()
    demand = WorkloadDemand(
        DemandBook(DemandSettings(min_history_s=300.0)),
        MetricsStore(),
        cluster,
        rate_metric=RATE,
        default_startup_s=120.0,
        max_age_s=75.0,
        clock=lambda: clock["now"],
    )
    forecasts = WorkloadForecasts(demand)
    store = MetricsStore()

    def swap(snapshot: Snapshot, publish) -> None:
        """What Pipeline.refresh_once does on the loop: the snapshot in, then what was prepared for it."""
        store.update(snapshot)  # NB: also a new store version: answers cached for the last one are not reused
        publish()

    while clock["now"] < T0 + 720:
        taken = _snapshot(clock["now"])
        swap(taken, finish(forecasts.prepare(taken)))
        clock["now"] += 5.0
    catalogue = load_catalogue()
    selfmetrics = AdapterMetrics(lambda: [])
    selfmetrics.registry.register(ForecastCollector(forecasts))
    provider = MetricsProvider(catalogue, store, cluster, clock=lambda: clock["now"], forecasts=forecasts)
    client = await aiohttp_client(
        make_app(provider, Discovery(catalogue, forecasts=tuple(METRICS)), selfmetrics, ready=lambda: (True, ""))
    )
    client.forecasts, client.cluster, client.clock, client.swap = forecasts, cluster, clock, swap
    return client


async def _now_rps(client) -> int:
    resp = await client.get(f"{CUSTOM}/deployments.apps/llm/workload_requests_per_second")
    body = await resp.json()
    assert resp.status == 200, body
    return hpa.object_metric(body)


async def test_a_request_during_a_stalled_update_is_answered_from_the_last_forecasts(served):
    now = served.clock["now"]  # a step boundary
    for dt in (0.0, 5.0, 10.0):  # a step of 40 req/s, not finished yet
        taken = _snapshot(now + dt, 40.0)
        served.swap(taken, finish(served.forecasts.prepare(taken)))
    before = served.forecasts.view
    served.cluster.stall = True
    stalled_snapshot = _snapshot(now + 15, 40.0)
    update = asyncio.create_task(asyncio.to_thread(finish, served.forecasts.prepare(stalled_snapshot)))
    try:
        assert await asyncio.to_thread(served.cluster.entered.wait, STALL_LIMIT), "the update never started"
        answered = await asyncio.wait_for(_now_rps(served), STALL_LIMIT / 2)
        during = served.forecasts.view
        stalled = not update.done()
    finally:
        served.cluster.release.set()
    publish = await update
    assert stalled, "the request waited for the stalled update"
    assert during is before and answered == 10_000  # the last published forecasts, whole
    served.swap(stalled_snapshot, publish)  # the update that finished the 40 req/s step goes live with it
    assert served.forecasts.view.taken_at == now + 15
    assert await _now_rps(served) == 40_000


async def test_updates_never_overlap_and_never_go_back(served):
    forecasts, cluster = served.forecasts, served.cluster
    t = served.clock["now"]
    cluster.stall = True
    first = asyncio.create_task(asyncio.to_thread(finish, forecasts.prepare(_snapshot(t))))
    assert await asyncio.to_thread(cluster.entered.wait, STALL_LIMIT)
    cluster.stall = False
    second = asyncio.create_task(asyncio.to_thread(finish, forecasts.prepare(_snapshot(t + 5))))
    await asyncio.sleep(0.05)
    assert not second.done()  # waits for the first
    cluster.release.set()
    publish_first, publish_second = await first, await second
    assert cluster.most_inside == 1
    publish_second()
    publish_first()  # published late: an older update never replaces a newer one
    assert forecasts.view.taken_at == t + 5
    finish(forecasts.prepare(_snapshot(t - 5)))()  # an older snapshot is not fed to the book at all
    assert forecasts.view.taken_at == t + 5
    assert forecasts.book.status(LLM).history_s == pytest.approx(forecasts.view.states[LLM].status.history_s)


async def test_a_failed_update_keeps_the_last_forecasts_and_is_counted(served, caplog):
    before = served.forecasts.view
    served.cluster.fail = RuntimeError("watch cache index changed")
    finish(served.forecasts.prepare(_snapshot(served.clock["now"])))()
    assert served.forecasts.view is before
    assert await _now_rps(served) == 10_000
    assert "forecast update failed, serving the last forecasts: watch cache index changed" in caplog.text
    text = await (await served.get("/metrics")).text()
    assert "gpuscale_forecast_update_failures_total 1.0" in text
    served.cluster.fail = None
    taken = _snapshot(served.clock["now"])
    served.swap(taken, finish(served.forecasts.prepare(taken)))
    assert served.forecasts.view.taken_at == served.clock["now"]
