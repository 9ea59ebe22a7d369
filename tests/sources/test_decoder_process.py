"""The answer decoder process (sources/decoder_process.py), against the fake Prometheus of test_prometheus.py.

What the thread path shares with it (values, faults, reasons) runs in both modes in test_prometheus.py; here what
only the process has: the event loop answers while the child is stopped on purpose, a child that hangs or dies
costs one refresh's queries (kind ``decoder``, last values kept) and the next refresh starts a new one, label sets
are sent once and forgotten by both sides when no answer has had them for a while, the child starts without the
adapter's heavy imports and ends with it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
from aiohttp import web

from gpuscale.sources import decoder_process
from gpuscale.sources.base import TermQuery
from gpuscale.sources.prometheus import PrometheusSource
from tests.helpers import T0
from tests.sources.test_prometheus import FakePrometheus

GAUGE = TermQuery(series=("DCGM_FI_DEV_GPU_UTIL",))
NAME = "DCGM_FI_DEV_GPU_UTIL"


def gpus(n: int, *, pod_prefix: str = "p") -> list[tuple[dict[str, str], str]]:
    return [
        ({"__name__": NAME, "UUID": f"GPU-{i}", "pod": f"{pod_prefix}{i}", "namespace": "ml"}, str(i)) for i in range(n)
    ]


async def started(answers: list[tuple[dict[str, str], str]]) -> FakePrometheus:
    prom = await FakePrometheus().start()
    prom.answers[NAME] = answers
    return prom


async def _pong(_: web.Request) -> web.Response:
    return web.Response(text="pong")


def process_source(url: str, **kw) -> PrometheusSource:
    return PrometheusSource(url, queries=[GAUGE], clock=lambda: T0, decode_in="process", **kw)


async def test_the_loop_answers_while_the_child_is_stopped_and_a_hung_child_costs_one_refresh():
    """A request is answered while a refresh is stalled on purpose (the child stopped mid-decode); past the decoder's
    deadline the child is killed, the query fails with kind decoder and keeps its values; the next refresh starts a
    new child and reads new values."""
    prom = await started(gpus(3))
    source = process_source(prom.url)
    source._decoder._timeout = 1.0  # NB: the shipped 30 s, shortened for the test
    app = web.Application()
    app.router.add_get("/ping", _pong)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    ping = f"http://127.0.0.1:{runner.addresses[0][1]}/ping"
    try:
        await source.refresh(now=T0)
        assert [v.value for v in source.read(GAUGE)] == [0, 1, 2]
        pid = source._decoder.pid
        os.kill(pid, signal.SIGSTOP)
        prom.answers[NAME] = gpus(3)[:2]
        refresh = asyncio.create_task(source.refresh(now=T0))
        async with aiohttp.ClientSession() as client:
            for _ in range(3):
                async with client.get(ping) as resp:  # NB: answered while the decode cannot progress
                    assert await resp.text() == "pong"
            assert not refresh.done()
        await refresh
        health = source.health()[0]
        assert not health.healthy and health.error_kind == "decoder"
        assert "answer decoder process did not answer within 1s: killed" in health.error
        assert health.extra["decoder_restarts"] == "1"
        assert [v.value for v in source.read(GAUGE)] == [0, 1, 2]  # NB: last values kept, old timestamps
        source._decoder._timeout = 30.0  # NB: the new child's start is not what is tested (1 s was short at load 24)
        await source.refresh(now=T0)
        assert source.health()[0].healthy and source._decoder.pid not in (None, pid)
        assert [v.value for v in source.read(GAUGE)] == [0, 1]
    finally:
        await source.close()
        await runner.cleanup()
        await prom.stop()


async def test_a_child_killed_between_refreshes_is_replaced():
    prom = await started(gpus(2))
    source = process_source(prom.url)
    try:
        await source.refresh(now=T0)
        os.kill(source._decoder.pid, signal.SIGKILL)
        await asyncio.sleep(0.2)
        await source.refresh(now=T0)
        health = source.health()[0]
        if not health.healthy:  # NB: the kill may be seen before the refresh (a new child) or by it (this query fails)
            assert health.error_kind == "decoder" and "exited (killed by signal 9)" in health.error
            await source.refresh(now=T0)
        assert source.health()[0].healthy
        assert [(v.labels["pod"], v.value) for v in source.read(GAUGE)] == [("p0", 0), ("p1", 1)]
    finally:
        await source.close()
        await prom.stop()


async def test_label_sets_are_sent_once_and_forgotten_when_gone(monkeypatch):
    """Pods churn every refresh: the adapter's table holds the sets of the last KEEP_GENERATIONS refreshes at most,
    and an unchanged answer sends no label set again (the same dict serves every refresh)."""
    prom = await started(gpus(5))
    source = process_source(prom.url)
    try:
        await source.refresh(now=T0)
        first = source.read(GAUGE)
        await source.refresh(now=T0)
        again = source.read(GAUGE)
        assert [v.labels for v in again] == [v.labels for v in first]
        assert all(a.labels is b.labels for a, b in zip(first, again, strict=True))
        keep = decoder_process.KEEP_GENERATIONS
        for r in range(3 * keep):
            prom.answers[NAME] = gpus(5, pod_prefix=f"r{r}-")
            await source.refresh(now=T0)
            assert [v.labels["pod"] for v in source.read(GAUGE)] == [f"r{r}-{i}" for i in range(5)]
            assert len(source._decoder._sets) <= 5 * (2 * keep + 1)
        assert len(source._decoder._sets) < 5 * 3 * keep  # NB: churned sets were forgotten
    finally:
        await source.close()
        await prom.stop()


async def test_close_ends_the_child():
    prom = await started(gpus(1))
    source = process_source(prom.url)
    await source.refresh(now=T0)
    pid = source._decoder.pid
    await source.close()
    await prom.stop()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"decoder process {pid} still runs after close()")


def test_the_child_imports_neither_aiohttp_nor_numpy():
    code = (
        "import sys; import gpuscale.sources.decoder_process; "
        "print(sorted(m for m in ('aiohttp', 'numpy', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
