"""The clocks the simulated exporters read: wall time, or a ``ManualClock`` a test advances."""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]


class ManualClock:
    """A clock for tests: returns ``now`` seconds until told to ``advance``."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
