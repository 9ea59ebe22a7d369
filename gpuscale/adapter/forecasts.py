"""Forecast metrics (issue 26): each workload's request rate a start-up ahead, served to HPAs.

Once per refresh each Deployment and StatefulSet's request rate, horizon (its start-up) and capacity per replica
go into the DemandBook (metrics/workload_demand.py says how each is read; metrics/demand.py keeps the history and
the forecasts). That update runs in steps with the snapshot's build (``prepare``, the pipeline's prepare hook),
between HPA requests: 0.17 s of CPU at 5,000 workloads, which in one go on the event loop held every HPA request for
as long. What it returns, run on the loop in the step that swaps the snapshot in, publishes the new state in one
assignment (a ``ForecastView``); requests and /metrics read only published views, never the book, so they see
one whole update or the one before. Updates run one at a time, in snapshot order; one that fails leaves the last
view served (the step is a gap) and is counted and logged.

Served metrics (Object: deployments.apps / statefulsets.apps; External: one item per workload with labels
``workload`` and ``kind``, which a labelSelector picks):

    forecast_requests_per_second       the mean forecast at the horizon
    forecast_requests_per_second_p90   its upper quantile (the empirical p90 of past errors at this horizon)
    forecast_desired_replicas          p90 ÷ capacity per replica — for an AverageValue 1 target; absent
                                       without the capacity annotation
    workload_requests_per_second       the forecast's input now: the workload's rate in the last 15 s step

A workload with too little history has no value (404 naming what it lacks), never a guess; /metrics shows
every workload's state (gpuscale_forecast_available, _history_seconds). The forecast timestamps its last step,
so a failing source turns it stale (503) like any other metric. A value no quantity can hold (a rate summed past
9.2e15) is left out like a missing one, and counted once per update by metric and reason (``count_dropped``:
the adapter's gpuscale_adapter_values_dropped_total).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuscale.errors import MetricNotFound, MetricStale, ObjectNotFound, one_line
from gpuscale.metrics.demand import WorkloadForecast, WorkloadState
from gpuscale.metrics.steps import Steps, finish
from gpuscale.metrics.store import NOT_FINITE, OUT_OF_RANGE, MetricPoint, MetricsStore, Snapshot
from gpuscale.metrics.workload_demand import CAPACITY_ANNOTATION, Inputs, WorkloadDemand
from gpuscale.model import DEPLOYMENT, STATEFULSET, ObjectRef, representable
from gpuscale.piecemeal import free_piecemeal
from gpuscale.selectors import LabelSelector

log = logging.getLogger(__name__)

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
# NB: below this magnitude a value stays a quantity after rounding to 9 digits (``served``); only values beyond
# it are checked exactly, so the check of every workload's values at each update costs a comparison each.
_SURELY_SERVABLE = 9.2e15


# (namespaces, now) → pod → its (time, requests/s) samples before ``now``: the rate's recorded history, for
# backfilling a workload the book has no history of (cli/adapter.py reads it from Prometheus)
RateHistory = Callable[[frozenset[str], float], Awaitable[Mapping[ObjectRef, Sequence[tuple[float, float]]]]]


@dataclass(frozen=True)
class ForecastView:
    """One update's result, published whole: what requests and /metrics read until the next one."""

    inputs: Mapping[ObjectRef, Inputs] = field(default_factory=dict)
    states: Mapping[ObjectRef, WorkloadState] = field(default_factory=dict)
    namespaces: frozenset[str] | None = None  # where the rate was read (None: every namespace)
    taken_at: float = float("-inf")  # the snapshot it was computed from
    update_seconds: float = 0.0  # its wall time, from its first step to its last
    dropped: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (metric, reason) → values left out


