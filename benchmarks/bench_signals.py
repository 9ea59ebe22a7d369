"""Decision quality: which signal should an LLM Deployment's HPA scale on?

On three real traces (Azure LLM 2023 code and conversation, Mooncake FAST'25 conversation), an HPA on
``gpu_utilization`` is compared with one on ``inference_queue_depth`` and one on
``inference_queue_compute_ratio``, each over a sweep of targets, all else equal (minReplicas 1,
maxReplicas 20, 180 s model load, the adapter's 5 s refresh, the 15 s sync, the
same initial replicas), with the default ``behavior`` and with a slow scale-down (600 s window, one pod
per 120 s), as a Deployment whose replicas take minutes to start would use. Each run replays the trace
through ``gpuscale.replay`` (the serving model and the HPA algorithm of gpuscale.hpa) and reports
GPU-hours and the minutes whose p95 queue time exceeded 2 s.

Two comparisons per trace:
- matched SLO: the cheapest target of each signal whose violating minutes are at most the budget;
- matched GPU-hours: for each signal, the run whose GPU-hours are closest to the util-80 HPA's, and its SLO.

Usage: .venv/bin/python benchmarks/bench_signals.py [--budget-minutes 3] [--json out.json]
Deterministic: the same code gives the same numbers (rate scaling is seeded).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

from gpuscale.hpa import parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.serving import ServingProfile
from gpuscale.replay.trace_replay import ReplaySettings, replay
from gpuscale.replay.traces import read_trace

TRACES = Path(__file__).parents[1] / "tests" / "fixtures" / "traces"

# (file, rate scale): scaled so the hour needs several replicas of the default profile (Llama-3-8B, A100)
WORKLOADS = [
    ("AzureLLMInferenceTrace_code.csv.gz", 4.0),
    ("AzureLLMInferenceTrace_conv.csv.gz", 4.0),
    ("conversation_trace.jsonl.gz", 1.0),
]
SIGNALS = {
    "gpu_utilization": ["50", "65", "80", "90"],
    "inference_queue_depth": ["1", "2", "4", "8", "16"],
    "inference_queue_compute_ratio": ["100m", "250m", "500m", "1", "2"],
}
# The default behavior, and one for replicas that take minutes to start: give capacity back slowly
BEHAVIORS = {
    "default": "",
    "slow-down": """  behavior:
    scaleDown:
      stabilizationWindowSeconds: 600
      policies: [{type: Pods, value: 1, periodSeconds: 120}]
""",
}
MANIFEST = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {name}}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: llm}}
  minReplicas: 1
  maxReplicas: 20
  metrics:
    - type: Pods
      pods:
        metric: {{name: {metric}}}
        target: {{type: AverageValue, averageValue: "{target}"}}
{behavior}"""
INITIAL_REPLICAS = 4


def run(budget: int) -> dict:
    catalogue = load_catalogue()
    settings = ReplaySettings(initial_replicas=INITIAL_REPLICAS)
    profile = ServingProfile()
    report: dict = {"budget_minutes": budget, "workloads": []}
    for file, scale in WORKLOADS:
        trace = read_trace(TRACES / file).scaled(scale, seed=0)
        rows = []
        for (behavior, extra), (metric, targets) in itertools.product(BEHAVIORS.items(), SIGNALS.items()):
            for target in targets:
                text = MANIFEST.format(name=f"{metric}-{target}", metric=metric, target=target, behavior=extra)
                hpa = parse_manifests(text, source="-")[0]
                cpu = time.process_time()
                out = replay(trace, hpa, catalogue=catalogue, profile=profile, settings=settings).to_json()
                rows.append(
                    {
                        "behavior": behavior,
                        "metric": metric,
                        "target": target,
                        "gpu_hours": out["gpu_hours"],
                        "violating_minutes": out["slo"]["violating_minutes"],
                        "minutes": out["slo"]["minutes"],
                        "queue_p95_s": out["queue_time_s"]["p95"],
                        "queue_p99_s": out["queue_time_s"]["p99"],
                        "max_replicas": out["max_replicas"],
                        "scale_events": out["scale_ups"] + out["scale_downs"],
                        "cpu_s": round(time.process_time() - cpu, 2),
                    }
                )
        report["workloads"].append({"trace": file, "rate_scale": scale, "requests": len(trace), "runs": rows})
    return report


def summarize(report: dict) -> str:
    lines = []
    budget = report["budget_minutes"]
    for w0, behavior in itertools.product(report["workloads"], BEHAVIORS):
        w = {**w0, "runs": [r for r in w0["runs"] if r["behavior"] == behavior]}
        lines.append(f"\n## {w['trace']} ×{w['rate_scale']:g} ({w['requests']} requests), behavior: {behavior}\n")
        lines.append("| signal | target | GPU-h | SLO-violating min | p95 queue s | max pods | scale events |")
        lines.append("|---|---|---:|---:|---:|---:|---:|")
        for r in w["runs"]:
            lines.append(
                f"| {r['metric']} | {r['target']} | {r['gpu_hours']:.2f} | {r['violating_minutes']}/{r['minutes']} | "
                f"{r['queue_p95_s']:.1f} | {r['max_replicas']} | {r['scale_events']} |"
            )
        reference = next(r for r in w["runs"] if r["metric"] == "gpu_utilization" and r["target"] == "80")
        lines.append(f"\nMatched SLO (≤ {budget} violating minutes), cheapest target per signal:")
        for metric in SIGNALS:
            ok = [r for r in w["runs"] if r["metric"] == metric and r["violating_minutes"] <= budget]
            if ok:
                best = min(ok, key=lambda r: r["gpu_hours"])
                lines.append(
                    f"- {metric} {best['target']}: {best['gpu_hours']:.2f} GPU-h ({best['violating_minutes']} min)"
                )
            else:
                best = min((r for r in w["runs"] if r["metric"] == metric), key=lambda r: r["violating_minutes"])
                lines.append(
                    f"- {metric}: no target meets it; fewest violations {best['violating_minutes']} min at "
                    f"{best['target']} ({best['gpu_hours']:.2f} GPU-h)"
                )
        lines.append(f"\nMatched GPU-hours (closest to gpu_utilization 80's {reference['gpu_hours']:.2f} GPU-h):")
        for metric in SIGNALS:
            near = min(
                (r for r in w["runs"] if r["metric"] == metric),
                key=lambda r: abs(r["gpu_hours"] - reference["gpu_hours"]),
            )
            lines.append(
                f"- {metric} {near['target']}: {near['gpu_hours']:.2f} GPU-h, "
                f"{near['violating_minutes']} violating min, "
                f"p95 queue {near['queue_p95_s']:.1f} s"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-minutes", type=int, default=3)
    parser.add_argument("--json", help="also write the raw results here")
    args = parser.parse_args()
    cpu = time.process_time()
    report = run(args.budget_minutes)
    print(summarize(report))
    print(f"\n{sum(len(w['runs']) for w in report['workloads'])} replays in {time.process_time() - cpu:.1f} s of CPU")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
