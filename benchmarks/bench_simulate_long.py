"""Long traces: a 23-day service-time trace through `gpuscale simulate`'s general model, HPA every 15 s.

Goal (issue 23): ≤ 60 s on this machine for 23 days with one HPA decision per 15 s. The trace is synthetic
and seeded (a diurnal Poisson process, 0.2–2 requests/s, lognormal service times p50 1.2 s / p95 4 s: about
2.2 million requests), written as CSV first so parsing is measured too. Prints CPU seconds (process time, so
the shared machine's other load counts little) and wall seconds for: parsing, the whole CLI run
(`run_simulate`: parse + replay + summary), and the peer in the same run: the first 2 days sampled every
second (``general_step_s`` 1 s instead of the refresh interval's 5 s), the step the LLM model needs.

With ``--model llm`` the same arrivals carry token counts instead (prompts lognormal p50 1,000 tokens, outputs
p50 200, Azure-conversation-like) and go through the LLM token model with the same HPA; the peer is then
the first 2 hours of that trace.

``--rate-scale X`` offers X times the requests (as the CLI's flag: same arrival pattern), for a load that
keeps several replicas busy.

Usage: .venv/bin/python benchmarks/bench_simulate_long.py [--days 23] [--model general|llm] [--rate-scale 1]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from gpuscale.cli.simulate import SimulateSettings, run_simulate
from gpuscale.hpa import parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.distributions import parse_distribution
from gpuscale.replay.general import ServiceProfile
from gpuscale.replay.serving import ServingProfile
from gpuscale.replay.trace_replay import ReplaySettings, replay
from gpuscale.replay.traces import read_trace

HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: image-queue}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: image}
  minReplicas: 1
  maxReplicas: 20
  metrics:
    - type: Pods
      pods:
        metric: {name: inference_queue_depth}
        target: {type: AverageValue, averageValue: "2"}
"""


def write_trace(path: Path, days: float, *, tokens: bool = False) -> int:
    rng = np.random.default_rng(23)
    span, peak = days * 86400, 2.0
    t = np.cumsum(rng.exponential(1 / peak, int(span * peak * 1.05)))
    t = t[t < span]
    rate = 0.2 + (peak - 0.2) * (1 - np.cos(2 * math.pi * t / 86400)) / 2
    t = t[rng.random(len(t)) < rate / peak]
    service = rng.lognormal(math.log(1.2), math.log(4 / 1.2) / 1.6448536, len(t))
    if tokens:
        prompt = np.maximum(1, rng.lognormal(math.log(1000), 0.8, len(t))).astype(np.int64)
        output = np.maximum(1, rng.lognormal(math.log(200), 0.8, len(t))).astype(np.int64)
        columns = [np.char.mod("%.3f", t), np.char.mod("%d", prompt), np.char.mod("%d", output)]
        header = "timestamp,input_tokens,output_tokens"
    else:
        columns = [np.char.mod("%.3f", t), np.char.mod("%.3f", service)]
        header = "timestamp,service_time"
    rows = columns[0]
    for column in columns[1:]:
        rows = np.char.add(np.char.add(rows, ","), column)
    path.write_text(header + "\n" + "\n".join(rows.tolist()) + "\n")
    return len(t)


def timed(fn):
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=float, default=23.0)
    parser.add_argument("--model", choices=("general", "llm"), default="general")
    parser.add_argument("--rate-scale", type=float, default=1.0)
    args = parser.parse_args()
    llm = args.model == "llm"
    with tempfile.TemporaryDirectory() as tmp:
        trace_path, hpa_path = Path(tmp) / "long.csv", Path(tmp) / "hpa.yaml"
        n = write_trace(trace_path, args.days, tokens=llm)
        hpa_path.write_text(HPA)
        _, parse_cpu, parse_wall = timed(lambda: read_trace(trace_path))
        print(
            f"trace: {args.days:g} days, {n} requests (×{args.rate_scale:g} offered); "
            f"parse {parse_cpu:.1f} s CPU ({parse_wall:.1f} s wall)"
        )
        startup = "lognormal:p50=22.7s,p95=45.4s"
        settings = (
            SimulateSettings(trace=str(trace_path), hpa=[str(hpa_path)], startup=startup, rate_scale=args.rate_scale)
            if llm
            else SimulateSettings(
                trace=str(trace_path), hpa=[str(hpa_path)], concurrency=2, startup=startup, rate_scale=args.rate_scale
            )
        )
        doc, cpu, wall = timed(lambda: run_simulate(settings))
        r = doc["results"][0]
        how = "LLM token model, 0.25 s steps" if llm else "sampled every 5 s"
        print(
            f"whole run ({args.model}: parse + replay, HPA every 15 s, {how}): {cpu:.1f} s CPU ({wall:.1f} s wall); "
            f"{r['gpu_hours']:.0f} GPU-h simulated, {len(r['events'])} scaling events"
        )
        if llm:
            hours = min(2.0, args.days * 24)
            trace = read_trace(trace_path).window(duration_s=hours * 3600).scaled(args.rate_scale)
            hpa = parse_manifests(HPA, source="hpa.yaml")[0]
            peer = ReplaySettings(startup=parse_distribution(startup, flag="--startup"))
            _, cpu1, wall1 = timed(
                lambda: replay(trace, hpa, catalogue=load_catalogue(None), profile=ServingProfile(), settings=peer)
            )
            print(f"peer: the first {hours:g} hours: {cpu1:.1f} s CPU ({wall1:.1f} s wall)")
            return
        peer_days = min(2.0, args.days)
        trace = read_trace(trace_path).window(duration_s=peer_days * 86400).scaled(args.rate_scale)
        hpa = parse_manifests(HPA, source="hpa.yaml")[0]
        peer = ReplaySettings(
            startup=parse_distribution("lognormal:p50=22.7s,p95=45.4s", flag="--startup"), general_step_s=1.0
        )
        profile = ServiceProfile(concurrency=2)
        _, cpu1, wall1 = timed(
            lambda: replay(trace, hpa, catalogue=load_catalogue(None), profile=profile, settings=peer)
        )
        print(f"peer: {peer_days:g} days sampled every 1 s: {cpu1:.1f} s CPU ({wall1:.1f} s wall)")


if __name__ == "__main__":
    main()
