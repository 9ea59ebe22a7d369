"""Per-workload demand history and forecasts, fed once per refresh: what the adapter serves as forecast metrics.

Pure and in memory (the history starts empty at each start, so forecasts are absent for ``min_history_s`` after
a restart). ``DemandBook.observe(now, rates, horizons_s, capacities)`` takes each workload's request rate at
one refresh; refreshes are averaged into fixed ``step_s`` steps and each finished step is fed to that
workload's ``Forecaster`` (metrics/forecast.py). A step with no refresh is filled with the last value when the
gap is short (``max_gap_s``); a longer gap starts the workload's history over, since what came before no
longer says what comes next. Workloads not seen for ``forget_after_s`` are dropped.

A reading is recorded only if it is new: given each rate's newest sample time (``sampled_at``), a rate whose
samples are no newer than the last recorded is the same reading again (a source that stopped answering keeps its
last value "fresh" for its max-age) and is a gap, not a step. A served value's timestamp is never later than the
newest sample it saw, so a consumer's max-age check turns it stale on time.

``states()`` publishes every workload's served state (its rate now, forecast and status) as one immutable
mapping: the adapter updates the book in steps between requests (``observe_steps``, ``states_steps``) and serves
only what was published, so a request never reads a forecaster halfway through an update.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass

from gpuscale.metrics.forecast import Forecast, Forecaster, model_spec
from gpuscale.metrics.steps import Steps, finish


@dataclass(frozen=True)
class DemandSettings:
    step_s: float = 15.0
    model: str = "holt"
    quantile: float = 0.9
    min_history_s: float = 600.0
    min_residuals: int = 20
    # NB: residuals kept per workload (30 min at 15 s); 1 h over-covered on bursty traces (docs/forecast.md)
    residual_window: int = 120
    # serve the last value instead of the model unless the model's p90 loss was lower over the last
    # ``loss_window`` checked forecasts (15 min at 15 s; Forecaster's ``choose``), by more than
    # ``choice_confidence`` standard errors of the paired differences (1.5: docs/forecast.md, the stated margin)
    choose: bool = True
    loss_window: int = 60
    choice_margin: float = 1.0
    choice_confidence: float = 1.5
    season_s: float = 86_400.0  # for the seasonal models
    max_gap_s: float = 120.0
    forget_after_s: float = 3_600.0

    def __post_init__(self) -> None:
        model_spec(self.model)  # fails early, naming the valid models
        if self.step_s <= 0:
            raise ValueError("the forecast step must be positive")

    def horizon_steps(self, horizon_s: float) -> int:
        return max(1, math.ceil(horizon_s / self.step_s - 1e-9))


@dataclass(frozen=True, slots=True)
class WorkloadForecast:
    """What is served for one workload. ``timestamp``: the end of the last step the forecast saw."""

    now: float  # requests/s in the last finished step
    mean: float  # requests/s expected ``horizon_s`` later
    upper: float  # its upper quantile (e.g. p90)
    horizon_s: float
    capacity: float | None  # requests/s one replica serves, where known
    timestamp: float
    model: str = ""  # the model that made it: the configured one or, when it forecast worse recently, naive
    losses: tuple[tuple[str, float], ...] = ()  # each candidate's recent mean pinball loss of its p90

    @property
    def desired_replicas(self) -> float | None:
        """upper ÷ capacity per replica: the replicas the forecast asks for (an AverageValue 1 target)."""
        return self.upper / self.capacity if self.capacity else None


@dataclass(frozen=True, slots=True)
class DemandStatus:
    """Why a workload has or has no forecast (for /metrics and error messages)."""

    history_s: float
    needs_s: float
    residuals: int
    needs_residuals: int
    horizon_s: float

    @property
    def reason(self) -> str:
        if self.history_s < self.needs_s:
            return f"{self.history_s:.0f} s of request-rate history, needs {self.needs_s:.0f} s"
        return (
            f"{self.residuals} of {self.needs_residuals} forecasts at the {self.horizon_s:.0f} s horizon checked "
            "against what followed"
        )


@dataclass(frozen=True, slots=True)
class WorkloadState:
    """One workload as served until the next update: what ``current``, ``forecast`` and ``status`` answer."""

    current: tuple[float, float] | None
    forecast: WorkloadForecast | None
    status: DemandStatus


class _Workload:
    __slots__ = (
        "bucket",
        "capacity",
        "count",
        "forecaster",
        "horizon_s",
        "last",
        "last_step_end",
        "sampled",
        "seen",
        "served",
        "state",
        "total",
    )

    def __init__(self, forecaster: Forecaster, bucket: int, horizon_s: float) -> None:
        self.forecaster = forecaster
        self.bucket = bucket  # the step being filled
        self.total = 0.0
        self.count = 0
        self.last: float | None = None  # the last finished step's rate
        self.last_step_end = 0.0
        self.horizon_s = horizon_s
        self.capacity: float | None = None
        self.seen = 0.0
        self.sampled = -math.inf  # the newest sample time recorded
        # NB: the forecast changes only when a step finishes (or the horizon or capacity does): computed once
        # then, not at every refresh and HPA request (the residual quantile is most of the cost).
        self.served: WorkloadForecast | None = None
        self.state: WorkloadState | None = None  # the published state, rebuilt when ``served`` is

    def changed(self) -> None:
        self.served = None
        self.state = None


class DemandBook:
    def __init__(self, settings: DemandSettings | None = None) -> None:
        self.settings = settings or DemandSettings()
        self._workloads: dict[Hashable, _Workload] = {}

    def _new(self, bucket: int, horizon_s: float) -> _Workload:
        s = self.settings
        spec = model_spec(s.model)
        forecaster = Forecaster(
            spec.build(max(1, round(s.season_s / s.step_s))),
            horizon_steps=s.horizon_steps(horizon_s),
            quantile=s.quantile,
            residual_window=s.residual_window,
            min_history=max(1, math.ceil(s.min_history_s / s.step_s)),
            min_residuals=s.min_residuals,
            name=s.model,
            choose=s.choose,
            loss_window=s.loss_window,
            margin=s.choice_margin,
            confidence=s.choice_confidence,
        )
        return _Workload(forecaster, bucket, horizon_s)

    def observe(
        self,
        now: float,
        rates: Mapping[Hashable, float],
        horizons_s: Mapping[Hashable, float],
        capacities: Mapping[Hashable, float] | None = None,
        *,
        sampled_at: Mapping[Hashable, float] | None = None,
    ) -> None:
        """One refresh: each workload's request rate (requests/s), forecast horizon (its start-up, seconds) and,
        where known, capacity per replica (requests/s). A workload missing from ``rates`` had no value.
        ``sampled_at``: the time of the newest sample each rate was computed from (default ``now``); a rate no
        newer than the last recorded is not recorded (see the module's docstring)."""
        finish(self.observe_steps(now, rates, horizons_s, capacities, sampled_at=sampled_at))

    def observe_steps(
        self,
        now: float,
        rates: Mapping[Hashable, float],
        horizons_s: Mapping[Hashable, float],
        capacities: Mapping[Hashable, float] | None = None,
        *,
        sampled_at: Mapping[Hashable, float] | None = None,
    ) -> Steps[None]:
        """``observe`` in steps (metrics/steps.py): one workload per step (a finished step feeds its models)."""
        s = self.settings
        bucket = math.floor(now / s.step_s)
        gap_steps = s.max_gap_s / s.step_s
        for key, rate in rates.items():
            yield
            if not math.isfinite(rate):
                continue
            at = min(now, sampled_at.get(key, now)) if sampled_at is not None else now
            horizon_s = horizons_s[key]
            w = self._workloads.get(key)
            if w is not None and at <= w.sampled:
                continue  # the same reading again: no new step, and the workload ages towards being forgotten
            if w is None or bucket - w.bucket > gap_steps + 1:
                w = self._workloads[key] = self._new(bucket, horizon_s)
            elif bucket > w.bucket:
                self._finish(w, bucket, at)
            w.sampled = at
            if horizon_s != w.horizon_s:
                w.horizon_s = horizon_s
                w.forecaster.reset_horizon(s.horizon_steps(horizon_s))
                w.changed()
            capacity = (capacities or {}).get(key)
            if capacity != w.capacity:
                w.capacity = capacity
                w.changed()
            w.total += max(0.0, rate)
            w.count += 1
            w.seen = now
        for key in [k for k, w in self._workloads.items() if now - w.seen > s.forget_after_s]:
            del self._workloads[key]

    def _finish(self, w: _Workload, bucket: int, sampled_at: float) -> None:
        """Feed the filled step, and the last value for each empty step up to ``bucket`` (whose first reading,
        sampled at ``sampled_at``, finishes them)."""
        value = w.total / w.count if w.count else w.last
        steps = bucket - w.bucket
        if value is not None:
            for _ in range(steps):
                w.forecaster.observe(value)
            w.last = value
        # NB: a reading can reach a refresh a little after its sample (a slow scrape): the step's end is then later
        # than any sample seen, and a forecast stamped with it would outlive its source by that much
        w.last_step_end = min(bucket * self.settings.step_s, sampled_at)
        w.bucket, w.total, w.count = bucket, 0.0, 0
        w.changed()

    def forecast(self, key: Hashable) -> WorkloadForecast | None:
        """The served forecast, or None while the workload's history is too short (never a guess)."""
        w = self._workloads.get(key)
        if w is None or w.last is None:
            return None
        if w.served is None:
            f: Forecast | None = w.forecaster.forecast()
            if f is None:
                return None
            w.served = WorkloadForecast(
                w.last, f.mean, f.upper, w.horizon_s, w.capacity, w.last_step_end, f.model, f.losses
            )
        return w.served

    def current(self, key: Hashable) -> tuple[float, float] | None:
        """(requests/s in the last finished step, the end of that step): the forecast's input, from the first
        finished step on, whether or not the forecast is served yet."""
        w = self._workloads.get(key)
        if w is None or w.last is None:
            return None
        return w.last, w.last_step_end

    def status(self, key: Hashable) -> DemandStatus | None:
        w = self._workloads.get(key)
        if w is None:
            return None
        f = w.forecaster
        s = self.settings
        return DemandStatus(f.steps * s.step_s, s.min_history_s, f.residual_count, s.min_residuals, w.horizon_s)

    def states(self) -> dict[Hashable, WorkloadState]:
        """Every workload's state as served now, in a new mapping (computes the forecasts a finished step made
        due: once per step, so about one call in three does the models' work at 5 s refreshes)."""
        return finish(self.states_steps())

    def states_steps(self) -> Steps[dict[Hashable, WorkloadState]]:
        """``states`` in steps (metrics/steps.py): one workload's forecast per step."""
        out = {}
        for key, w in self._workloads.items():
            if w.state is None:
                yield
                status = self.status(key)
                assert status is not None
                w.state = WorkloadState(self.current(key), self.forecast(key), status)
            out[key] = w.state
        return out

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._workloads))

    def __len__(self) -> int:
        return len(self._workloads)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._workloads
