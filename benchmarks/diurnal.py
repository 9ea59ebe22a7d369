"""Synthetic diurnal demand for the forecast backtests and replays (seeded, so every run is the same).

Not measured data: a daily cycle (night ≈ 15 % of the peak, a weekday/weekend difference), slow
multiplicative noise (log-AR(1), ~30 min memory), and bursts with no precursor (a few a day: ×1.5–×3 for
3–20 minutes, starting within one step) — the case a forecast cannot see coming. ``rate(...)`` gives the
expected requests/s per step; ``arrivals(...)`` draws a Poisson process from it.
"""

from __future__ import annotations

import math

import numpy as np

DAY_S = 86_400.0


def rate(*, days: float, step_s: float = 15.0, peak_rps: float = 8.0, bursts_per_day: float = 4.0, seed: int = 26):
    """Expected requests/s in each ``step_s`` step of ``days`` days."""
    rng = np.random.default_rng(seed)
    n = int(days * DAY_S / step_s)
    t = np.arange(n) * step_s
    phase = (t % DAY_S) / DAY_S
    # a working-day shape: low at 04:00, a morning ramp, a plateau with a lunch dip, an evening decline
    daily = 0.15 + 0.85 * np.clip(np.sin(math.pi * np.clip((phase - 0.25) / 0.7, 0, 1)) ** 1.5, 0, None)
    daily *= 1 - 0.12 * np.exp(-(((phase - 0.54) / 0.025) ** 2))
    weekday = np.where(((t // DAY_S) % 7) >= 5, 0.6, 1.0)
    rho = math.exp(-step_s / 1800.0)
    shocks = rng.normal(0.0, 0.12 * math.sqrt(1 - rho**2), n)
    noise = np.empty(n)
    level = 0.0
    for i in range(n):
        level = rho * level + shocks[i]
        noise[i] = level
    burst = np.ones(n)
    for _ in range(rng.poisson(bursts_per_day * days)):
        start = rng.integers(0, n)
        length = int(rng.uniform(180, 1200) / step_s)
        burst[start : start + length] *= rng.uniform(1.5, 3.0)
    return peak_rps * daily * weekday * np.exp(noise) * burst


def arrivals(rates: np.ndarray, *, step_s: float = 15.0, seed: int = 26) -> np.ndarray:
    """Poisson arrival times (seconds from 0) with the rate piecewise constant per step."""
    rng = np.random.default_rng(seed + 1)
    counts = rng.poisson(rates * step_s)
    starts = np.repeat(np.arange(len(rates)) * step_s, counts)
    return np.sort(starts + rng.random(len(starts)) * step_s)
