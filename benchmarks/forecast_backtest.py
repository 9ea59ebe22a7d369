"""Forecast backtests, as served (issues 26, 38): the adapter's own path on real, held-out and synthetic traffic.

Every trace is walked through the adapter's DemandBook exactly as ``gpuscale backtest`` does
(gpuscale/replay/served_forecast.py): every 5 s the workload's request rate over the last 60 s (what the adapter
reads as ``inference_requests_per_second``) goes into the book with the adapter's default settings (holt, chosen
per workload against the last value; 15 s steps; 10 min of history), and each finished step's served p90 is judged
against the value of the step one horizon later (what ``workload_requests_per_second`` serves for it). Beside it,
naive — the last value with its own empirical p90 — on the same steps.

Traces: shipped with the package (gpuscale/replay/data: the demo's 30-minute Azure conversation slice, the
synthetic 2-hour text-to-image trace), the three real traces the Holt parameters were tuned on
(tests/fixtures/traces: Azure LLM 2023 code and conversation, Mooncake conversation), two held out — never used to
choose any setting — (ServeGen mm-image and deepseek-r1, one day each: benchmarks/servegen.py), and synthetic
diurnal days (benchmarks/diurnal.py).

``--inputs`` adds the table the input was chosen by: the served forecast fed the catalogue's 60 s rate (what the
adapter reads) or per-step counts (a rate over each 5 s refresh, averaged per 15 s step), each judged against both
truths — the 60 s rate at the end of the target step, and the target step's own arrivals.

Usage: .venv/bin/python benchmarks/forecast_backtest.py [--days 2] [--horizons 30,60,90,180] [--inputs]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import diurnal
import servegen

from gpuscale.metrics.demand import DemandSettings
from gpuscale.metrics.forecast import pinball_loss
from gpuscale.replay.served_forecast import score, trace_readings, walk
from gpuscale.replay.traces import read_trace

ROOT = Path(__file__).parents[1]
SHIPPED = {
    "Azure conv 15–45 min (shipped)": ROOT / "gpuscale/replay/data/azure-conv-15-45min.csv.gz",
    "Text-to-image 2 h (shipped, synthetic)": ROOT / "gpuscale/replay/data/text-to-image-2h.csv.gz",
}
TUNED = {
    "Azure code (tuned on)": ROOT / "tests/fixtures/traces/AzureLLMInferenceTrace_code.csv.gz",
    "Azure conv (tuned on)": ROOT / "tests/fixtures/traces/AzureLLMInferenceTrace_conv.csv.gz",
    "Mooncake conv (tuned on)": ROOT / "tests/fixtures/traces/conversation_trace.jsonl.gz",
}


def traces(days: float) -> dict[str, np.ndarray]:
    out = {name: read_trace(path).arrival_s for name, path in {**SHIPPED, **TUNED}.items()}
    for name, file in servegen.TRACES.items():
        out[f"{name} (held out)"] = servegen.arrivals(file)
    if days > 0:
        rate = diurnal.rate(days=days, step_s=15.0)
        out[f"Synthetic diurnal, {days:g} days"] = diurnal.arrivals(rate, step_s=15.0)
    return out


def served_table(named: dict[str, np.ndarray], horizons: list[float]) -> str:
    rows = [
        "| trace | horizon | points | served p90 loss | naive p90 loss | ratio | coverage | naive coverage "
        "| holt served |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, arrivals in named.items():
        times, rates = trace_readings(arrivals)
        for h in horizons:
            s = score(times, rates, horizon_s=h)
            rows.append(
                f"| {name} | {h:g} s | {s.points} | {s.loss:.4f} | {s.naive_loss:.4f} | **{s.ratio:.3f}** | "
                f"{s.coverage:.2f} | {s.naive_coverage:.2f} | {s.model_share:.0%} |"
            )
    return "\n".join(rows)


def _judged(arrivals: np.ndarray, window_s: float, horizon_s: float, truths: dict[str, np.ndarray]) -> list[str]:
    """The served forecast fed a rate over ``window_s`` every 5 s, judged against each truth (per step index)."""
    times, rates = trace_readings(arrivals, window_s=window_s)
    run = walk(times, rates, horizon_s=horizon_s)
    h = run.horizon_steps
    made = {int(step): upper for _, step, _, upper, _, _ in run.forecasts}
    cells = []
    for truth in truths.values():
        scored = [k for k in made if k + h < len(truth)]
        y = truth[[k + h for k in scored]]
        upper = np.array([made[k] for k in scored])
        cells.append(f"{pinball_loss(y, upper, 0.9):.4f} / {np.mean(y <= upper):.2f}")
    return cells


def inputs_table(named: dict[str, np.ndarray], horizons: list[float]) -> str:
    step = DemandSettings().step_s
    rows = [
        "| trace | horizon | input | vs the 60 s rate: p90 loss / coverage "
        "| vs the step's arrivals: p90 loss / coverage |",
        "|---|---|---|---|---|",
    ]
    for name, arrivals in named.items():
        ends = np.arange(1, int(arrivals[-1] // step) + 2) * step  # step k ends at (k + 1) × step
        upto = np.searchsorted(arrivals, ends, side="right")
        truths = {
            "60 s rate at the step's end": (upto - np.searchsorted(arrivals, ends - 60.0, side="right")) / 60.0,
            "the step's arrivals": (upto - np.searchsorted(arrivals, ends - step, side="right")) / step,
        }
        for h in horizons:
            for label, window in (("60 s rate (served)", 60.0), ("per-step counts", 5.0)):
                cells = " | ".join(_judged(arrivals, window, h, truths))
                rows.append(f"| {name} | {h:g} s | {label} | {cells} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=2.0, help="synthetic diurnal days (default 2; 0: none)")
    parser.add_argument("--horizons", default="30,60,90,180", help="horizons in seconds (default 30,60,90,180)")
    parser.add_argument("--inputs", action="store_true", help="also the input comparison (tuned-on traces)")
    args = parser.parse_args()
    horizons = [float(h) for h in args.horizons.split(",")]
    started = time.process_time()
    named = traces(args.days)
    print(served_table(named, horizons))
    if args.inputs:
        print()
        real = {n: a for n, a in named.items() if n in TUNED or n.startswith("Text-to-image")}
        print(inputs_table(real, [60.0, 180.0]))
    print(f"\n({time.process_time() - started:.1f} s of CPU)")


if __name__ == "__main__":
    main()
