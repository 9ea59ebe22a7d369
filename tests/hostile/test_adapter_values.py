"""Hostile values and timestamps through the adapter, over HTTP (issue 32, items 1 and 2).

A source answers, beside good pods in the same namespace, one pod whose series carry a hostile value (±Inf, NaN,
"1e400", 9.3e15, -1, -301, 1e308, 1e-320, the int64 milli boundary and the floats either side) or a hostile
sample time (1e20, ±Inf, NaN, -1, 0, a year ahead, just inside and just outside the allowed skew). The real
pipeline builds the store; the app is served by the adapter's own HTTP layer, and every answer is read as the HPA
reads it. For three metrics — one with a range (gpu_utilization, 0–100, mean), one that cannot be negative
(inference_queue_depth, sum, external too) and one without a range (a temperature, max) — every answer must be:

- 200 with the good pods and, only when the table says the value is servable, the hostile one; 404 (a Status, as
  for a missing metric) for the hostile pod by name when it is not; never a 5xx;
- every value a Kubernetes quantity whose milli value fits int64 (read independently: tests/adapter/hpa.py);
- counted on /metrics as gpuscale_adapter_values_dropped_total{metric, reason} exactly as the table says, and said
  once in the log per metric and reason, however many refreshes.

Then max-age on the adapter's clock: a value stamped a year ahead and one just inside the skew, the source silent
(it keeps its last values with their times, as a failing Prometheus query does): nothing is served as fresh past
max-age. And the forecast path: absurd capacity/start-up annotations are ignored with one log line naming the
Deployment; a forecast no quantity can hold is left out (404) and counted.
"""

from __future__ import annotations

import logging
import math
import re
from decimal import ROUND_CEILING, Decimal
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.forecasts import METRICS as FORECAST_METRICS
from gpuscale.adapter.forecasts import ForecastCollector, WorkloadForecasts
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.transport import AdapterRunner, RejectionLog
from gpuscale.config import read_yaml
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import DEFAULT_CATALOGUE_PATH, parse_catalogue
from gpuscale.metrics.demand import DemandBook, DemandSettings
from gpuscale.metrics.series import SeriesValue
from gpuscale.metrics.store import MetricPoint, MetricsStore, Snapshot
from gpuscale.metrics.workload_demand import WorkloadDemand
from gpuscale.model import POD, ObjectRef, pod
from gpuscale.pipeline import Pipeline
from gpuscale.selectors import LabelSelector
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects, WorkloadInfo
from tests.adapter import hpa

CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
NOW = 1_764_806_400.0
MAX_AGE = 60.0  # the shipped catalogue's default
INT64 = 2**63 - 1

UTIL, QUEUE, TEMP = "gpu_utilization", "inference_queue_depth", "gpu_temperature_celsius"
METRICS = (UTIL, QUEUE, TEMP)
SERIES = {UTIL: "DCGM_FI_DEV_GPU_UTIL", QUEUE: "vllm:num_requests_waiting", TEMP: "DCGM_FI_DEV_GPU_TEMP"}
GOOD = {"good-0": {UTIL: 40.0, QUEUE: 3.0, TEMP: 55.0}, "good-1": {UTIL: 60.0, QUEUE: 5.0, TEMP: 65.0}}

NF, OOR, BAD, FUT = "not_finite", "out_of_range", "bad_timestamp", "future_timestamp"
EDGE = 9223372036854774.0  # the largest float whose milli value fits int64
PAST_EDGE = 9223372036854776.0  # the next float up: its milli value does not

