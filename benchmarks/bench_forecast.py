"""Cost of forecasting every workload every refresh (issue 26): DemandBook.observe + forecast() per workload.

Per refresh the adapter hands the book each workload's request rate and asks for each forecast. Measured here
in steady state (every workload has a full residual window) for 100, 1,000 and 5,000 workloads, refreshes
every 5 s with 15 s steps (so one refresh in three finishes a step and runs the models), for the served
model (holt) beside the naive baseline in the same run. Prints CPU ms per refresh (mean over the refreshes
of 3 steps, so the step-finishing refresh is weighted as it occurs) and µs per workload.

Usage: .venv/bin/python benchmarks/bench_forecast.py [--workloads 100,1000,5000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gpuscale.metrics.demand import DemandBook, DemandSettings


def run(model: str, workloads: int) -> tuple[float, float]:
    book = DemandBook(DemandSettings(model=model, residual_window=240))
    keys = [f"ns/w{i}" for i in range(workloads)]
    rng = np.random.default_rng(26)
    base = rng.uniform(0.5, 20, workloads)
    horizons = dict.fromkeys(keys, 120.0)

    def refresh(t: float) -> None:
        rates = dict(
            zip(keys, (base * (1 + 0.2 * np.sin(t / 600)) + rng.normal(0, 0.3, workloads)).tolist(), strict=True)
        )
        book.observe(t, rates, horizons)
        for k in keys:
            book.forecast(k)

    t = 0.0
    # warm up: 10 min history plus a full residual window (240 steps of 15 s = 1 h), 5 s refreshes
    warm_until = 600 + 240 * 15 + 60
    while t < warm_until:
        rates = dict(zip(keys, (base + rng.normal(0, 0.3, workloads)).tolist(), strict=True))
        book.observe(t, rates, horizons)
        t += 5.0
    assert book.forecast(keys[0]) is not None
    refreshes = 12
    started = time.process_time()
    for _ in range(refreshes):
        refresh(t)
        t += 5.0
    ms = (time.process_time() - started) / refreshes * 1000
    return ms, ms * 1000 / workloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="100,1000,5000")
    args = parser.parse_args()
    print("| workloads | holt ms/refresh | µs/workload | naive ms/refresh | holt ÷ naive |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.workloads.split(",")):
        holt, per = run("holt", n)
        naive, _ = run("naive", n)
        print(f"| {n:,} | {holt:.1f} | {per:.1f} | {naive:.1f} | {holt / naive:.2f} |")


if __name__ == "__main__":
    main()
