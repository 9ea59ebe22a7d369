"""Stale means gone (issue 38): a workload whose exporter stops answering loses its forecast within the rate's
max-age plus one step of its last real sample, through the adapter's own path.

The path is the adapter's: a real ScrapeSource polls a real HTTP exporter (a vLLM page whose request counter
grows 10 per second), the refresh Pipeline builds each snapshot and runs the forecasts' prepare hook, the forecasts
are wired by ``cli.adapter.make_forecasts`` (the adapter's max-age: the rate's own plus one step) and the answers
are read over HTTP as an HPA reads them. Only the clock is the test's, stepped 5 s per refresh. The scrape source
keeps a failed target's last rate with its old timestamp, "fresh" for the rate's max-age: recording it as new
steps stamped the forecast ~60 s after the stop and served it until ~122 s (the bug this pins).
"""

from __future__ import annotations

from aiohttp import web

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.forecasts import METRICS
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.cli.adapter import make_forecasts
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.store import MetricsStore
from gpuscale.model import POD, ObjectRef
from gpuscale.pipeline import Pipeline
from gpuscale.selectors import LabelSelector
from gpuscale.settings import AdapterSettings
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects, WorkloadInfo
from gpuscale.sources.scrape import ScrapeSource
from tests.adapter import hpa

T0 = 1_764_806_400.0
REFRESH_S = 5.0
FORECAST = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/serving/deployments.apps/llm/forecast_requests_per_second"


def _cluster() -> StaticClusterObjects:
    pod = PodInfo(
        "serving",
        "llm-0",
        {"app": "llm", "pod-template-hash": "5d9c"},
        "node-a",
        None,
        (),
        "Running",
        ("ReplicaSet", "llm-5d9c"),
    )
    workload = WorkloadInfo("Deployment", "serving", "llm", LabelSelector.parse("app=llm"), {}, {})
    return StaticClusterObjects(pods=[pod], workloads=[workload], nodes={}, namespaces=["serving"])


async def test_a_stopped_exporter_loses_its_forecast_within_max_age_plus_a_step(aiohttp_client, aiohttp_server):
    clock = {"now": T0}
    exporter = {"up": True}

    async def page(request: web.Request) -> web.Response:
        if not exporter["up"]:
            return web.Response(status=503, text="shutting down")
        served = 10 * (clock["now"] - T0)
        return web.Response(
            text="# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{model_name="m",finished_reason="stop"}} {served}\n'
        )

    app = web.Application()
    app.router.add_get("/metrics", page)
    server = await aiohttp_server(app)
    url = str(server.make_url("/metrics"))

    catalogue = load_catalogue()
    settings = AdapterSettings(forecast_min_history=300.0)
    store = MetricsStore()
    cluster = _cluster()
    selfmetrics = AdapterMetrics(lambda: [])
    forecasts = make_forecasts(settings, catalogue, store, cluster, None, selfmetrics, clock=lambda: clock["now"])
    assert forecasts is not None
    source = ScrapeSource(
        [url],
        series=catalogue.series_names,
        windowed_series=catalogue.windowed_series,
        history_seconds=180.0,
        clock=lambda: clock["now"],
    )
    pod = ObjectRef(POD, "llm-0", "serving")
    pipeline = Pipeline(
        catalogue,
        source,
        store,
        Attributor(lambda u: Target(u, pod=pod)),
        clock=lambda: clock["now"],
        prepare=forecasts.prepare,
    )
    provider = MetricsProvider(catalogue, store, cluster, clock=lambda: clock["now"], forecasts=forecasts)
    client = await aiohttp_client(
        make_app(provider, Discovery(catalogue, forecasts=tuple(METRICS)), selfmetrics, ready=lambda: (True, ""))
    )

    async def refresh(seconds: float) -> list[tuple[float, int, dict]]:
        """Refresh every 5 s for ``seconds``, asking for the forecast every second in between as an HPA might:
        (time, status, body) of each answer."""
        answers = []
        for _ in range(round(seconds / REFRESH_S)):
            clock["now"] += REFRESH_S
            await pipeline.refresh_once()
            for _ in range(round(REFRESH_S)):
                resp = await client.get(FORECAST)
                answers.append((clock["now"], resp.status, await resp.json()))
                clock["now"] += 1.0
            clock["now"] -= REFRESH_S
        return answers

    try:
        before = await refresh(600.0)
        assert before[-1][1] == 200, before[-1][2].get("message")
        assert abs(hpa.object_metric(before[-1][2]) - 10_000) <= 10  # 10 req/s, in milli-units
        last_sample = clock["now"]  # the exporter's last answer: the scrape at this refresh
        exporter["up"] = False
        after = await refresh(180.0)
    finally:
        await source.close()

    gone_at = next((t for t, status, _ in after if status != 200), None)
    assert gone_at is not None, "the forecast of a stopped exporter was still served 180 s later"
    last_served = max((t for t, status, _ in after if status == 200), default=last_sample)
    max_age = catalogue.max_age(catalogue.get("inference_requests_per_second"))  # the rate's own (60 s)
    step = forecasts.book.settings.step_s
    assert last_served - last_sample <= max_age + step, (last_served - last_sample, after[:20])
    # every answer while still served is stamped no later than the last real sample
    for _, status, body in after:
        if status == 200:
            assert body["items"][0]["timestamp"] <= _rfc3339(last_sample)
    # absent for good, with the reason
    statuses = {status for t, status, _ in after if t >= gone_at}
    assert statuses == {503}, statuses
    assert "not serving a stale forecast" in after[-1][2]["message"]


def _rfc3339(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
