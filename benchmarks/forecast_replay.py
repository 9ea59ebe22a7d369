"""Predictive vs reactive HPAs, replayed (issues 26, 38): `gpuscale simulate` on each trace, with and without forecast.

For each trace this script writes (in a temporary directory):
  * the trace as a general service (``timestamp,service_time``): the image trace keeps its service times; the
    LLM traces (Azure code and conv, Mooncake) get one per request from its tokens — 0.1 s + 50 µs per prompt
    token + 25 ms per generated token (a decode step shared in a batch) — and a replica serves 8 at once;
    the synthetic diurnal days are Poisson arrivals from benchmarks/diurnal.py with lognormal service times;
  * nothing for the forecast: simulate computes the one the predictive HPAs name, as the adapter would have
    served it (gpuscale/replay/served_forecast.py: every 5 s refresh the rate over the last 60 s into the
    adapter's demand book, model and settings; ``--forecast-horizon`` the median start-up, as the adapter
    measures it): ``forecast_desired_replicas`` = p90 ÷ ``--forecast-capacity``, 75 % of concurrency ÷ mean
    service time; absent during the first 10 minutes;
  * reactive HPAs on the Pods queue depth (targets 1, 2, 4 per pod; 1 and 2 also with a slow scale-down, one pod
    per 2 minutes; 2 also with scale-ups limited to doubling per minute) and on the Pods request rate (AverageValue =
    the capacity per replica: the forecast's arithmetic on the rate now), and each of them again with the External
    forecast metric added (AverageValue 1) — the recommended two-metric form;
then runs `gpuscale simulate --trace … --hpa … --forecast-capacity C --forecast-horizon H --startup DIST --output
json` twice per trace (without and with the forecast) with start-ups drawn from a lognormal distribution, and
prints one Markdown table per trace — queue-wait p95, SLO-violation minutes (p95 queue wait > 2 s in a minute),
GPU-hours and max pods of each HPA without and with the forecast — and a summary: the best reactive and the best
predictive HPA per trace (fewest SLO-violation minutes, then fewest GPU-hours).

Usage: .venv/bin/python benchmarks/forecast_replay.py [--days 2] [--traces code,conv,mooncake,image,diurnal]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

import diurnal

from gpuscale.replay.distributions import parse_distribution
from gpuscale.replay.traces import Trace, read_trace

ROOT = Path(__file__).parents[1]
TRACES = ROOT / "tests" / "fixtures" / "traces"
ORIGIN = 1_764_806_400.0  # the written traces' clock: 2025-12-04T00:00:00Z
STEP_S = 15.0
CONCURRENCY = 8
UTILISATION = 0.75
LLM_STARTUP = "lognormal:p50=90s,p95=180s"  # a large model's load: minutes at the tail
IMAGE_STARTUP = "lognormal:p50=22.7s,p95=45.4s"  # the base-model load the issue measured
QUEUE_TARGETS = (1, 2, 4)


def llm_service(trace: Trace) -> np.ndarray:
    return 0.1 + 50e-6 * trace.input_tokens + 0.025 * trace.output_tokens


def cases(days: float) -> dict[str, tuple[np.ndarray, np.ndarray, str, float]]:
    """name → (arrival seconds, service seconds, start-up distribution, rate scale used)."""
    out = {}
    for name, file, scale in (
        ("Azure code ×4", "AzureLLMInferenceTrace_code.csv.gz", 4.0),
        ("Azure conv ×2", "AzureLLMInferenceTrace_conv.csv.gz", 2.0),
        ("Mooncake conv ×2", "conversation_trace.jsonl.gz", 2.0),
    ):
        trace = read_trace(TRACES / file).scaled(scale, seed=26)
        out[name] = (trace.arrival_s, llm_service(trace), LLM_STARTUP, scale)
    image = read_trace(ROOT / "gpuscale" / "replay" / "data" / "text-to-image-2h.csv.gz")
    assert image.service_s is not None
    out["Text-to-image 2 h (synthetic)"] = (image.arrival_s, image.service_s, IMAGE_STARTUP, 1.0)
    rates = diurnal.rate(days=days, step_s=STEP_S, peak_rps=6.0)
    arrivals = diurnal.arrivals(rates, step_s=STEP_S)
    service = np.random.default_rng(27).lognormal(np.log(1.2), np.log(4 / 1.2) / 1.645, len(arrivals))
    out[f"Diurnal {days:g} days (synthetic)"] = (arrivals, service, IMAGE_STARTUP, 1.0)
    return out


def reactive_metrics(capacity: float) -> dict[str, str]:
    """The reactive candidates: HPA name → its metrics (YAML list items)."""
    out = {
        f"queue-{target}": f"""
    - type: Pods
      pods:
        metric: {{name: inference_queue_depth}}
        target: {{type: AverageValue, averageValue: "{target}"}}"""
        for target in QUEUE_TARGETS
    }
    out["queue-1-slow"] = out["queue-1"]
    out["queue-2-slow"] = out["queue-2"]
    out["queue-2-damped"] = out["queue-2"]
    # the forecast's own arithmetic on the rate now: requests/s per pod at the capacity per replica
    out["rate"] = f"""
    - type: Pods
      pods:
        metric: {{name: inference_requests_per_second}}
        target: {{type: AverageValue, averageValue: "{round(capacity * 1000)}m"}}"""
    return out


FORECAST_METRIC = """
    - type: External
      external:
        metric: {name: forecast_desired_replicas}
        target: {type: AverageValue, averageValue: "1"}"""


# NB: a queue metric with a long start-up overshoots (the queue keeps growing until the first new replica is
# ready, and every sync asks for more); limiting scale-ups to doubling per minute is the usual tuning for it.
DAMPED = """
    scaleUp:
      policies: [{type: Percent, value: 100, periodSeconds: 60}]"""
# NB: a queue-only HPA scales to minReplicas once its replicas drain the queue (the queue reads 0), then starts
# over a start-up late; removing one pod per 2 minutes is the usual tuning for it (deploy/examples/llm-hpa.yaml).
SLOW_DOWN = """
      policies: [{type: Pods, value: 1, periodSeconds: 120}]"""


def hpa(name: str, metrics: str) -> str:
    behavior = DAMPED if "damped" in name else ""
    slow = SLOW_DOWN if "slow" in name else ""
    return f"""apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {name}}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: server}}
  minReplicas: 1
  maxReplicas: 40
  metrics:{metrics}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 300{slow}{behavior}
