"""List+watch: the machinery every cache of Kubernetes objects here shares (``Reflector``), one loop per
resource in the style of kopf's ``infinite_watch`` and client-go's reflector::

    list (paged) ──► replace the index ──► watch from the list's resourceVersion ──► apply each event
      ▲                                        │ stream ended (timeoutSeconds): watch again from the
      │                                        │   last resourceVersion seen (events and BOOKMARKs)
      └── 410 Gone (ERROR event or HTTP 410) ◄─┘ other errors: back off (doubling, capped), resume

A relist replaces everything of that kind, so an object deleted while no watch was open disappears:
a DELETED is never lost, it is at worst learned late.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from gpuscale.backoff import Backoff
from gpuscale.errors import SourceUnavailable
from gpuscale.sources.base import TargetHealth

__all__ = [
    "SOURCE",
    "Reflector",
    "WatchExpired",
    "WatchedKind",
    "api_unavailable",
    "namespaced_name",
    "read_json",
    "watch_events",
]

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
_LIST_PAGE_SIZE = 500
_LIST_TIMEOUT_SECONDS = 60.0
_INITIAL_BACKOFF_SECONDS = 0.5


class WatchExpired(Exception):
    """The watch's resourceVersion is older than the server keeps (410 Gone): relist."""


@dataclass(frozen=True, slots=True)
class WatchedKind:
    """One cached resource: how to list/watch it and how its objects enter the index."""

    name: str
    list_call: Callable[..., Awaitable[Any]]
    replace: Callable[[list[dict[str, Any]]], None]
    put: Callable[[dict[str, Any]], None]
    remove: Callable[[dict[str, Any]], None]


