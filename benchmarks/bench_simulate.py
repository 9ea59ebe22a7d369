"""Replay speed: one hour of the Azure conversation trace (19,366 requests) against three HPA manifests.

Goal: ≤ 10 s of CPU for the three replays (trace parsing included). Prints CPU seconds (process time, so the
shared machine's other load counts little), simulated replica-hours and the cost per simulated replica-hour.
Peer, in the same run: the same replay with the replica count pinned (minReplicas = maxReplicas), i.e. the
serving model alone, to show what the HPA in the loop adds.

Usage: .venv/bin/python benchmarks/bench_simulate.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from gpuscale.hpa import parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.serving import ServingProfile
from gpuscale.replay.trace_replay import ReplaySettings, replay
from gpuscale.replay.traces import read_trace

TRACE = Path(__file__).parents[1] / "tests" / "fixtures" / "traces" / "AzureLLMInferenceTrace_conv.csv.gz"
MANIFEST = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {metric}}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: llm}}
  minReplicas: {low}
  maxReplicas: {high}
  metrics:
    - type: Pods
      pods:
        metric: {{name: {metric}}}
        target: {{type: AverageValue, averageValue: "{target}"}}
"""
THREE = [("gpu_utilization", "80"), ("inference_queue_depth", "4"), ("inference_queue_compute_ratio", "1")]


def once(low: int | None) -> tuple[float, float]:
    cpu = time.process_time()
    catalogue = load_catalogue()
    trace = read_trace(TRACE)
    replica_hours = 0.0
    for metric, target in THREE:
        text = MANIFEST.format(metric=metric, target=target, low=low or 1, high=low or 20)
        out = replay(
            trace,
            parse_manifests(text, source="-")[0],
            catalogue=catalogue,
            profile=ServingProfile(),
            settings=ReplaySettings(),
        )
        replica_hours += out.replica_hours
    return time.process_time() - cpu, replica_hours


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for label, low in (("three HPA manifests", None), ("peer: replicas pinned at 4", 4)):
        runs = [once(low) for _ in range(args.repeat)]
        cpu = [c for c, _ in runs]
        hours = runs[0][1]
        med = statistics.median(cpu)
        print(
            f"{label}: CPU {med:.2f} s median of {args.repeat} (best {min(cpu):.2f} s); "
            f"{hours:.1f} simulated replica-hours; {1000 * med / hours:.0f} ms CPU per replica-hour"
        )


if __name__ == "__main__":
    main()
