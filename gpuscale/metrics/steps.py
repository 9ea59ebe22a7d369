"""Long pure computations written as steps: a generator that yields between small pieces and returns its result.

The adapter builds each refresh's snapshot and answers on its event loop, a time slice at a time between HPA
requests (gpuscale/pipeline.py says why not in a worker thread). So the code that runs long there — aggregation,
attribution, the answers' preparation — is a generator: it ``yield``\\s wherever it may be paused, each piece a small
fraction of a millisecond, and returns what it built. Whoever runs it decides how: ``finish`` at once (`top`, the
report, tests), ``pipeline.run_sliced`` a slice per turn of the event loop.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

__all__ = ["STEP", "Steps", "finish"]

T = TypeVar("T")

Steps = Generator[None, None, T]

# NB: items of per-item Python work (an attribution, a dict entry, a MetricPoint: ~0.3–2 µs each) between two yields
STEP = 256


def finish(steps: Steps[T]) -> T:
    """Run ``steps`` to the end in one go; its result."""
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value
