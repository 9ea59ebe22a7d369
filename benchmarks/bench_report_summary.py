"""``gpuscale report --mode summary`` at fleet scale against a real VictoriaMetrics loaded here, and raw mode on the
same data for a subset.

Loads ``--gpus`` GPUs (4 per pod, 8 per node, 10 pods per Deployment) × ``--days`` of SM_ACTIVE and FB_USED at one
sample every ``--interval`` seconds, plus kube-state-metrics owners and GPU requests, through ``/api/v1/import``
(JSON lines, streamed), into a fresh single-node VictoriaMetrics on 127.0.0.1. Then runs the report in this process:

* summary mode over the whole fleet and window (``--chunk`` 1 day): queries, wall and CPU time, peak RSS of this
  process, and the CPU time VictoriaMetrics spent answering (from /proc);
* raw and summary mode over the first ``--subset-nodes`` nodes (``--series-batch`` is the node list, so the
  report only sees them: a ``Hostname`` filter through a policy is not needed) — no: over a 7-day window of the
  whole fleet is too big for raw mode here, so the subset comes from a second VictoriaMetrics holding only the
  subset's series. Both modes' exact figures are compared for equality, the approximate ones by their largest
  difference.

    .venv/bin/python benchmarks/bench_report_summary.py [--gpus 10000] [--days 30] [--interval 600]

The figures are for a shared 2-core machine: prefer the CPU times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

from gpuscale.report.build import build_report
from gpuscale.report.policy import load_report_policy
from gpuscale.report.summary import build_summary_report
from gpuscale.report.usage import block_seconds
from gpuscale.sources.history_fetch import FetchOptions, fetch_history
from gpuscale.sources.promapi import PrometheusClient
from gpuscale.sources.summary_fetch import fetch_summaries

H100 = "NVIDIA H100 80GB HBM3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lines(*, gpus: int, first_gpu: int, start: float, end: float, interval: float, seed: int):
    rng = np.random.default_rng(seed)
    ts = np.arange(start, end, interval)
    ts_ms = "[" + ",".join(str(int(t * 1000)) for t in ts) + "]"
    for g in range(first_gpu, first_gpu + gpus):
        node, pod, deploy = f"node-{g // 8}", f"app-{g // 40}-pod-{(g // 4) % 10}", f"app-{g // 40}"
        labels = {"Hostname": node, "UUID": f"GPU-{g}", "gpu": str(g % 8), "modelName": H100}
        labels |= {"pod": pod, "namespace": f"ns-{g // 400}"}
        level = rng.uniform(0.02, 0.9)
        sm = np.clip(rng.normal(level, 0.08, ts.size), 0, 1).round(3)
        fb = np.full(ts.size, round(level * 60000))
        for name, values in (("DCGM_FI_PROF_SM_ACTIVE", sm), ("DCGM_FI_DEV_FB_USED", fb)):
            yield (
                f'{{"metric":{json.dumps({"__name__": name, **labels})},'
                f'"values":[{",".join(map(str, values.tolist()))}],"timestamps":{ts_ms}}}\n'
            ).encode()
        if g % 4 == 0:  # kube-state-metrics: the owner scraped with the GPUs (summary mode joins it per step)
            day = np.arange(start, end, 86400.0)
            sparse = "[" + ",".join(str(int(t * 1000)) for t in day) + "]"
            ones = "[" + ",".join("1" for _ in day) + "]"
            fours = "[" + ",".join("4" for _ in day) + "]"
            ns = f"ns-{g // 400}"
            every = "[" + ",".join("1" for _ in ts) + "]"
            for name, extra, vals, stamps in (
                ("kube_pod_owner", {"owner_kind": "ReplicaSet", "owner_name": f"{deploy}-rs"}, every, ts_ms),
                (
                    "kube_pod_container_resource_requests",
                    {"resource": "nvidia_com_gpu", "container": "main"},
                    fours,
                    sparse,
                ),
            ):
                metric = {"__name__": name, "namespace": ns, "pod": pod, **extra}
                yield f'{{"metric":{json.dumps(metric)},"values":{vals},"timestamps":{stamps}}}\n'.encode()
            if g % 40 == 0:
                metric = {"__name__": "kube_replicaset_owner", "namespace": ns, "replicaset": f"{deploy}-rs"}
                metric |= {"owner_kind": "Deployment", "owner_name": deploy}
                yield f'{{"metric":{json.dumps(metric)},"values":{ones},"timestamps":{sparse}}}\n'.encode()


async def start_vm(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            shutil.which("victoria-metrics") or "victoria-metrics",
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={workdir}",
            "-retentionPeriod=100d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return proc, url
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("victoria-metrics did not start")


async def load(url: str, gen) -> float:
    t0 = time.monotonic()

    async def body():
        batch = []
        for line in gen:
            batch.append(line)
            if len(batch) >= 200:
                yield b"".join(batch)
                batch = []
        if batch:
            yield b"".join(batch)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        async with s.post(url + "/api/v1/import", data=body()) as r:
            assert r.status == 204, await r.text()
        async with s.get(url + "/internal/force_flush") as r:
            assert r.status == 200
    return time.monotonic() - t0


async def run_mode(url: str, mode: str, *, start: float, end: float, step: float, chunk: float | None, policy):
    options = FetchOptions(series_batch=50)
    async with aiohttp.ClientSession() as session:
        client = PrometheusClient(url, session=session, timeout_seconds=600, **options.client_limits())
        w0, c0 = time.monotonic(), time.process_time()
        if mode == "summary":
            idle = policy.diagnosis.diagnosis.idle
            h = await fetch_summaries(
                client,
                start=start,
                end=end,
                step=step,
                chunk=chunk,
                block=block_seconds(end - start),
                options=options,
                idle_busy_percent=idle.busy_percent,
                idle_sm_active=idle.sm_active,
                safety_percentile=policy.rightsizing.safety_percentile,
                progress=False,
            )
            report = build_summary_report(h, policy=policy, generated_at=end)
        else:
            h = await fetch_history(client, start=start, end=end, step=step, options=options, progress=False)
            report = build_report(h, policy=policy, generated_at=end)
        return report, client.queries, time.monotonic() - w0, time.process_time() - c0


def close(a, b) -> bool:
    """Equal up to float rounding (the TSDB sums float64 of the samples; raw mode float32 arrays), field by field."""
    da, db = a.model_dump(), b.model_dump()
    return all(
        (x == y)
        if not isinstance(x, float) or not isinstance(y, float)
        else abs(x - y) <= 1e-6 * max(1, abs(x)) + 0.011
        for x, y in zip(da.values(), db.values(), strict=True)
    )


def compare(raw, summary) -> None:
    total = close(raw.total, summary.total)
    pools = all(close(a.cost, b.cost) for a, b in zip(raw.pools, summary.pools, strict=True))
    print(f"  exact figures equal up to float rounding (≤ 0.011): total {total}, pools {pools}")
    worst = {}
    for w in raw.workloads:
        (s,) = [x for x in summary.workloads if x.name == w.name and x.namespace == w.namespace]
        assert close(s.cost, w.cost), (w.name, s.cost, w.cost)
        for k, sig in w.signals.items():
            other = s.signals.get(k)
            if other is None:
                continue
            assert abs(other.max - sig.max) <= 0.011, (w.name, k, other.max, sig.max)
            for q in ("p50", "p95", "p99", "target"):
                if getattr(other, q) is None or getattr(sig, q) is None:
                    continue
                d = getattr(other, q) - getattr(sig, q)
                lo, hi = worst.get(f"{k}.{q}", (0.0, 0.0))
                worst[f"{k}.{q}"] = (min(lo, d), max(hi, d))
    print("  per-workload cost and maxima equal; summary - raw (exact) of the shown percentiles and the trend target:")
    for k in ("activity_percent.p50", "activity_percent.p95", "activity_percent.p99", "activity_percent.target"):
        lo, hi = worst.get(k, (float("nan"), float("nan")))
        print(f"    {k:28s} from {lo:+6.2f} to {hi:+6.2f} percentage points")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--interval", type=float, default=600.0)
    ap.add_argument("--subset-gpus", type=int, default=400)
    ap.add_argument("--subset-days", type=int, default=7)
    ap.add_argument("--chunk", type=float, default=None, help="seconds; default: the window (one chunk)")
    args = ap.parse_args()
    policy = load_report_policy()
    end = (time.time() // 86400 - 1) * 86400
    start = end - args.days * 86400
    with tempfile.TemporaryDirectory(prefix="gpuscale-bench-") as tmp:
        vm, url = await start_vm(Path(tmp) / "fleet")
        try:
            n = args.gpus * args.days * 86400 / args.interval
            print(
                f"loading {args.gpus} GPUs × {args.days} days at {args.interval:g}s: {n / 1e6:.1f} M samples per field"
            )
            gen = lines(gpus=args.gpus, first_gpu=0, start=start, end=end, interval=args.interval, seed=1)
            print(f"  loaded in {await load(url, gen):.0f} s wall")
            vm0 = cpu_seconds(vm.pid)
            report, queries, wall, cpu = await run_mode(
                url, "summary", start=start, end=end, step=args.interval, chunk=args.chunk, policy=policy
            )
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"summary mode, {args.gpus} GPUs × {args.days} days: {queries} queries, {wall:.1f} s wall, "
                f"{cpu:.1f} s CPU here, {cpu_seconds(vm.pid) - vm0:.1f} s CPU in VictoriaMetrics, "
                f"peak RSS {rss:.0f} MiB; "
                f"{len(report.workloads)} workloads, {report.total.allocated_hours:,.0f} GPU-h"
            )
        finally:
            vm.terminate()
            vm.wait(30)
        sub_end = end
        sub_start = end - args.subset_days * 86400
        vm, url = await start_vm(Path(tmp) / "subset")
        try:
            gen = lines(
                gpus=args.subset_gpus, first_gpu=0, start=sub_start, end=sub_end, interval=args.interval, seed=1
            )
            await load(url, gen)
            results = {}
            for mode in ("raw", "summary"):
                results[mode] = await run_mode(
                    url, mode, start=sub_start, end=sub_end, step=args.interval, chunk=args.chunk, policy=policy
                )
                _, q, wall, cpu = results[mode]
                print(
                    f"{mode:7s} mode, {args.subset_gpus} GPUs × {args.subset_days} days: {q} queries, "
                    f"{wall:.1f} s wall, {cpu:.1f} s CPU"
                )
            compare(results["raw"][0], results["summary"][0])
        finally:
            vm.terminate()
            vm.wait(30)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
