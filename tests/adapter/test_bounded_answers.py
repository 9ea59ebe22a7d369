"""Bounded answers: the adapter's Prometheus backend refuses a huge answer and cuts off a stalled one.

The whole adapter runs (``start_adapter``: the real Prometheus source, pipeline, store, HTTP app) against a
fake Prometheus on loopback whose DCGM_FI_DEV_GPU_UTIL answer can turn huge (300 MB, streamed from a generator
without a Content-Length, so the fake never holds it) or stall after its first bytes. In both cases the
refused query keeps its last values, HPA requests are answered from them, and /readyz and /metrics say why.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gpuscale.cli.adapter import RunningAdapter, start_adapter
from gpuscale.settings import AdapterSettings

URL = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization"
HUGE_BYTES = 300 * 1000 * 1000
LIMIT_BYTES = 16 << 20
STALL_LIMIT = 10.0  # NB: only a bound so that a regression fails instead of hanging the suite


class FakePrometheus:
    """Answers every query; DCGM_FI_DEV_GPU_UTIL with two trainer GPUs, or huge, or stalled (``mode``)."""

    def __init__(self) -> None:
        self.mode = "good"
        self.sent_bytes = 0
        self.stalled = asyncio.Event()
        self.release = asyncio.Event()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> FakePrometheus:
        app = web.Application()
        app.router.add_post("/api/v1/query", self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = (await request.post()).get("query", "")
        now = time.time()
        result = []
        if str(query).startswith("DCGM_FI_DEV_GPU_UTIL"):
            if self.mode == "huge":
                return await self._huge(request)
            if self.mode == "stall":
                return await self._stall(request)
            result = [
                {
                    "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": str(g), "UUID": f"GPU-{g}",
                               "Hostname": "node-1", "namespace": "ml", "pod": f"trainer-{g}"},
                    "value": [now, str(40 + g)],
                }
                for g in range(2)
            ]  # fmt: skip
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    async def _huge(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})  # NB: chunked, no length
        await response.prepare(request)
        chunk = b'{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"0"},"value":[1,"1"]},' * 14_000  # ~1 MB
        try:
            await response.write(b'{"status":"success","data":{"resultType":"vector","result":[')
            while self.sent_bytes < HUGE_BYTES:
                await response.write(chunk)
                self.sent_bytes += len(chunk)
        except ConnectionError:
            pass  # the client hung up: what the limit is for
        return response

    async def _stall(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"status":"success","data":{"resultType":"vector","result":[')
        self.stalled.set()
        try:
            await asyncio.wait_for(self.release.wait(), STALL_LIMIT)
            await response.write(b"]}}")
        except (ConnectionError, TimeoutError):
            pass
        return response

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def adapter_and_prometheus():
    prometheus = await FakePrometheus().start()
    settings = AdapterSettings(
        prometheus_url=prometheus.url,
        insecure_port=0,
        refresh_interval=3600,  # NB: the test drives refreshes itself (refresh_once), never waits on the timer
        prometheus_timeout=1.0,
        prometheus_max_response_size=LIMIT_BYTES,
    )
    adapter = await start_adapter(settings)
    try:
        while adapter.pipeline.refreshes < 1:  # the first refresh, started with the adapter
            await asyncio.sleep(0.02)
        yield adapter, prometheus
    finally:
        prometheus.release.set()
        await adapter.stop()
        await prometheus.stop()


async def _get(adapter: RunningAdapter, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(adapter.url + path) as resp:
        return resp.status, await resp.text()


def _values(body: str) -> dict[str, str]:
    return {i["describedObject"]["name"]: i["value"] for i in json.loads(body)["items"]}


def _peak_rss_bytes() -> int:
    return int(re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # NB: Linux: VmHWM starts again from the current RSS


async def test_a_300_mb_answer_is_refused_in_one_line_with_memory_bounded(adapter_and_prometheus):
    adapter, prometheus = adapter_and_prometheus
    status, body = await _get(adapter, URL)
    assert status == 200 and _values(body) == {"trainer-0": "40", "trainer-1": "41"}, body

    prometheus.mode = "huge"
    _reset_peak_rss()
    before = _peak_rss_bytes()
    await adapter.pipeline.refresh_once()
    growth = _peak_rss_bytes() - before

    assert prometheus.sent_bytes < LIMIT_BYTES + (32 << 20), "the adapter read on past its limit"
    # NB: the limit plus slack for the bytearray's growth and socket buffers; decoding 300 MB took 5.8 GB.
    assert growth < LIMIT_BYTES + (64 << 20), f"peak RSS grew {growth >> 20} MiB"
    (health,) = adapter.source.health()
    assert not health.healthy and health.error_kind == "too_large", health
    assert "\n" not in health.error
    assert health.error.startswith("1 of ") and "DCGM_FI_DEV_GPU_UTIL" in health.error, health.error
    assert "answer larger than 16 MiB (--prometheus-max-response-size): refused unread" in health.error, health.error

    # the last good values keep serving, and /readyz and /metrics say why
    status, body = await _get(adapter, URL)
    assert status == 200 and _values(body) == {"trainer-0": "40", "trainer-1": "41"}, body
    status, text = await _get(adapter, "/readyz")
    assert status == 200 and "larger than 16 MiB (--prometheus-max-response-size)" in text, text
    status, text = await _get(adapter, "/metrics")
    assert re.search(r'gpuscale_source_target_last_error_timestamp_seconds\{[^}]*kind="too_large"', text), text

    prometheus.mode = "good"  # and the next answer that fits is read again
    await adapter.pipeline.refresh_once()
    assert adapter.source.health()[0].healthy, adapter.source.health()[0].error


async def test_a_stalled_answer_is_cut_off_at_the_deadline_while_requests_are_answered(adapter_and_prometheus):
    adapter, prometheus = adapter_and_prometheus
    prometheus.mode = "stall"
    started = time.monotonic()
    refresh = asyncio.create_task(adapter.pipeline.refresh_once())
    await asyncio.wait_for(prometheus.stalled.wait(), STALL_LIMIT)
    status, body = await _get(adapter, URL)
    answered_during_stall = not refresh.done()
    await refresh
    elapsed = time.monotonic() - started

    assert status == 200 and _values(body) == {"trainer-0": "40", "trainer-1": "41"}, body
    assert answered_during_stall, "the request waited for the stalled refresh"
    assert elapsed < STALL_LIMIT / 2, "the deadline (--prometheus-timeout 1s) did not cut the body off"
    (health,) = adapter.source.health()
    assert not health.healthy and health.error_kind == "timeout", health
    assert "DCGM_FI_DEV_GPU_UTIL" in health.error and "timed out after 1s" in health.error, health.error
    status, text = await _get(adapter, "/readyz")
    assert status == 200 and "timed out after 1s" in text, text
    status, body = await _get(adapter, URL)
    assert status == 200 and _values(body) == {"trainer-0": "40", "trainer-1": "41"}, body
