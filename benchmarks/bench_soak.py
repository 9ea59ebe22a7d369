"""Load and soak: the `gpuscale adapter` process at a fixed request rate for minutes while pods churn.

The adapter runs as a user starts it (a subprocess: `gpuscale adapter --scrape-url … --kubeconfig …`)
against the simulated cluster (Kubernetes API + dcgm-exporter + Triton endpoints) in this process, where
a Triton Deployment is scaled up and down every few seconds, so watch events, scrape targets and pods
change under load. A load generator in a second process sends an open-loop fixed rate of requests
(default 500/s) spread over the queries of N HPAs (default 200: every metric × pods-with-selector,
Deployment and namespace URL the simulated workloads have, both API versions), and records every
answer's status and latency.

Figures: errors (any answer but 200; goal 0), p50/p99 latency, the adapter's RSS after warm-up and at
the end (growth; goal < 10 %). The peer, in the same run and at the same rate for ``--peer-seconds``: a
bare aiohttp server answering one precomputed body of the same size, for the latency floor of this
machine and load generator.

Usage: .venv/bin/python benchmarks/bench_soak.py [--minutes 10] [--rate 500] [--hpas 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _load(base: str, paths: list[str], rate: float, seconds: float, out: mp.Queue) -> None:  # child process
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {1})

    async def main() -> None:
        statuses: dict[int, int] = {}
        latencies: list[float] = []
        errors: dict[str, int] = {}
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(base, connector=connector) as session:

            async def one(path: str) -> None:
                started = time.perf_counter()
                try:
                    async with session.get(path) as resp:
                        await resp.read()
                        statuses[resp.status] = statuses.get(resp.status, 0) + 1
                        if resp.status != 200:
                            errors[f"{resp.status} {path[:80]}"] = errors.get(f"{resp.status} {path[:80]}", 0) + 1
                except (aiohttp.ClientError, TimeoutError) as e:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
                    return
                latencies.append(time.perf_counter() - started)

            tasks: set[asyncio.Task] = set()
            start = time.perf_counter()
            n = 0
            rng = random.Random(1)
            # NB: open loop: request k is due at start + k/rate whatever the answers do (no coordinated omission).
            while (due := n / rate) < seconds:
                delay = start + due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(one(rng.choice(paths)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                n += 1
            await asyncio.gather(*tasks)
        out.put({"sent": n, "statuses": statuses, "latencies": latencies, "errors": errors})

    asyncio.run(main())


def _run_load(base: str, paths: list[str], rate: float, seconds: float) -> dict:
    out: mp.Queue = mp.Queue()
    proc = mp.Process(target=_load, args=(base, paths, rate, seconds, out))
    proc.start()
    result = out.get(timeout=seconds + 120)
    proc.join(30)
    return result


def _summary(result: dict) -> dict:
    lat = sorted(result["latencies"])
    q = statistics.quantiles(lat, n=100) if len(lat) >= 100 else [float("nan")] * 99
    ok = result["statuses"].get(200, 0)
    return {
        "sent": result["sent"],
        "ok": ok,
        "errors": result["sent"] - ok,
        "p50_ms": q[49] * 1e3,
        "p99_ms": q[98] * 1e3,
    }


async def _hpa_paths(base: str, cluster, hpas: int) -> list[str]:
    """Up to ``hpas`` distinct queries an HPA would send, each answering 200 now."""
    from gpuscale.metrics.catalogue import load_catalogue

    metrics = [m.name for m in load_catalogue().metrics]
    candidates: list[str] = []
    for workload in cluster.scenario.workloads:
        ns, name = workload.namespace, workload.name
        for metric in metrics:
            for version in ("v1beta2", "v1beta1"):
                root = f"/apis/custom.metrics.k8s.io/{version}/namespaces/{ns}"
                candidates.append(f"{root}/pods/*/{metric}?labelSelector=app%3D{name}")
                candidates.append(f"{root}/deployments.apps/{name}/{metric}")
                candidates.append(f"{root}/metrics/{metric}")
    good: list[str] = []
    async with aiohttp.ClientSession(base) as session:
        for path in dict.fromkeys(candidates):
            async with session.get(path) as resp:
                if resp.status == 200:
                    good.append(path)
            if len(good) >= hpas:
                break
    return good


async def _churn(cluster, stop: asyncio.Event, period: float) -> int:
    """Scale a Triton Deployment (pods, exporters and scrape targets come and go) every ``period`` seconds."""
    deployments = [w for w in cluster.scenario.workloads if w.kind == "Deployment"]
    workload = next((w for w in deployments if w.triton_models), deployments[0])
    key = f"{workload.namespace}/{workload.name}"
    base = workload.replicas
    changes = 0
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period)
        if stop.is_set():
            break
        changes += 1
        await cluster.exporters.set_replicas(key, base + (0, 1, 2, 1)[changes % 4])
    await cluster.exporters.set_replicas(key, base)
    return changes


async def _peer(body: bytes, port: int) -> aiohttp.web.AppRunner:
    from aiohttp import web

    async def answer(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def main(args: argparse.Namespace) -> None:
    from gpuscale.sim.cluster import SimCluster

    async with SimCluster() as cluster:
        port = _free_port()
        command = [sys.executable, "-m", "gpuscale", "adapter", "--kubeconfig", cluster.kubeconfig]
        command += ["--insecure-port", str(port), "--refresh-interval", "2s", "--log-level", "warning"]
        for url in cluster.scrape_urls:
            command += ["--scrape-url", url]
        adapter = subprocess.Popen(command, cwd=REPO)
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as session:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        async with session.get(f"{base}/readyz") as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    if time.monotonic() > deadline or adapter.poll() is not None:
                        raise SystemExit("the adapter did not become ready")
                    await asyncio.sleep(0.2)
            await asyncio.sleep(5)  # NB: rates need two scrapes; every catalogue metric has a value after this
            paths = await _hpa_paths(base, cluster, args.hpas)
            print(f"{len(paths)} HPA queries, {args.rate:g} requests/s, {args.minutes:g} min, pods churning")
            warmup = _summary(await asyncio.to_thread(_run_load, base, paths, args.rate, 30))
            rss_start = _rss_mib(adapter.pid)
            stop = asyncio.Event()
            churn = asyncio.create_task(_churn(cluster, stop, 5.0))
            samples: list[float] = []

            async def sample_rss() -> None:
                while not stop.is_set():
                    samples.append(_rss_mib(adapter.pid))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 10)

            sampler = asyncio.create_task(sample_rss())
            soak = await asyncio.to_thread(_run_load, base, paths, args.rate, args.minutes * 60)
            stop.set()
            changes = await churn
            await sampler
            rss_end = _rss_mib(adapter.pid)
            async with aiohttp.ClientSession() as session, session.get(base + paths[0]) as resp:
                body = await resp.read()
        finally:
            adapter.send_signal(signal.SIGTERM)
            adapter.wait(30)
    peer_port = _free_port()
    runner = await _peer(body, peer_port)
    try:
        peer = _summary(
            await asyncio.to_thread(_run_load, f"http://127.0.0.1:{peer_port}", paths, args.rate, args.peer_seconds)
        )
    finally:
        await runner.cleanup()
    s = _summary(soak)
    growth = (rss_end - rss_start) / rss_start * 100
    print(f"warm-up 30 s: {warmup['sent']} requests, {warmup['errors']} errors")
    print(f"{'':34}{'requests':>10}{'errors':>8}{'p50 ms':>9}{'p99 ms':>9}")
    print(f"{'gpuscale adapter, soak':34}{s['sent']:>10}{s['errors']:>8}{s['p50_ms']:>9.2f}{s['p99_ms']:>9.2f}")
    print(
        f"{'bare aiohttp, same body (peer)':34}{peer['sent']:>10}{peer['errors']:>8}{peer['p50_ms']:>9.2f}"
        f"{peer['p99_ms']:>9.2f}"
    )
    print(f"errors: {s['errors']} (goal 0){'; ' + json.dumps(soak['errors'])[:300] if soak['errors'] else ''}")
    print(
        f"adapter RSS: {rss_start:.1f} MiB after warm-up, {rss_end:.1f} MiB at the end ({growth:+.1f} %, goal < 10 %),"
        f" max {max(samples, default=rss_end):.1f} MiB; {changes} scale changes during the soak"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--hpas", type=int, default=200)
    parser.add_argument("--peer-seconds", type=float, default=60.0)
    asyncio.run(main(parser.parse_args()))
