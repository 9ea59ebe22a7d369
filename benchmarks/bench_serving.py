"""Cached serving throughput: `pods/*/gpu_utilization` over 100 selected pods vs a bare aiohttp JSON endpoint.

Both servers run in one child process pinned to one core (the adapter's app with its real provider,
store and watch-cache lookup; the peer returns a precomputed JSON body of the same size). A load
generator in this process, pinned to the other core, measures:

1. closed-loop throughput: C concurrent keep-alive connections for D seconds, requests/s;
2. open-loop latency at a fixed 500 requests/s: p50/p99 over N requests.

Usage: .venv/bin/python benchmarks/bench_serving.py [--seconds 5] [--connections 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import time

import aiohttp

PODS = 100
PATH = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton"


def _dcgm_text(now: float) -> str:
    lines = []
    for i in range(PODS):
        labels = (
            f'gpu="{i % 8}",UUID="GPU-{i:08d}",Hostname="node-{i // 8}",container="triton",'
            f'namespace="inference",pod="triton-{i:03d}"'
        )
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {40 + i % 50}")
    for i in range(PODS):  # other namespaces' pods, which the selector must leave out
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-x{i}",Hostname="n",namespace="other",pod="o-{i}"}} 5')
    return "\n".join(lines) + "\n"


def _serve(port_queue: mp.Queue) -> None:  # the child process
    os.sched_setaffinity(0, {0})
    from aiohttp import web

    from gpuscale.adapter.app import make_app
    from gpuscale.adapter.discovery import Discovery
    from gpuscale.adapter.provider import MetricsProvider
    from gpuscale.adapter.selfmetrics import AdapterMetrics
    from gpuscale.adapter.transport import AdapterRunner, RejectionLog
    from gpuscale.metrics.aggregation import build_snapshot
    from gpuscale.metrics.attribution import Attributor, Target
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.exposition import parse_samples
    from gpuscale.metrics.store import MetricsStore
    from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects
    from gpuscale.sources.scrape import ScrapeSource

    catalogue = load_catalogue()
    source = ScrapeSource([], series=catalogue.series_names, windowed_series=catalogue.windowed_series)
    now = time.time()
    source.ingest("http://dcgm/metrics", parse_samples(_dcgm_text(now)), timestamp=now)
    store = MetricsStore()
    store.update(build_snapshot(catalogue, source.read, Attributor(Target), now=now))
    pods = [
        PodInfo("inference", f"triton-{i:03d}", {"app": "triton"}, f"node-{i // 8}", None, (), "Running", None)
        for i in range(PODS)
    ]
    pods += [PodInfo("other", f"o-{i}", {"app": "other"}, "n", None, (), "Running", None) for i in range(PODS)]
    # NB: a far-future clock keeps values fresh for the whole run (max-age is 60 s).
    provider = MetricsProvider(catalogue, store, StaticClusterObjects(pods=pods), clock=lambda: now)
    app = make_app(provider, Discovery(catalogue), AdapterMetrics(lambda: [source]), ready=lambda: (True, ""))

    async def main() -> None:
        # NB: the adapter's own runner, as `gpuscale adapter` serves (its fast path for URLs asked before)
        runner = AdapterRunner(app, rejections=RejectionLog(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        adapter_port = site._server.sockets[0].getsockname()[1]

        body = None

        async def bare(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type="application/json")

        peer = web.Application()
        peer.router.add_get("/json", bare)
        peer_runner = web.AppRunner(peer, access_log=None)
        await peer_runner.setup()
        peer_site = web.TCPSite(peer_runner, "127.0.0.1", 0)
        await peer_site.start()
        peer_port = peer_site._server.sockets[0].getsockname()[1]
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{adapter_port}{PATH}") as r:
            body = await r.read()
            assert r.status == 200 and len(json.loads(body)["items"]) == PODS, body[:200]
        port_queue.put((adapter_port, peer_port, len(body)))
        await asyncio.Event().wait()

    asyncio.run(main())


async def closed_loop(url: str, seconds: float, connections: int, *, cold: bool = False) -> float:
    """Requests/s; ``cold`` gives every request its own label selector (``app=triton,nocache!=N``: the same pods)
    so no answer cache can serve it (worst case). NB: a bare unknown query parameter would not do: answers are
    cached by what a request means (adapter/answers.py), not by its URL text."""
    done = 0
    deadline = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with session.get(f"{url}%2Cnocache%21%3D{done}" if cold else url) as resp:
                    await resp.read()
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        return done / (time.perf_counter() - started)


async def open_loop(url: str, rate: float, count: int) -> list[float]:
    latencies: list[float] = []
    conn = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def one() -> None:
            t0 = time.perf_counter()
            async with session.get(url) as resp:
                await resp.read()
            latencies.append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        for i in range(count):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return latencies


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def run(args: argparse.Namespace, adapter_port: int, peer_port: int, size: int) -> None:
    adapter = f"http://127.0.0.1:{adapter_port}{PATH}"
    peer = f"http://127.0.0.1:{peer_port}/json"
    for url in (adapter, peer):  # warm-up
        await closed_loop(url, 1.0, args.connections)
    rps = {
        name: await closed_loop(url, args.seconds, args.connections)
        for name, url in (("adapter", adapter), ("bare aiohttp", peer))
    }
    cold = await closed_loop(adapter, args.seconds, args.connections, cold=True)
    lat = {
        name: await open_loop(url, 500, args.requests) for name, url in (("adapter", adapter), ("bare aiohttp", peer))
    }
    print(f"response: {size} bytes ({PODS} pods selected of {2 * PODS}); server: one process on one core")
    conns = f"req/s ({args.connections} conns)"
    print(f"{'server':<14}{conns:>22}{'p50 ms @500/s':>16}{'p99 ms @500/s':>16}")
    for name in rps:
        print(
            f"{name:<14}{rps[name]:>22.0f}{1000 * statistics.median(lat[name]):>16.2f}"
            f"{1000 * pct(lat[name], 99):>16.2f}"
        )
    print(
        f"adapter, every request a cache miss (unique URL): {cold:.0f} req/s "
        f"({cold / rps['bare aiohttp']:.2f}x bare aiohttp)"
    )
    print(
        f"ratio adapter / bare aiohttp: {rps['adapter'] / rps['bare aiohttp']:.2f}x "
        f"(goal >= 0.5x); adapter p99 at 500/s: {1000 * pct(lat['adapter'], 99):.2f} ms (goal <= 10 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2500)
    args = parser.parse_args()
    queue: mp.Queue = mp.Queue()
    server = mp.Process(target=_serve, args=(queue,), daemon=True)
    server.start()
    try:
        adapter_port, peer_port, size = queue.get(timeout=30)
        if len(os.sched_getaffinity(0)) > 1:
            os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {0})
        asyncio.run(run(args, adapter_port, peer_port, size))
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    main()
