"""Long pure computations written as steps: a generator that yields between small pieces and returns its result.

The adapter builds each refresh's snapshot and answers on its event loop, a time slice at a time between HPA
requests (``run_sliced`` says why not in a worker thread). So the code that runs long there — aggregation,
attribution, the answers' preparation — is a generator: it ``yield``\\s wherever it may be paused, each piece a small
fraction of a millisecond, and returns what it built. Whoever runs it decides how: ``finish`` at once (`top`, the
report, tests), ``run_sliced`` a slice per turn of the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from typing import TypeVar

__all__ = ["SLICE_SECONDS", "STEP", "Steps", "already", "finish", "run_sliced"]

T = TypeVar("T")

Steps = Generator[None, None, T]

# NB: items of per-item Python work (an attribution, a dict entry, a MetricPoint: ~0.3–2 µs each) between two yields
STEP = 256


def already(value: T) -> Steps[T]:
    """Steps that pause nowhere and return ``value`` (what is at hand, where steps are expected)."""
    return value
    yield  # NB: unreachable: it makes this function a generator


def finish(steps: Steps[T]) -> T:
    """Run ``steps`` to the end in one go; its result."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value


# NB: how long the build runs on the event loop before the loop serves what arrived meanwhile. A request waits at
# most about this long for the build; each pause costs one turn of the loop (~20–40 µs).
SLICE_SECONDS = 0.0003
_AFTER_IO = 1e-9  # NB: a timer due at the loop's next iteration


async def run_sliced(steps: Steps[T], *, budget: float = SLICE_SECONDS) -> T:
    """Run ``steps`` on the event loop, ``budget`` seconds at a time: between two slices the loop
    serves whatever is ready. Its result; cancelling the caller closes it.

    NB: not in a worker thread. The build is ~0.5 s of pure Python at 10,000 GPUs, and a thread beside the loop takes
    the interpreter lock from it at every system call it makes (``select``, ``send``, ``recv``): the loop then waits
    a switch interval or the thread's current C call to get it back, several times per request. Measured with 4,000
    distinct HPA queries at 267 requests/s, p99 during a refresh was 1.8–2.4× p99 at rest with the build in a thread
    whose every C call was cut under 1 ms (benchmarks/bench_cluster_serving.py, docs/benchmarks.md).
    """
    clock = time.perf_counter
    try:
        while True:
            end = clock() + budget
            next(steps)
            while clock() < end:
                next(steps)
            # NB: resumed by a timer, not call_soon: an iteration of the loop runs the callbacks of I/O that became
            # ready (a request's bytes) before the timers that fell due, so a request waits for one slice, not two
            await asyncio.sleep(_AFTER_IO)
    except StopIteration as done:
        return done.value
    finally:
        steps.close()
