"""Arrivals from ServeGen's per-client rate windows (benchmarks/data/servegen, Apache-2.0): held-out public traffic.

Each row is one client's 10-minute window: its mean rate, and the inter-arrival distribution fitted to it in
production (Gamma or Weibull, shape and scale). As ServeGen's own generator does (servegen/construct.py,
``_sample_iats``), a window gets ceil(rate × 600) inter-arrival times drawn from its distribution, scaled so they
span the window; the clients' arrivals are merged. The rates and their burstiness are production's; the
individual arrivals are drawn (seeded, the same every run).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "data" / "servegen"
TRACES = {
    "ServeGen mm-image (1 day)": "mm-image-rates.csv.gz",
    "ServeGen deepseek-r1 (1 day)": "deepseek-r1-rates.csv.gz",
}


def arrivals(file: str, *, seed: int = 38) -> np.ndarray:
    """Sorted arrival times in seconds from the first window's start."""
    rng = np.random.default_rng(seed)
    with gzip.open(DATA / file, "rt", newline="") as f:
        rows = list(csv.DictReader(io.StringIO(f.read())))
    out = []
    for row in rows:
        rate, pattern = float(row["rate"]), row["pattern"]
        if rate <= 0 or not pattern:
            continue
        shape, scale = float(row["shape"]), float(row["scale"])
        n, window = math.ceil(rate * 600), 600.0
        if pattern == "Gamma":
            gaps = rng.gamma(shape, scale, n)
        elif pattern == "Weibull":
            gaps = scale * rng.weibull(shape, n)
        else:
            raise ValueError(f"{file}: unknown arrival pattern {pattern!r}")
        gaps *= window / gaps.sum()
        out.append(float(row["window_start"]) + np.cumsum(gaps))
    return np.sort(np.concatenate(out))