# (case, value, sample time, {metric: reason it is left out, absent: served}, extra objects out of range)
VALUES = [
    ("+Inf", math.inf, None, {UTIL: NF, QUEUE: NF, TEMP: NF}),
    ("-Inf", -math.inf, None, {UTIL: NF, QUEUE: NF, TEMP: NF}),
    ("NaN", math.nan, None, {UTIL: NF, QUEUE: NF, TEMP: NF}),
    ("'1e400'", float("1e400"), None, {UTIL: NF, QUEUE: NF, TEMP: NF}),
    ("'-1e400'", float("-1e400"), None, {UTIL: NF, QUEUE: NF, TEMP: NF}),
    ("9.3e15", 9.3e15, None, {UTIL: OOR, QUEUE: OOR, TEMP: OOR}),
    ("-1", -1.0, None, {UTIL: OOR, QUEUE: OOR}),
    ("-301", -301.0, None, {UTIL: OOR, QUEUE: OOR}),
    ("1e308", 1e308, None, {UTIL: OOR, QUEUE: OOR, TEMP: OOR}),
    ("-1e308", -1e308, None, {UTIL: OOR, QUEUE: OOR, TEMP: OOR}),
    ("1e-320", 1e-320, None, {}),
    ("-1e-320", -1e-320, None, {UTIL: OOR, QUEUE: OOR}),
    ("-0.0", -0.0, None, {}),
    ("100 (the utilisation's maximum)", 100.0, None, {}),
    ("100.5", 100.5, None, {UTIL: OOR}),
    ("int64 milli edge", EDGE, None, {UTIL: OOR}),
    ("-int64 milli edge", -EDGE, None, {UTIL: OOR, QUEUE: OOR}),
    ("just past the int64 milli edge", PAST_EDGE, None, {UTIL: OOR, QUEUE: OOR, TEMP: OOR}),
    ("2**63", 2.0**63, None, {UTIL: OOR, QUEUE: OOR, TEMP: OOR}),
]
_ALL_BAD = {UTIL: BAD, QUEUE: BAD, TEMP: BAD}
_ALL_FUTURE = {UTIL: FUT, QUEUE: FUT, TEMP: FUT}
TIMES = [
    ("time 1e20", 50.0, 1e20, _ALL_FUTURE),
    ("time +Inf", 50.0, math.inf, _ALL_BAD),
    ("time -Inf", 50.0, -math.inf, _ALL_BAD),
    ("time NaN", 50.0, math.nan, _ALL_BAD),
    ("time -1", 50.0, -1.0, _ALL_BAD),
    ("time 0", 50.0, 0.0, _ALL_BAD),
    ("time a year ahead", 50.0, NOW + 365 * 86400, _ALL_FUTURE),
    ("time 4 s ahead (inside the 5 s skew)", 50.0, NOW + 4, {}),
    ("time 6 s ahead (outside the 5 s skew)", 50.0, NOW + 6, _ALL_FUTURE),
    ("time NaN and value NaN (the time is said)", math.nan, math.nan, _ALL_BAD),
]
CASES = VALUES + TIMES
# The int64 edge is one pod's servable queue depth, but its namespace's and its node's sums (edge + 8) are not.
OBJECTS_OUT = {("int64 milli edge", QUEUE): 2}


def _catalogue():
    data = read_yaml(DEFAULT_CATALOGUE_PATH)
    # NB: a user's entry without a range: a negative temperature is a value, only the quantity's limits apply
    data["metrics"].append({"name": TEMP, "unit": "celsius", "aggregate": "max", "series": [SERIES[TEMP]]})
    return parse_catalogue(data)


CATALOGUE = _catalogue()


class SilentSource:
    """A source whose values stay as set: a refresh changes nothing, as a failing Prometheus query keeps its last
    values with their old times (sources/prometheus.py)."""

    name = "hostile"

    def __init__(self) -> None:
        self.values: list[SeriesValue] = []

    async def refresh(self, *, now: float) -> None:
        return None

    def read(self, query) -> list[SeriesValue]:
        return [v for v in self.values if v.name in query.series]

    def health(self) -> list:
        return []

    async def close(self) -> None:
        return None


