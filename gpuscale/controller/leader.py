"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

Only the leader writes; every replica keeps its caches warm, so a follower that takes over acts at once.

- ``try_acquire_or_renew`` is one step (what tests call): read the Lease; create it when absent; take it when it
  is free (no holder) or expired; renew it when held by us. Every write carries the resourceVersion read, so two
  replicas racing for one Lease cannot both win: the loser gets 409 Conflict and stays a follower.
- Expiry is judged on this replica's own clock from when it *observed* the current record, never from the
  ``renewTime`` another machine wrote (clock skew cannot hand the Lease to two replicas).
- The leader renews every ``retry_period``; if it cannot renew within ``renew_deadline`` it stops leading
  (``is_leader`` turns False) before the Lease can expire for the others.
- ``release`` (on SIGTERM) clears the holder so a successor takes over without waiting the lease duration.
- A Lease that cannot be read or written (its namespace missing, RBAC not granting it, the API away) is said on
  one log line naming the fix, once per distinct problem, and retried with a doubling backoff (up to a minute);
  ``problem`` holds it for /readyz.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuscale.backoff import Backoff
from gpuscale.errors import SourceUnavailable
from gpuscale.sources.kuberest import KubeRest

__all__ = ["LeaseElector"]

log = logging.getLogger("gpuscale.controller.leader")


def _micro_time(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Competes for ``namespace/name`` as ``identity``. Durations in seconds."""

    def __init__(
        self,
        rest: KubeRest,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry-period < renew-deadline < lease-duration")
        self.rest = rest
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._monotonic = monotonic
        self._wall = wall
        self._observed: tuple[Any, ...] | None = None  # (holder, renewTime, transitions) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # monotonic time of our last successful acquire/renew
        self.holder: str | None = None
        self.transitions = 0
        self.changed = asyncio.Event()
        self.problem = ""
        """Why the Lease could not be read or written in the last step ("" when it could)."""
        self._retries = Backoff(initial_seconds=retry_period, max_seconds=60.0)
        self._backoff = 0.0  # seconds to wait before the next step beyond the retry period (0 while healthy)

    @property
    def is_leader(self) -> bool:
        return self._renewed_at is not None and self._monotonic() - self._renewed_at < self.renew_deadline

    async def _path(self, name: str | None = None) -> str:
        return await self.rest.path("coordination.k8s.io/v1", "Lease", namespace=self.namespace, name=name)

    async def try_acquire_or_renew(self) -> bool:
        """One election step; True when this replica holds the Lease afterwards."""
        was_leader = self.is_leader
        try:
            won = await self._step()
        except SourceUnavailable as e:
            if e.reason != self.problem:
                log.warning("lease=%s/%s %s; retrying with backoff", self.namespace, self.name, e.reason)
            self.problem = e.reason
            self._backoff = self._retries.next_delay()
            won = False
        else:
            if self.problem:
                log.info("lease=%s/%s readable and writable again", self.namespace, self.name)
            self.problem, self._backoff = "", 0.0
            self._retries.reset()
        if won:
            self._renewed_at = self._monotonic()
        if was_leader != self.is_leader:
            log.info(
                "lease=%s/%s identity=%s leader=%s",
                self.namespace,
                self.name,
                self.identity,
                "true" if self.is_leader else "false",
            )
            self.changed.set()
        return won

    async def _step(self) -> bool:
        now = self._monotonic()
        answer = await self.rest.request("GET", await self._path(self.name))
        spec_now = _micro_time(self._wall())
        if answer.status == 404:
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(spec_now, acquire=spec_now, transitions=0),
            }
            created = await self.rest.request("POST", await self._path(), body=lease)
            if created.ok:
                self._observe(created.body, now)
            elif created.status != 409:  # NB: 409: another replica created it first, which is no problem
                raise SourceUnavailable("kubernetes", self._explain("create", created.status, created.message))
            return created.ok
        if not answer.ok:
            raise SourceUnavailable("kubernetes", self._explain("read", answer.status, answer.message))
        lease = answer.body
        self._observe(lease, now)
        spec: Mapping[str, Any] = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        transitions = int(spec.get("leaseTransitions") or 0)
        expired = now - self._observed_at >= float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and not expired:
            return False
        if holder == self.identity:
            new_spec = self._spec(spec_now, acquire=spec.get("acquireTime") or spec_now, transitions=transitions)
        else:
            new_spec = self._spec(spec_now, acquire=spec_now, transitions=transitions + 1)
        body = {**lease, "spec": new_spec}  # NB: PUT with the resourceVersion read: a racing replica gets 409
        updated = await self.rest.request("PUT", await self._path(self.name), body=body)
        if updated.ok:
            self._observe(updated.body, now)
        elif updated.status != 409:
            raise SourceUnavailable("kubernetes", self._explain("update", updated.status, updated.message))
        return updated.ok

    def _explain(self, verb: str, status: int, message: str) -> str:
        """One line: what failed and what fixes it."""
        what = f"cannot {verb} the Lease (HTTP {status}: {message})"
        if status == 404 and "namespace" in message.lower():
            return (
                f"{what}: namespace {self.namespace!r} does not exist — create it (kubectl create namespace "
                f"{self.namespace}) or give --namespace the controller's own namespace"
            )
        if status in (401, 403):
            return (
                f"{what}: this identity may not {verb} the Lease {self.name!r} in {self.namespace!r} — apply "
                "deploy/controller's RBAC (its Role grants create on leases and get, update on the Lease named "
                "gpuscale-controller; another --lease-name needs the Role's resourceNames changed to match)"
            )
        return what

    def _spec(self, now: str, *, acquire: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": acquire,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _observe(self, lease: Mapping[str, Any], now: float) -> None:
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        self.holder = spec.get("holderIdentity") or None
        self.transitions = int(spec.get("leaseTransitions") or 0)

    async def release(self) -> None:
        """Give the Lease up (holder cleared) if we hold it, so a successor need not wait for it to expire."""
        if not self.is_leader:
            return
        self._renewed_at = None
        try:
            answer = await self.rest.request("GET", await self._path(self.name))
            if answer.ok and (answer.body.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = {**answer.body["spec"], "holderIdentity": None, "leaseDurationSeconds": 1}
                await self.rest.request("PUT", await self._path(self.name), body={**answer.body, "spec": spec})
                log.info("lease=%s/%s identity=%s released", self.namespace, self.name, self.identity)
        except SourceUnavailable as e:
            log.warning("lease=%s/%s release failed: %s", self.namespace, self.name, e)
        self.changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Compete until ``stop``; then release."""
        try:
            while not stop.is_set():
                await self.try_acquire_or_renew()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(self.retry_period, self._backoff))
        finally:
            await self.release()
