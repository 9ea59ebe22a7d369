"""Asking the Kubernetes API to review something (TokenReview, SubjectAccessReview), and remembering the answers.

Shared by authentication (authn.py) and authorization (authz.py): ``create_review`` POSTs a review object and
turns every way the API can fail to answer into ``SourceUnavailable``; ``CachedLookup`` keeps answers for a TTL
and lets concurrent misses share one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

import aiohttp
from kubernetes_asyncio import client

from gpuscale.errors import SourceUnavailable
from gpuscale.sources.reflector import WatchExpired, read_json

__all__ = ["REVIEW_TIMEOUT_SECONDS", "SOURCE", "CachedLookup", "create_review"]

SOURCE = "kubernetes"
REVIEW_TIMEOUT_SECONDS = 5.0
_CACHE_ENTRIES = 4096


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class CachedLookup(Generic[K, V]):
    """Answers of an async lookup kept ``ttl(answer)`` seconds per key; concurrent misses share one call.

    Exceptions are not cached (a failed TokenReview or SubjectAccessReview is asked again next time).
    """

    def __init__(
        self, *, ttl: Callable[[V], float], clock: Callable[[], float], max_entries: int = _CACHE_ENTRIES
    ) -> None:
        self._ttl = ttl
        self._clock = clock
        self._max_entries = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._inflight: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K, lookup: Callable[[], Awaitable[V]]) -> V:
        hit = self._entries.get(key)
        if hit is not None:
            if hit[0] > self._clock():
                return hit[1]
            del self._entries[key]
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(self._fill(key, lookup))
            task.add_done_callback(_retrieve)
            self._inflight[key] = task
        # NB: shielded, so a client that hangs up does not cancel the lookup other requests wait for.
        return await asyncio.shield(task)

    async def _fill(self, key: K, lookup: Callable[[], Awaitable[V]]) -> V:
        try:
            value = await lookup()
        finally:
            self._inflight.pop(key, None)
        ttl = self._ttl(value)
        if ttl > 0:
            self._entries[key] = (self._clock() + ttl, value)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return value


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved: the waiters got it, or nobody waits any more


async def create_review(call: Callable[..., Awaitable[Any]], body: dict[str, Any], *, timeout: float) -> dict:
    """POST a review object; its ``status``. SourceUnavailable (with the cause) when the API does not answer."""
    kind = body["kind"]
    try:
        response = await call(body, _preload_content=False, _request_timeout=timeout)
        try:
            answer = await read_json(response)
        finally:
            response.release()
    except (client.ApiException, aiohttp.ClientError, OSError, TimeoutError, ValueError, WatchExpired) as e:
        if isinstance(e, client.ApiException):
            detail = f"HTTP {e.status} {e.reason}"
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                detail += f": {json.loads(e.body or b'{}').get('message', '')}"
        else:
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise SourceUnavailable(SOURCE, f"{kind} failed: {detail}") from e
    status = answer.get("status")
    return status if isinstance(status, dict) else {}