def _series(namespace: str, name: str, metric: str, value: float, ts: float) -> SeriesValue:
    labels = {"model": "m"}
    if metric == QUEUE:  # served by the pod itself: the scrape target is the pod
        return SeriesValue(SERIES[metric], labels, value, ts, f"http://{namespace}.{name}:8000/metrics")
    # DCGM: the node's exporter, naming the workload in labels it adds from the kubelet
    labels |= {"gpu": "0", "UUID": f"GPU-{namespace}-{name}", "pod": name, "namespace": namespace}
    return SeriesValue(SERIES[metric], labels, value, ts, f"http://dcgm.{namespace}:9400/metrics")


def _targets(namespaces: list[str]) -> dict[str, Target]:
    pods = {
        f"http://{ns}.{name}:8000/metrics": Target(f"http://{ns}.{name}:8000/metrics", pod(ns, name), f"node-{ns}")
        for ns in namespaces
        for name in (*GOOD, "bad-0")
    }
    return pods | {
        f"http://dcgm.{ns}:9400/metrics": Target(f"http://dcgm.{ns}:9400/metrics", None, f"node-{ns}")
        for ns in namespaces
    }


def _cluster(namespaces: list[str]) -> StaticClusterObjects:
    pods = [
        PodInfo(ns, name, {"app": "x"}, f"node-{ns}", None, (), "Running", None)
        for ns in namespaces
        for name in (*GOOD, "bad-0")
    ]
    return StaticClusterObjects(pods=pods, nodes={f"node-{ns}": {} for ns in namespaces}, namespaces=namespaces)


class AdapterTestServer(TestServer):
    async def _make_runner(self, **kwargs):  # type: ignore[override]
        return AdapterRunner(self.app, rejections=RejectionLog(), **kwargs)


class Adapter:
    """The adapter as `gpuscale adapter` wires it, on the silent source and a clock the test moves."""

    def __init__(self, namespaces: list[str]) -> None:
        self.clock = {"now": NOW}
        self.source = SilentSource()
        store = MetricsStore()
        self.selfmetrics = AdapterMetrics(lambda: [])
        self.pipeline = Pipeline(
            CATALOGUE,
            self.source,
            store,
            Attributor(_targets(namespaces).__getitem__),
            clock=lambda: self.clock["now"],
            on_refresh=self.selfmetrics.observe_refresh,
        )
        cluster = _cluster(namespaces)
        provider = MetricsProvider(CATALOGUE, store, cluster, clock=lambda: self.clock["now"])
        app = make_app(provider, Discovery(CATALOGUE), self.selfmetrics, ready=lambda: (True, ""))
        self.client = TestClient(AdapterTestServer(app, host="127.0.0.1"))
        self.statuses: list[int] = []

    async def get(self, path: str) -> tuple[int, dict | str]:
        resp = await self.client.get(path)
        text = await resp.text()
        self.statuses.append(resp.status)
        assert "NaN" not in text and "Infinity" not in text, (path, text[:300])
        return resp.status, (await resp.json(content_type=None) if resp.content_type == "application/json" else text)

    async def dropped(self) -> dict[tuple[str, str], float]:
        _, text = await self.get("/metrics")
        pattern = r'^gpuscale_adapter_values_dropped_total\{metric="([^"]+)",reason="([^"]+)"\} (\S+)$'
        return {(m, r): float(n) for m, r, n in re.findall(pattern, text, re.M)}


def _milli(value: float) -> int:
    """ceil(value × 1000), written here apart from gpuscale.model (the test's own oracle)."""
    return int((Decimal(repr(value)) * 1000).to_integral_value(rounding=ROUND_CEILING))


def _check_values(body: dict) -> dict[str, int]:
    """{object name: milli value}; every value a quantity within int64 milli."""
    out = {}
    for item in body["items"]:
        milli = hpa.milli_value(item["value"])
        assert -INT64 - 1 <= milli <= INT64, item
        out[item["describedObject"]["name"] if "describedObject" in item else ""] = milli
    return out


