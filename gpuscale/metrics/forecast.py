"""Short-horizon demand forecasts: a request-rate series on a fixed step → the rate ``h`` steps ahead.

Pure and incremental: a ``Forecaster`` is fed one value per step (``observe``) and answers in O(1) plus
one quantile over a bounded residual window, so the adapter can run one per workload every refresh
(benchmarks/bench_forecast.py measures it). The same objects run in the backtests (``backtest``), so the
figures in docs/forecast.md are those of the code that serves.

Models (``MODELS``; each is ``update(y)`` then ``predict(h)``, None while it has too little history):

    naive           ŷ(t+h) = y(t)                                   the baseline every model is judged against
    seasonal_naive  ŷ(t+h) = y(t+h−k·m)                             the same time one season (m steps) earlier
    ses             simple exponential smoothing (holt without its trend term, to show what the growth adds)
    holt            damped trend (Gardner & McKenzie):              level + a recent-growth term that fades
                      ℓ(t) = α·y(t) + (1−α)·(ℓ(t−1) + φ·b(t−1))
                      b(t) = β·(ℓ(t) − ℓ(t−1)) + (1−β)·φ·b(t−1)
                      ŷ(t+h) = ℓ(t) + (φ + φ² + … + φʰ)·b(t)
    seasonal_holt   holt on y(t) − y(t−m) (this season's change vs the last), added back to seasonal_naive

The upper quantile is empirical, by horizon: every forecast made is kept until its target step arrives,
the residual y − ŷ is remembered (the last ``residual_window``), and upper = ŷ + that residuals' quantile
(never below ŷ). No distribution is assumed. A forecast exists only once the model answers and enough
residuals at this horizon were seen (``min_residuals``): with less history the answer is None, never a
guess. Rates are never forecast below 0.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Model(Protocol):
    """One point-forecasting model, fed one value per step."""

    def update(self, y: float) -> None: ...

    def predict(self, h: int) -> float | None:
        """The value ``h`` ≥ 1 steps after the last one given, or None while history is too short."""
        ...


class Naive:
    """The last value: what a reactive HPA implicitly assumes."""

    def __init__(self) -> None:
        self.last: float | None = None

    def update(self, y: float) -> None:
        self.last = y

    def predict(self, h: int) -> float | None:
        return self.last


class SeasonalNaive:
    """The value one season earlier at the same phase (``season`` steps, e.g. a day)."""

    def __init__(self, season: int) -> None:
        if season < 1:
            raise ValueError("season must be at least one step")
        self.season = season
        self.values: deque[float] = deque(maxlen=season)

    def update(self, y: float) -> None:
        self.values.append(y)

    def predict(self, h: int) -> float | None:
        if len(self.values) < self.season:
            return None
        # values[0] is y(t − m + 1): the step t+h maps to y(t + h − k·m) with k the seasons h spans
        return self.values[(h - 1) % self.season]


class DampedHolt:
    """Exponential smoothing with a damped trend: the recent growth carries on, fading by φ per step."""

    # NB: defaults from a grid search on the backtest traces (docs/forecast.md): α 0.1–0.7, β 0–0.2, φ 0.8–0.98.
    def __init__(self, *, alpha: float = 0.2, beta: float = 0.02, phi: float = 0.95) -> None:
        if not (0 < alpha <= 1 and 0 <= beta <= 1 and 0 < phi <= 1):
            raise ValueError("need 0 < alpha ≤ 1, 0 ≤ beta ≤ 1, 0 < phi ≤ 1")
        self.alpha, self.beta, self.phi = alpha, beta, phi
        self.level: float | None = None
        self.trend = 0.0

    def update(self, y: float) -> None:
        if self.level is None:
            self.level = y
            return
        previous = self.level
        self.level = self.alpha * y + (1 - self.alpha) * (previous + self.phi * self.trend)
        self.trend = self.beta * (self.level - previous) + (1 - self.beta) * self.phi * self.trend

    def predict(self, h: int) -> float | None:
        if self.level is None:
            return None
        phi = self.phi
        damped = h if phi == 1 else phi * (1 - phi**h) / (1 - phi)  # φ + φ² + … + φʰ
        return self.level + damped * self.trend


class SeasonalHolt:
    """Seasonal naive corrected by the trend of the season-over-season change (a damped Holt on it):
    'like yesterday at this time, plus however much busier than yesterday we are now'."""

    def __init__(self, season: int, *, alpha: float = 0.2, beta: float = 0.02, phi: float = 0.95) -> None:
        self.seasonal = SeasonalNaive(season)
        self.change = DampedHolt(alpha=alpha, beta=beta, phi=phi)

    def update(self, y: float) -> None:
        if len(self.seasonal.values) == self.seasonal.season:
            self.change.update(y - self.seasonal.values[0])  # y(t) − y(t − m)
        self.seasonal.update(y)

    def predict(self, h: int) -> float | None:
        base = self.seasonal.predict(h)
        change = self.change.predict(h)
        if base is None or change is None:
            return None
        return base + change


@dataclass(frozen=True)
class ModelSpec:
    """How to build a model; ``season_steps`` is 0 for models that need no season."""

    name: str
    build: Callable[[int], Model]  # season in steps → a fresh model
    needs_season: bool = False


MODELS: dict[str, ModelSpec] = {
    "naive": ModelSpec("naive", lambda season: Naive()),
    "seasonal_naive": ModelSpec("seasonal_naive", lambda season: SeasonalNaive(season), needs_season=True),
    "ses": ModelSpec("ses", lambda season: DampedHolt(beta=0.0)),
    "holt": ModelSpec("holt", lambda season: DampedHolt()),
    "seasonal_holt": ModelSpec("seasonal_holt", lambda season: SeasonalHolt(season), needs_season=True),
}


def model_spec(name: str) -> ModelSpec:
    spec = MODELS.get(name)
    if spec is None:
        raise ValueError(f"unknown forecast model {name!r}; valid: {', '.join(MODELS)}")
    return spec


@dataclass(frozen=True, slots=True)
class Forecast:
    """The rate expected ``horizon_steps`` after the last observed step: ``mean`` and the ``upper`` quantile.

    ``model``: the model that made it (with ``choose``, the model or ``naive``, whichever had the lower recent
    loss); ``losses``: each candidate's mean pinball loss of its upper quantile over its recent checked forecasts
    (out of sample: each upper was made before its target step was seen)."""

    mean: float
    upper: float
    horizon_steps: int
    history_steps: int  # steps observed so far
    residuals: int  # residuals the upper quantile is drawn from
    model: str = ""
    losses: tuple[tuple[str, float], ...] = ()


class _Track:
    """One candidate model's h-step forecasts: those not checked yet, the residuals of those checked (also kept
    sorted) and the pinball losses of its recent upper quantiles."""

    __slots__ = ("loss_sum", "losses", "model", "name", "pending", "residuals", "sorted")

    def __init__(self, name: str, model: Model, *, residual_window: int, loss_window: int) -> None:
        self.name = name
        self.model = model
        self.pending: deque[tuple[int, float, float | None]] = deque()  # (target step, forecast, its upper)
        self.residuals: deque[float] = deque(maxlen=residual_window)
        # NB: the same residuals kept sorted (one insort and one removal per step): the quantile is then two
        # lookups instead of np.quantile over the window, which was ~60 µs per workload at every finished step
        # (0.3 s of a 5,000-workload refresh).
        self.sorted: list[float] = []
        self.losses: deque[float] = deque(maxlen=loss_window)
        self.loss_sum = 0.0

    def check(self, step: int, y: float, quantile: float) -> float | None:
        """Score the forecasts made for ``step`` against its value ``y``: the pinball loss of its upper, if any."""
        loss = None
        while self.pending and self.pending[0][0] <= step:
            target, predicted, upper = self.pending.popleft()
            if target != step:
                continue
            r = y - predicted
            if len(self.residuals) == self.residuals.maxlen:
                del self.sorted[bisect.bisect_left(self.sorted, self.residuals[0])]
            self.residuals.append(r)
            bisect.insort(self.sorted, r)
            if upper is not None:
                diff = y - upper
                loss = quantile * diff if diff >= 0 else (quantile - 1) * diff
                if len(self.losses) == self.losses.maxlen:
                    self.loss_sum -= self.losses[0]
                self.losses.append(loss)
                self.loss_sum += loss
        return loss

    def upper(self, predicted: float, quantile: float, min_residuals: int) -> float | None:
        """The upper quantile of a forecast made now, or None with too few residuals."""
        if len(self.residuals) < min_residuals:
            return None
        return max(predicted, predicted + sorted_quantile(self.sorted, quantile))

    def recent_loss(self) -> float:
        return self.loss_sum / len(self.losses) if self.losses else math.nan

    def clear(self) -> None:
        self.pending.clear()
        self.residuals.clear()
        self.sorted.clear()
        self.losses.clear()
        self.loss_sum = 0.0


class Forecaster:
    """One series' forecast at one horizon: a model plus the empirical residuals of its h-step forecasts.

    ``observe(y)`` once per step (NaN for a step without data is not accepted: the caller decides what a gap
    means). ``forecast()`` is None until ``min_history`` steps were seen and ``min_residuals`` forecasts at this
    horizon could be checked against what happened.

    ``choose``: the last value (naive) runs beside the model, with its own residuals, and each forecast is made by
    whichever of the two had the lower pinball loss of its upper quantile over the last ``loss_window`` checked
    forecasts: the model only with a whole window of them, a loss below ``margin`` × naive's, and the mean of the
    paired differences (model − naive) below 0 by more than ``confidence`` standard errors; otherwise naive. Each
    upper was made before the step it forecast was seen, so the choice is judged out of sample, per series: on a
    series where the model's smoothing or trend only adds lag, the last value is served instead.
    """

    def __init__(
        self,
        model: Model,
        *,
        horizon_steps: int,
        quantile: float = 0.9,
        residual_window: int = 240,
        min_history: int = 40,
        min_residuals: int = 20,
        name: str = "model",
        choose: bool = False,
        loss_window: int = 60,
        margin: float = 1.0,
        confidence: float = 0.0,
    ) -> None:
        if horizon_steps < 1:
            raise ValueError("horizon_steps must be at least 1")
        if not 0 < quantile < 1:
            raise ValueError("quantile must be between 0 and 1")
        if loss_window < 1:
            raise ValueError("loss_window must be at least 1")
        self.model = model
        self.horizon_steps = horizon_steps
        self.quantile = quantile
        self.min_history = min_history
        self.min_residuals = min_residuals
        self.margin = margin
        self.steps = 0
        windows = {"residual_window": residual_window, "loss_window": loss_window}
        self._tracks = [_Track(name, model, **windows)]
        if choose and not isinstance(model, Naive):
            self._tracks.append(_Track("naive", Naive(), **windows))
        self.confidence = confidence
        # model's loss − naive's, per step both were checked: the model serves only when these are below 0 by more
        # than ``confidence`` standard errors (a run of luck in a noisy series is not evidence)
        self._differences: deque[float] = deque(maxlen=loss_window)
        self._difference_sum = 0.0
        self._difference_squares = 0.0

    def observe(self, y: float) -> None:
        if not math.isfinite(y):
            raise ValueError(f"a rate must be a finite number, got {y!r}")
        step = self.steps
        h = self.horizon_steps
        losses = [track.check(step, y, self.quantile) for track in self._tracks]
        if len(losses) == 2 and losses[0] is not None and losses[1] is not None:
            d = losses[0] - losses[1]
            if len(self._differences) == self._differences.maxlen:
                old = self._differences[0]
                self._difference_sum -= old
                self._difference_squares -= old * old
            self._differences.append(d)
            self._difference_sum += d
            self._difference_squares += d * d
        for track in self._tracks:
            track.model.update(y)
            predicted = track.model.predict(h)
            if predicted is not None:
                # made after step `step`: it is about step + h
                predicted = max(0.0, predicted)
                track.pending.append((step + h, predicted, track.upper(predicted, self.quantile, self.min_residuals)))
        self.steps += 1

    def reset_horizon(self, horizon_steps: int) -> None:
        """A new horizon: the models keep their state, the residuals and losses (which were at the old horizon)
        go."""
        if horizon_steps != self.horizon_steps:
            if horizon_steps < 1:
                raise ValueError("horizon_steps must be at least 1")
            self.horizon_steps = horizon_steps
            for track in self._tracks:
                track.clear()
            self._differences.clear()
            self._difference_sum = self._difference_squares = 0.0

    @property
    def residual_count(self) -> int:
        return len(self._tracks[0].residuals)

    def chosen(self) -> _Track:
        """The track that forecasts now: the model, or with ``choose`` the one with the lower recent loss."""
        if len(self._tracks) == 1:
            return self._tracks[0]
        model, naive = self._tracks
        n = len(self._differences)
        if n < (self._differences.maxlen or 0) or not model.loss_sum < self.margin * naive.loss_sum:
            return naive
        mean = self._difference_sum / n
        variance = max(0.0, self._difference_squares / n - mean * mean)
        return model if mean + self.confidence * math.sqrt(variance / n) < 0 else naive

    def forecast(self) -> Forecast | None:
        if self.steps < self.min_history or len(self._tracks[0].residuals) < self.min_residuals:
            return None
        track = self.chosen()
        predicted = track.model.predict(self.horizon_steps)
        if predicted is None:
            return None
        mean = max(0.0, predicted)
        upper = track.upper(mean, self.quantile, self.min_residuals)
        if upper is None:
            return None
        losses = tuple((t.name, t.recent_loss()) for t in self._tracks)
        return Forecast(mean, upper, self.horizon_steps, self.steps, len(track.residuals), track.name, losses)


def sorted_quantile(values: list[float], q: float) -> float:
    """``np.quantile(values, q)`` (its default, linear method, to the bit) of ``values`` already sorted."""
    n = len(values)
    virtual = (n - 1) * q  # NB: numpy's own expression for the linear method
    lo = math.floor(virtual)
    if lo < 0:
        return values[0]
    if lo >= n - 1:
        return values[-1]
    a, b = values[lo], values[lo + 1]
    t = virtual - lo
    diff = b - a
    if t >= 0.5:  # NB: numpy's _lerp, for monotonicity near b
        return b - diff * (1 - t)
    return a + diff * t


# --- backtests --------------------------------------------------------------------------------------


def pinball_loss(actual: np.ndarray, predicted: np.ndarray, quantile: float) -> float:
    """Mean quantile (pinball) loss: q·(y − ŷ) when under-forecast, (1 − q)·(ŷ − y) when over."""
    diff = actual - predicted
    return float(np.mean(np.maximum(quantile * diff, (quantile - 1) * diff)))


@dataclass(frozen=True)
class BacktestScore:
    model: str
    horizon_steps: int
    points: int  # steps scored (the same steps for every model compared)
    mape_percent: float  # over scored steps whose actual ≥ mape_floor (MAPE is undefined at 0)
    mae: float
    pinball_mean: float  # pinball loss of the mean forecast at q = 0.5 (= MAE/2)
    pinball_upper: float  # pinball loss of the upper quantile at its own q
    coverage: float  # share of actuals at or below the upper quantile (a calibrated p90 gives 0.9)


def walk_forward(
    y: np.ndarray, *, model: str, horizon_steps: int, season_steps: int = 0, quantile: float = 0.9, **options: int
) -> tuple[np.ndarray, np.ndarray]:
    """Forecast ``horizon_steps`` ahead after every step exactly as the adapter does: (mean, upper) per target
    step, NaN where the forecaster had no answer."""
    spec = model_spec(model)
    if spec.needs_season and season_steps < 1:
        raise ValueError(f"model {model} needs season_steps")
    forecaster = Forecaster(spec.build(season_steps), horizon_steps=horizon_steps, quantile=quantile, **options)
    means = np.full(len(y), np.nan)
    uppers = np.full(len(y), np.nan)
    for t, value in enumerate(y[: len(y) - horizon_steps]):
        forecaster.observe(float(value))
        f = forecaster.forecast()
        if f is not None:
            means[t + horizon_steps] = f.mean
            uppers[t + horizon_steps] = f.upper
    return means, uppers


def score(
    model: str,
    horizon_steps: int,
    y: np.ndarray,
    means: np.ndarray,
    uppers: np.ndarray,
    scored: np.ndarray,
    *,
    quantile: float = 0.9,
    mape_floor: float = 1e-9,
) -> BacktestScore:
    """Errors of one model's forecasts on the ``scored`` steps (a boolean mask)."""
    actual, mean, upper = y[scored], means[scored], uppers[scored]
    if not len(actual):
        return BacktestScore(model, horizon_steps, 0, math.nan, math.nan, math.nan, math.nan, math.nan)
    nonzero = actual >= mape_floor
    mape = (
        float(np.mean(np.abs(actual[nonzero] - mean[nonzero]) / actual[nonzero]) * 100) if nonzero.any() else math.nan
    )
    return BacktestScore(
        model,
        horizon_steps,
        len(actual),
        mape,
        float(np.mean(np.abs(actual - mean))),
        pinball_loss(actual, mean, 0.5),
        pinball_loss(actual, upper, quantile),
        float(np.mean(actual <= upper)),
    )


