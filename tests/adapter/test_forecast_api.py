"""Forecast metrics over the metrics API: refreshes of a store whose pods report a request rate feed the
workloads' forecasts; the answers are read the way the HPA reads them (tests/adapter/hpa.py).

Covers: absent (404 naming the missing history) until enough history, then served as Object and External
metrics (labelSelector on workload/kind); the horizon from the annotation, the measured pod start → ready,
or the default; desired replicas = p90 ÷ the capacity annotation (absent without it); discovery lists the
metrics; /metrics shows each workload's state; a stopped rate turns the forecast stale (503)."""

from __future__ import annotations

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
from gpuscale.metrics.workload_demand import WorkloadDemand, measured_startup
from gpuscale.model import POD, ObjectRef
from gpuscale.selectors import LabelSelector
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects, WorkloadInfo
from tests.adapter import hpa

CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/serving"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1/namespaces/serving"
RATE = "inference_requests_per_second"
T0 = 1_764_806_400.0


def _pod(name, app, *, started=None, ready=None):
    return PodInfo(
        "serving", name, {"app": app}, "node-a", None, (), "Running", None, started_at=started, ready_at=ready
    )


def _cluster():
    pods = [
        _pod("llm-0", "llm", started=T0 - 500, ready=T0 - 410),  # 90 s start-ups measured
        _pod("llm-1", "llm", started=T0 - 300, ready=T0 - 210),
        _pod("img-0", "img"),
        _pod("new-0", "new"),
    ]
    workloads = [
        WorkloadInfo(
            "Deployment",
            "serving",
            "llm",
            LabelSelector.parse("app=llm"),
            {"tier": "gpu"},
            {"gpuscale.io/capacity-requests-per-second": "4"},
        ),
        WorkloadInfo(
            "Deployment", "serving", "img", LabelSelector.parse("app=img"), {}, {"gpuscale.io/startup-seconds": "45"}
        ),
        WorkloadInfo("StatefulSet", "serving", "new", LabelSelector.parse("app=new"), {}, {}),
    ]
    return StaticClusterObjects(pods=pods, workloads=workloads, nodes={}, namespaces=["serving"])


def _rates(t: float) -> dict[str, float]:
    # llm: two pods, a steady 10 req/s in all; img: 3 req/s; new: no value (its history never starts)
    return {"llm-0": 6.0, "llm-1": 4.0, "img-0": 3.0}


@pytest.fixture
async def adapter(aiohttp_client):
    catalogue = load_catalogue()
    store = MetricsStore()
    clock = {"now": T0}
    demand = WorkloadDemand(
        DemandBook(DemandSettings(step_s=15.0, model="holt", min_history_s=300.0)),
        store,
        _cluster(),
        rate_metric=RATE,
        default_startup_s=120.0,
        max_age_s=75.0,
        clock=lambda: clock["now"],
    )
    forecasts = WorkloadForecasts(demand)

    def refresh(seconds: float, rates=_rates) -> None:
        end = clock["now"] + seconds
        while clock["now"] < end:
            t = clock["now"]
            values = {ObjectRef(POD, p, "serving"): MetricPoint(v, t - 1, 60.0) for p, v in rates(t).items()}
            snapshot = Snapshot(t, values={RATE: values})
            store.update(snapshot)
            forecasts.observe(snapshot)
            clock["now"] += 5.0

    selfmetrics = AdapterMetrics(lambda: [])
    selfmetrics.registry.register(ForecastCollector(forecasts))
    provider = MetricsProvider(catalogue, store, _cluster(), clock=lambda: clock["now"], forecasts=forecasts)
    app = make_app(provider, Discovery(catalogue, forecasts=tuple(METRICS)), selfmetrics, ready=lambda: (True, ""))
    client = await aiohttp_client(app)
    client.app_ = app
    client.provider = provider
    client.refresh = refresh
    client.forecasts = forecasts
    return client


async def _get(client, path, status=200):
    resp = await client.get(path)
    body = await resp.json(content_type=None) if resp.content_type == "application/json" else await resp.text()
    assert resp.status == status, (path, resp.status, body)
    return body


