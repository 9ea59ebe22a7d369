"""The forecast the adapter would have served, walked through the adapter's own DemandBook (issues 26, 38).

One path for every judgement of the forecast: the replays through ``simulate`` (``served_forecast``), the
backtests (benchmarks/forecast_backtest.py) and ``gpuscale forecast backtest`` all feed the book the readings the
adapter's refresh takes — every ``refresh_s`` the workload's request rate as the catalogue reads it
(``inference_requests_per_second``: requests over the last ``window_s``, 60 s) — with the adapter's settings
(metrics/demand.py), and read back what the adapter would serve. The truth a forecast is judged against is the
same series: the book's own value of the step it forecast (what ``workload_requests_per_second`` serves for that
step), so the forecast is fed, served and judged on one input.

Readings come from a trace's arrivals (``trace_readings``) or from a recorded rate (``timestamp,value`` rows,
e.g. a Prometheus range query of the rate: each row is one reading, taken at its own time). NB: arrivals stand
in for the finished requests the adapter reads; the two differ while replicas are saturated (the adapter then
under-reads a rise).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from gpuscale.metrics.demand import DemandBook, DemandSettings
from gpuscale.metrics.forecast import pinball_loss

_KEY = "workload"


def trace_readings(
    arrival_s: np.ndarray, *, refresh_s: float = 5.0, window_s: float = 60.0
) -> tuple[np.ndarray, np.ndarray]:
    """(refresh times, requests/s over the last ``window_s`` then — shorter at the start, as a rate over the
    scrapes seen so far is), seconds from the first arrival, up to the last."""
    end = float(arrival_s[-1]) if len(arrival_s) else 0.0
    times = np.arange(refresh_s, end + refresh_s, refresh_s)
    upto = np.searchsorted(arrival_s, times, side="right")
    since = np.searchsorted(arrival_s, times - window_s, side="right")
    return times, (upto - since) / np.minimum(window_s, times)


@dataclass(frozen=True)
class ServedRun:
    """What one workload's book served at each refresh, and its steps.

    ``steps``: step index → the step's value (the forecast's input and its truth). ``forecasts``: one row per
    refresh with a forecast: (refresh time, index of the last step it saw, mean, upper, desired replicas or NaN,
    1 if the configured model made it, 0 if naive did)."""

    step_s: float
    horizon_steps: int
    steps: dict[int, float]
    forecasts: np.ndarray  # shape (n, 6)


def walk(
    times: np.ndarray,
    rates: np.ndarray,
    *,
    horizon_s: float,
    settings: DemandSettings | None = None,
    capacity: float | None = None,
) -> ServedRun:
    """Feed the readings (``rates`` at ``times``, seconds) to a DemandBook one refresh at a time, as the adapter
    does, and record what it serves after each."""
    settings = settings or DemandSettings()
    book = DemandBook(settings)
    steps: dict[int, float] = {}
    rows: list[tuple[float, ...]] = []
    capacities = {_KEY: capacity} if capacity else None
    horizons = {_KEY: horizon_s}
    for t, rate in zip(times.tolist(), rates.tolist(), strict=True):
        book.observe(t, {_KEY: rate}, horizons, capacities)
        current = book.current(_KEY)
        if current is None:
            continue
        step = math.ceil(current[1] / settings.step_s - 1e-9) - 1  # the last finished step (its end ≤ its time)
        steps[step] = current[0]
        f = book.forecast(_KEY)
        if f is not None:
            replicas = f.desired_replicas
            rows.append(
                (t, step, f.mean, f.upper, math.nan if replicas is None else replicas, float(f.model == settings.model))
            )
    return ServedRun(
        settings.step_s, settings.horizon_steps(horizon_s), steps, np.asarray(rows, dtype=float).reshape(-1, 6)
    )


def served_forecast(
    arrival_s: np.ndarray,
    *,
    horizon_s: float,
    capacity: float,
    settings: DemandSettings | None = None,
    refresh_s: float = 5.0,
    window_s: float = 60.0,
) -> tuple[np.ndarray, np.ndarray]:
    """(times in seconds from the first arrival, desired replicas) at each refresh with a forecast."""
    times, rates = trace_readings(arrival_s, refresh_s=refresh_s, window_s=window_s)
    run = walk(times, rates, horizon_s=horizon_s, settings=settings, capacity=capacity)
    return run.forecasts[:, 0], run.forecasts[:, 4]


@dataclass(frozen=True)
class ServedScore:
    """The served forecast's p90 at one horizon against what followed, beside naive's on the same steps."""

    horizon_s: float
    points: int  # forecasts scored (one per step: the one served when the step finished)
    loss: float  # mean pinball loss (q) of the served p90
    naive_loss: float  # the same of naive's p90 (the last value plus its own residuals' quantile)
    coverage: float  # share of steps at or below the served p90 (0.9 is calibrated)
    naive_coverage: float
    model_share: float  # share of scored forecasts the configured model made (the rest: naive, chosen)

    @property
    def ratio(self) -> float:
        return self.loss / self.naive_loss if self.naive_loss > 0 else math.nan


def _per_step(run: ServedRun) -> dict[int, tuple[float, float]]:
    """Step → (upper, made by the model) of the forecast served when that step finished (its last refresh's)."""
    return {int(step): (upper, by_model) for _, step, _, upper, _, by_model in run.forecasts}


def score(
    times: np.ndarray,
    rates: np.ndarray,
    *,
    horizon_s: float,
    settings: DemandSettings | None = None,
) -> ServedScore:
    """Walk the readings with the adapter's settings and with naive, and score both p90s on the steps where both
    were served: each step's forecast against the value of the step ``horizon`` later."""
    settings = settings or DemandSettings()
    served = walk(times, rates, horizon_s=horizon_s, settings=settings)
    naive = walk(times, rates, horizon_s=horizon_s, settings=replace(settings, model="naive"))
    h = served.horizon_steps
    ours, theirs = _per_step(served), _per_step(naive)
    scored = sorted(k for k in ours if k in theirs and k + h in served.steps)
    y = np.array([served.steps[k + h] for k in scored])
    upper = np.array([ours[k][0] for k in scored])
    naive_upper = np.array([theirs[k][0] for k in scored])
    if not scored:
        return ServedScore(horizon_s, 0, math.nan, math.nan, math.nan, math.nan, math.nan)
    q = settings.quantile
    return ServedScore(
        horizon_s,
        len(scored),
        pinball_loss(y, upper, q),
        pinball_loss(y, naive_upper, q),
        float(np.mean(y <= upper)),
        float(np.mean(y <= naive_upper)),
        float(np.mean([ours[k][1] for k in scored])),
    )


# The adapter's forecast metrics (adapter/forecasts.py) a replay can be fed: name → its column in
# ServedRun.forecasts.
FORECAST_COLUMNS = {
    "forecast_requests_per_second": 2,
    "forecast_requests_per_second_p90": 3,
    "forecast_desired_replicas": 4,
}


def forecast_series(
    arrival_s: np.ndarray,
    names: Iterable[str],
    *,
    horizon_s: float,
    capacity: float | None,
    origin: float = 0.0,
    settings: DemandSettings | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each named forecast metric as the adapter would have served it on these arrivals: name → (times on the
    clock ``origin`` + seconds from the first arrival, values), only where it was served."""
    times, rates = trace_readings(arrival_s)
    run = walk(times, rates, horizon_s=horizon_s, settings=settings, capacity=capacity)
    out = {}
    for name in names:
        values = run.forecasts[:, FORECAST_COLUMNS[name]]
        kept = ~np.isnan(values)
        out[name] = (run.forecasts[kept, 0] + origin, values[kept])
    return out


def series_csv(times: np.ndarray, values: np.ndarray, *, origin: float = 0.0) -> str:
    """``timestamp,value`` rows as ``gpuscale simulate --external NAME=@file.csv`` reads them."""
    rows = "".join(f"{origin + t:.3f},{v:.4f}\n" for t, v in zip(times, values, strict=True))
    return "timestamp,value\n" + rows
