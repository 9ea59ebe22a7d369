"""Requests the HTTP layer rejects before the app sees them: answered with a metav1.Status, logged in one line.

aiohttp's parser refuses a request line over its limit, an unknown method, a bad Content-Length, a NUL
in a header, too many headers or undecodable bytes in the path before any handler or middleware runs.
By default it then logs an ERROR with a full traceback and answers ``text/plain`` that echoes the raw
bytes — so any client can fill the adapter's log. Here every such rejection is

- answered with a Status (``400 BadRequest``; the connection is closed, as the parser cannot resync),
  whose message names the kind of problem and never echoes the request;
- counted in ``gpuscale_adapter_rejected_requests_total{reason}`` (a fixed set of reasons);
- logged as one WARNING line without a traceback, at most once per client address per ``interval``
  (with the number of rejections held back since), and at most ``max_lines`` lines per interval in all.

The request line may be up to ``MAX_REQUEST_LINE`` bytes (aiohttp's default is 8190): kube-apiserver
passes on label selectors far longer than 8 KB, and a long but valid selector must not be refused.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aiohttp import http_exceptions, web, web_protocol, web_server

from gpuscale.adapter.fastpath import FAST_PATH, FastPath
from gpuscale.adapter.status import status_body

log = logging.getLogger(__name__)

MAX_REQUEST_LINE = 64 * 1024
"""Longest request line (method, path with query, version) accepted, in bytes."""
MAX_FIELD_SIZE = 16 * 1024
"""Longest header line accepted, in bytes."""

# Exception class → (reason label, message). Ordered: subclasses before their bases.
_KINDS: tuple[tuple[type[BaseException], str, str], ...] = (
    (http_exceptions.LineTooLong, "too_long", "request line or header too long"),
    (http_exceptions.BadHttpMethod, "bad_method", "unsupported HTTP method"),
    (http_exceptions.InvalidURLError, "bad_url", "malformed request URL"),
    (http_exceptions.InvalidHeader, "bad_header", "malformed HTTP header"),
    (http_exceptions.ContentLengthError, "bad_length", "invalid Content-Length"),
    (http_exceptions.BadStatusLine, "bad_request_line", "malformed HTTP request line"),
    (http_exceptions.TransferEncodingError, "bad_encoding", "invalid Transfer-Encoding"),
    (http_exceptions.BadHttpMessage, "bad_message", "malformed HTTP request"),
)
REASONS = (*dict.fromkeys(kind for _, kind, _ in _KINDS), "other")


def classify(exc: BaseException | None, status: int) -> tuple[str, str]:
    """(reason label, client-safe message) for a rejection."""
    for cls, kind, message in _KINDS:
        if isinstance(exc, cls):
            if kind == "too_long":
                message += f" (the request line may be up to {MAX_REQUEST_LINE} bytes, a header {MAX_FIELD_SIZE})"
            return kind, message
    return "other", f"the request could not be processed (HTTP {status})"


class RejectionLog:
    """Counts rejections and logs them one line at a time, bounded per client and per interval."""

    def __init__(
        self,
        *,
        interval: float = 60.0,
        max_lines: int = 100,
        count: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval = interval
        self._max_lines = max_lines
        self._count = count
        self._clock = clock
        # client → [time of its last logged line, rejections held back since]; least recently logged first
        self._clients: OrderedDict[str, list[float]] = OrderedDict()
        self._window = (float("-inf"), 0)  # (start of the current interval, lines logged in it)

    def record(self, client: str | None, reason: str, message: str) -> bool:
        """Count one rejection; True when it was logged."""
        if self._count is not None:
            self._count(reason)
        now = self._clock()
        key = client or "unknown"
        entry = self._clients.get(key)
        if entry is not None and now - entry[0] < self._interval:
            entry[1] += 1
            return False
        start, lines = self._window
        if now - start >= self._interval:
            start, lines = now, 0
        if lines >= self._max_lines:
            return False  # NB: many clients at once: the counter still says how many; the log stays bounded
        self._window = (start, lines + 1)
        held = int(entry[1]) if entry is not None else 0
        self._clients[key] = [now, 0]
        self._clients.move_to_end(key)
        while len(self._clients) > 4 * self._max_lines:
            self._clients.popitem(last=False)
        log.warning(
            "rejected a malformed HTTP request from %s: %s [%s]%s",
            key,
            message,
            reason,
            f" ({held} more from this client since its last line)" if held else "",
        )
        return True


class _RequestHandler(web_protocol.RequestHandler):
    rejections: RejectionLog

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            # NB: not a client's malformed request but a failure in the server: keep aiohttp's full report.
            return super().handle_error(request, status, exc, message)
        reason, text = classify(exc, status)
        self.rejections.record(request.remote, reason, text)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send the error")
        resp = web.Response(status=status, text=json.dumps(status_body(status, text)), content_type="application/json")
        resp.force_close()
        return resp


class _Server(web_server.Server):
    rejections: RejectionLog

    def __call__(self) -> web_protocol.RequestHandler:
        handler = _RequestHandler(self, loop=self._loop, **self._kwargs)
        handler.rejections = self.rejections
        return handler


class AdapterRunner(web.AppRunner):
    """An AppRunner whose connections answer requests the parser rejects with a Status (see module docs), and
    whose metrics requests for a URL asked before take the app's fast path (fastpath.py) when it has one and
    access is not logged (``access_log=None``, as the adapter runs)."""

    def __init__(self, app: web.Application, *, rejections: RejectionLog, **kwargs: Any) -> None:
        kwargs.setdefault("max_line_size", MAX_REQUEST_LINE)
        kwargs.setdefault("max_field_size", MAX_FIELD_SIZE)
        super().__init__(app, **kwargs)
        self._rejections = rejections

    async def _make_server(self) -> web_server.Server:
        server = await super()._make_server()
        # NB: aiohttp builds its Server inside Application._make_handler and has no hook for the handler
        # class; the subclass adds only handler creation, so the instance is re-classed rather than rebuilt.
        server.__class__ = _Server
        server.rejections = self._rejections  # type: ignore[attr-defined]
        fast = self.app.get(FAST_PATH)
        if isinstance(fast, FastPath) and self._kwargs.get("access_log", True) is None and fast.usable():
            server.request_handler = fast.handler(server.request_handler)
        return server


__all__ = ["MAX_FIELD_SIZE", "MAX_REQUEST_LINE", "REASONS", "AdapterRunner", "RejectionLog", "classify"]
