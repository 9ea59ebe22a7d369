"""Forecast backtests (issue 26): error by horizon of each model vs the naive last value, on real and synthetic traces.

Walks forward through each trace's request rate (15 s steps), forecasting at every step exactly as the adapter
does (gpuscale/metrics/forecast.py), and prints one Markdown table per trace: MAPE, pinball loss of the mean
(q 0.5) and of the p90 (q 0.9), and the p90's coverage, each model beside naive, on the same steps. MAPE counts
steps with at least one request (it is undefined at 0). Traces: the Azure LLM 2023
code and conversation traces and Mooncake's conversation trace (tests/fixtures/traces, ~1 h each), and 14
synthetic diurnal days (benchmarks/diurnal.py: Poisson arrivals from a seeded daily cycle with bursts).

Usage: .venv/bin/python benchmarks/forecast_backtest.py [--days 14] [--horizons 2,4,8,12]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import diurnal

from gpuscale.metrics.forecast import MODELS, backtest, rate_series
from gpuscale.replay.traces import read_trace

TRACES = Path(__file__).parents[1] / "tests" / "fixtures" / "traces"
REAL = {
    "Azure code": "AzureLLMInferenceTrace_code.csv.gz",
    "Azure conv": "AzureLLMInferenceTrace_conv.csv.gz",
    "Mooncake conv": "conversation_trace.jsonl.gz",
}
STEP_S = 15.0


def series() -> dict[str, tuple[np.ndarray, int]]:
    """name → (requests/s per 15 s step, season in steps or 0)."""
    out = {}
    for name, file in REAL.items():
        out[name] = (rate_series(read_trace(TRACES / file).arrival_s, step_s=STEP_S), 0)
    return out


def table(name: str, y: np.ndarray, season: int, horizons: list[int]) -> str:
    models = [m for m, spec in MODELS.items() if season or not spec.needs_season]
    rows = [
        f"**{name}** — {len(y)} steps of {STEP_S:g} s, mean {y.mean():.2f} req/s"
        + (
            f"; scored after the first season ({season} steps) so every model is compared on the same steps"
            if season
            else ""
        ),
        "",
        "| horizon | model | points | MAPE % | pinball q0.5 | pinball p90 | p90 coverage | MAPE ÷ naive "
        "| p90 pinball ÷ naive |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for h in horizons:
        scores = backtest(y, models=models, horizon_steps=h, season_steps=season, mape_floor=1 / STEP_S)
        naive = scores[0]
        for s in scores:
            rows.append(
                f"| {h * STEP_S:g} s | {s.model} | {s.points} | {s.mape_percent:.1f} | {s.pinball_mean:.3f} | "
                f"{s.pinball_upper:.3f} | {s.coverage:.2f} | {s.mape_percent / naive.mape_percent:.2f} | "
                f"{s.pinball_upper / naive.pinball_upper:.2f} |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=14.0, help="synthetic diurnal days (default 14)")
    parser.add_argument("--horizons", default="2,4,8,12", help="horizons in 15 s steps (default 2,4,8,12)")
    args = parser.parse_args()
    horizons = [int(h) for h in args.horizons.split(",")]
    started = time.process_time()
    traces = series()
    synthetic = diurnal.arrivals(diurnal.rate(days=args.days, step_s=STEP_S), step_s=STEP_S)
    traces[f"Synthetic diurnal, {args.days:g} days"] = (
        rate_series(synthetic, step_s=STEP_S, duration_s=args.days * diurnal.DAY_S),
        int(diurnal.DAY_S / STEP_S),
    )
    for name, (y, season) in traces.items():
        print(table(name, y, season, horizons))
        print()
    print(f"({time.process_time() - started:.1f} s of CPU)")


if __name__ == "__main__":
    main()
