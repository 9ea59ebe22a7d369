"""The reconcile loop: telemetry → every planner → the actuator (when leading) → metrics. Thin on purpose.

``reconcile_once`` is one whole cycle (what tests and the benchmark call); ``run`` repeats it every
``interval_seconds`` until told to stop. A planner that raises is logged and counted, and the others still run;
a reconcile whose telemetry cannot be read plans nothing (never from stale or missing data).

Acting only on a view just confirmed (a ``LiveClusterView``, i.e. the watch caches):

- while any cache is not confirmed — before its first list, or after a watch error until it has listed again
  (an API outage, a dropped watch) — nothing is planned or written;
- a replica that becomes leader lists every cache again before its first write, so it reads what the previous
  leader did (the breaker's record, the nodes it acted on) from the API, not from a follower's cache;
- what the API answers to a write is recorded in the view, so the next plan sees its own write even before the
  watch delivers it (no duplicate patches or Events between the write and its watch event);
- a write answered ``conflict`` (the object is not as the plan read it) leads to a re-read of that object and
  a new plan, at most ``rounds`` times per reconcile; writes already applied in an earlier round are not sent
  again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuscale.controller.actuator import action_of, target_of
from gpuscale.controller.metrics import ControllerMetrics
from gpuscale.controller.telemetry import ClusterTelemetry
from gpuscale.controller.writes import (
    Actuator,
    ClusterView,
    Create,
    Delete,
    Emit,
    LiveClusterView,
    ObjectKey,
    Patch,
    Planner,
    Write,
    WriteOutcome,
)
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
        acting: bool = True,
        observers: Sequence[Callable[[ClusterView, ClusterTelemetry, float], None]] = (),
        interval_seconds: float = 15.0,
        clock: Callable[[], float] = time.time,
        rounds: int = 3,
    ) -> None:
        self.view = view
        self.telemetry = telemetry
        self.planners = list(planners)
        self.actuator = actuator
        self.metrics = metrics
        self.leadership: Leadership = leadership or _AlwaysLeader()
        # NB: a dry run plans as a leader (to say what it would do) but takes no Lease and writes nothing, so its
        # leader gauge stays 0: two dry-run replicas of a first install must not read as two leaders.
        self.acting = acting
        self.observers = list(observers)
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.rounds = max(1, rounds)
        self.held: str = ""
        """Why the last reconcile planned nothing (view not confirmed, telemetry unreadable), or ""."""
        self._led = False  # whether the previous reconcile acted as leader (a new leader reconfirms first)
        self.last: ReconcileResult | None = None
        self.last_success_at: float | None = None
        self.reconciles = 0

    async def reconcile_once(self) -> ReconcileResult:
        started = time.perf_counter()
        now = self.clock()
        result = ReconcileResult(at=now)
        live = self.view if isinstance(self.view, LiveClusterView) else None
        leading = self.leadership.is_leader
        self.metrics.leader.set(1 if leading and self.acting else 0)
        if live is not None:
            if leading and not self._led:
                # NB: a new leader acts only on what it has just listed (the old leader's last writes included).
                if not await live.reconfirm(timeout=max(self.interval_seconds, 5.0)):
                    return self._hold(result, started, "view", f"view not confirmed: {live.unconfirmed()}")
            elif not live.confirmed:
                return self._hold(result, started, "view", f"view not confirmed: {live.unconfirmed()}")
        self.metrics.view_confirmed.set(1)
        try:
            telemetry = await self.telemetry.refresh(now=now)
        except GpuscaleError as e:
            self.metrics.reconcile_failures.labels("telemetry").inc()
            return self._hold(result, started, "telemetry", f"telemetry: {e}")
        result.leading = leading = self.leadership.is_leader
        self._led = leading
        done: set[str] = set()  # writes applied in an earlier round of this reconcile (never sent twice)
        for round_ in range(self.rounds):
            planned = self._plan(telemetry, now)
            if round_ == 0:
                result.planned = planned
            if not leading:
                if result.writes:
                    log.debug("not leading: %d planned writes left to the leader", len(result.writes))
                break
            conflicts: list[WriteOutcome] = []
            for name, writes in planned.items():
                fresh = [w for w in writes if _identity(w) not in done]
                if not fresh:
                    continue
                outcomes = await self.actuator.apply(fresh)
                result.outcomes.extend(outcomes)
                for outcome in outcomes:
                    write = outcome.write
                    self.metrics.actions.labels(name, action_of(write), outcome.result).inc()
                    if isinstance(write, Emit) and write.reason == "RemediationHeldBack":
                        self.metrics.held_back.inc()
                    if outcome.result in ("applied", "already-done"):
                        done.add(_identity(write))
                    if outcome.result == "conflict":
                        conflicts.append(outcome)
                    await self._record(live, outcome)
            if not conflicts or live is None or not self.leadership.is_leader:
                break
            try:
                for outcome in conflicts:
                    key = _key_of(outcome.write)
                    if key is not None:
                        await live.reread(key.api_version, key.kind, key.name, key.namespace)
            except GpuscaleError as e:
                log.warning("re-read after a conflict failed: %s", e)
                break
            self.metrics.replans.inc()
        self.held = ""
        self.last_success_at = now
        return self._finish(result, started)

    def _plan(self, telemetry: ClusterTelemetry, now: float) -> dict[str, list[Write]]:
        planned: dict[str, list[Write]] = {}
        with cyclic_gc_paused():
            for observe in self.observers:
                observe(self.view, telemetry, now)
            for planner in self.planners:
                try:
                    planned[planner.name] = planner.plan(self.view, telemetry, now=now)
                except Exception:  # NB: one planner's bug must not stop the others; logged with its traceback
                    self.metrics.reconcile_failures.labels(f"planner:{planner.name}").inc()
                    log.exception("planner=%s failed", planner.name)
        return planned

    async def _record(self, live: LiveClusterView | None, outcome: WriteOutcome) -> None:
        """What the API answered goes into the view, so the next plan sees this write (see the module doc)."""
        if live is None or outcome.result != "applied":
            return
        if outcome.obj is not None:
            live.record(outcome.obj)
        elif isinstance(outcome.write, Delete):
            key = outcome.write.key
            # NB: on failure the watch delivers the deletion; the next plan is then right anyway
            with contextlib.suppress(GpuscaleError):
                await live.reread(key.api_version, key.kind, key.name, key.namespace)

    def _hold(self, result: ReconcileResult, started: float, stage: str, why: str) -> ReconcileResult:
        """Plan and write nothing this reconcile, and say why (log line on change, /readyz, /metrics)."""
        result.error = why
        if stage == "view":
            self.metrics.view_confirmed.set(0)
            self._led = False  # NB: whoever leads once the view is back confirms it afresh
        self.metrics.reconciles_held.labels(stage).inc()
        if why != self.held:
            log.warning("reconcile held: %s", why)
        self.held = why
        return self._finish(result, started, quiet=True)

    def _finish(self, result: ReconcileResult, started: float, *, quiet: bool = False) -> ReconcileResult:
        result.seconds = time.perf_counter() - started
        self.metrics.reconcile_seconds.observe(result.seconds)
        self.reconciles += 1
        self.last = result
        if (result.writes or result.error) and not quiet:
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


def _identity(write: Write) -> str:
    return f"{action_of(write)} {target_of(write)} {write.why}"


def _key_of(write: Write) -> ObjectKey | None:
    return write.key if isinstance(write, (Create, Patch)) else None
