"""Event-loop lag during a 10,000-GPU refresh from Prometheus: what an HPA request waits before it is served.

The cluster and the fake Prometheus (a child process) are bench_refresh.py's. A probe on the adapter's event
loop asks to wake every 1 ms and records how late it wakes: a request arriving then waits about as long
before its handler runs. Measured at rest and while ``Pipeline.refresh_once`` runs (HTTP, JSON decode,
snapshot build), in the same run: as the adapter ships it (queries on a loop of their own in a thread, answers
decoded in the child process, build in a worker thread), with decode and build in worker threads, and the peer:
the same refresh with decode and build run on the
loop, as before issue 21. Goal (issue 21): p99 during a refresh within 2× of p99 at rest.

This is loop lag, not end-to-end request latency (no HTTP client in this process); on a loaded machine the
figures move from run to run, so read them as ratios within one run.

Usage: .venv/bin/python benchmarks/bench_refresh_lag.py [--cycles 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_refresh import fake_prometheus


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


async def probe(lags: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t0 = loop.time()
        await asyncio.sleep(0.001)
        lags.append(max(0.0, loop.time() - t0 - 0.001))


async def lag_at_rest(seconds: float = 1.0) -> list[float]:
    """The probe's lags over ``seconds`` with nothing else running."""
    lags: list[float] = []
    stop = asyncio.Event()
    task = asyncio.create_task(probe(lags, stop))
    await asyncio.sleep(seconds)
    stop.set()
    await task
    return lags


async def lag_during(refresh: Callable[[], Awaitable[object]], cycles: int) -> tuple[list[float], float]:
    """The probe's lags while ``refresh`` runs, ``cycles`` times over, and the median wall time of one refresh."""
    lags: list[float] = []
    walls = []
    for _ in range(cycles):
        stop = asyncio.Event()
        task = asyncio.create_task(probe(lags, stop))
        t0 = time.perf_counter()
        await refresh()
        walls.append(time.perf_counter() - t0)
        stop.set()
        await task
    return lags, sorted(walls)[len(walls) // 2]


def print_lags(label: str, rest: list[float], during: list[float], wall: float, width: int = 36) -> None:
    """Two rows (at rest, during a refresh: p50, p99, max ms) and the ratio the goal is about."""
    for name, xs in ((f"{label}, at rest", rest), (f"{label}, refresh", during)):
        print(f"{name:<{width}}{1e3 * pct(xs, 50):>9.2f}{1e3 * pct(xs, 99):>9.2f}{1e3 * max(xs):>9.2f}", end="")
        print(f"{wall:>11.2f}" if xs is during else "")
    ratio = pct(during, 99) / max(pct(rest, 99), 1e-4)
    print(f"  p99 during refresh / p99 at rest: {ratio:.1f}x [goal <= 2x]")


async def measure(
    port: int, cycles: int, *, on_loop: bool, decode_in: str = "thread"
) -> tuple[list[float], list[float], float]:
    from gpuscale.metrics.aggregation import build_snapshot, queries
    from gpuscale.metrics.attribution import Attributor, Target
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.store import MetricsStore
    from gpuscale.pipeline import Pipeline, cyclic_gc_paused
    from gpuscale.sources import prometheus as promsource

    catalogue = load_catalogue()
    url = f"http://127.0.0.1:{port}"
    # NB: as the adapter runs it (cli/adapter.py): decoder process and queries on their own loop, or neither
    source = promsource.PrometheusSource(
        url, queries=queries(catalogue), timeout_seconds=60, decode_in=decode_in, off_loop=decode_in == "process"
    )
    pipeline = Pipeline(catalogue, source, MetricsStore(), Attributor(Target))
    if on_loop:  # NB: the peer: decode and build on the event loop, as the code did before issue 21

        async def inline_refresh() -> None:
            with cyclic_gc_paused():
                await source.refresh(now=time.time())
                pipeline.attributor.begin_refresh()
                pipeline.store.update(build_snapshot(catalogue, source.read, pipeline.attributor, now=time.time()))

        real_to_thread = asyncio.to_thread

        async def same_thread(fn, *a, **kw):  # type: ignore[no-untyped-def]
            return fn(*a, **kw)

        async def refresh() -> None:
            promsource.asyncio.to_thread = same_thread  # type: ignore[attr-defined]
            try:
                await inline_refresh()
            finally:
                promsource.asyncio.to_thread = real_to_thread  # type: ignore[attr-defined]
    else:
        refresh = pipeline.refresh_once
    await pipeline.refresh_once()  # warm: connections, plans
    rest = await lag_at_rest()
    during, wall = await lag_during(refresh, cycles)
    await source.close()
    return rest, during, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--switch-interval", type=float, default=0.001, help="as the adapter sets it (s)")
    args = parser.parse_args()
    sys.setswitchinterval(args.switch_interval)
    with fake_prometheus() as port:
        print(f"{'':34}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'refresh s':>11}")
        modes = (
            ("gpuscale (as the adapter)", False, "process"),
            ("decode+build in threads", False, "thread"),
            ("peer: decode+build on loop", True, "thread"),
        )
        for label, on_loop, decode_in in modes:
            rest, during, wall = asyncio.run(measure(port, args.cycles, on_loop=on_loop, decode_in=decode_in))
            print_lags(label, rest, during, wall, width=34)


if __name__ == "__main__":
    main()