"""


def simulate(
    directory: Path, trace: Path, hpas: list[Path], startup: str, forecast: tuple[float, float] | None, *, initial: int
) -> list[dict]:
    command = [sys.executable, "-m", "gpuscale", "simulate", "--trace", str(trace), "--output", "json"]
    command += ["--concurrency", str(CONCURRENCY), "--startup", startup, "--initial-replicas", str(initial)]
    for h in hpas:
        command += ["--hpa", str(h)]
    if forecast is not None:  # NB: simulate computes the forecast the HPA names, as the adapter would serve it
        capacity, horizon = forecast
        command += ["--forecast-capacity", f"{capacity:.6g}", "--forecast-horizon", f"{horizon:.6g}"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=directory)
    if done.returncode:
        raise SystemExit(f"gpuscale simulate failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout)["results"]


def cells(r: dict) -> str:
    return f"{r['queue_wait_s']['p95']:.1f} | {r['slo_violation_minutes']} | {r['gpu_hours']:.2f} | {r['max_replicas']}"


def best(results: list[dict]) -> dict:
    """Fewest SLO-violation minutes, then fewest GPU-hours."""
    return min(results, key=lambda r: (r["slo_violation_minutes"], r["gpu_hours"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=2.0, help="synthetic diurnal days (default 2)")
    parser.add_argument("--traces", default="code,conv,mooncake,image,diurnal")
    args = parser.parse_args()
    wanted = args.traces.split(",")
    keys = {
        "code": "Azure code",
        "conv": "Azure conv",
        "mooncake": "Mooncake",
        "image": "Text-to-image",
        "diurnal": "Diurnal",
    }
    started = time.process_time()
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, (name, (arrivals, service, startup, _)) in enumerate(cases(args.days).items()):
            if not any(name.startswith(keys[w]) for w in wanted):
                continue
            d = Path(tmp) / str(n)
            d.mkdir()
            trace = d / "trace.csv"
            trace.write_text(
                "timestamp,service_time\n"
                + "".join(f"{ORIGIN + a:.3f},{s:.4f}\n" for a, s in zip(arrivals, service, strict=True))
            )
            capacity = UTILISATION * CONCURRENCY / float(np.mean(service))
            # the adapter's measured horizon: the median start-up of the pods it has seen
            draws = parse_distribution(startup, flag="--startup").draw(np.random.default_rng(0), 1000)
            horizon = float(np.median(draws))
            candidates = reactive_metrics(capacity)
            reactive, predictive = [], []
            for hpa_name, metrics in candidates.items():
                for suffix, extra, paths in (("", "", reactive), ("-forecast", FORECAST_METRIC, predictive)):
                    path = d / f"{hpa_name}{suffix}.yaml"
                    path.write_text(hpa(hpa_name + suffix, metrics + extra))
                    paths.append(path)
            # NB: start with the replicas the first minute needs, as a service already running would: starting every
            # HPA at 1 replica into a full-rate trace made the first minutes a cold start that no HPA (and no
            # forecast, which has no history yet) could avoid, and that dominated the comparison
            initial = max(1, math.ceil(np.searchsorted(arrivals, 60.0) / 60.0 / capacity))
            plain = simulate(d, trace, reactive, startup, None, initial=initial)
            forecast = simulate(d, trace, predictive, startup, (capacity, horizon), initial=initial)
            minutes = plain[0]["slo"]["minutes"]
            print(
                f"**{name}** — {len(arrivals):,} requests over {minutes} minutes, start-up {startup}, "
                f"{CONCURRENCY} at once per replica, capacity {capacity:.2f} req/s per replica, "
                f"horizon {horizon:.0f} s, {initial} replicas at the start\n"
            )
            print(
                "| HPA | queue wait p95 s | SLO-violation min | GPU-hours | max pods "
                "| + forecast: queue wait p95 s | SLO-violation min | GPU-hours | max pods |"
            )
            print("|---|---|---|---|---|---|---|---|---|")
            for r, f in zip(plain, forecast, strict=True):
                print(f"| {r['hpa']} | {cells(r)} | {cells(f)} |")
            b_r, b_p = best(plain), best(forecast)
            paired = forecast[plain.index(b_r)]  # the best reactive HPA with the forecast added
            summary.append(
                f"| {name} | {b_r['hpa']} | {b_r['slo_violation_minutes']} | {b_r['gpu_hours']:.2f} | "
                f"{paired['slo_violation_minutes']} | {paired['gpu_hours']:.2f} | "
                f"{b_p['hpa']} | {b_p['slo_violation_minutes']} | {b_p['gpu_hours']:.2f} | "
                f"{(b_p['gpu_hours'] / b_r['gpu_hours'] - 1) * 100:+.0f} % |"
            )
            print()
            sys.stdout.flush()
    print("**Best of each** (fewest SLO-violation minutes, then fewest GPU-hours)\n")
    print(
        "| trace | best reactive | SLO-violation min | GPU-hours | it + forecast: SLO-violation min | GPU-hours "
        "| best predictive | SLO-violation min | GPU-hours | GPU-hours best vs best |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(summary))
    print(f"\n({time.process_time() - started:.1f} s of CPU in this process; simulate runs in child processes)")


if __name__ == "__main__":
    main()