class WorkloadForecasts:
    """The forecast metrics' answers, from the workloads' demand (metrics/workload_demand.py).

    ``rate_namespaces()`` says, during a refresh, where that refresh fetches the rate metric (None: everywhere);
    with demand-driven refresh only those namespaces' workloads are updated (metrics/refresh_scope.py)."""

    def __init__(
        self,
        demand: WorkloadDemand,
        *,
        rate_namespaces: Callable[[], Collection[str] | None] = lambda: None,
        count_dropped: Callable[[Mapping[tuple[str, str], int]], None] = lambda dropped: None,
        history: RateHistory | None = None,
    ) -> None:
        self.demand = demand
        self.book = demand.book
        self.cluster = demand.cluster
        self.max_age_s = demand.max_age_s
        self.clock = demand.clock
        self.rate_namespaces = rate_namespaces
        self.count_dropped = count_dropped
        self.view = ForecastView()
        self.failures = 0  # updates that raised (the last view kept serving)
        self._updating = threading.Lock()  # NB: the book is one workload history per key: never two updates at once
        self._updated_at = float("-inf")  # the newest snapshot updated from
        self._retired: ForecastView | None = None  # the view last replaced, freed off the loop
        self.history = history
        self._backfilled: set[str] = set()  # namespaces whose history was asked for once
        # what ``gather`` read for the next ``prepare``: (namespaces, pod → samples)
        self._history_read: tuple[frozenset[str], Mapping[ObjectRef, Sequence[tuple[float, float]]]] | None = None

    @property
    def inputs(self) -> Mapping[ObjectRef, Inputs]:
        return self.view.inputs

    async def gather(self, now: float) -> None:
        """Before a refresh's build: read the rate's recorded history for the namespaces forecast for the first time
        (once per namespace, I/O on the event loop); ``prepare`` warms their workloads from it. A failure is logged
        and the forecasts warm up live, as without a history."""
        if self.history is None or not self.cluster.synced:
            return
        namespaces = self.rate_namespaces()
        present = self.cluster.namespaces()
        new = (present if namespaces is None else present & frozenset(namespaces)) - self._backfilled
        if not new:
            return
        self._backfilled |= new
        try:
            self._history_read = (frozenset(new), await self.history(frozenset(new), now))
        except Exception as e:  # NB: the history is a help, never a condition: live readings carry on
            log.warning("forecast history not read (%s); forecasts warm up live", one_line(str(e) or repr(e), 200))

    def prepare(self, snapshot: Snapshot) -> Steps[Callable[[], None]]:
        """Update the book from ``snapshot`` (not served yet), in steps (metrics/steps.py: the pipeline runs them
        between requests); returns what publishes the result — call it on the event loop when the snapshot is
        swapped in (the pipeline's prepare hook does both). A snapshot older than the last one updated from is
        skipped: the book's steps only move forward."""
        with self._updating:
            retired, self._retired = self._retired, None
            if retired is not None:
                yield from free_piecemeal(retired, ("inputs", "states"))
            retired = None
            if snapshot.taken_at < self._updated_at:
                return _nothing
            self._updated_at = snapshot.taken_at
            started = time.perf_counter()
            try:
                namespaces = self.rate_namespaces()
                read, self._history_read = self._history_read, None
                if read is not None:
                    warmed = self.demand.backfill(read[1], namespaces=read[0])
                    log.info("forecast history read for %d namespaces: %d workloads warmed", len(read[0]), warmed)
                reader = MetricsStore()
                reader.update(snapshot)
                yield from self.demand.observe_steps(reader, now=snapshot.taken_at, namespaces=namespaces)
                states = yield from self.book.states_steps()
                view = ForecastView(
                    self.demand.inputs,
                    states,
                    None if namespaces is None else frozenset(namespaces),
                    snapshot.taken_at,
                    time.perf_counter() - started,
                    unservable(states),
                )
            except Exception as e:  # NB: a failed update must not fail the refresh; the last view keeps serving
                self.failures += 1
                log.error("forecast update failed, serving the last forecasts: %s", one_line(str(e) or repr(e), 200))
                log.debug("forecast update failure", exc_info=True)
                return _nothing

        def publish() -> None:
            if view.taken_at >= self.view.taken_at:
                # NB: the old view is freed by the next update, in steps: dropping ~10⁴ objects here took ~2.5 ms of
                # the event loop at 5,000 workloads
                self._retired, self.view = self.view, view
                if view.dropped:
                    self.count_dropped(view.dropped)

        return publish

    def observe(self, snapshot: Snapshot) -> None:
        """Update and publish at once (for callers without a pipeline, e.g. tests and benchmarks)."""
        finish(self.prepare(snapshot))()

    # --- serving ------------------------------------------------------------------------------------

    def _point(self, metric: str, key: ObjectRef) -> MetricPoint:
        """The fresh value, or MetricNotFound / MetricStale saying why there is none."""
        what = f"{key.kind.lower()} {key.namespace}/{key.name}"
        view = self.view
        state = view.states.get(key)
        if state is None:
            raise MetricNotFound(f"no {metric} for {what} yet: {self._no_history(view, key.namespace)}")
        if metric == NOW:
            if state.current is None:
                raise MetricNotFound(f"no {metric} for {what} yet: no request rate read for it")
            return self._fresh(metric, what, state.current[0], state.current[1], None)
        forecast = state.forecast
        if forecast is None:
            raise MetricNotFound(f"no {metric} for {what} yet: {state.status.reason} (a forecast is never guessed)")
        value = FORECASTS[metric](forecast)
        if value is None:
            raise MetricNotFound(
                f"no {metric} for {what}: annotate it {CAPACITY_ANNOTATION} (requests/s one replica serves)"
            )
        return self._fresh(metric, what, value, forecast.timestamp, forecast.horizon_s)

    def _no_history(self, view: ForecastView, namespace: str | None) -> str:
        needs = f"a forecast needs {self.book.settings.min_history_s:.0f} s of it (never guessed)"
        if view.namespaces is not None and namespace not in view.namespaces:
            return (
                f"no request-rate history: the rate is read in namespace {namespace} only once an HPA or a request "
                f"asks for a forecast there (demand-driven refresh; this request does), and {needs}"
            )
        return f"no request-rate history; {needs}"

    def _fresh(self, metric: str, what: str, value: float, timestamp: float, horizon_s: float | None) -> MetricPoint:
        if timestamp < self.clock() - self.max_age_s:
            raise MetricStale(
                f"the {metric} of {what} is older than {self.max_age_s:g}s (its request rate is not being read); "
                "not serving a stale forecast",
                retry_after_seconds=5,
            )
        value = served(value)
        if not representable(value):
            raise MetricNotFound(
                f"no {metric} for {what}: its value {value!r} is not one a quantity can hold; left out "
                "(counted in gpuscale_adapter_values_dropped_total)"
            )
        # The window of a forecast is its horizon (what `gpuscale top workloads` shows as HORIZON).
        return MetricPoint(value, timestamp, horizon_s)

    def object_point(self, resource: str, namespace: str, name: str, metric: str) -> tuple[ObjectRef, MetricPoint]:
        key = ObjectRef(KINDS[resource], name, namespace)
        if self.cluster.synced and self.cluster.workload(key.kind, namespace, name) is None:
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
        # NB: the watch cache's workloads, not the view's: with demand-driven refresh a namespace nobody asked
        # for yet has none in the view, and each then says why it has no value
        keys = [
            ObjectRef(kind, w.name, namespace)
            for kind in KINDS.values()
            for w in self.cluster.workloads(kind, namespace)
        ]
        for key in sorted(keys):
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


