"""The request side of demand-driven refresh: a metric nobody references is fetched on its first request.

Before a metric request reaches its handler, this middleware tells the refresh scope (metrics/refresh_scope.py) which
(metric, namespace) it asks for. If the last refresh fetched that scope the request goes on at once — the
common case, every HPA's metric is fetched at the full rate. Otherwise the scope becomes warm and the request
waits for the next refresh, which the adapter starts at once (``Pipeline.refresh_soon``), then is answered from
the store like any other; later requests for it are served at once while it stays warm.

The namespace of a request (None: every namespace):

    custom   namespaces/{ns}/metrics/{m}            ns (the namespace object)
             namespaces/{ns}/{resource}/{name}/{m}  ns (pods, workloads, resource claims)
             namespaces/{name}/{m}                  name, or None for ``*`` (namespaces by selector)
             nodes/{name}/{m}                       None (node values aggregate every namespace's GPUs)
    external namespaces/{ns}/{m}                    ns

A request that is not a metric request (discovery, health) passes untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

__all__ = ["asked_for_middleware", "requested_scope"]


def requested_scope(request: web.Request) -> tuple[str, str | None] | None:
    """(metric, namespace or None) of a metric request; None for any other request or a malformed path."""
    group = request.match_info.get("group_name", "")
    if group.startswith("external."):
        return request.match_info["metric"], request.match_info["namespace"]
    if not group.startswith("custom."):
        return None
    parts = request.match_info.get("tail", "").split("/")
    if len(parts) == 4 and parts[0] == "namespaces" and parts[2] == "metrics":
        return parts[3], parts[1]
    if len(parts) == 5 and parts[0] == "namespaces":
        return parts[4], parts[1]
    if len(parts) == 3 and parts[0] == "namespaces":
        return parts[2], None if parts[1] == "*" else parts[1]
    if len(parts) == 3:
        return parts[2], None
    return None


def asked_for_middleware(note: Callable[[str, str | None], bool], refresh: Callable[[], Awaitable[None]]) -> Middleware:
    """``note(metric, namespace)`` records the request and says whether its scope is in the store;
    ``refresh()`` waits for a refresh that fetches it (raising TimeoutError when it does not come in time)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        scope = requested_scope(request)
        if scope is not None and not note(*scope):
            # NB: on timeout it is answered from what the store has (404/503 as usual); why is in /readyz
            with contextlib.suppress(TimeoutError):
                await refresh()
        return await handler(request)

    return middleware