@pytest.fixture
async def hostile(caplog):
    caplog.set_level(logging.WARNING, logger="gpuscale.adapter.selfmetrics")
    namespaces = [f"case-{i}" for i in range(len(CASES))]
    adapter = Adapter(namespaces)
    for ns, (_, value, ts, _) in zip(namespaces, CASES, strict=True):
        for metric in METRICS:
            for name, good in GOOD.items():
                adapter.source.values.append(_series(ns, name, metric, good[metric], NOW - 1))
            adapter.source.values.append(_series(ns, "bad-0", metric, value, NOW - 1 if ts is None else ts))
    await adapter.client.start_server()
    yield adapter, namespaces
    await adapter.client.close()


async def _pods_answers(adapter: Adapter, ns: str, metric: str, served: bool, value: float, case: str) -> int:
    """The pods list (both versions, plain, by label selector and by metric label selector) and each pod by name."""
    expected = {"good-0", "good-1", *(["bad-0"] if served else [])}
    asked = 0
    for version in ("v1beta1", "v1beta2"):
        base = f"{CUSTOM}/{version}/namespaces/{ns}/pods"
        for query in ("", f"?labelSelector={quote('app=x')}", f"?metricLabelSelector={quote('model=m')}"):
            status, body = await adapter.get(f"{base}/*/{metric}{query}")
            asked += 1
            assert status == 200, (case, metric, query, body)
            values = _check_values(body)
            assert set(values) == expected, (case, metric, query, values)
            if served:
                assert values["bad-0"] == _milli(value), (case, metric, values)
            assert values["good-0"] == _milli(GOOD["good-0"][metric]), (case, metric, values)
        status, body = await adapter.get(f"{base}/bad-0/{metric}")
        asked += 1
        if served:
            assert status == 200 and _check_values(body) == {"bad-0": _milli(value)}, (case, metric, body)
        else:
            assert status == 404 and body["kind"] == "Status" and body["reason"] == "NotFound", (case, metric, body)
        status, body = await adapter.get(f"{base}/good-1/{metric}")
        asked += 1
        assert status == 200 and _check_values(body) == {"good-1": _milli(GOOD["good-1"][metric])}, (case, body)
    return asked


async def _aggregate_answers(adapter: Adapter, ns: str, metric: str, served: bool, value: float, case: str) -> int:
    """The namespace's and the node's value, and the external metric: good pods' values always make one."""
    overflow = OBJECTS_OUT.get((case, metric), 0) > 0
    asked = 0
    for path in (
        f"{CUSTOM}/v1beta2/namespaces/{ns}/metrics/{metric}",
        f"{CUSTOM}/v1beta2/nodes/node-{ns}/{metric}",
        *([f"{EXTERNAL}/namespaces/{ns}/{metric}"] if metric == QUEUE else []),
    ):
        status, body = await adapter.get(path)
        asked += 1
        if overflow:
            assert status == 404, (case, path, body)  # NB: edge + 8 is no quantity: missing, not 500
            continue
        assert status == 200, (case, path, body)
        (milli,) = _check_values(body).values()
        if metric == QUEUE:  # a sum: exactly the good pods' and, when served, the hostile one's
            total = sum(g[QUEUE] for g in GOOD.values()) + (value if served else 0.0)
            assert milli == _milli(total), (case, path, milli)
    return asked


async def test_one_pods_hostile_value_or_time_never_fails_the_namespace(hostile, caplog):
    adapter, namespaces = hostile
    refreshes = 3
    for _ in range(refreshes):
        await adapter.pipeline.refresh_once()  # NB: at NOW, the clock the table's sample times are written against
    adapter.clock["now"] = NOW + 1.0
    asked = 0
    for ns, (case, value, _, out) in zip(namespaces, CASES, strict=True):
        for metric in METRICS:
            served = metric not in out
            asked += await _pods_answers(adapter, ns, metric, served, value, case)
            asked += await _aggregate_answers(adapter, ns, metric, served, value, case)

    expected: dict[tuple[str, str], float] = {}
    for _case, _, _, out in CASES:
        for metric, reason in out.items():
            expected[(metric, reason)] = expected.get((metric, reason), 0) + refreshes
    for (_case, metric), n in OBJECTS_OUT.items():
        expected[(metric, OOR)] = expected.get((metric, OOR), 0) + n * refreshes
    assert await adapter.dropped() == expected
    said = [r.getMessage() for r in caplog.records if r.name == "gpuscale.adapter.selfmetrics"]
    assert len(said) == len(expected), said  # once per metric and reason, not per refresh
    assert all(s.startswith(tuple(m for m, _ in expected)) for s in said), said
    assert not [s for s in adapter.statuses if s >= 500]
    inputs = len(CASES) * len(METRICS)
    print(
        f"\nhostile values/times: {len(CASES)} cases × {len(METRICS)} metrics = {inputs} hostile inputs, "
        f"{asked} metrics API answers checked, 0 5xx"
    )


