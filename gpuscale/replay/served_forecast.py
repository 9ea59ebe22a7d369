"""The forecast the adapter would have served on a trace, for replays through ``--external`` (issue 26).

Walks forward through a trace's arrivals as the adapter's refresh loop does: every ``refresh_s`` the request
rate over the last ``window_s`` (the catalogue's window for ``inference_requests_per_second``) goes into the
DemandBook (metrics/demand.py, the adapter's model and settings), and ``forecast_desired_replicas`` (the p90
at the horizon ÷ capacity per replica) is recorded whenever the adapter would serve it — never in the first
``min_history_s``. NB: arrivals stand in for the finished requests the adapter reads; the two differ while
replicas are saturated (the adapter then under-reads a rise).
"""

from __future__ import annotations

import numpy as np

from gpuscale.metrics.demand import DemandBook, DemandSettings


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
    book = DemandBook(settings or DemandSettings())
    times: list[float] = []
    values: list[float] = []
    end = float(arrival_s[-1]) if len(arrival_s) else 0.0
    for t in np.arange(refresh_s, end + refresh_s, refresh_s):
        seen = np.searchsorted(arrival_s, [t - window_s, t], side="right")
        rate = float(seen[1] - seen[0]) / min(window_s, float(t))
        book.observe(float(t), {"w": rate}, {"w": horizon_s}, {"w": capacity})
        f = book.forecast("w")
        if f is not None and f.desired_replicas is not None:
            times.append(float(t))
            values.append(f.desired_replicas)
    return np.asarray(times), np.asarray(values)


def series_csv(times: np.ndarray, values: np.ndarray, *, origin: float = 0.0) -> str:
    """``timestamp,value`` rows as ``gpuscale simulate --external NAME=@file.csv`` reads them."""
    rows = "".join(f"{origin + t:.3f},{v:.4f}\n" for t, v in zip(times, values, strict=True))
    return "timestamp,value\n" + rows
