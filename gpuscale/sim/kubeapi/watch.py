"""Watch streams (``?watch=1``): newline-delimited events from a resourceVersion, selectors applied as the watch
cache applies them, BOOKMARKs, ``timeoutSeconds``, and 410 Expired (one ERROR event) for a resourceVersion
older than the history kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpuscale.sim.api_errors import (
    ApiStatusError,
    bad_request,
)
from gpuscale.sim.kubeapi.payloads import (
    JSON,
    table_of,
    to_served,
    truthy,
    wants_table,
)
from gpuscale.sim.kubeapi.storage import Change, Filter, ObjectStore, parse_selectors
from gpuscale.sim.resources import (
    ResourceType,
)

# kube-apiserver picks a watch timeout in [min-request-timeout, 2×) when the client gives none.
_DEFAULT_WATCH_TIMEOUT_SECONDS = 1800.0


@dataclass(eq=False, slots=True)
class Watcher:
    filter: Filter
    queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = field(default_factory=asyncio.Queue)
    transport: asyncio.BaseTransport | None = None
    dropped: bool = False  # cut by drop_watches: end without a final BOOKMARK


@dataclass(frozen=True, slots=True)
class _Opening:
    """A watch as it opens: what it sends first (or that it is expired) and its options."""

    watcher: Watcher
    initial: list[tuple[str, dict[str, Any]]]
    expired: bool
    started_rv: int  # the storage's newest resourceVersion when it began: later ones earn a BOOKMARK
    rv_text: str
    timeout_seconds: float
    bookmarks: bool


class Watches:
    """The open watches, per storage: each change is fanned out to them as it is committed.

    ``bookmark_interval_seconds`` spaces BOOKMARK events on watches that allow them.
    """

    def __init__(self, store: ObjectStore, *, bookmark_interval_seconds: float) -> None:
        self._store = store
        self._bookmark_interval = bookmark_interval_seconds
        self._watchers: dict[str, set[Watcher]] = {}
        self.stopping = False

    def notify(self, change: Change) -> None:
        """Queue the event each watch of the change's storage sees for it (if any)."""
        for watcher in self._watchers.get(change.storage, ()):
            event = watcher.filter.event_for(change)
            if event is not None:
                watcher.queue.put_nowait(event)

    def end_all(self) -> None:
        """End every watch stream (the server is stopping)."""
        self.stopping = True
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.queue.put_nowait(None)

    def drop(self, resource: str | None = None) -> int:
        """Cut every open watch (of ``resource``, or all) mid-stream, as a restarting apiserver or a load
        balancer's idle timeout does: the connection is aborted, with no final chunk and no BOOKMARK.
        Returns how many were cut."""
        dropped = 0
        for watchers in self._watchers.values():
            for watcher in list(watchers):
                if resource is not None and resource not in (
                    watcher.filter.rt.group_resource,
                    watcher.filter.rt.plural,
                ):
                    continue
                watcher.dropped = True
                if watcher.transport is not None:
                    watcher.transport.abort()
                watcher.queue.put_nowait(None)
                dropped += 1
        return dropped

    async def serve(
        self, request: web.Request, rt: ResourceType, namespace: str | None, *, expire: bool = False
    ) -> web.StreamResponse:
        """Answer ``?watch=1`` (``expire``: with the one ERROR event of a 410, as the fault plan asks)."""
        opening = self._open(request, rt, namespace, expire=expire)
        watcher, rv_text = opening.watcher, opening.rv_text
        table = wants_table(request)
        include = request.query.get("includeObject", "Metadata")
        response = web.StreamResponse(status=200, headers={"Content-Type": JSON, "Cache-Control": "no-cache, private"})
        first_table = True

        async def send(kind: str, obj: dict[str, Any]) -> None:
            nonlocal first_table
            if kind in ("ERROR", "BOOKMARK"):
                payload = obj
            elif table:
                payload = table_of(
                    rt, [obj], rv=obj["metadata"]["resourceVersion"], include=include, columns=first_table
                )
                first_table = False
            else:
                payload = to_served(rt, obj)
            await response.write(json.dumps({"type": kind, "object": payload}, separators=(",", ":")).encode() + b"\n")

        async def bookmark() -> None:
            newest = self._store.storage_rv.get(rt.storage, 0)
            if newest > opening.started_rv:
                obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {"resourceVersion": str(newest)}}
                await send("BOOKMARK", obj)

        try:
            await response.prepare(request)
            if opening.expired:
                # NB: a planned 410 (``fail_next``) names the current resourceVersion as the oldest one kept.
                oldest = (
                    self._store.rv if expire else max(self._store.floor, self._store.storage_floor.get(rt.storage, 0))
                )
                gone = ApiStatusError(410, "Expired", f"too old resource version: {rv_text} ({oldest})").status
                await send("ERROR", gone)
                return response
            for kind, obj in opening.initial:
                await send(kind, obj)
            await self._follow(request, watcher, opening, send, bookmark)
        except ConnectionResetError:
            pass
        finally:
            self._watchers.get(rt.storage, set()).discard(watcher)
        return response

    def _open(self, request: web.Request, rt: ResourceType, namespace: str | None, *, expire: bool) -> _Opening:
        """Read the watch's options and what it sends first, and register it to see every later change."""
        query = request.query
        labels, fields = parse_selectors(rt, query)
        try:
            timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else _DEFAULT_WATCH_TIMEOUT_SECONDS
        except ValueError as e:
            raise bad_request(f"invalid timeoutSeconds {query.get('timeoutSeconds')!r}") from e
        bookmarks = truthy(query.get("allowWatchBookmarks"))
        rv_text = query.get("resourceVersion", "")
        since = 0
        if rv_text not in ("", "0"):
            try:
                since = int(rv_text)
            except ValueError as e:
                raise bad_request(f"invalid resource version {rv_text!r}") from e
        watcher = Watcher(Filter(rt, namespace, labels, fields), transport=request.transport)
        initial: list[tuple[str, dict[str, Any]]] = []
        expired = expire
        # NB: everything from here to registering the watcher runs without an await, so no change can fall
        # between the replayed history (or the synthetic ADDED snapshot) and the live queue.
        if expired:
            pass
        elif rv_text in ("", "0"):
            initial = [("ADDED", o) for o in self._store.select(rt, namespace, labels, fields)]
        elif since < max(self._store.floor, self._store.storage_floor.get(rt.storage, 0)):
            expired = True
        else:
            for change in self._store.history:
                if change.rv > since and change.storage == rt.storage:
                    event = watcher.filter.event_for(change)
                    if event is not None:
                        initial.append(event)
        if not expired:
            self._watchers.setdefault(rt.storage, set()).add(watcher)
        # NB: the watch cache sends a bookmark only with a resourceVersion of the resource newer than every one the
        # watch had when it began (events it replayed included, whether or not they passed its selectors).
        started_rv = max(since, self._store.storage_rv.get(rt.storage, 0))
        return _Opening(watcher, initial, expired, started_rv, rv_text, timeout, bookmarks)

    async def _follow(
        self,
        request: web.Request,
        watcher: Watcher,
        opening: _Opening,
        send: Callable[[str, dict[str, Any]], Awaitable[None]],
        bookmark: Callable[[], Awaitable[None]],
    ) -> None:
        """Send the live events until the timeout, the server stopping, the watch being dropped or the client
        going away, with BOOKMARKs when the watch allows them."""
        timeout, bookmarks = opening.timeout_seconds, opening.bookmarks
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # NB: kube-apiserver sends bookmarks every minute and once about 2 s before the watch times out, so
        # the client resumes from as close to now as it can; none when that moment has passed at the start.
        pre_timeout = deadline - 2.0 if timeout >= 2.0 else None
        next_bookmark = loop.time() + self._bookmark_interval
        if pre_timeout is not None:
            next_bookmark = min(next_bookmark, pre_timeout)
        while not self.stopping:
            now = loop.time()
            if now >= deadline:
                break
            if request.transport is None or request.transport.is_closing():
                return  # the client went away
            # NB: wake at least once a second to notice a client that hung up without a write failing.
            wait = min(deadline - now, 1.0)
            if bookmarks:
                wait = min(wait, max(next_bookmark - now, 0.0))
            try:
                item = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
            except TimeoutError:
                # An empty queue means every change up to now that this watch selects has been sent.
                if bookmarks and loop.time() >= next_bookmark and watcher.queue.empty():
                    await bookmark()
                    next_bookmark = loop.time() + self._bookmark_interval
                    if pre_timeout is not None and loop.time() < pre_timeout:
                        next_bookmark = min(next_bookmark, pre_timeout)
                continue
            if item is None:
                break
            kind, obj = item
            await send(kind, obj)
