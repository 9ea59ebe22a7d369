"""The request path of a metrics request whose URL was asked before: raw request target → prepared body.

Every HPA sends the same URL on every poll, and with the bodies prepared by the refresh (answers.py) the answer
itself is a dictionary lookup — yet the full request path cost ~2.5× a bare aiohttp handler: the router matching
the path against the app's routes, the handler splitting the path and parsing the query string into a
``MetricQuery``, and ``web.Response`` building and serialising its header multidict. All of that gives the
same result for the same request target (the router and the handlers are fixed once the app runs), so the
full path remembers, per raw target (path and query exactly as sent), what it made of it (``remember``), and a
later request for that target takes this path:

- routing: the match info is rebuilt from the remembered match (what the router would give again);
- the app's middlewares run unchanged, in aiohttp's order — errors and metrics, authentication and
  authorization (auth.py), demand-driven refresh — so who may ask, what is counted and what fails how are
  the full path's by construction;
- the handler: the answer cache asked for the remembered query, exactly what the full path's handler asks;
- the response: the body and the header block aiohttp writes for it (``Content-Type``, ``Content-Length``,
  ``Date``, ``Server``; no ``Connection`` header for a keep-alive HTTP/1.1 request) in one write, without a
  ``web.Response``. An error raised by the answer (404, 503, 400 …) becomes a Status in the errors
  middleware as on the full path.

Anything else takes the full path: a target not seen (or forgotten: at most ``max_targets`` are kept), a
method other than GET, HTTP/1.0, ``Connection: close``, ``Expect``, an app with ``on_response_prepare``
signals or old-style middlewares, or a server that logs access (the access logger reads response fields).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion11
from aiohttp.web_urldispatcher import AbstractRoute, UrlMappingMatchInfo

from gpuscale.adapter.answers import MetricQuery

__all__ = ["DEFAULT_MAX_TARGETS", "FAST_PATH", "FastPath", "PreparedResponse"]

DEFAULT_MAX_TARGETS = 16384  # NB: beyond a cluster's distinct HPA queries (answers.DEFAULT_MAX_ENTRIES)
FAST_PATH = web.AppKey("fast_path", object)  # a FastPath (defined below)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Answer = Callable[[web.Request, MetricQuery, str], bytes]


class PreparedResponse:
    """A 200 ``application/json`` answer written as one block, byte for byte what ``web.Response(body=body,
    content_type="application/json")`` writes for a keep-alive HTTP/1.1 request.

    What aiohttp's ``RequestHandler.finish_response`` and ``start`` use of a response: ``prepare``,
    ``write_eof``, ``keep_alive``; ``status`` for the metrics middleware. The write goes through the request's
    ``StreamWriter`` (its byte count, and its drain when the client reads slower than we write).
    """

    __slots__ = ("_body", "_writer")
    status = 200
    keep_alive = True
    prepared = True

    def __init__(self, writer: Any, body: bytes) -> None:
        self._writer = writer
        self._body = body

    async def prepare(self, request: web.BaseRequest) -> None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        body = self._body
        await self._writer.write_eof(_head(len(body)) + body)


_SERVER = f"\r\nServer: {SERVER_SOFTWARE}\r\n\r\n"
_date: list = [None, b""]  # (aiohttp's cached Date text, the header block's tail with it)


def _head(length: int) -> bytes:
    # NB: aiohttp's order for web.Response: Content-Type (constructor), Content-Length (_start), Date, Server
    # (_prepare_headers); its Date text is cached per second, so is this tail.
    date = rfc822_formatted_time()
    if date is not _date[0]:
        _date[0], _date[1] = date, f"\r\nDate: {date}{_SERVER}".encode()
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d%b" % (length, _date[1])


@dataclass(slots=True)
class _Target:
    handler: Handler  # the app's middlewares around this target's answer
    match: dict[str, str]
    route: AbstractRoute


class FastPath:
    """The server's request handler in place of ``app._handle``: known targets here, the rest to the app.

    ``answer(request, query, resource)`` is the handler's last step on both paths (app.py's ``_answer`` without
    the ``web.Response``): it asks the answer cache and records the request's resource label.
    """

    def __init__(self, app: web.Application, answer: Answer, *, max_targets: int = DEFAULT_MAX_TARGETS) -> None:
        self._app = app
        self._answer = answer
        self._targets: dict[str, _Target] = {}
        self._max_targets = max_targets
        self.served = 0  # requests that took this path (whatever the middlewares then answered)

    def usable(self) -> bool:
        """Whether this app's requests can take the fast path at all (module docstring); once it is frozen."""
        app = self._app
        return (
            app.frozen
            and all(getattr(m, "__middleware_version__", None) == 1 for m in app.middlewares)
            and len(app.on_response_prepare) == 0
        )

    def remember(self, request: web.Request, query: MetricQuery, resource: str) -> None:
        """Called by the full path's handler once it has made ``query`` of ``request``'s target."""
        target = request.raw_path
        if target in self._targets or request.method != hdrs.METH_GET:
            return
        match_info = request.match_info
        if not isinstance(match_info, UrlMappingMatchInfo) or len(match_info.apps) != 1:
            return
        if len(self._targets) >= self._max_targets:
            self._targets.clear()  # NB: a flood of distinct URLs; the full path serves them meanwhile

        async def answer(request: web.Request) -> PreparedResponse:
            return PreparedResponse(request.writer, self._answer(request, query, resource))

        handler: Handler = answer
        # NB: as web.Application._handle wraps a route's handler, the first middleware outermost; without the one
        # aiohttp adds to set the match info's current app, which is this app already (one app, no sub-apps)
        for middleware in reversed(self._app.middlewares):
            handler = functools.partial(middleware, handler=handler)
        self._targets[target] = _Target(handler, dict(match_info), match_info.route)

    def __len__(self) -> int:
        return len(self._targets)

    def handler(self, full: Handler) -> Handler:
        """The server's request handler: this path for known targets, ``full`` (the app's) for the rest."""
        targets = self._targets
        app = self._app

        async def handle(request: web.Request) -> web.StreamResponse:
            target = targets.get(request.raw_path)
            if (
                target is None
                or request.method != hdrs.METH_GET
                or request.version != HttpVersion11
                or not request.keep_alive
                or hdrs.EXPECT in request.headers
            ):
                return await full(request)
            self.served += 1
            match_info = UrlMappingMatchInfo(target.match, target.route)
            match_info.add_app(app)
            match_info.freeze()
            request._match_info = match_info  # NB: what web.Application._handle sets after routing
            return await target.handler(request)

        return handle
