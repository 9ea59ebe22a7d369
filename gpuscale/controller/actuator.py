"""The controller's only Kubernetes writer: applies planned ``Write``s, in order, and reports each outcome.

- ``dry_run``: every write is sent with ``dryRun=All``, so the API server validates it (admission, schema,
  conflicts) and writes nothing; the outcome is ``dry-run`` and the log line says what would have changed.
  The same write validated once is not sent again (planners re-plan it every reconcile, since nothing changed).
- Retries: 429, 5xx and a 409 Conflict on an unconditional write are retried with doubling backoff (never
  sooner than a ``Retry-After``), up to ``attempts``.
- Guarded writes are never retried blindly: a 409 on a write with a ``resource_version``, a 422 on a JSON patch
  (a ``test`` operation failed: the object is not as the plan read it) and AlreadyExists on a create are a
  ``conflict``; the loop re-reads the object and plans again. NotFound on a delete is ``already-done``; an
  Eviction the PodDisruptionBudget forbids now (429 with a DisruptionBudget cause) is ``refused`` and tried again
  by a later reconcile.
- Order: when a ``barrier`` write does not apply, the rest of the batch is ``skipped``; when one eviction of a
  gang (``Evict.group``) does not apply, the gang's later evictions are ``skipped``.
- Events: ``Emit`` creates a core v1 Event named after what it is about and a hash of reason and message; a
  repeat bumps ``count`` and ``lastTimestamp`` instead of creating another, as client-go's recorder does.

Every outcome is logged on one line (``action=… object=… result=… why=…``) and counted in ``outcomes``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from gpuscale.backoff import Backoff
from gpuscale.controller.writes import Create, Delete, Emit, Evict, Patch, Write, WriteOutcome
from gpuscale.errors import SourceUnavailable
from gpuscale.sources.kuberest import PATCH_CONTENT_TYPES, KubeAnswer, KubeRest

__all__ = ["KubeActuator", "action_of", "target_of"]

log = logging.getLogger("gpuscale.controller.actuator")

_RETRYABLE = frozenset({429, 500, 502, 503, 504})


def action_of(write: Write) -> str:
    """A short verb for logs and metrics: create, patch, patch-status, delete, evict, event."""
    if isinstance(write, Create):
        return "create"
    if isinstance(write, Patch):
        return f"patch-{write.subresource}" if write.subresource else "patch"
    if isinstance(write, Delete):
        return "delete"
    if isinstance(write, Evict):
        return "evict"
    return "event"


def target_of(write: Write) -> str:
    """What a write is about, for logs: ``Node/gpu-1``, ``Pod/ns/name``."""
    if isinstance(write, (Create, Patch, Delete)):
        return str(write.key)
    if isinstance(write, Evict):
        return f"Pod/{write.namespace}/{write.name}"
    return str(write.regarding)


def _timestamp(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeActuator:
    """Applies writes through ``KubeRest``. ``component`` names the Event source (``reportingComponent``)."""

    def __init__(
        self,
        rest: KubeRest,
        *,
        dry_run: bool = False,
        attempts: int = 4,
        backoff_seconds: float = 0.2,
        backoff_max_seconds: float = 5.0,
        component: str = "gpuscale-controller",
        instance: str = "",
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        import time

        self.rest = rest
        self.dry_run = dry_run
        self.attempts = max(1, attempts)
        self.backoff_seconds = backoff_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.component = component
        self.instance = instance
        self.clock = clock or time.time
        self._sleep = sleep
        self._validated: set[str] = set()  # dry-run writes already validated (sent once, not every reconcile)
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (action, result) → count
        self.retries = 0

    async def apply(self, writes: Sequence[Write]) -> list[WriteOutcome]:
        out = []
        barrier_failed = ""
        failed_groups: set[str] = set()
        for write in writes:
            # NB: keyed on what and why, not the body: bodies carry times (heartbeats, "since") that move each time.
            memo = f"{action_of(write)} {target_of(write)} {write.why}" if self.dry_run else ""
            if memo and memo in self._validated:
                continue
            group = write.group if isinstance(write, Evict) else ""
            if barrier_failed or group in failed_groups:
                why = barrier_failed or f"an earlier eviction of {group} did not apply"
                outcome = WriteOutcome(write, "skipped", why)
            else:
                try:
                    outcome = await self._apply(write)
                except SourceUnavailable as e:
                    outcome = WriteOutcome(write, "failed", str(e))
                if outcome.result not in ("applied", "dry-run", "already-done"):
                    if getattr(write, "barrier", False):
                        barrier_failed = f"{action_of(write)} {target_of(write)} did not apply ({outcome.result})"
                    if group:
                        failed_groups.add(group)
            if memo and outcome.result == "dry-run":
                if len(self._validated) >= 100_000:  # NB: bounded: a long dry run may see many distinct writes
                    self._validated.clear()
                self._validated.add(memo)
            self.outcomes[(action_of(write), outcome.result)] += 1
            level = logging.WARNING if outcome.result == "failed" else logging.INFO
            log.log(
                level,
                "action=%s object=%s result=%s why=%r%s",
                action_of(write),
                target_of(write),
                outcome.result,
                write.why,
                f" detail={outcome.detail!r}" if outcome.detail else "",
            )
            out.append(outcome)
        return out

    # -- one write

    async def _apply(self, write: Write) -> WriteOutcome:
        if isinstance(write, Emit):
            return await self._emit(write)
        if isinstance(write, Create):
            key = write.key
            path = await self.rest.path(key.api_version, key.kind, namespace=key.namespace)
            answer = await self._send(write, "POST", path, body=dict(write.obj))
            if answer.status == 409 and answer.reason == "AlreadyExists":
                return WriteOutcome(write, "conflict", f"AlreadyExists: {answer.message}")
            return self._outcome(write, answer)
        if isinstance(write, Patch):
            key = write.key
            path = await self.rest.path(
                key.api_version, key.kind, namespace=key.namespace, name=key.name, subresource=write.subresource
            )
            body = write.patch
            if write.resource_version is not None and isinstance(body, dict):
                body = {**body, "metadata": {**(body.get("metadata") or {}), "resourceVersion": write.resource_version}}
            answer = await self._send(
                write,
                "PATCH",
                path,
                body=body,
                content_type=PATCH_CONTENT_TYPES[write.patch_type],
                conflict_is_final=write.resource_version is not None,
            )
            if answer.status == 422 and write.patch_type == "json":
                # NB: kube answers a failed ``test`` (or a ``remove`` of what is gone) with one generic 422.
                detail = f"HTTP 422: the object changed since it was read: {answer.message}"
                return WriteOutcome(write, "conflict", detail)
            return self._outcome(write, answer)
        if isinstance(write, Delete):
            key = write.key
            path = await self.rest.path(key.api_version, key.kind, namespace=key.namespace, name=key.name)
            answer = await self._send(write, "DELETE", path)
            if answer.status == 404:
                return WriteOutcome(write, "already-done", answer.message)
            return self._outcome(write, answer)
        path = await self.rest.path("v1", "Pod", namespace=write.namespace, name=write.name, subresource="eviction")
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": write.name, "namespace": write.namespace},
        }
        answer = await self._send(write, "POST", path, body=eviction, eviction=True)
        if answer.status == 404:
            return WriteOutcome(write, "already-done", answer.message)
        if answer.status == 429:
            return WriteOutcome(write, "refused", answer.message or "a PodDisruptionBudget forbids it now")
        return self._outcome(write, answer)

    def _outcome(self, write: Write, answer: KubeAnswer) -> WriteOutcome:
        if answer.ok:
            if self.dry_run:
                return WriteOutcome(write, "dry-run")
            obj = answer.body if answer.body.get("kind") not in ("Status", None) else None
            return WriteOutcome(write, "applied", obj=obj)
        if answer.status == 409:
            return WriteOutcome(write, "conflict", f"HTTP 409 {answer.reason}: {answer.message}")
        if answer.status == 404:
            return WriteOutcome(write, "refused", f"HTTP {answer.status} {answer.reason}: {answer.message}")
        return WriteOutcome(write, "failed", f"HTTP {answer.status} {answer.reason}: {answer.message}".rstrip(": "))

    async def _send(
        self,
        write: Write,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        conflict_is_final: bool = False,
        eviction: bool = False,
    ) -> KubeAnswer:
        query = {"dryRun": "All"} if self.dry_run else {}
        if method in ("POST", "PATCH"):
            query["fieldManager"] = self.component
        backoff = Backoff(initial_seconds=self.backoff_seconds, max_seconds=self.backoff_max_seconds, jitter=0.2)
        answer = KubeAnswer(0)
        for attempt in range(self.attempts):
            try:
                answer = await self.rest.request(method, path, query=query, body=body, content_type=content_type)
            except SourceUnavailable:
                if attempt == self.attempts - 1:
                    raise
                answer = KubeAnswer(0)
            else:
                if eviction and answer.status == 429 and _is_disruption_budget(answer):
                    return answer
                retry = answer.status in _RETRYABLE or (
                    answer.status == 409 and answer.reason == "Conflict" and not conflict_is_final
                )
                if not retry:
                    return answer
            if attempt < self.attempts - 1:
                self.retries += 1
                wait = max(backoff.next_delay(), answer.retry_after_seconds if answer.status else 0.0)
                log.info(
                    "action=%s object=%s retry=%d after=%.2fs status=%s",
                    action_of(write),
                    target_of(write),
                    attempt + 1,
                    wait,
                    answer.status or "no answer",
                )
                await self._sleep(wait)
        return answer

    # -- events

    async def _emit(self, emit: Emit) -> WriteOutcome:
        regarding = emit.regarding
        namespace = regarding.namespace or "default"
        digest = hashlib.sha256(f"{emit.reason}\0{emit.message}".encode()).hexdigest()[:10]
        name = f"{regarding.name}.{digest}"[:253]
        now = _timestamp(self.clock())
        path = await self.rest.path("v1", "Event", namespace=namespace)
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": regarding.api_version,
                "kind": regarding.kind,
                "name": regarding.name,
                **({"namespace": regarding.namespace} if regarding.namespace else {}),
            },
            "reason": emit.reason,
            "message": emit.message[:1024],
            "type": emit.type,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance or self.component,
        }
        answer = await self._send(emit, "POST", path, body=event)
        if answer.status == 409 and answer.reason == "AlreadyExists":
            current = await self.rest.request("GET", f"{path}/{name}")
            count = int(current.body.get("count") or 1) + 1 if current.ok else 2
            answer = await self._send(
                emit,
                "PATCH",
                f"{path}/{name}",
                body={"count": count, "lastTimestamp": now},
                content_type=PATCH_CONTENT_TYPES["merge"],
            )
        return self._outcome(emit, answer)


def _is_disruption_budget(answer: KubeAnswer) -> bool:
    causes = (answer.body.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "DisruptionBudget" for c in causes if isinstance(c, dict))
