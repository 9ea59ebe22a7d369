"""The fast path (adapter/fastpath.py): a URL asked before is answered byte for byte as the full path answers it.

Scope: over real sockets, the adapter's runner (fast path on) against the same app served by a plain aiohttp
runner (full path only): status line, headers (Date aside) and body equal for every URL shape, both API versions,
selectors, metricLabelSelector, external metrics and every error Status — first request, repeats, after the
values went stale and after refreshes that prepared the bodies; what is not a keep-alive HTTP/1.1 GET takes the
full path; the app's middlewares (demand-driven refresh here; authentication and authorization in test_auth.py,
whose server is the adapter's runner) run on the fast path as on the full one.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from gpuscale.adapter.answers import AnswerCache
from gpuscale.adapter.app import make_app
from gpuscale.adapter.asked_for import asked_for_middleware
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.fastpath import FAST_PATH, FastPath
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.transport import AdapterRunner, RejectionLog
from gpuscale.metrics.catalogue import load_catalogue
from tests.adapter.test_answers import ALIKE, BATCH, WEB, Refreshing
from tests.adapter.test_api import CUSTOM, NOW, ROUTES, make_cluster, store  # noqa: F401  (a fixture)

CATALOGUE = load_catalogue()
URLS = list(dict.fromkeys([path for path, _, _ in ROUTES] + ALIKE))
DATE = re.compile(rb"\r\nDate: [^\r]*")


class Connection:
    """One keep-alive client connection that reads answers as raw bytes (status line, headers, body)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def get(self, path: str, *, method: str = "GET", version: str = "1.1", headers: str = "") -> bytes:
        self.writer.write(f"{method} {path} HTTP/{version}\r\nHost: adapter\r\n{headers}\r\n".encode())
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        length = re.search(rb"\r\nContent-Length: (\d+)", head)
        body = b""
        if length and method != "HEAD":
            body = await asyncio.wait_for(self.reader.readexactly(int(length.group(1))), 10)
        return DATE.sub(b"\r\nDate: -", head) + body

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def serve(app: web.Application, runner_class: Callable[..., web.AppRunner]) -> tuple[web.AppRunner, int]:
    runner = runner_class(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


def adapter_runner(app: web.Application, **kwargs) -> web.AppRunner:
    return AdapterRunner(app, rejections=RejectionLog(), **kwargs)


class Pair:
    """The same provider served twice: by the adapter's runner (fast path) and by a plain one (full path only),
    each app with its own answer cache, so the reference computes every answer itself."""

    def __init__(self, provider: MetricsProvider, *, answers: AnswerCache | None = None, middlewares=()) -> None:
        def app(answers: AnswerCache | None) -> web.Application:
            metrics = AdapterMetrics(lambda: [])
            return make_app(
                provider,
                Discovery(CATALOGUE),
                metrics,
                ready=lambda: (True, ""),
                answers=answers,
                middlewares=middlewares,
            )

        self.fast_app, self.full_app = app(answers), app(None)

    @property
    def fast(self) -> FastPath:
        fast = self.fast_app[FAST_PATH]
        assert isinstance(fast, FastPath)
        return fast

    async def __aenter__(self) -> Pair:
        self.runners = []
        connections = []
        for app, runner_class in ((self.fast_app, adapter_runner), (self.full_app, web.AppRunner)):
            runner, port = await serve(app, runner_class)
            self.runners.append(runner)
            connections.append(await Connection.open(port))
        self.on_fast, self.on_full = connections
        return self

    async def __aexit__(self, *exc) -> None:
        for connection in (self.on_fast, self.on_full):
            await connection.close()
        for runner in self.runners:
            await runner.cleanup()

    async def both(self, path: str, **options) -> tuple[bytes, bytes]:
        return await self.on_fast.get(path, **options), await self.on_full.get(path, **options)


@pytest.fixture
async def pair(store) -> AsyncIterator[tuple[Pair, dict]]:  # noqa: F811
    clock = {"now": NOW}
    provider = MetricsProvider(CATALOGUE, store, make_cluster(), clock=lambda: clock["now"])
    async with Pair(provider) as p:
        yield p, clock


async def test_every_url_is_answered_by_the_fast_path_exactly_as_by_the_full_path(pair):
    p, clock = pair
    ok = []
    for path in URLS:
        first, reference = await p.both(path)
        assert first == reference, path
        if reference.startswith(b"HTTP/1.1 200 "):
            ok.append(path)
    assert len(ok) >= 20 and p.fast.served == 0  # every URL new so far: the full path made each answer
    for _ in range(2):
        for path in URLS:
            again, reference = await p.both(path)
            assert again == reference, path
    assert p.fast.served == 2 * len(ok)  # every URL that was answered once, then from the fast path

    clock["now"] += 3600  # every value past its max-age: the same 503 Status, from the fast path too
    for path in ok:
        stale, reference = await p.both(path)
        assert stale == reference and stale.startswith(b"HTTP/1.1 503 "), (path, stale)
    assert p.fast.served == 3 * len(ok)


async def test_prepared_bodies_after_each_refresh_are_what_the_full_path_computes():
    r = Refreshing()
    async with Pair(r.provider, answers=r.answers) as p:
        await r.refresh(10)
        paths = [WEB, BATCH, WEB.replace("v1beta2", "v1beta1"), BATCH.replace("v1beta1", "v1beta2")]
        for path in paths:
            assert len(set(await p.both(path))) == 1
        for value in (20, 30, 40):
            await r.refresh(value)
            for path in paths:
                fast, full = await p.both(path)
                expected = value + 3 if path.endswith("batch") else value  # web-3 is the batch pod, 3 above web-0
                assert fast == full and f'"value":"{expected}"'.encode() in fast
        assert p.fast.served == 3 * len(paths)


@pytest.mark.parametrize(
    ("options", "closes"),
    [
        ({"method": "HEAD"}, False),
        ({"version": "1.0"}, True),
        ({"version": "1.0", "headers": "Connection: keep-alive\r\n"}, False),
        ({"headers": "Connection: close\r\n"}, True),
    ],
)
async def test_what_is_not_a_keep_alive_http_1_1_get_takes_the_full_path(pair, options, closes):
    p, _ = pair
    path = URLS[0]
    await p.both(path)
    await p.both(path)
    assert p.fast.served == 1
    fast, full = await p.both(path, **options)
    assert fast == full and fast.startswith(b"HTTP/1.")
    assert p.fast.served == 1
    if closes:
        assert await p.on_fast.reader.read() == b""  # the server closed the connection, as the full path does


async def test_the_apps_middlewares_run_on_the_fast_path(store):  # noqa: F811
    noted: list[tuple[str, str | None]] = []

    def note(metric: str, namespace: str | None) -> bool:
        noted.append((metric, namespace))
        return True

    async def refresh() -> None:
        raise AssertionError("every scope is fetched here")

    provider = MetricsProvider(CATALOGUE, store, make_cluster(), clock=lambda: NOW)
    async with Pair(provider, middlewares=[asked_for_middleware(note, refresh)]) as p:
        path = f"{CUSTOM}/v1beta2/namespaces/ml-training/pods/*/gpu_utilization"
        for _ in range(3):
            fast, full = await p.both(path)
            assert fast == full
        assert p.fast.served == 2
        assert noted == [("gpu_utilization", "ml-training")] * 6  # three requests on each server


async def test_a_flood_of_distinct_urls_stays_within_the_bound(store):  # noqa: F811
    provider = MetricsProvider(CATALOGUE, store, make_cluster(), clock=lambda: NOW)
    async with Pair(provider) as p:
        p.fast._max_targets = 8
        base = f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization?labelSelector=app%21%3Dx"
        for i in range(30):
            fast, full = await p.both(f"{base}{i}")
            assert fast == full
            assert len(p.fast) <= 8