async def test_absent_until_enough_history_then_served_as_object_and_external(adapter):
    adapter.refresh(120)
    body = await _get(adapter, f"{CUSTOM}/deployments.apps/llm/forecast_requests_per_second", 404)
    assert "s of request-rate history, needs 300 s" in body["message"] and "never guessed" in body["message"]
    body = await _get(adapter, f"{CUSTOM}/deployments.apps/llm/workload_requests_per_second")  # "now": served
    assert hpa.object_metric(body) == 10_000 and "windowSeconds" not in body["items"][0]
    adapter.refresh(600)
    body = await _get(adapter, f"{CUSTOM}/deployments.apps/llm/forecast_requests_per_second")
    assert hpa.object_metric(body) == 10_000  # 10 req/s in milli-units
    body = await _get(adapter, f"{CUSTOM}/deployments.apps/llm/forecast_requests_per_second_p90")
    assert hpa.object_metric(body) == 10_000  # a steady rate: no residual above the mean
    assert body["items"][0]["windowSeconds"] == 90  # the horizon: llm's measured start-up
    body = await _get(adapter, f"{EXTERNAL}/forecast_requests_per_second?labelSelector=workload%3Dimg")
    assert hpa.external_metric(body) == 3_000
    assert body["items"][0]["metricLabels"] == {"workload": "img", "kind": "deployment"}
    body = await _get(adapter, f"{EXTERNAL}/forecast_requests_per_second")  # every workload with a forecast
    assert hpa.external_metric(body) == 13_000
    body = await _get(adapter, f"{CUSTOM}/deployments.apps/*/forecast_requests_per_second?labelSelector=tier%3Dgpu")
    assert [i["describedObject"]["name"] for i in body["items"]] == ["llm"]


async def test_desired_replicas_needs_the_capacity_annotation(adapter):
    adapter.refresh(720)
    body = await _get(adapter, f"{CUSTOM}/deployments.apps/llm/forecast_desired_replicas")
    assert hpa.object_metric(body) == 2_500  # 10 req/s ÷ 4 req/s per replica
    body = await _get(adapter, f"{CUSTOM}/deployments.apps/img/forecast_desired_replicas", 404)
    assert "gpuscale.io/capacity-requests-per-second" in body["message"]


async def test_horizon_from_annotation_measured_or_default(adapter):
    adapter.refresh(30)
    inputs = {k.name: (i.horizon_s, i.horizon_source) for k, i in adapter.forecasts.inputs.items()}
    assert inputs == {"llm": (90.0, "measured"), "img": (45.0, "annotation"), "new": (120.0, "default")}
    assert measured_startup([_pod("x", "x", started=10.0, ready=5.0)]) is None  # ready before start: ignored


async def test_a_workload_without_rate_values_is_absent_and_visible_in_metrics(adapter):
    adapter.refresh(720)
    body = await _get(
        adapter,
        "/apis/custom.metrics.k8s.io/v1beta2/namespaces/serving/statefulsets.apps/new/forecast_requests_per_second",
        404,
    )
    assert "no request-rate history" in body["message"]
    text = await _get(adapter, "/metrics")
    assert 'gpuscale_forecast_available{kind="StatefulSet",name="new",namespace="serving"} 0.0' in text
    assert 'gpuscale_forecast_available{kind="Deployment",name="llm",namespace="serving"} 1.0' in text
    assert (
        'gpuscale_forecast_requests_per_second{at="p90",kind="Deployment",name="llm",namespace="serving"} 10.0' in text
    )
    assert (
        'gpuscale_forecast_horizon_seconds{kind="Deployment",name="img",namespace="serving",source="annotation"} 45.0'
        in text
    )
    assert "gpuscale_forecast_update_seconds" in text
    # a steady rate: both candidates' p90 loss is 0, and on a tie the last value serves
    assert 'gpuscale_forecast_model{kind="Deployment",model="naive",name="llm",namespace="serving"} 1.0' in text
    assert 'gpuscale_forecast_p90_loss{kind="Deployment",model="holt",name="llm",namespace="serving"} 0.0' in text


