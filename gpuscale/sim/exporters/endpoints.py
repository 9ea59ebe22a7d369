"""``ExporterServer``: one aiohttp runner serving any number of ``/metrics`` endpoints, each on its own port,
rendering on every GET, with per-endpoint fault knobs (``Faults``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class Faults:
    """Fault knobs of one endpoint, checked on every request in this order.

    - ``hang``: accept the request and never answer (until the server stops).
    - ``delay_s``: answer normally after this many seconds.
    - ``status``: answer with this HTTP status and a short text body.
    - ``stream_bytes``: stream a chunked body of this many bytes (valid exposition: comment lines).
    - ``body``: answer 200 with this body instead of the rendering (e.g. malformed text).
    - ``nan``: render normally, then replace every sample value with NaN.
    """

    hang: bool = False
    delay_s: float = 0.0
    status: int | None = None
    stream_bytes: int | None = None
    body: str | bytes | None = None
    nan: bool = False


_SAMPLE_VALUE = re.compile(r"^([^#\s][^\n]*?) (\S+)$", re.MULTILINE)


def _nan_values(text: str, literal: str) -> str:
    return _SAMPLE_VALUE.sub(lambda m: f"{m.group(1)} {literal}", text)


@dataclass(slots=True)
class _Endpoint:
    name: str
    render: Callable[[], str]
    port: int
    nan_literal: str
    site: web.SockSite
    faults: Faults = field(default_factory=Faults)
    requests: int = 0
    last_body: str = ""  # NB: what a retiring endpoint serves in its grace period (its pod's state is gone)


class ExporterServer:
    """Many ``/metrics`` endpoints served from one process, each on its own port of ``host``.

    ``await add(name, render)`` binds a new port (0 = any free one) and returns it; every GET calls
    ``render()`` for a fresh body. Use ``async with ExporterServer() as server`` or ``start``/``stop``;
    ``stop`` releases hung requests first, so it returns promptly.
    """

    def __init__(self, *, host: str = "127.0.0.1", shutdown_timeout: float = 1.0) -> None:
        self.host = host
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None
        self._endpoints: dict[str, _Endpoint] = {}
        self._by_port: dict[int, _Endpoint] = {}
        self._closing = asyncio.Event()
        self._retiring: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> ExporterServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._runner is not None:
            return
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=self._shutdown_timeout)
        await runner.setup()
        self._closing = asyncio.Event()
        self._runner = runner

    async def stop(self) -> None:
        """Stop every endpoint; requests in flight (including hung ones) are released first."""
        self._closing.set()
        for task in self._retiring:
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        runner, self._runner = self._runner, None
        self._endpoints.clear()
        self._by_port.clear()
        if runner is not None:
            await runner.cleanup()

    async def add(self, name: str, render: Callable[[], str], *, port: int = 0, nan_literal: str = "NaN") -> int:
        """Serve ``render()`` at ``http://host:<port>/metrics`` under ``name``; returns the port."""
        if self._runner is None:
            raise RuntimeError("ExporterServer is not started")
        if name in self._endpoints:
            raise ValueError(f"endpoint {name!r} already exists")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        bound = int(sock.getsockname()[1])
        site = web.SockSite(self._runner, sock)
        await site.start()
        endpoint = _Endpoint(name=name, render=render, port=bound, nan_literal=nan_literal, site=site)
        self._endpoints[name] = endpoint
        self._by_port[bound] = endpoint
        return bound

    async def remove(self, name: str) -> None:
        endpoint = self._endpoint(name)
        del self._endpoints[name]
        self._by_port.pop(endpoint.port, None)
        await endpoint.site.stop()

    async def retire(self, name: str, *, after_s: float) -> None:
        """Stop ``name`` as a pod in its termination grace period stops: the name is free at once (a new endpoint
        may take it), its port serves the last body for ``after_s`` more seconds (a scraper that listed it just
        before it went finishes its round), then closes."""
        endpoint = self._endpoint(name)
        if not endpoint.last_body:  # NB: never scraped: nothing true to serve in its grace period
            await self.remove(name)
            return
        del self._endpoints[name]
        last = endpoint.last_body
        endpoint.render = lambda: last
        task = asyncio.create_task(self._close_later(endpoint, after_s))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _close_later(self, endpoint: _Endpoint, after_s: float) -> None:
        await asyncio.sleep(after_s)
        if self._by_port.get(endpoint.port) is endpoint:
            del self._by_port[endpoint.port]
        await endpoint.site.stop()

    def _endpoint(self, name: str) -> _Endpoint:
        try:
            return self._endpoints[name]
        except KeyError:
            raise KeyError(f"unknown endpoint {name!r}; endpoints: {', '.join(sorted(self._endpoints))}") from None

    @property
    def names(self) -> list[str]:
        return sorted(self._endpoints)

    def port(self, name: str) -> int:
        return self._endpoint(name).port

    def url(self, name: str) -> str:
        return f"http://{self.host}:{self.port(name)}/metrics"

    def requests(self, name: str) -> int:
        """How many requests ``name`` has received (faulty ones included)."""
        return self._endpoint(name).requests

    def faults(self, name: str) -> Faults:
        """The live fault knobs of ``name`` (mutate them, or use ``set_faults``)."""
        return self._endpoint(name).faults

    def set_faults(self, name: str, **knobs: Any) -> Faults:
        """Replace ``name``'s faults with ``Faults(**knobs)`` (no knobs = healthy again)."""
        endpoint = self._endpoint(name)
        endpoint.faults = Faults(**knobs)
        return endpoint.faults

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
        endpoint = self._by_port.get(sockname[1]) if sockname else None
        if endpoint is None:
            return web.Response(status=404, text="404 page not found\n")
        endpoint.requests += 1
        if request.path != "/metrics":
            return web.Response(status=404, text="404 page not found\n")
        faults = endpoint.faults
        if faults.hang:
            await self._closing.wait()
            return web.Response(status=503, text="exporter stopped\n")
        if faults.delay_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), faults.delay_s)
        if faults.status is not None:
            return web.Response(status=faults.status, text=f"simulated failure: HTTP {faults.status}\n")
        if faults.stream_bytes is not None:
            return await self._stream(request, faults.stream_bytes)
        if faults.body is not None:
            body = faults.body.encode() if isinstance(faults.body, str) else faults.body
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
        text = endpoint.last_body = endpoint.render()
        if faults.nan:
            text = _nan_values(text, endpoint.nan_literal)
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    async def _stream(self, request: web.Request, size: int) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        response.enable_chunked_encoding()
        await response.prepare(request)
        line = b"# padding " + b"x" * 53 + b"\n"  # 64-byte valid comment lines
        chunk = line * 1024  # 64 KiB
        remaining = max(0, size)
        try:
            while remaining > 0 and not self._closing.is_set():
                piece = chunk[: min(len(chunk), remaining)]
                await response.write(piece)
                remaining -= len(piece)
            await response.write_eof()
        except (ConnectionError, RuntimeError) as e:  # the client gave up (e.g. its size limit)
            log.debug("stream to %s aborted: %s", request.remote, e)
        return response
