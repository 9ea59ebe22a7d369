"""Warm after restart (issue 38): with Prometheus as the source, a workload's forecast history is read back with one
range query the first time its namespace is forecast, so the forecast is served from the first refresh instead of
10 minutes later; a Prometheus that cannot answer leaves the forecasts to warm up live.

The wiring is the adapter's (``cli.adapter.make_forecasts`` with ``--prometheus-url``): the range query runs on the
serving loop before the build (``gather``, as the pipeline runs it), then warms the workloads in ``prepare``, against a
stub Prometheus; the answer is read over HTTP as an HPA reads it.
"""

from __future__ import annotations

from aiohttp import web

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.forecasts import METRICS
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.cli.adapter import make_forecasts
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.steps import finish
from gpuscale.metrics.store import MetricPoint, MetricsStore, Snapshot
from gpuscale.model import POD, ObjectRef
from gpuscale.settings import AdapterSettings
from tests.adapter import hpa
from tests.adapter.test_forecast_api import CUSTOM, RATE, T0, _cluster

FORECAST = f"{CUSTOM}/deployments.apps/llm/forecast_requests_per_second"


async def _adapter(aiohttp_client, aiohttp_server, *, answer: str):
    asked: list[dict] = []

    async def query_range(request: web.Request) -> web.Response:
        form = dict(await request.post()) or dict(request.query)
        asked.append(form)
        if answer == "fail":
            return web.json_response({"status": "error", "errorType": "internal", "error": "down"}, status=500)
        start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
        times = [start + step * i for i in range(int((end - start) // step) + 1)]
        result = [
            {"metric": {"pod": pod}, "values": [[t, str(rate)] for t in times]}
            for pod, rate in (("llm-0", 6.0), ("llm-1", 4.0), ("gone-7", 50.0))  # gone-7: no such pod now
        ]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    app = web.Application()
    app.router.add_route("*", "/api/v1/query_range", query_range)
    prometheus = await aiohttp_server(app)
    clock = {"now": T0}
    catalogue = load_catalogue()
    store = MetricsStore()
    selfmetrics = AdapterMetrics(lambda: [])
    settings = AdapterSettings(prometheus={"url": str(prometheus.make_url(""))})
    forecasts = make_forecasts(settings, catalogue, store, _cluster(), None, selfmetrics, clock=lambda: clock["now"])
    assert forecasts is not None and forecasts.history is not None
    provider = MetricsProvider(catalogue, store, _cluster(), clock=lambda: clock["now"], forecasts=forecasts)
    client = await aiohttp_client(
        make_app(provider, Discovery(catalogue, forecasts=tuple(METRICS)), selfmetrics, ready=lambda: (True, ""))
    )

    async def refresh() -> None:
        t = clock["now"]
        pods = {"llm-0": 6.0, "llm-1": 4.0, "img-0": 3.0}
        snapshot = Snapshot(
            t, values={RATE: {ObjectRef(POD, p, "serving"): MetricPoint(v, t - 1, 60.0) for p, v in pods.items()}}
        )
        store.update(snapshot)
        await forecasts.gather(t)  # the history's I/O before the build, as the pipeline does
        finish(forecasts.prepare(snapshot))()
        clock["now"] += 5.0

    return client, refresh, asked


async def test_a_restarted_adapter_serves_the_forecast_from_its_first_refresh(aiohttp_client, aiohttp_server):
    client, refresh, asked = await _adapter(aiohttp_client, aiohttp_server, answer="history")
    await refresh()
    await refresh()  # NB: the first live reading is as old as the last recorded one: the second is the new step
    resp = await client.get(FORECAST)
    body = await resp.json()
    assert resp.status == 200, body
    assert hpa.object_metric(body) == 10_000  # llm-0 + llm-1, 10 req/s (gone-7 is no pod of the workload now)
    assert len(asked) == 1  # once per namespace, not per refresh
    assert "inference_requests_per_second" not in asked[0]["query"] and "by (pod)" in asked[0]["query"]
    assert float(asked[0]["end"]) - float(asked[0]["start"]) >= 600  # at least the history a forecast needs


async def test_without_a_history_the_forecast_warms_up_live(aiohttp_client, aiohttp_server, caplog):
    client, refresh, asked = await _adapter(aiohttp_client, aiohttp_server, answer="fail")
    await refresh()
    await refresh()
    resp = await client.get(FORECAST)
    assert resp.status == 404
    assert "s of request-rate history, needs 600 s" in (await resp.json())["message"]
    assert len(asked) == 1 and "forecast history not read" in caplog.text
