"""The report's streaming statistics pass against ``numpy.percentile([50, 90, 95])`` over the same array.

30 days × 1,000 GPUs × 1-minute samples = 43.2 M samples of one metric (SM active, float32). Measured in one
process, alternating repeat by repeat so machine noise hits both alike, in CPU time (``time.process_time``;
the machine's 2 cores are shared):

* peer: ``np.percentile(values, [50, 90, 95])`` over the whole array (it partitions a copy);
* ours (stats): ``DecayingHistogram.add`` over chunks of ``--chunk-gpus`` GPUs with their decay weights, then
  p50/p90/p95 — the VPA-style histogram the report keeps per workload;
* ours (report): ``build_report`` on a History holding the same array (100 Deployments of 10 one-GPU pods): the
  whole per-workload pass (activity, busy flags, histograms of every signal, hourly verdict sums, GPU-hours),
  recommendations, costs, incidents.

Peak RSS (``ru_maxrss``) is printed after each phase; the array itself is 173 MB.

    .venv/bin/python benchmarks/bench_report.py [--days 30] [--gpus 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np

from gpuscale.metrics.history import History, Owner, PodRef
from gpuscale.report.build import build_report
from gpuscale.report.policy import load_report_policy
from gpuscale.report.stats import PERCENT, DecayingHistogram


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu(f) -> tuple[float, object]:
    t0 = time.process_time()
    out = f()
    return time.process_time() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-gpus", type=int, default=50)
    args = ap.parse_args()
    steps = args.days * 1440
    rng = np.random.default_rng(7)
    values = np.empty((args.gpus, steps), dtype=np.float32)
    for i in range(args.gpus):  # per-GPU level plus noise, clipped to a ratio
        values[i] = np.clip(rng.normal(rng.uniform(0.05, 0.9), 0.1, steps), 0, 1)
    print(f"{args.gpus} GPUs × {args.days} days × 1-min = {values.size / 1e6:.1f} M samples; rss {rss_mib():.0f} MiB")
    start = 1_780_000_000.0
    times = start + 60.0 * np.arange(steps)
    end = times[-1] + 60

    def peer():
        return np.percentile(values, [50, 90, 95])

    def stats():
        hist = DecayingHistogram(PERCENT, half_life_seconds=86400, reference=end)
        w = hist.decay(times + 60)
        for i in range(0, args.gpus, args.chunk_gpus):
            hist.add(values[i : i + args.chunk_gpus] * np.float32(100), weights=w)
        return [hist.percentile(p) for p in (0.5, 0.9, 0.95)]

    peer_t, ours_t = [], []
    for _ in range(args.repeats):
        t, p = cpu(peer)
        peer_t.append(t)
        t, o = cpu(stats)
        ours_t.append(t)
    print(f"peer  np.percentile      median {statistics.median(peer_t):6.2f} s CPU  p50/90/95 = {np.round(p * 100, 2)}")
    print(f"ours  decaying histogram median {statistics.median(ours_t):6.2f} s CPU  p50/90/95 = {np.round(o, 2)}")
    print(f"ratio stats/peer {statistics.median(ours_t) / statistics.median(peer_t):.2f}; rss {rss_mib():.0f} MiB")

    h = History(start=start, step_seconds=60.0, steps=steps, source="bench")
    for i in range(args.gpus):
        ref = PodRef("ml", f"app-{i // 10}-{i % 10}")
        h.owners[ref] = Owner("Deployment", f"app-{i // 10}")
        h.requests[ref] = 1
        gpu = h.new_gpu(f"GPU-{i}", node=f"node-{i // 8}", product="NVIDIA H100 80GB HBM3")
        gpu.pod[:] = h.pod_index(ref)
        gpu.values["sm_active"] = values[i]
    policy = load_report_policy()
    report_t = []
    for _ in range(args.repeats):
        t, p = cpu(peer)
        peer_t.append(t)
        t, report = cpu(lambda: build_report(h, policy=policy, generated_at=end))
        report_t.append(t)
    print(
        f"ours  build_report       median {statistics.median(report_t):6.2f} s CPU  "
        f"({len(report.workloads)} workloads, {report.total.allocated_hours:,.0f} GPU-h)"
    )
    print(
        f"ratio report/peer {statistics.median(report_t) / statistics.median(peer_t):.2f}; "
        f"peak rss {rss_mib():.0f} MiB (the array: {values.nbytes / 2**20:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
