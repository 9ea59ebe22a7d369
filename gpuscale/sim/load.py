"""Offered load over time: the request rates the simulated cluster's workloads see, pure and deterministic.

A ``LoadModel`` answers ``rate_at(t)``: requests per second offered to a whole workload at simulated time ``t``
(seconds). ``ConstantLoad`` and ``StepLoad`` are for tests, ``PiecewiseLinearLoad`` replays a trace
(``RepeatingLoad`` loops one), ``DiurnalLoad`` is a smooth daily sinusoid plus seeded bursts and jitter for
demos. None keeps state, so ``rate_at`` may be called for any ``t`` in any order; same inputs and seed → same
numbers, in any process.

What that load does to a GPU lives in ``gpu_activity`` (how a profile uses the engine) and ``device_gauges``
(what dcgm-exporter reports); how a Triton replica queues it in ``serving_queue``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "ConstantLoad",
    "DiurnalLoad",
    "LoadModel",
    "PiecewiseLinearLoad",
    "RepeatingLoad",
    "StepLoad",
    "smooth_noise",
    "unit_hash",
]


# --- deterministic randomness ------------------------------------------------------------------------


def unit_hash(*parts: object) -> float:
    """A deterministic pseudo-random number in [0, 1) for ``parts`` (stable across processes and runs).

    NB: not ``hash()``, which is salted per process for str.
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def smooth_noise(t: float, *key: object) -> float:
    """Smooth deterministic jitter in [-1, 1] at time ``t`` seconds, different for every ``key``.

    A weighted sum of three sinusoids with seeded periods (≈ 20 s, 2 min, 10 min) and phases: continuous,
    so consecutive scrapes differ a little, never jump.
    """
    total = 0.0
    for i, (weight, lo, hi) in enumerate(((0.5, 17.0, 41.0), (0.3, 60.0, 180.0), (0.2, 300.0, 900.0))):
        period = lo + (hi - lo) * unit_hash(*key, "period", i)
        phase = 2 * math.pi * unit_hash(*key, "phase", i)
        total += weight * math.sin(2 * math.pi * t / period + phase)
    return total


# --- offered load over time --------------------------------------------------------------------------


class LoadModel(Protocol):
    """Requests per second offered to a whole workload (all replicas together) at time ``t`` seconds."""

    def rate_at(self, t: float) -> float: ...


@dataclass(frozen=True, slots=True)
class ConstantLoad:
    """The same offered rate at every instant."""

    rps: float

    def rate_at(self, t: float) -> float:
        return max(0.0, self.rps)


@dataclass(frozen=True, slots=True)
class StepLoad:
    """A piecewise-constant rate: ``steps`` are ``(start_s, rps)`` pairs, ascending by start.

    Before the first start the rate is ``initial_rps``. ``StepLoad(((60, 500),), initial_rps=50)`` offers
    50 rps until t = 60 s and 500 rps from then on.
    """

    steps: tuple[tuple[float, float], ...]
    initial_rps: float = 0.0

    def __post_init__(self) -> None:
        starts = [start for start, _ in self.steps]
        if starts != sorted(starts):
            raise ValueError(f"StepLoad steps must be ascending by start time, got {starts}")

    def rate_at(self, t: float) -> float:
        rate = self.initial_rps
        for start, rps in self.steps:
            if t < start:
                break
            rate = rps
        return max(0.0, rate)


@dataclass(frozen=True, slots=True)
class PiecewiseLinearLoad:
    """Linear interpolation between ``(t_s, rps)`` points (e.g. a request trace binned per minute).

    Before the first point and after the last the rate is held constant.
    """

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("PiecewiseLinearLoad needs at least one point")
        times = [t for t, _ in self.points]
        if times != sorted(times):
            raise ValueError(f"PiecewiseLinearLoad points must be ascending by time, got {times[:5]}…")

    def rate_at(self, t: float) -> float:
        points = self.points
        if t <= points[0][0]:
            return max(0.0, points[0][1])
        for (t0, r0), (t1, r1) in itertools.pairwise(points):
            if t <= t1:
                if t1 == t0:
                    return max(0.0, r1)
                return max(0.0, r0 + (r1 - r0) * (t - t0) / (t1 - t0))
        return max(0.0, points[-1][1])


@dataclass(frozen=True, slots=True)
class RepeatingLoad:
    """``inner`` from ``start_s`` for ``period_s`` seconds, then the same period again and again (a trace slice
    looped, as the demo replays it until Ctrl-C); before ``start_s`` it is ``inner`` unchanged."""

    inner: LoadModel
    start_s: float
    period_s: float

    def __post_init__(self) -> None:
        if not self.period_s > 0:
            raise ValueError(f"RepeatingLoad period_s must be > 0, got {self.period_s}")

    def rate_at(self, t: float) -> float:
        if t <= self.start_s:
            return self.inner.rate_at(t)
        return self.inner.rate_at(self.start_s + (t - self.start_s) % self.period_s)


@dataclass(frozen=True, slots=True)
class DiurnalLoad:
    """A smooth daily cycle plus seeded bursts and jitter.

    ``rate_at(t) = mean_rps × (1 + amplitude·cos(2π(t − peak_at_s)/period_s)) + burst(t) + jitter(t)``

    - Bursts: time is cut into slots of ``burst_every_s``; each slot holds one burst with probability
      ``burst_probability`` (seeded), at a seeded offset, shaped as a raised cosine of
      ``burst_duration_s`` whose height is ``burst_factor × mean_rps × (0.5 … 1.5)``.
    - Jitter: ``noise × mean_rps × smooth_noise(t)``.

    Use a short ``period_s`` (e.g. 900 s, "a compressed day") for demos and replays.
    """

    mean_rps: float
    amplitude: float = 0.4
    period_s: float = 86_400.0
    peak_at_s: float = 14 * 3600.0
    burst_every_s: float = 3600.0
    burst_probability: float = 0.5
    burst_factor: float = 1.0
    burst_duration_s: float = 120.0
    noise: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        if self.burst_every_s > 0 and self.burst_duration_s > self.burst_every_s:
            raise ValueError("burst_duration_s must not exceed burst_every_s")

    def burst_at(self, t: float) -> float:
        """The burst component alone (rps) at ``t``; 0 outside bursts."""
        if self.burst_every_s <= 0 or self.burst_factor <= 0:
            return 0.0
        slot = math.floor(t / self.burst_every_s)
        if unit_hash(self.seed, "burst", slot) >= self.burst_probability:
            return 0.0
        start = slot * self.burst_every_s + unit_hash(self.seed, "offset", slot) * (
            self.burst_every_s - self.burst_duration_s
        )
        x = (t - start) / self.burst_duration_s
        if not 0.0 <= x <= 1.0:
            return 0.0
        height = self.burst_factor * self.mean_rps * (0.5 + unit_hash(self.seed, "height", slot))
        return height * 0.5 * (1.0 - math.cos(2 * math.pi * x))

    def rate_at(self, t: float) -> float:
        daily = 1.0 + self.amplitude * math.cos(2 * math.pi * (t - self.peak_at_s) / self.period_s)
        jitter = self.noise * smooth_noise(t, self.seed, "diurnal")
        return max(0.0, self.mean_rps * (daily + jitter) + self.burst_at(t))