def backtest(
    series: Iterable[float],
    *,
    models: Iterable[str],
    horizon_steps: int,
    season_steps: int = 0,
    quantile: float = 0.9,
    mape_floor: float = 1e-9,
    **options: int,
) -> list[BacktestScore]:
    """Walk forward through ``series`` with each model and score them all on the same steps: those where every
    model had a forecast (a model that needs a season of history is compared only after it has one)."""
    y = np.asarray(list(series), dtype=float)
    runs = {
        m: walk_forward(
            y, model=m, horizon_steps=horizon_steps, season_steps=season_steps, quantile=quantile, **options
        )
        for m in models
    }
    scored = np.logical_and.reduce([~np.isnan(means) for means, _ in runs.values()])
    return [
        score(m, horizon_steps, y, means, uppers, scored, quantile=quantile, mape_floor=mape_floor)
        for m, (means, uppers) in runs.items()
    ]


def rate_series(arrival_s: np.ndarray, *, step_s: float, duration_s: float | None = None) -> np.ndarray:
    """Requests per second in consecutive ``step_s`` windows from arrival times (seconds from 0): up to the last
    arrival's step, or ``duration_s`` (a later arrival counts in the last step)."""
    if duration_s is None:
        steps = int(arrival_s[-1] // step_s) + 1 if len(arrival_s) else 1
    else:
        steps = max(1, math.ceil(duration_s / step_s - 1e-9))
    counts = np.bincount(np.minimum((arrival_s // step_s).astype(np.int64), steps - 1), minlength=steps)
    return counts / step_s
