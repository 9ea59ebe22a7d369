"""An asyncio event loop of its own, in a thread: for I/O-heavy work that must not queue in front of serving.

A request's callback on the serving loop runs after every callback that was ready before it; a refresh that
scrapes 2,250 exporters puts thousands there. Run on a loop in another thread, that work only shares the
interpreter lock, which the serving loop takes back every switch interval.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["IoLoop", "LoopThread"]

T = TypeVar("T")


class LoopThread:
    """A daemon thread running an event loop until ``stop``; ``run`` awaits a coroutine on it from another loop."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """The coroutine's result, computed on this thread's loop (cancelling the caller cancels it there)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))

    def stop(self) -> None:
        """Stop the loop, join the thread, close the loop (anything still scheduled on it is dropped)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


class IoLoop:
    """Where a source does its I/O: the caller's loop, or (``own``) a LoopThread started on first use.

    One place for what every source that offers ``off_loop`` needs: ``run`` a refresh there, ``close`` there
    (sessions and tasks belong to the loop that made them) and then stop the thread.
    """

    def __init__(self, name: str, *, own: bool) -> None:
        self._name = name
        self._own = own
        self._thread: LoopThread | None = None

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if not self._own:
            return await coroutine
        if self._thread is None:
            self._thread = LoopThread(self._name)
        return await self._thread.run(coroutine)

    async def close(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run ``coroutine`` (the source's own closing) where the I/O ran, then stop the thread if any."""
        thread, self._thread = self._thread, None
        if thread is None:
            await coroutine
            return
        try:
            await thread.run(coroutine)
        finally:
            thread.stop()