def served(value: float) -> float:
    """The value as served. NB: smoothing a steady 3 req/s gives 3.0000000000004, which a quantity ceils to 3001m;
    9 significant digits are far finer than any forecast is good for."""
    return float(f"{value:.9g}")


def _values(state: WorkloadState) -> Iterator[tuple[str, float | None]]:
    """(metric, value) of every forecast metric a state serves (None: it has none)."""
    yield NOW, state.current[0] if state.current is not None else None
    forecast = state.forecast
    for metric, read in FORECASTS.items():
        yield metric, read(forecast) if forecast is not None else None


def unservable(states: Mapping[ObjectRef, WorkloadState]) -> dict[tuple[str, str], int]:
    """(metric, reason) → how many of these states' values cannot be served (``_fresh`` leaves them out)."""
    out: dict[tuple[str, str], int] = {}
    for state in states.values():
        for metric, value in _values(state):
            if value is None or -_SURELY_SERVABLE < value < _SURELY_SERVABLE or representable(served(value)):
                continue
            key = (metric, OUT_OF_RANGE if math.isfinite(value) else NOT_FINITE)
            out[key] = out.get(key, 0) + 1
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
        model = GaugeMetricFamily(
            "gpuscale_forecast_model",
            "1 for the model that makes the served forecast: the configured one, or naive (the last value) while "
            "the configured one's recent p90 loss at the horizon is not lower.",
            labels=[*labels, "model"],
        )
        loss = GaugeMetricFamily(
            "gpuscale_forecast_p90_loss",
            "Mean pinball loss (q 0.9) of each candidate's p90 over its recent forecasts checked against what "
            "followed (requests/s; lower is better): what the served model is chosen by.",
            labels=[*labels, "model"],
        )
        seconds = GaugeMetricFamily(
            "gpuscale_forecast_update_seconds",
            "Wall time of the last refresh's forecast update (in steps between requests on the event loop).",
        )
        failures = CounterMetricFamily(
            "gpuscale_forecast_update_failures",
            "Forecast updates that failed (the last forecasts kept serving; the log says why).",
        )
        view = self.forecasts.view
        seconds.add_metric([], view.update_seconds)
        failures.add_metric([], self.forecasts.failures)
        for key, inputs in sorted(view.inputs.items()):
            ids = [key.namespace or "", key.kind, key.name]
            state = view.states.get(key)
            forecast = state.forecast if state is not None else None
            available.add_metric(ids, 1.0 if forecast is not None else 0.0)
            history.add_metric(ids, state.status.history_s if state is not None else 0.0)
            horizon.add_metric([*ids, inputs.horizon_source], inputs.horizon_s)
            if forecast is not None:
                rate.add_metric([*ids, "now"], forecast.now)
                rate.add_metric([*ids, "mean"], forecast.mean)
                rate.add_metric([*ids, "p90"], forecast.upper)
                if forecast.model:
                    model.add_metric([*ids, forecast.model], 1.0)
                for name, value in forecast.losses:
                    if math.isfinite(value):
                        loss.add_metric([*ids, name], value)
        yield from (available, history, horizon, rate, model, loss, seconds, failures)


def _nothing() -> None:
    """Nothing to publish."""