async def test_a_future_stamp_never_outlives_max_age_while_the_source_is_silent():
    adapter = Adapter(["late"])
    adapter.source.values = [
        _series("late", "good-0", QUEUE, 1.0, NOW - 1),  # a good sample: fresh for 59 s more
        _series("late", "good-1", QUEUE, 2.0, NOW + 4),  # inside the skew: fresh until NOW + 64
        _series("late", "bad-0", QUEUE, 3.0, NOW + 365 * 86400),  # a year ahead: never a fresh value
    ]
    await adapter.client.start_server()
    try:
        fresh_until = {"good-0": NOW - 1 + MAX_AGE, "good-1": NOW + 4 + MAX_AGE}
        stale_as_fresh = answered = 0
        while adapter.clock["now"] <= NOW + 3 * MAX_AGE:
            await adapter.pipeline.refresh_once()  # NB: the source is silent: the same values and times
            now = adapter.clock["now"]
            for path in ("pods/*", "pods/bad-0", "pods/good-0", "pods/good-1"):
                status, body = await adapter.get(f"{CUSTOM}/v1beta2/namespaces/late/{path}/{QUEUE}")
                answered += 1
                assert status in (200, 404, 503), (now - NOW, path, body)
                if status == 200:
                    names = set(_check_values(body))
                    assert "bad-0" not in names, (now - NOW, body)
                    stale_as_fresh += sum(now > fresh_until[n] for n in names)
            adapter.clock["now"] += 5.0
        assert stale_as_fresh == 0
        status, body = await adapter.get(f"{CUSTOM}/v1beta2/namespaces/late/pods/*/{QUEUE}")
        assert status == 503 and body["reason"] == "ServiceUnavailable", body  # stale, said as such
        assert (await adapter.dropped())[(QUEUE, FUT)] > 0
        print(f"\nmax-age with a silent source: {answered} answers over {3 * MAX_AGE:g} s, 0 stale served as fresh")
    finally:
        await adapter.client.close()


# --- the forecast path ------------------------------------------------------------------------------------------

ANNOTATIONS = ["1e-12", "0", "-4", "NaN", "1e400", "-1e400", "abc", "", "0x10", "1e-4"]
CAPACITY = "gpuscale.io/capacity-requests-per-second"
STARTUP = "gpuscale.io/startup-seconds"


def _forecast_cluster():
    names = [f"w{i}" for i in range(len(ANNOTATIONS))]
    pods = [
        PodInfo("serving", f"{name}-{k}", {"app": name}, "node-a", None, (), "Running", None)
        for name in [*names, "good", "huge"]
        for k in range(2)
    ]
    workloads = [
        WorkloadInfo(
            "Deployment", "serving", name, LabelSelector.parse(f"app={name}"), {}, {CAPACITY: text, STARTUP: text}
        )
        for name, text in zip(names, ANNOTATIONS, strict=True)
    ]
    workloads.append(
        WorkloadInfo("Deployment", "serving", "good", LabelSelector.parse("app=good"), {}, {CAPACITY: "4"})
    )
    workloads.append(
        WorkloadInfo("Deployment", "serving", "huge", LabelSelector.parse("app=huge"), {}, {CAPACITY: "4"})
    )
    return StaticClusterObjects(pods=pods, workloads=workloads, nodes={}, namespaces=["serving"]), names