async def test_a_rate_that_stops_turns_the_forecast_stale(adapter):
    adapter.refresh(720)
    adapter.refresh(120, rates=lambda t: {})  # the pods' rate is no longer read
    body = await _get(adapter, f"{CUSTOM}/deployments.apps/llm/forecast_requests_per_second", 503)
    assert "not serving a stale forecast" in body["message"]


async def test_on_a_ramp_the_p90_is_above_now(adapter):
    adapter.refresh(600)
    adapter.refresh(300, rates=lambda t: {"llm-0": 10.0 + (t - T0 - 600) / 10, "llm-1": 0.0})
    f = adapter.forecasts.book.forecast(ObjectRef("Deployment", "llm", "serving"))
    # NB: the smoothed mean lags a sustained ramp (α 0.2, a slow trend); the residuals of the forecasts made
    # during the ramp carry it into the p90, which is what the recommended HPA scales on.
    assert f is not None and f.now > 30 and f.upper > f.now + 5


async def test_discovery_lists_the_forecast_metrics(adapter):
    body = await _get(adapter, "/apis/custom.metrics.k8s.io/v1beta2")
    names = {r["name"] for r in body["resources"]}
    assert {"deployments.apps/forecast_desired_replicas", "statefulsets.apps/forecast_requests_per_second"} <= names
    body = await _get(adapter, "/apis/external.metrics.k8s.io/v1beta1")
    assert "forecast_requests_per_second_p90" in {r["name"] for r in body["resources"]}
    await _get(adapter, f"{CUSTOM}/pods/*/forecast_requests_per_second", 404)  # workloads only


async def test_forecast_answers_are_not_prepared_ahead_of_the_forecasts(adapter):
    """A refresh prepares bodies for recent queries before the swap; the forecasts move on after it, so a
    prepared forecast body would be one refresh behind. The request computes it instead."""
    from gpuscale.adapter.app import ANSWERS

    adapter.refresh(720)
    await _get(adapter, f"{CUSTOM}/deployments.apps/llm/forecast_requests_per_second")
    await _get(adapter, f"{CUSTOM}/deployments.apps/*/forecast_requests_per_second")
    answers = adapter.app_[ANSWERS]
    assert len(answers) == 2  # both computed and kept for this store version
    install = finish(answers.prepare(adapter.provider, Snapshot(T0 + 9999, values={})))
    install()
    assert len(answers) == 0  # nothing prepared for them: the next request computes from the new forecasts


