"""The reconcile loop: telemetry → every planner → the actuator (when leading) → metrics. Thin on purpose.

``reconcile_once`` is one whole cycle (what tests and the benchmark call); ``run`` repeats it every
``interval_seconds`` until told to stop. A planner that raises is logged and counted, and the others still run;
a reconcile whose telemetry cannot be read plans nothing (never from stale or missing data).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuscale.controller.actuator import action_of
from gpuscale.controller.metrics import ControllerMetrics
from gpuscale.controller.telemetry import ClusterTelemetry
from gpuscale.controller.writes import Actuator, ClusterView, Emit, Planner, Write, WriteOutcome
from gpuscale.errors import GpuscaleError
from gpuscale.pipeline import cyclic_gc_paused

__all__ = ["Controller", "Leadership", "ReconcileResult", "TelemetryProvider"]

log = logging.getLogger("gpuscale.controller")


class TelemetryProvider(Protocol):
    async def refresh(self, *, now: float) -> ClusterTelemetry: ...


class Leadership(Protocol):
    @property
    def is_leader(self) -> bool: ...


class _AlwaysLeader:
    is_leader = True


@dataclass
class ReconcileResult:
    """What one reconcile did: the writes planned per planner, their outcomes (empty when not leading)."""

    at: float
    planned: dict[str, list[Write]] = field(default_factory=dict)
    outcomes: list[WriteOutcome] = field(default_factory=list)
    leading: bool = False
    error: str | None = None
    seconds: float = 0.0

    @property
    def writes(self) -> list[Write]:
        return [w for ws in self.planned.values() for w in ws]


class Controller:
    def __init__(
        self,
        *,
        view: ClusterView,
        telemetry: TelemetryProvider,
        planners: Sequence[Planner],
        actuator: Actuator,
        metrics: ControllerMetrics,
        leadership: Leadership | None = None,
        observers: Sequence[Callable[[ClusterView, ClusterTelemetry, float], None]] = (),
        interval_seconds: float = 15.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.view = view
        self.telemetry = telemetry
        self.planners = list(planners)
        self.actuator = actuator
        self.metrics = metrics
        self.leadership: Leadership = leadership or _AlwaysLeader()
        self.observers = list(observers)
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.last: ReconcileResult | None = None
        self.last_success_at: float | None = None
        self.reconciles = 0

    async def reconcile_once(self) -> ReconcileResult:
        started = time.perf_counter()
        now = self.clock()
        result = ReconcileResult(at=now)
        try:
            telemetry = await self.telemetry.refresh(now=now)
        except GpuscaleError as e:
            result.error = f"telemetry: {e}"
            self.metrics.reconcile_failures.labels("telemetry").inc()
            log.warning("reconcile skipped: %s", result.error)
            return self._finish(result, started)
        with cyclic_gc_paused():
            for observe in self.observers:
                observe(self.view, telemetry, now)
            for planner in self.planners:
                try:
                    result.planned[planner.name] = planner.plan(self.view, telemetry, now=now)
                except Exception:  # NB: one planner's bug must not stop the others; logged with its traceback
                    self.metrics.reconcile_failures.labels(f"planner:{planner.name}").inc()
                    log.exception("planner=%s failed", planner.name)
        result.leading = self.leadership.is_leader
        self.metrics.leader.set(1 if result.leading else 0)
        if result.leading:
            for name, writes in result.planned.items():
                outcomes = await self.actuator.apply(writes)
                result.outcomes.extend(outcomes)
                for outcome in outcomes:
                    self.metrics.actions.labels(name, action_of(outcome.write), outcome.result).inc()
                    write = outcome.write
                    if isinstance(write, Emit) and write.reason == "RemediationHeldBack":
                        self.metrics.held_back.inc()
        elif result.writes:
            log.debug("not leading: %d planned writes left to the leader", len(result.writes))
        self.last_success_at = now
        return self._finish(result, started)

    def _finish(self, result: ReconcileResult, started: float) -> ReconcileResult:
        result.seconds = time.perf_counter() - started
        self.metrics.reconcile_seconds.observe(result.seconds)
        self.reconciles += 1
        self.last = result
        if result.writes or result.error:
            log.info(
                "reconcile writes=%d applied=%d leading=%s seconds=%.3f%s",
                len(result.writes),
                sum(1 for o in result.outcomes if o.result in ("applied", "dry-run", "already-done")),
                result.leading,
                result.seconds,
                f" error={result.error!r}" if result.error else "",
            )
        return result

    async def run(self, stop: asyncio.Event, *, wake: asyncio.Event | None = None) -> None:
        """Reconcile every interval until ``stop``; ``wake`` (e.g. leadership changed) starts one sooner."""
        while not stop.is_set():
            try:
                await self.reconcile_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # NB: a bug in one cycle must not stop the loop; it is logged with its traceback
                self.metrics.reconcile_failures.labels("reconcile").inc()
                log.exception("reconcile failed")
            waiters = [asyncio.ensure_future(stop.wait())]
            if wake is not None:
                waiters.append(asyncio.ensure_future(wake.wait()))
            try:
                await asyncio.wait(waiters, timeout=self.interval_seconds, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiter
            if wake is not None:
                wake.clear()