async def test_absurd_annotations_and_unservable_forecasts(aiohttp_client, caplog):
    caplog.set_level(logging.WARNING)
    cluster, names = _forecast_cluster()
    store = MetricsStore()
    clock = {"now": NOW}
    demand = WorkloadDemand(
        DemandBook(DemandSettings(step_s=15.0, model="holt", min_history_s=300.0)),
        store,
        cluster,
        rate_metric="inference_requests_per_second",
        default_startup_s=60.0,
        max_age_s=75.0,
        clock=lambda: clock["now"],
    )
    selfmetrics = AdapterMetrics(lambda: [])
    forecasts = WorkloadForecasts(demand, count_dropped=selfmetrics.count_dropped)
    selfmetrics.registry.register(ForecastCollector(forecasts))
    catalogue = CATALOGUE
    provider = MetricsProvider(catalogue, store, cluster, clock=lambda: clock["now"], forecasts=forecasts)
    app = make_app(
        provider, Discovery(catalogue, forecasts=tuple(FORECAST_METRICS)), selfmetrics, ready=lambda: (True, "")
    )
    client = await aiohttp_client(app)
    # 5 req/s per pod everywhere, and a servable 5e15 per pod in "huge", whose sum (1e16) no quantity holds
    rates = {f"{w}-{k}": 5.0 for w in [*names, "good"] for k in range(2)} | {"huge-0": 5e15, "huge-1": 5e15}
    updates = 0
    while clock["now"] < NOW + 900:
        t = clock["now"]
        points = {ObjectRef(POD, p, "serving"): MetricPoint(v, t - 1, 60.0) for p, v in rates.items()}
        snapshot = Snapshot(t, values={"inference_requests_per_second": points})
        store.update(snapshot)
        forecasts.observe(snapshot)
        updates += 1
        clock["now"] += 5.0

    base = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/serving/deployments.apps"
    resp = await client.get(f"{base}/good/forecast_desired_replicas")
    assert resp.status == 200, await resp.text()
    good = (await resp.json())["items"][0]
    assert hpa.milli_value(good["value"]) == 2500 and good["windowSeconds"] == 60  # 10 req/s ÷ 4, the default start-up
    for name, text in zip(names, ANNOTATIONS, strict=True):
        resp = await client.get(f"{base}/{name}/forecast_desired_replicas")
        body = await resp.json()
        assert resp.status == 404 and CAPACITY in body["message"], (text, body)  # absent: no usable capacity
        resp = await client.get(f"{base}/{name}/forecast_requests_per_second")
        item = (await resp.json())["items"][0]
        assert resp.status == 200 and item["windowSeconds"] == 60, (text, item)  # the start-up fell back
        said = [r.getMessage() for r in caplog.records if f"Deployment serving/{name}:" in r.getMessage()]
        assert len(said) == 2, (text, said)  # capacity and start-up, each once in 180 refreshes
    for metric in ("workload_requests_per_second", "forecast_requests_per_second"):
        resp = await client.get(f"{base}/huge/{metric}")
        body = await resp.json()
        assert resp.status == 404 and "quantity" in body["message"], body
        resp = await client.get(f"/apis/external.metrics.k8s.io/v1beta1/namespaces/serving/{metric}")
        assert resp.status == 200, await resp.text()
        workloads = {i["metricLabels"]["workload"] for i in (await resp.json())["items"]}
        assert "huge" not in workloads and "good" in workloads
    text = await (await client.get("/metrics")).text()
    dropped = dict(
        re.findall(r'^gpuscale_adapter_values_dropped_total\{metric="(\w+)",reason="out_of_range"\} (\S+)$', text, re.M)
    )
    assert float(dropped["workload_requests_per_second"]) > 0 and float(dropped["forecast_requests_per_second"]) > 0
    print(f"\nforecast path: {len(ANNOTATIONS)} absurd annotations × 2 keys, 1 unservable workload, {updates} updates")
