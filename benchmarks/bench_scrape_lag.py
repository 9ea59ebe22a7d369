"""Event-loop lag during a 10,000-GPU refresh by the embedded scraper: scrapes on a loop of their own in a thread (the
adapter, ``ScrapeSource(off_loop=True)``) against the same refresh on the serving loop (as before, and as a one-shot
``top`` does).

The pages are bench_refresh.py's (1,250 dcgm-exporter pages of 8 H100 and 1,000 Triton pages), served over HTTP by
a child process on loopback, one path per exporter. The adapter's source (``ScrapeSource`` with
``publish_early``, as ``gpuscale adapter --scrape-url`` builds it) and ``Pipeline.refresh_once`` run in this
process; a probe on its event loop asks to wake every 1 ms and records how late it wakes — what a request arriving
then would wait before its handler runs — at rest and during each refresh. Loop lag, not HTTP latency; on a shared
machine read the ratios within one run.

Usage: .venv/bin/python benchmarks/bench_scrape_lag.py [--cycles 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_refresh import NODES, TRITON_PODS, scrape_pages
from bench_refresh_lag import lag_at_rest, lag_during, print_lags


def _serve_pages(queue: mp.Queue) -> None:  # the child process
    from aiohttp import web

    dcgm, triton = scrape_pages(time.time())
    pages = {f"/dcgm/{n}": text.encode() for n, text in enumerate(dcgm)}
    pages |= {f"/triton/{p}": text.encode() for p, text in enumerate(triton)}

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=pages[request.path], content_type="text/plain")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{kind}/{n}", page)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        queue.put(site._server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


async def measure(port: int, cycles: int, *, off_loop: bool) -> tuple[list[float], list[float], float]:
    from gpuscale.metrics.attribution import Attributor, Target
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.store import MetricsStore
    from gpuscale.pipeline import Pipeline
    from gpuscale.sources.scrape import ScrapeSource

    catalogue = load_catalogue()
    urls = [f"http://127.0.0.1:{port}/dcgm/{n}" for n in range(NODES)]
    urls += [f"http://127.0.0.1:{port}/triton/{p}" for p in range(TRITON_PODS)]
    source = ScrapeSource(
        urls,
        series=catalogue.series_names,
        windowed_series=catalogue.windowed_series,
        history_seconds=600,
        timeout_seconds=30,
        publish_early=True,
        off_loop=off_loop,
    )
    pipeline = Pipeline(catalogue, source, MetricsStore(), Attributor(Target))
    await pipeline.refresh_once()  # warm: connections
    rest = await lag_at_rest()
    during, wall = await lag_during(pipeline.refresh_once, cycles)
    await source.close()
    return rest, during, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--switch-interval", type=float, default=0.001, help="as the adapter sets it (s)")
    args = parser.parse_args()
    sys.setswitchinterval(args.switch_interval)
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    server = ctx.Process(target=_serve_pages, args=(queue,), daemon=True)
    server.start()
    try:
        port = queue.get(timeout=300)
        print(f"{NODES} dcgm-exporter pages (8 GPUs each) + {TRITON_PODS} Triton pages over HTTP; "
              f"switch interval {args.switch_interval:g} s")  # fmt: skip
        print(f"{'':36}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'refresh s':>11}")
        for label, off_loop in (("gpuscale (scrapes off the loop)", True), ("peer: scrapes on the loop", False)):
            rest, during, wall = asyncio.run(measure(port, args.cycles, off_loop=off_loop))
            print_lags(label, rest, during, wall)
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
