"""Fault injection: the plan of failures the next requests get, in kube-apiserver's own shapes, and the record
of what was served."""

from __future__ import annotations

from dataclasses import dataclass

from gpuscale.sim.api_errors import (
    ApiStatusError,
    conflict,
)
from gpuscale.sim.resources import (
    ResourceType,
)

_FAULT_VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "*")


@dataclass(slots=True)
class PlannedFailure:
    """One entry of the fault plan (see ``SimKubeApi.fail_next``)."""

    code: int
    verb: str
    resource: str | None  # group_resource ("pods", "deployments.apps"); None = any
    remaining: int
    retry_after_seconds: int

    def matches(self, verb: str, rt: ResourceType) -> bool:
        return self.verb in ("*", verb) and self.resource in (None, rt.group_resource, rt.plural)


@dataclass(frozen=True, slots=True)
class ServedFault:
    """A request the fault plan answered: what it asked for and the status it got."""

    verb: str
    resource: str
    code: int
    path_qs: str


class FaultPlan:
    """Planned failures, matched in order by the requests that come; ``served`` records what was answered."""

    def __init__(self) -> None:
        self._plan: list[PlannedFailure] = []
        self.served: list[ServedFault] = []
        """Every request answered by the fault plan, in order."""

    def add(
        self,
        code: int,
        *,
        verb: str = "list",
        resource: str | None = None,
        times: int = 1,
        retry_after_seconds: int = 1,
    ) -> None:
        """Answer the next ``times`` requests of ``verb`` on ``resource`` with ``code``, as kube-apiserver would.

        ``verb`` is a Kubernetes verb (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
        ``deletecollection``, or ``*``); ``resource`` a plural with its group (``pods``, ``deployments.apps``) or
        None for any. Entries queue up in order; a request takes the first entry it matches. The answers:

        * 410 on a watch: HTTP 200 and one ERROR event carrying an ``Expired`` Status ("too old resource
          version"), exactly what the watch cache sends; 410 on anything else: an HTTP 410 ``Expired`` Status.
        * 409: ``Conflict`` ("Operation cannot be fulfilled on pods ...: the object has been modified ...").
        * 429: ``TooManyRequests`` with ``Retry-After`` and ``details.retryAfterSeconds`` (the shape of
          apierrors.NewTooManyRequests; note that API Priority and Fairness itself answers 429 in plain text).
        * 500: ``InternalError`` ("Internal error occurred: etcdserver: leader changed", with the cause).
        * 503/504: ``ServiceUnavailable`` / ``Timeout``, with ``Retry-After``. Any other code: a Status with it.
        """
        if verb not in _FAULT_VERBS:
            raise ValueError(f"verb must be one of {', '.join(_FAULT_VERBS)}, not {verb!r}")
        if times < 1:
            raise ValueError("times must be at least 1")
        if not 400 <= code <= 599:
            raise ValueError(f"code must be an HTTP error status (4xx/5xx), not {code}")
        self._plan.append(PlannedFailure(code, verb, resource, times, retry_after_seconds))

    def clear(self) -> None:
        """Forget every planned failure not yet served."""
        self._plan.clear()

    @property
    def pending(self) -> int:
        """How many planned failures are still to be served."""
        return sum(f.remaining for f in self._plan)

    def take(self, verb: str, rt: ResourceType) -> PlannedFailure | None:
        for i, planned in enumerate(self._plan):
            if planned.matches(verb, rt):
                planned.remaining -= 1
                if planned.remaining == 0:
                    del self._plan[i]
                return planned
        return None


def planned_status(
    planned: PlannedFailure, rt: ResourceType, name: str | None, *, floor: int, rv: int
) -> ApiStatusError:
    code, retry = planned.code, planned.retry_after_seconds
    if code == 409:
        why = "the object has been modified; please apply your changes to the latest version and try again"
        return conflict(rt, name or "", why)
    if code == 410:
        return ApiStatusError(410, "Expired", f"too old resource version: {floor} ({rv})")
    if code == 429:
        return ApiStatusError(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
            details={"retryAfterSeconds": retry},
            headers={"Retry-After": str(retry)},
        )
    if code == 500:
        cause = "etcdserver: leader changed"
        return ApiStatusError(
            500, "InternalError", f"Internal error occurred: {cause}", details={"causes": [{"message": cause}]}
        )
    if code == 503:
        return ApiStatusError(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
            details={"retryAfterSeconds": retry},
            headers={"Retry-After": str(retry)},
        )
    if code == 504:
        return ApiStatusError(
            504,
            "Timeout",
            "the server was unable to return a response in the time allotted, but may still be processing the request",
            details={"retryAfterSeconds": retry},
            headers={"Retry-After": str(retry)},
        )
    reason = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound"}.get(code, "Unknown")
    return ApiStatusError(code, reason, f"simulated failure: HTTP {code}")