def namespaced_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    """An object's (namespace, name); ``""`` for a cluster-scoped object's namespace."""
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class Reflector:
    """List+watch loops over a set of kinds (client-go's reflector, kopf's ``infinite_watch``): the machinery
    every cache here shares. A subclass sets ``self._kinds`` (how to list each kind and where its objects go);
    ``name`` labels its health entries.

    ``watch_timeout_seconds`` is the server-side ``timeoutSeconds`` of each watch request;
    ``backoff_max_seconds`` caps the doubling delay after errors.
    """

    name = SOURCE

    def __init__(self, *, watch_timeout_seconds: int = 300, backoff_max_seconds: float = 30) -> None:
        self._watch_timeout = int(watch_timeout_seconds)
        self._backoff_max = float(backoff_max_seconds)
        self._kinds: tuple[WatchedKind, ...] = ()
        self._listed: set[str] = set()
        self._synced_event = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.last_errors: dict[str, str] = {}
        """kind → the last error its loop met (cleared by the next successful list); for readiness messages."""
        self._answered_at: dict[str, float] = {}  # kind → when the API last answered its list or watch
        self._failures: dict[str, int] = {}
        self._last_problem: dict[str, tuple[str, float]] = {}  # kind → (reason, when), kept after recovery
        self.relists = 0
        """How many times a watch expired (410 Gone) and its kind was listed again."""
        self.relist_after_error = False
        """Whether a watch error (not a clean end) leads to a new list rather than a watch resumed from the last
        resourceVersion: a cache others act on (the controller's) is confirmed again by a list after any outage."""
        self._confirmed: set[str] = set()  # kinds listed since their last watch error
        self._unconfirmed_since: dict[str, float] = {}  # kind → when its last error made it unconfirmed
        self._confirm_changed = asyncio.Event()  # set by every list: what ``reconfirm`` waits on
        self._said: dict[str, tuple[str, float]] = {}  # kind → (problem last logged, when)

    def health(self) -> list[TargetHealth]:
        """One entry per kind, as sources report targets: /metrics and /readyz show an API outage with them."""
        out = []
        for kind in self._kinds:
            error = self.last_errors.get(kind.name)
            problem, problem_at = self._last_problem.get(kind.name, (None, None))
            out.append(
                TargetHealth(
                    kind.name,
                    error is None and kind.name in self._listed,
                    last_success=self._answered_at.get(kind.name),
                    error=error if error is not None else (None if kind.name in self._listed else "not listed yet"),
                    failures_total=self._failures.get(kind.name, 0),
                    error_kind="api_error" if error is not None else None,
                    last_error=problem,
                    last_error_kind="api_error" if problem is not None else None,
                    last_error_at=problem_at,
                )
            )
        return out

    def _answered(self, kind: str) -> None:
        self._answered_at[kind] = time.time()
        self.last_errors.pop(kind, None)

    @property
    def synced(self) -> bool:
        return self._synced_event.is_set()

    # -- lifecycle

    async def start(self) -> None:
        """Start the list+watch loops (idempotent). Returns at once; see ``wait_synced``."""
        if self._tasks:
            return
        self._tasks = [asyncio.create_task(self._run(kind), name=f"kube-watch-{kind.name}") for kind in self._kinds]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_synced(self, timeout: float) -> None:
        """Wait until every kind has been listed once; SourceUnavailable after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._synced_event.wait(), timeout)
        except TimeoutError:
            missing = ", ".join(k.name for k in self._kinds if k.name not in self._listed)
            errors = "; ".join(f"{k}: {e}" for k, e in sorted(self.last_errors.items()))
            reason = f"cache not synced after {timeout:g}s ({missing} not listed yet)"
            raise SourceUnavailable(SOURCE, f"{reason}: {errors}" if errors else reason) from None

    async def refresh_once(self) -> None:
        """List every kind once and replace the indices; SourceUnavailable if the API cannot be read."""
        results = await asyncio.gather(*(self._list(kind) for kind in self._kinds), return_exceptions=True)
        for kind, result in zip(self._kinds, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, SourceUnavailable):
                    raise result
                if isinstance(result, asyncio.CancelledError):
                    raise result
                raise api_unavailable(kind.name, result) from result

    # -- the loop

    async def _run(self, kind: WatchedKind) -> None:
        backoff = self._backoff()
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    resource_version = await self._list(kind)
                    backoff.reset()
                loop = asyncio.get_running_loop()
                started = loop.time()
                resource_version, events = await self._watch(kind, resource_version)
                self._answered(kind.name)
                if events == 0 and loop.time() - started < 1.0:
                    # NB: a server that ends watches at once would otherwise have us spinning.
                    await asyncio.sleep(backoff.next_delay())
                else:
                    backoff.reset()
            except WatchExpired as e:
                if resource_version is None:  # the list itself expired (a stale continue token): not too fast
                    await asyncio.sleep(backoff.next_delay())
                log.info("kubernetes %s watch expired (%s); relisting", kind.name, e)
                self.relists += 1
                resource_version = None
            except asyncio.CancelledError:
                raise
            except (
                SourceUnavailable,
                client.ApiException,
                aiohttp.ClientError,
                OSError,
                TimeoutError,
                ValueError,
            ) as e:
                if self.relist_after_error:
                    resource_version = None
                    if kind.name in self._confirmed:
                        self._confirmed.discard(kind.name)
                        self._unconfirmed_since[kind.name] = time.time()
                error = api_unavailable(kind.name, e)
                self.last_errors[kind.name] = error.reason
                self._failures[kind.name] = self._failures.get(kind.name, 0) + 1
                self._last_problem[kind.name] = (error.reason, time.time())
                # NB: a 429 or 503 says when to come back; never sooner than it asks.
                delay = max(backoff.next_delay(), _retry_after(e))
                # NB: said once per distinct problem (and every 5 minutes while it lasts), not every retry
                said, said_at = self._said.get(kind.name, ("", 0.0))
                if said != error.reason or time.monotonic() - said_at > 300:
                    log.warning("%s; retrying with backoff (now %.1fs)", error, delay)
                    self._said[kind.name] = (error.reason, time.monotonic())
                await asyncio.sleep(delay)

    def _backoff(self) -> Backoff:
        """A loop's delays after errors: from 0.5 s, doubling up to ``backoff_max_seconds``, ±20 % jitter."""
        return Backoff(initial_seconds=_INITIAL_BACKOFF_SECONDS, max_seconds=self._backoff_max, jitter=0.2)

    async def _list(self, kind: WatchedKind) -> str:
        """List every object of a kind (paged), replace its index, return the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        resource_version = ""
        token: str | None = None
        while True:
            response = await kind.list_call(
                limit=_LIST_PAGE_SIZE,
                _continue=token,
                _preload_content=False,
                _request_timeout=_LIST_TIMEOUT_SECONDS,
            )
            try:
                body = await read_json(response)
            finally:
                response.release()
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            resource_version = resource_version or meta.get("resourceVersion", "")
            token = meta.get("continue") or None
            if token is None:
                break
        kind.replace(items)
        self._listed.add(kind.name)
        self._confirmed.add(kind.name)
        self._unconfirmed_since.pop(kind.name, None)
        self._said.pop(kind.name, None)
        self._confirm_changed.set()
        self._answered(kind.name)
        if len(self._listed) == len(self._kinds):
            self._synced_event.set()
        log.debug("listed %d %s at resourceVersion %s", len(items), kind.name, resource_version)
        return resource_version

    async def _watch(self, kind: WatchedKind, resource_version: str) -> tuple[str, int]:
        """Apply one watch stream's events; return the resourceVersion to resume from and the event count."""
        events = 0
        async for event_type, obj in watch_events(
            kind.list_call, resource_version=resource_version, timeout_seconds=self._watch_timeout
        ):
            events += 1
            self._answered_at[kind.name] = time.time()
            resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
            if event_type in ("ADDED", "MODIFIED"):
                kind.put(obj)
            elif event_type == "DELETED":
                kind.remove(obj)
            # BOOKMARK: only the resourceVersion moves.
        return resource_version, events


