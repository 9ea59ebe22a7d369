"""Test helpers: fixture paths and a store built from fixture scrapes through the real pipeline (no network)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

from gpuscale.metrics.aggregation import build_snapshot
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.store import MetricsStore
from gpuscale.model import pod
from gpuscale.sources.scrape import ScrapeSource

FIXTURES = Path(__file__).parent / "fixtures"
H100 = FIXTURES / "dcgm" / "dcgm-exporter-h100-8gpu.prom"
MIG = FIXTURES / "dcgm" / "dcgm-exporter-mig.prom"
LEGACY = FIXTURES / "dcgm" / "dcgm-exporter-3x-legacy.prom"
TRITON = FIXTURES / "triton" / "triton.prom"
TRITON_T0 = FIXTURES / "triton" / "triton-t0.prom"

H100_NODE = "ip-10-0-131-77.ec2.internal"
TRITON_POD = pod("inference", "triton-inference-7d9f8b6c5-x2k4q")
T0 = 1_790_000_000.0  # an arbitrary epoch second for the first scrape

_T = TypeVar("_T")


async def reaped(proc: asyncio.subprocess.Process, waiting: Awaitable[_T], timeout: float) -> _T:
    """``waiting`` (e.g. ``proc.communicate()``) within ``timeout``; if it fails or times out, the child is killed
    and reaped here, on this loop, so no live transport is left for the garbage collector to close after the loop
    has closed (which prints an 'Event loop is closed' traceback at the end of a run and reads like a failure)."""
    try:
        return await asyncio.wait_for(waiting, timeout)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def fixture_store(
    scrapes: list[tuple[str, Path, float]], *, targets: dict[str, Target] | None = None, now: float | None = None
) -> MetricsStore:
    """Feed fixture files, as if scraped from ``url`` at ``timestamp``, through the real pipeline."""
    catalogue = load_catalogue()
    source = ScrapeSource(
        [], series=catalogue.series_names, windowed_series=catalogue.windowed_series, history_seconds=600
    )
    for url, path, ts in scrapes:
        source.ingest(url, parse_samples(path.read_text(), source=str(path)), timestamp=ts)
    targets = targets or {}
    attributor = Attributor(lambda url: targets.get(url, Target(url)))
    store = MetricsStore()
    last = max(ts for _, _, ts in scrapes)
    store.update(build_snapshot(catalogue, source.read, attributor, now=now if now is not None else last))
    return store


def run_counting_pauses(steps):
    """What steps (gpuscale/metrics/steps.py) return, and how many times they paused on the way."""
    paused = 0
    try:
        while True:
            next(steps)
            paused += 1
    except StopIteration as done:
        return done.value, paused
