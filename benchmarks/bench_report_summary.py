"""``gpuscale report --mode summary`` at fleet scale against a real VictoriaMetrics loaded here, and raw mode on the
same data for a subset.

Each ``--fleet GPUS[xINTERVAL]`` (repeatable: fleets measured in one run are each other's peers) is ``GPUS`` GPUs
(4 per pod, 8 per node, 10 pods per Deployment) × ``--days`` of SM_ACTIVE and FB_USED at one sample every
``INTERVAL`` seconds (default ``--interval``), plus kube-state-metrics owners and GPU requests, loaded through
``/api/v1/import`` (JSON lines, streamed over ``--load-workers`` connections, each fed by its own generating
process) into a fresh single-node VictoriaMetrics on 127.0.0.1. Then the report runs in a child process (so its
peak RSS is its own, not the generator's): summary mode over the whole fleet and window at ``--step`` (default:
the fleet's interval; one chunk unless ``--chunk``): queries, retries and refused queries, wall and CPU time and
peak RSS of the child, the CPU time VictoriaMetrics spent answering (from /proc). The report must describe the
fleet: one workload per Deployment, the GPU-hours loaded, recommendations made.

Unless ``--skip-raw``: raw and summary mode over the first ``--subset-gpus`` GPUs × ``--subset-days`` in a second
VictoriaMetrics holding only those (raw mode of the whole fleet does not fit this machine); both modes' exact
figures are compared for equality, the approximate ones by their largest difference.

    .venv/bin/python benchmarks/bench_report_summary.py [--fleet 10000x600 ...] [--days 30] [--step S] [--skip-raw]

The figures are for a shared 2-core machine: prefer the CPU times.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
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

H100 = "NVIDIA H100 80GB HBM3"
GPUS_PER_DEPLOYMENT = 40  # 10 pods × 4 GPUs
_peaks: dict[str, float] = {}  # the report process's peak RSS (MiB) at the end of a phase: "fetch"
_BLOCK = 200  # GPUs generated at once (and the unit of the seeds: a fleet's first GPUs are the subset's)
# SM_ACTIVE rounded to thousandths: its text by index, so a sample's text is a table look-up, not a float format
_THOUSANDTHS = np.array([f"{k / 1000:g}".encode() for k in range(1001)], dtype=object)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _stamps(start: float, end: float, every: float) -> tuple[bytes, int]:
    ts = np.arange(start, end, every)
    return b"[" + b",".join(str(int(t * 1000)).encode() for t in ts) + b"]", ts.size


def lines(*, first_gpu: int, gpus: int, start: float, end: float, interval: float, seed: int):
    """Import lines (bytes) of GPUs ``first_gpu`` .. ``first_gpu + gpus`` (both multiples of ``_BLOCK``, or the end)."""
    ts_ms, n = _stamps(start, end, interval)
    daily, days = _stamps(start, end, 86400.0)
    every_one = b"[" + b",".join([b"1"] * n) + b"]"
    ones, fours = (b"[" + b",".join([v] * days) + b"]" for v in (b"1", b"4"))
    for block in range(first_gpu, first_gpu + gpus, _BLOCK):
        count = min(_BLOCK, first_gpu + gpus - block)
        rng = np.random.default_rng([seed, block // _BLOCK])
        level = rng.uniform(0.02, 0.9, _BLOCK)[:count]
        sm = np.rint(np.clip(rng.normal(level[:, None], 0.08, (count, n)), 0, 1) * 1000).astype(np.int64)
        for i, g in enumerate(range(block, block + count)):
            node, pod, deploy = f"node-{g // 8}", f"app-{g // 40}-pod-{(g // 4) % 10}", f"app-{g // 40}"
            ns = f"ns-{g // 400}"
            labels = {"Hostname": node, "UUID": f"GPU-{g}", "gpu": str(g % 8), "modelName": H100}
            labels |= {"pod": pod, "namespace": ns}
            fb = str(round(level[i] * 60000)).encode()
            for name, values in (
                ("DCGM_FI_PROF_SM_ACTIVE", b",".join(_THOUSANDTHS[sm[i]].tolist())),
                ("DCGM_FI_DEV_FB_USED", b",".join([fb] * n)),
            ):
                metric = json.dumps({"__name__": name, **labels}).encode()
                yield b'{"metric":' + metric + b',"values":[' + values + b'],"timestamps":' + ts_ms + b"}\n"
            if g % 4 == 0:  # kube-state-metrics: the owner scraped with the GPUs (summary mode joins it per step)
                for name, extra, vals, stamps in (
                    ("kube_pod_owner", {"owner_kind": "ReplicaSet", "owner_name": f"{deploy}-rs"}, every_one, ts_ms),
                    (
                        "kube_pod_container_resource_requests",
                        {"resource": "nvidia_com_gpu", "container": "main"},
                        fours,
                        daily,
                    ),
                ):
                    metric = json.dumps({"__name__": name, "namespace": ns, "pod": pod, **extra}).encode()
                    yield b'{"metric":' + metric + b',"values":' + vals + b',"timestamps":' + stamps + b"}\n"
                if g % 40 == 0:
                    metric = {"__name__": "kube_replicaset_owner", "namespace": ns, "replicaset": f"{deploy}-rs"}
                    metric |= {"owner_kind": "Deployment", "owner_name": deploy}
                    yield b'{"metric":' + json.dumps(metric).encode() + b',"values":' + ones
                    yield b',"timestamps":' + daily + b"}\n"


def _import(job: tuple[int, int, int, float, float, float, int]) -> float:
    """One import connection (chunked POST) of a share of the fleet, in its own process; its CPU seconds."""
    port, first_gpu, gpus, start, end, interval, seed = job

    def body():
        batch: list[bytes] = []
        for line in lines(first_gpu=first_gpu, gpus=gpus, start=start, end=end, interval=interval, seed=seed):
            batch.append(line)
            if len(batch) >= 200:
                yield b"".join(batch)
                batch = []
        if batch:
            yield b"".join(batch)

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/api/v1/import", body=body(), encode_chunked=True)
    r = conn.getresponse()
    text = r.read()
    assert r.status == 204, (r.status, text[:500])
    return time.process_time()


def load(
    url: str, *, gpus: int, start: float, end: float, interval: float, seed: int, workers: int
) -> tuple[float, float]:
    """Wall seconds of the import and the generators' CPU seconds."""
    port = int(url.rpartition(":")[2])
    share = -(-gpus // workers // _BLOCK) * _BLOCK
    jobs = [(port, g, min(share, gpus - g), start, end, interval, seed) for g in range(0, gpus, share)]
    t0 = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
        cpu = sum(pool.map(_import, jobs))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("GET", "/internal/force_flush")
    assert conn.getresponse().status == 200
    return time.monotonic() - t0, cpu


async def start_vm(workdir: Path, *, exist_ok: bool = False) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=exist_ok)
    proc = subprocess.Popen(
        [
            shutil.which("victoria-metrics") or "victoria-metrics",
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={workdir}",
            "-retentionPeriod=100d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(workdir.parent / f"{workdir.name}.log").open("wb"),
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


def vm_complaints(workdir: Path) -> list[str]:
    """The lines VictoriaMetrics logged as warnings or errors (a query it ended at its limit, a refused import), but
    for its rollup cache reset: a backfilled history's samples are older than its cache offset, and every query here
    is sent with nocache."""
    log = workdir.parent / f"{workdir.name}.log"
    return [
        ln
        for ln in log.read_text(errors="replace").splitlines()
        if ("\twarn\t" in ln or "\terror\t" in ln) and "resetting rollup result cache" not in ln
    ]


async def run_mode(
    url: str, mode: str, *, start: float, end: float, step: float, chunk: float | None, policy, interval: float
):
    """(report, queries, retries, refused, wall, CPU) of one report; refused: queries the server refused by size
    (each asked again for half its node batch), retries: timeouts, 5xx and connection errors asked again."""
    from gpuscale.report.build import build_report
    from gpuscale.report.summary import build_summary_report
    from gpuscale.report.usage import block_seconds
    from gpuscale.sources.history_fetch import FetchOptions, fetch_history
    from gpuscale.sources.promapi import PrometheusClient, TooManySamples

    # NB: the scrape interval as given with --scrape-interval: gpuscale measures it on DCGM_FI_DEV_GPU_UTIL, which
    # this fleet does not export, and a report step longer than the interval would count a sample as a step
    options = FetchOptions(series_batch=50, scrape_interval=interval)
    counts = {"retries": 0, "refused": 0}

    async def counted_sleep(seconds: float) -> None:
        counts["retries"] += 1
        await asyncio.sleep(seconds)

    class Counted(PrometheusClient):
        async def query_range(self, promql: str, **kw):
            try:
                return await super().query_range(promql, **kw)
            except TooManySamples:
                counts["refused"] += 1
                raise

    async with aiohttp.ClientSession() as session:
        client = Counted(url, session=session, sleep=counted_sleep, timeout_seconds=600, **options.client_limits())
        w0, c0 = time.monotonic(), time.process_time()
        if mode == "summary":
            from gpuscale.sources.summary_fetch import fetch_summaries

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
            _peaks["fetch"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            report = build_summary_report(h, policy=policy, generated_at=end)
        else:
            h = await fetch_history(client, start=start, end=end, step=step, options=options, progress=False)
            report = build_report(h, policy=policy, generated_at=end)
        wall, cpu = time.monotonic() - w0, time.process_time() - c0
        return report, client.queries, counts["retries"], counts["refused"], wall, cpu


def child_report(spec: str) -> None:
    """The summary report in this (child) process; one JSON line of its figures on stdout."""
    from gpuscale.cli.run_coroutine import run_coroutine
    from gpuscale.report.policy import load_report_policy

    a = json.loads(spec)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    policy = load_report_policy()
    # NB: as `gpuscale report` does, so the peak is the command's (asyncio.run would format its result on exit)
    report, queries, retries, refused, wall, cpu = run_coroutine(
        run_mode(
            a["url"],
            "summary",
            start=a["start"],
            end=a["end"],
            step=a["step"],
            chunk=a["chunk"],
            policy=policy,
            interval=a["interval"],
        )
    )
    kinds: dict[str, int] = {}
    for w in report.workloads:
        for r in w.recommendations:
            if r.role == "recommended":
                kinds[r.kind] = kinds.get(r.kind, 0) + 1
    out = {
        "queries": queries,
        "retries": retries,
        "refused": refused,
        "wall": wall,
        "cpu": cpu,
        "rss_at_start": base,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_rss_fetch": _peaks.get("fetch"),
        "workloads": len(report.workloads),
        "ok": sum(w.status == "ok" for w in report.workloads),
        "busy": sum(w.busy for w in report.workloads),
        "recommended": kinds,
        "gpu_hours": report.total.allocated_hours,
        "gpus": report.total.gpus,
        "gaps": list(getattr(report, "gaps", []) or []),
    }
    print(json.dumps(out))


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


def parse_fleet(text: str, default_interval: float) -> tuple[int, float]:
    gpus, _, interval = text.partition("x")
    try:
        n, every = int(gpus), float(interval) if interval else default_interval
    except ValueError:
        raise SystemExit(f"--fleet {text!r}: expected GPUS or GPUSxINTERVAL (e.g. 100000x3600)") from None
    if n <= 0 or n % GPUS_PER_DEPLOYMENT or every <= 0:
        raise SystemExit(f"--fleet {text!r}: GPUS a positive multiple of {GPUS_PER_DEPLOYMENT}, INTERVAL > 0")
    return n, every


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


async def measure_fleet(args, tmp: Path, gpus: int, interval: float, *, start: float, end: float) -> dict:
    step = args.step or interval
    window = min(args.window_days or args.days, args.days)
    n = gpus * args.days * 86400 / interval
    print(
        f"fleet {gpus} GPUs × {args.days} days at {interval:g}s ({n / 1e6:.1f} M samples per field), "
        f"report over the last {window} days at step {step:g}s; load average {load_average()}",
        flush=True,
    )
    kept = Path(args.data_dir) if args.data_dir else None
    workdir = (kept or tmp) / f"fleet-{gpus}-{interval:g}-{args.days}d-{int(end)}"
    marker = workdir.parent / f"{workdir.name}.loaded"
    vm, url = await start_vm(workdir, exist_ok=marker.exists())
    try:
        if marker.exists():
            print(f"  loaded by an earlier run: {marker.read_text().strip()}", flush=True)
        else:
            v0 = cpu_seconds(vm.pid)
            wall, gen_cpu = load(
                url, gpus=gpus, start=start, end=end, interval=interval, seed=1, workers=args.load_workers
            )
            loaded = (
                f"loaded in {wall:.0f} s wall: {gen_cpu:.0f} s CPU generating, {cpu_seconds(vm.pid) - v0:.0f} s CPU "
                f"in VictoriaMetrics; load average {load_average()}"
            )
            print(f"  {loaded}", flush=True)
            if kept:
                marker.write_text(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {loaded}\n")
        if args.load_only:
            return {}
        v0 = cpu_seconds(vm.pid)
        spec = json.dumps(
            {"url": url, "start": end - window * 86400, "end": end, "step": step, "chunk": args.chunk}
            | {"interval": interval}
        )
        done = subprocess.run(
            [sys.executable, __file__, "--child-report", spec], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"the report failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r |= {"vm_cpu": cpu_seconds(vm.pid) - v0, "vm_peak_rss": peak_rss_mib(vm.pid), "load": load_average()}
        r |= {"gpus_loaded": gpus, "interval": interval, "step": step, "complaints": vm_complaints(workdir)}
    finally:
        vm.terminate()
        vm.wait(60)
        if not kept:
            shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"  summary mode: {r['queries']} queries ({r['retries']} retried, {r['refused']} refused by size), "
        f"{r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU in the report, {r['vm_cpu']:.1f} s CPU in VictoriaMetrics; "
        f"report peak RSS {r['peak_rss']:.0f} MiB ({r['rss_at_start']:.0f} MiB after imports, "
        f"{r['peak_rss_fetch']:.0f} MiB at the end of the fetch), VictoriaMetrics peak "
        f"RSS {r['vm_peak_rss']:.0f} MiB; load average {r['load']}",
        flush=True,
    )
    print(
        f"  {r['workloads']} workloads ({r['ok']} ok, {r['busy']} busy), {r['gpus']} GPUs, {r['gpu_hours']:,.0f} "
        f"GPU-h, recommended: {r['recommended']}; gaps: {r['gaps'] or 'none'}",
        flush=True,
    )
    slow = [ln for ln in r["complaints"] if "slow query" in ln]
    if slow:
        took = [float(ln.partition("duration=")[2].split()[0]) for ln in slow]
        print(f"  VictoriaMetrics logged {len(slow)} queries slower than 5 s (longest {max(took):.1f} s)")
    r["complaints"] = [ln for ln in r["complaints"] if "slow query" not in ln]
    for line in r["complaints"][:5]:
        print(f"  VictoriaMetrics: {line[:300]}")
    if len(r["complaints"]) > 5:
        print(f"  VictoriaMetrics: {len(r['complaints']) - 5} more warnings or errors")
    # the report must describe the fleet it was run on, or its cost says nothing
    expected_hours = gpus * window * 24
    problems = []
    if r["workloads"] != gpus // GPUS_PER_DEPLOYMENT:
        problems.append(f"{r['workloads']} workloads, not {gpus // GPUS_PER_DEPLOYMENT}")
    if r["gpus"] != gpus:
        problems.append(f"{r['gpus']} GPUs, not {gpus}")
    if abs(r["gpu_hours"] - expected_hours) > 0.01 * expected_hours:
        problems.append(f"{r['gpu_hours']:,.0f} GPU-h, not {expected_hours:,}")
    if not r["recommended"] or r["ok"] != r["workloads"]:
        problems.append("workloads without a status ok or no recommendation at all")
    if problems:
        raise SystemExit("the report does not describe the fleet: " + "; ".join(problems))
    return r


async def subset(args, tmp: Path, interval: float, *, end: float) -> None:
    from gpuscale.report.policy import load_report_policy

    policy = load_report_policy()
    sub_start = end - args.subset_days * 86400
    workdir = tmp / "subset"
    vm, url = await start_vm(workdir)
    try:
        load(url, gpus=args.subset_gpus, start=sub_start, end=end, interval=interval, seed=1, workers=1)
        results = {}
        for mode in ("raw", "summary"):
            results[mode] = await run_mode(
                url,
                mode,
                start=sub_start,
                end=end,
                step=args.step or interval,
                chunk=args.chunk,
                policy=policy,
                interval=interval,
            )
            _, q, _, _, wall, cpu = results[mode]
            print(
                f"{mode:7s} mode, {args.subset_gpus} GPUs × {args.subset_days} days: {q} queries, "
                f"{wall:.1f} s wall, {cpu:.1f} s CPU"
            )
        compare(results["raw"][0], results["summary"][0])
    finally:
        vm.terminate()
        vm.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fleet", action="append", help="GPUS[xINTERVAL], repeatable (default: 10000)")
    ap.add_argument("--gpus", type=int, default=None, help="one fleet of this many GPUs (same as --fleet GPUS)")
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--interval", type=float, default=600.0, help="seconds between samples (default of --fleet)")
    ap.add_argument("--step", type=float, default=None, help="the report's step (default: the fleet's interval)")
    ap.add_argument("--chunk", type=float, default=None, help="seconds; default: the window (one chunk)")
    ap.add_argument("--load-workers", type=int, default=2, help="import connections, each with its own generator")
    ap.add_argument("--skip-raw", action="store_true", help="no raw-vs-summary comparison on a subset")
    ap.add_argument(
        "--data-dir", help="keep each fleet's VictoriaMetrics data here, and use what an earlier run loaded there"
    )
    ap.add_argument("--load-only", action="store_true", help="load the fleets into --data-dir and stop")
    ap.add_argument("--window-days", type=int, default=None, help="the report's window (default: --days)")
    ap.add_argument("--subset-gpus", type=int, default=400)
    ap.add_argument("--subset-days", type=int, default=7)
    ap.add_argument("--child-report", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_only and not args.data_dir:
        raise SystemExit("--load-only needs --data-dir: the data would be deleted when the run ends")
    if args.child_report:
        child_report(args.child_report)
        return
    fleets = [parse_fleet(f, args.interval) for f in (args.fleet or [str(args.gpus or 10_000)])]
    asyncio.run(run(args, fleets))


async def run(args, fleets: list[tuple[int, float]]) -> None:
    end = (time.time() // 86400 - 1) * 86400
    start = end - args.days * 86400
    results = []
    with tempfile.TemporaryDirectory(prefix="gpuscale-bench-") as tmp:
        for gpus, interval in fleets:
            results.append(await measure_fleet(args, Path(tmp), gpus, interval, start=start, end=end))
        if args.load_only:
            return
        if len(results) > 1:
            print("\n| GPUs | interval | step | samples in window | queries | wall | CPU report | CPU VM | peak RSS |")
            print("|---|---|---|---|---|---|---|---|---|")
            for r in results:
                n = r["gpus_loaded"] * min(args.window_days or args.days, args.days) * 86400 / r["interval"]
                print(
                    f"| {r['gpus_loaded']:,} | {r['interval']:g} s | {r['step']:g} s | {n / 1e6:.1f} M | "
                    f"{r['queries']:,} | {r['wall']:.0f} s | {r['cpu']:.1f} s | {r['vm_cpu']:.1f} s | "
                    f"{r['peak_rss']:.0f} MiB |"
                )
        if not args.skip_raw:
            await subset(args, Path(tmp), fleets[0][1], end=end)


if __name__ == "__main__":
    main()