def _retry_after(error: BaseException) -> float:
    """Seconds a 429/503 answer's Retry-After asks for (0 when none)."""
    if isinstance(error, client.ApiException) and error.status in (429, 503):
        try:
            return min(float((error.headers or {}).get("Retry-After", 0)), 60.0)
        except (TypeError, ValueError):
            return 0.0
    return 0.0


async def watch_events(
    list_call: Callable[..., Awaitable[Any]], *, resource_version: str, timeout_seconds: int, **list_kwargs: Any
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """One watch stream as (event type, object) pairs, until the server closes it after ``timeout_seconds``.

    Raises ``WatchExpired`` for a 410 (in an ERROR event or as the HTTP status): the caller relists.
    Other ERROR events and statuses raise ``client.ApiException``. Shared by every list+watch loop here.
    """
    response = await list_call(
        **list_kwargs,
        watch=True,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        allow_watch_bookmarks=True,
        _preload_content=False,
        _request_timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=_LIST_TIMEOUT_SECONDS, sock_read=timeout_seconds + 30
        ),
    )
    try:
        if response.status != 200:
            await read_json(response)  # raises with the server's Status
        async for raw in response.content:
            line = raw.strip()
            if not line:
                continue
            event = json.loads(line)
            event_type = event.get("type")
            obj = event.get("object") or {}
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired(obj.get("message", "410 Gone"))
                raise client.ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
            yield event_type, obj
    finally:
        response.close()


async def read_json(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The JSON body of a 2xx response; ``WatchExpired`` for 410, ``client.ApiException`` for other statuses."""
    raw = await response.read()
    if response.status == 410:
        raise WatchExpired(raw.decode(errors="replace")[:200])
    if not 200 <= response.status < 300:
        error = client.ApiException(status=response.status, reason=response.reason)
        error.body = raw
        raise error
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("the API server answered with JSON that is not an object")
    return body


def api_unavailable(kind: str, error: BaseException) -> SourceUnavailable:
    if isinstance(error, SourceUnavailable):
        return error
    if isinstance(error, client.ApiException):
        detail = f"HTTP {error.status} {error.reason}"
        body = getattr(error, "body", None)
        if body:
            with contextlib.suppress(ValueError, AttributeError):
                detail += f": {json.loads(body).get('message', '')}"
        if error.status in (401, 403):
            detail += " — this identity needs list and watch on it: apply deploy/'s RBAC for this component"
    else:
        detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return SourceUnavailable(SOURCE, f"cannot list/watch {kind}: {detail}")
