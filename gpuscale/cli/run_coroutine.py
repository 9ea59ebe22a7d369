"""``asyncio.run`` for a command's coroutine whose result is large (a report's history, a replay's metric history).

On Python 3.11, ``asyncio.run`` formats ``repr()`` of its coroutine's result twice on the way out: the runner
restores SIGINT with ``signal.signal``, which converts the handler it replaces — a ``functools.partial`` holding the
main task — to a ``signal.Handlers`` member; the lookup fails, and the enum's ValueError message is built with
``%r`` of the partial, so of the finished task, so of its result. A dataclass repr formats every numpy array in it:
half of the CPU of a 6-hour report on 135 pods, and a string the size of the fleet's history at 100,000 GPUs. The
result is handed out through a box instead, so the main task finishes with None."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    box: list[T] = []

    async def main() -> None:
        box.append(await coro)

    asyncio.run(main())
    return box[0]