def test_an_unknown_forecast_model_is_a_one_line_error(capsys):
    from gpuscale.cli.main import main

    args = [
        "adapter",
        "--insecure-port",
        "0",
        "--scrape-url",
        "http://127.0.0.1:1/metrics",
        "--forecast-model",
        "arima",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--forecast-model: unknown model 'arima'; valid: naive, seasonal_naive" in err


async def test_top_workloads_shows_the_rate_now_beside_the_forecast(adapter):
    from tests.cli.test_top import top

    url = str(adapter.make_url("")).rstrip("/")
    adapter.refresh(120)  # rates read, forecasts not served yet
    early = await top("workloads", "-n", "serving", "--adapter-url", url, "-o", "json")
    assert early.code == 0, early.err
    got = {w.name: w for w in early.doc().items}
    assert set(got) == {"img", "llm"}  # "new" has no rate at all
    assert got["llm"].requests_per_second == 10.0 and got["llm"].forecast_requests_per_second is None
    adapter.refresh(600)
    table = await top("workloads", "-n", "serving", "--adapter-url", url, "--sort-by", "rps")
    assert table.code == 0, table.err
    assert table.table() == [
        {"NAMESPACE": "serving", "WORKLOAD": "deployment/llm", "REQ/S NOW": "10.00", "FORECAST": "10.00",
         "P90": "10.00", "AHEAD": "90s", "REPLICAS": "2.5", "MODEL": "naive"},
        {"NAMESPACE": "serving", "WORKLOAD": "deployment/img", "REQ/S NOW": "3.00", "FORECAST": "3.00",
         "P90": "3.00", "AHEAD": "45s", "REPLICAS": "-", "MODEL": "naive"},
    ]  # fmt: skip
    assert early.doc().items[0].forecast_model is None  # no forecast yet: no model either
    needs = await top("workloads", "--scrape-url", "http://127.0.0.1:1/metrics")
    assert needs.code == 2 and "the workloads view shows the request rate now and the adapter's forecast" in needs.err


def test_demand_driven_refresh_fetches_the_rate_where_a_forecast_is_referenced():
    """With --prometheus-url only what HPAs name is fetched; an HPA naming a forecast (not a catalogue metric)
    pulls in the forecasts' rate metric in its namespace, and nowhere else."""
    from types import SimpleNamespace

    from gpuscale.cli.adapter import ScopedRefresh
    from gpuscale.metrics.refresh_scope import RefreshScope

    scopes = []
    source = SimpleNamespace(set_scope=scopes.append)
    hpas = SimpleNamespace(synced=True, references=lambda: [("forecast_desired_replicas", "serving")])
    catalogue = load_catalogue()
    for derived in ({}, dict.fromkeys(METRICS, RATE)):
        ScopedRefresh(RefreshScope(catalogue, derived=derived), hpas, source).before_refresh()
    without, with_forecasts = scopes
    assert without == {}  # forecasts off: nothing to fetch for that HPA
    ((term, namespaces),) = with_forecasts.items()
    assert "vllm:request_success_total" in term.series and namespaces == {"serving"}


async def test_only_the_namespaces_whose_rate_was_read_are_updated(aiohttp_client):
    """Demand-driven refresh reads the rate only where a forecast is wanted: workloads elsewhere are not
    updated, and a request there says why it has no value (and that the rate is read from now on)."""
    cluster = StaticClusterObjects(
        pods=[_pod("llm-0", "llm"), PodInfo("batch", "b-0", {"app": "b"}, "node-a", None, (), "Running", None)],
        workloads=[
            WorkloadInfo("Deployment", "serving", "llm", LabelSelector.parse("app=llm"), {}),
            WorkloadInfo("Deployment", "batch", "b", LabelSelector.parse("app=b"), {}),
        ],
        nodes={},
        namespaces=["serving", "batch"],
    )
    store = MetricsStore()
    forecasts = WorkloadForecasts(
        WorkloadDemand(
            DemandBook(DemandSettings()),
            store,
            cluster,
            rate_metric=RATE,
            default_startup_s=120,
            max_age_s=75,
            clock=lambda: T0 + 60,
        ),
        rate_namespaces=lambda: frozenset({"serving"}),
    )
    for t in range(0, 60, 5):
        now = T0 + t
        values = {
            ObjectRef(POD, "llm-0", "serving"): MetricPoint(5.0, now),
            ObjectRef(POD, "b-0", "batch"): MetricPoint(1.0, now),
        }
        forecasts.observe(Snapshot(now, values={RATE: values}))
    assert set(forecasts.inputs) == {ObjectRef("Deployment", "llm", "serving")}
    assert forecasts.book.current(ObjectRef("Deployment", "b", "batch")) is None
    catalogue = load_catalogue()
    provider = MetricsProvider(catalogue, store, cluster, clock=lambda: T0 + 60, forecasts=forecasts)
    client = await aiohttp_client(
        make_app(
            provider,
            Discovery(catalogue, forecasts=tuple(METRICS)),
            AdapterMetrics(lambda: []),
            ready=lambda: (True, ""),
        )
    )
    body = await _get(client, f"{CUSTOM}/deployments.apps/llm/workload_requests_per_second")
    assert hpa.object_metric(body) == 5_000
    batch = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/batch/deployments.apps"
    body = await _get(client, f"{batch}/b/forecast_requests_per_second", 404)
    assert (
        "the rate is read in namespace batch only once an HPA or a request asks for a forecast there" in body["message"]
    )
    body = await _get(
        client, "/apis/external.metrics.k8s.io/v1beta1/namespaces/batch/forecast_requests_per_second", 404
    )
    assert "the rate is read in namespace batch only once" in body["message"]  # the workload is listed, with why
    body = await _get(client, f"{batch}/nope/forecast_requests_per_second", 404)
    assert 'deployments "nope" not found in namespace batch' in body["message"]
