"""Forecast metrics (issue 26): each workload's request rate a start-up ahead, served to HPAs.

Once per refresh (``observe``, the pipeline's on_refresh hook) each Deployment and StatefulSet's request rate,
horizon (its start-up) and capacity per replica go into the DemandBook (metrics/workload_demand.py says how
each is read; metrics/demand.py keeps the history and the forecasts).

Served metrics (Object: deployments.apps / statefulsets.apps; External: one item per workload with labels
``workload`` and ``kind``, which a labelSelector picks):

    forecast_requests_per_second       the mean forecast at the horizon
    forecast_requests_per_second_p90   its upper quantile (the empirical p90 of past errors at this horizon)
    forecast_desired_replicas          p90 ÷ capacity per replica — for an AverageValue 1 target; absent
                                       without the capacity annotation
    workload_requests_per_second       the forecast's input now: the workload's rate in the last 15 s step

A workload with too little history has no value (404 naming what it lacks), never a guess; /metrics shows
every workload's state (gpuscale_forecast_available, _history_seconds). The forecast timestamps its last step,
so a failing source turns it stale (503) like any other metric.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuscale.errors import MetricNotFound, MetricStale, ObjectNotFound
from gpuscale.metrics.demand import WorkloadForecast
from gpuscale.metrics.store import MetricPoint
from gpuscale.metrics.workload_demand import CAPACITY_ANNOTATION, Inputs, WorkloadDemand
from gpuscale.model import DEPLOYMENT, STATEFULSET, ObjectRef
from gpuscale.selectors import LabelSelector

RESOURCES = ("deployments.apps", "statefulsets.apps")
KINDS = {"deployments.apps": DEPLOYMENT, "statefulsets.apps": STATEFULSET}

# metric name → what of a WorkloadForecast it serves
FORECASTS: dict[str, Callable[[WorkloadForecast], float | None]] = {
    "forecast_requests_per_second": lambda f: f.mean,
    "forecast_requests_per_second_p90": lambda f: f.upper,
    "forecast_desired_replicas": lambda f: f.desired_replicas,
}
# the forecast's input, served from the first finished step (before the forecast is): "now" beside the forecast
NOW = "workload_requests_per_second"
METRICS: tuple[str, ...] = (NOW, *FORECASTS)


class WorkloadForecasts:
    """The forecast metrics' answers, from the workloads' demand (metrics/workload_demand.py)."""

    def __init__(self, demand: WorkloadDemand) -> None:
        self.demand = demand
        self.book = demand.book
        self.cluster = demand.cluster
        self.max_age_s = demand.max_age_s
        self.clock = demand.clock

    @property
    def inputs(self) -> dict[ObjectRef, Inputs]:
        return self.demand.inputs

    def observe(self, *_: object) -> None:
        """One refresh (the pipeline's on_refresh(snapshot, seconds) calls it)."""
        self.demand.observe()

    # --- serving ------------------------------------------------------------------------------------

    def _point(self, metric: str, key: ObjectRef) -> MetricPoint:
        """The fresh value, or MetricNotFound / MetricStale saying why there is none."""
        what = f"{key.kind.lower()} {key.namespace}/{key.name}"
        if metric == NOW:
            current = self.book.current(key)
            if current is None:
                raise MetricNotFound(f"no {metric} for {what} yet: no request rate read for it")
            return self._fresh(metric, what, current[0], current[1], None)
        forecast = self.book.forecast(key)
        if forecast is None:
            status = self.book.status(key)
            why = status.reason if status is not None else "no request-rate history"
            raise MetricNotFound(f"no {metric} for {what} yet: {why} (a forecast is never guessed)")
        value = FORECASTS[metric](forecast)
        if value is None:
            raise MetricNotFound(
                f"no {metric} for {what}: annotate it {CAPACITY_ANNOTATION} (requests/s one replica serves)"
            )
        return self._fresh(metric, what, value, forecast.timestamp, forecast.horizon_s)

    def _fresh(self, metric: str, what: str, value: float, timestamp: float, horizon_s: float | None) -> MetricPoint:
        if timestamp < self.clock() - self.max_age_s:
            raise MetricStale(
                f"the {metric} of {what} is older than {self.max_age_s:g}s (its request rate is not being read); "
                "not serving a stale forecast",
                retry_after_seconds=5,
            )
        # NB: smoothing a steady 3 req/s gives 3.0000000000004, which a quantity ceils to 3001m; 9 significant
        # digits are far finer than any forecast is good for.
        # The window of a forecast is its horizon (what `gpuscale top workloads` shows as HORIZON).
        return MetricPoint(float(f"{value:.9g}"), timestamp, horizon_s)

    def object_point(self, resource: str, namespace: str, name: str, metric: str) -> tuple[ObjectRef, MetricPoint]:
        key = ObjectRef(KINDS[resource], name, namespace)
        if key not in self.inputs and self.cluster.synced:
            raise ObjectNotFound(f'{resource.split(".")[0]} "{name}" not found in namespace {namespace}')
        return key, self._point(metric, key)

    def object_points(
        self, resource: str, namespace: str, selector: LabelSelector, metric: str
    ) -> list[tuple[ObjectRef, MetricPoint]]:
        kind = KINDS[resource]
        out = []
        for w in self.cluster.workloads(kind, namespace):
            if selector.matches(w.labels):
                key = ObjectRef(kind, w.name, namespace)
                try:
                    out.append((key, self._point(metric, key)))
                except (MetricNotFound, MetricStale):
                    continue  # NB: a list leaves out what has no value; none at all is answered below
        if not out:
            raise MetricNotFound(f"no {metric} for any {resource} in namespace {namespace} matching {selector}")
        return out

    def external_points(
        self, namespace: str, metric: str, selector: LabelSelector
    ) -> list[tuple[dict[str, str], MetricPoint]]:
        """One item per matching workload, labelled workload=NAME, kind=deployment|statefulset."""
        out = []
        reasons = []
        for key in sorted(k for k in self.inputs if k.namespace == namespace):
            labels = {"workload": key.name, "kind": key.kind.lower()}
            if not selector.matches(labels):
                continue
            try:
                out.append((labels, self._point(metric, key)))
            except (MetricNotFound, MetricStale) as e:
                reasons.append(str(e))
        if not out:
            detail = "; ".join(reasons[:3]) or f"no Deployment or StatefulSet matches {selector}"
            raise MetricNotFound(f"no {metric} in namespace {namespace}: {detail}")
        return out


class ForecastCollector(Collector):
    """/metrics: every workload's forecast state, read at scrape time."""

    def __init__(self, forecasts: WorkloadForecasts) -> None:
        self.forecasts = forecasts

    def collect(self):  # type: ignore[no-untyped-def]
        labels = ["namespace", "kind", "name"]
        available = GaugeMetricFamily(
            "gpuscale_forecast_available",
            "1 if the workload's forecast is served; 0 while its history is too short (absent, never a guess).",
            labels=labels,
        )
        history = GaugeMetricFamily(
            "gpuscale_forecast_history_seconds", "Request-rate history the workload's forecast has.", labels=labels
        )
        horizon = GaugeMetricFamily(
            "gpuscale_forecast_horizon_seconds",
            "The forecast's horizon (the workload's start-up) and where it came from.",
            labels=[*labels, "source"],
        )
        rate = GaugeMetricFamily(
            "gpuscale_forecast_requests_per_second",
            "Request rate now (the last step) and forecast at the horizon (mean, p90).",
            labels=[*labels, "at"],
        )
        seconds = GaugeMetricFamily(
            "gpuscale_forecast_update_seconds", "Time the last refresh spent updating every workload's forecast."
        )
        seconds.add_metric([], self.forecasts.demand.last_seconds)
        for key, inputs in sorted(self.forecasts.inputs.items()):
            ids = [key.namespace or "", key.kind, key.name]
            forecast = self.forecasts.book.forecast(key)
            status = self.forecasts.book.status(key)
            available.add_metric(ids, 1.0 if forecast is not None else 0.0)
            history.add_metric(ids, status.history_s if status is not None else 0.0)
            horizon.add_metric([*ids, inputs.horizon_source], inputs.horizon_s)
            if forecast is not None:
                rate.add_metric([*ids, "now"], forecast.now)
                rate.add_metric([*ids, "mean"], forecast.mean)
                rate.add_metric([*ids, "p90"], forecast.upper)
        yield from (available, history, horizon, rate, seconds)
