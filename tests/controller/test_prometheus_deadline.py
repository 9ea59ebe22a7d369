"""The controller's Prometheus read has its own deadline, --prometheus-timeout (at most --interval), not the
exporter scrape timeout: one read asks for every GPU's series at once, and at 8,000 GPUs a busy Prometheus took
far longer than one scrape (benchmarks/bench_fleet_real.py), so the 5 s scrape deadline left the controller with
no telemetry at all."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from gpuscale.cli.controller import _sources
from gpuscale.settings import ControllerSettings

DELAY = 1.0


async def _slow_prometheus() -> tuple[web.AppRunner, str]:
    async def query(request: web.Request) -> web.Response:
        await asyncio.sleep(DELAY)
        body = {"status": "success", "data": {"resultType": "vector", "result": []}}
        return web.Response(body=json.dumps(body).encode(), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/api/v1/query", query)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # NB: the port the OS chose
    return runner, f"http://127.0.0.1:{port}"


async def _read(url: str, **flags: float) -> tuple[bool, float, str | None]:
    settings = ControllerSettings(prometheus_url=url, **flags)
    (source,), _, _ = _sources(settings)
    started = time.monotonic()
    try:
        await source.refresh(now=time.time())
    finally:
        await source.close()
    (health,) = source.health()
    return health.healthy, time.monotonic() - started, health.error


async def test_a_slow_prometheus_read_is_not_cut_at_the_scrape_timeout():
    runner, url = await _slow_prometheus()
    try:
        healthy, took, error = await _read(url, scrape_timeout=DELAY / 4, prometheus_timeout=DELAY * 4, interval=15)
        assert healthy, error
        assert took >= DELAY
    finally:
        await runner.cleanup()


async def test_the_prometheus_deadline_holds_and_never_outlasts_the_interval():
    runner, url = await _slow_prometheus()
    try:
        healthy, took, error = await _read(url, prometheus_timeout=DELAY / 4, interval=15)
        assert not healthy and "timed out after 0.25s" in (error or ""), error
        assert took < DELAY
        healthy, took, error = await _read(url, prometheus_timeout=60, interval=DELAY / 2)
        assert not healthy and "timed out after 0.5s" in (error or ""), error
        assert took < DELAY
    finally:
        await runner.cleanup()
