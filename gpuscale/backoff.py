"""Exponential backoff: the one delay rule every retry loop here uses.

The delay starts at ``initial_seconds``, doubles after each failure up to ``max_seconds``, and starts over after a
success (client-go's and kopf's rule). Jitter multiplies a delay by a factor drawn from ``1 ± jitter``, so replicas
that failed together do not retry in step. Pure: no clock and no sleep here, the caller sleeps; a seeded
``random.Random`` makes the jitter reproducible in tests.

Used by the list+watch loops (sources/reflector.py ``Reflector`` and its discovery retry), the report's Prometheus
retries (sources/history_fetch.py), the controller's writes (controller/actuator.py), its Lease (controller/leader.py)
and the gang requests' wait between attempts (controller/pools.py ``GangPolicy``).
"""

from __future__ import annotations

import math
import random

__all__ = ["Backoff", "doubling_delay"]

# NB: 2.0 ** 1023 is the largest power of two a float holds; past it ``**`` raises OverflowError. Any finite
# initial delay times it is already past every cap.
_MAX_EXPONENT = 1023


def doubling_delay(failures: int, *, initial_seconds: float, max_seconds: float = math.inf) -> float:
    """Seconds to wait after ``failures`` consecutive failures counted from 0: initial × 2**failures, capped."""
    return min(initial_seconds * 2.0 ** min(max(failures, 0), _MAX_EXPONENT), max_seconds)


class Backoff:
    """The delays of one retry loop: ``next_delay()`` after a failure, ``reset()`` after a success.

    ``initial_seconds`` is lowered to ``max_seconds`` when above it; ``jitter`` is a ratio (0.2: ±20 %).
    """

    def __init__(
        self,
        *,
        initial_seconds: float,
        max_seconds: float = math.inf,
        jitter: float = 0.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0.0 <= jitter < 1.0:
            raise ValueError(f"jitter is a ratio in [0, 1), not {jitter}")
        self.max_seconds = float(max_seconds)
        self.initial_seconds = min(float(initial_seconds), self.max_seconds)
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.failures = 0
        """Failures since the last ``reset``."""

    @property
    def current_seconds(self) -> float:
        """The delay the next failure will wait, before jitter."""
        return doubling_delay(self.failures, initial_seconds=self.initial_seconds, max_seconds=self.max_seconds)

    def next_delay(self) -> float:
        """The (jittered) seconds to wait now; counts one more failure, so the next delay is doubled."""
        delay = self.current_seconds
        self.failures += 1
        if self.jitter:
            delay *= self._rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)
        return delay

    def reset(self) -> None:
        """A success: the next failure waits ``initial_seconds`` again."""
        self.failures = 0
