"""May this user do this? ``system:masters`` without asking, the rest by SubjectAccessReview (authorization.k8s.io/v1)
with the attributes apiserver's RequestInfo derives from the path, cached 10 s (allow and deny separately).

A SubjectAccessReview that cannot be made raises ``SourceUnavailable`` and is not cached; the middleware (auth.py)
turns it into a 403 saying the check could not be completed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from kubernetes_asyncio import client

from gpuscale.adapter.access_request import RequestAttributes, UserInfo, review_spec
from gpuscale.adapter.delegation import REVIEW_TIMEOUT_SECONDS, CachedLookup, create_review

__all__ = ["ALWAYS_ALLOW_GROUPS", "AccessDecision", "AccessReviewer", "Authorizer", "KubeAccessReviewer"]

log = logging.getLogger(__name__)

ALWAYS_ALLOW_GROUPS = ("system:masters",)


@dataclass(frozen=True, slots=True)
class AccessDecision:
    allowed: bool
    reason: str = ""


class AccessReviewer(Protocol):
    async def review(self, user: UserInfo, attributes: RequestAttributes) -> AccessDecision:
        """Allowed or not; SourceUnavailable when no answer can be had."""
        ...


class Authorizer:
    """May this user do this? ``always_allow_groups`` without asking, the rest by ``reviewer`` (cached)."""

    def __init__(
        self,
        reviewer: AccessReviewer,
        *,
        allowed_ttl_seconds: float = 10.0,
        denied_ttl_seconds: float = 10.0,
        always_allow_groups: Iterable[str] = ALWAYS_ALLOW_GROUPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviewer = reviewer
        self._always = frozenset(always_allow_groups)
        self._cache: CachedLookup[str, AccessDecision] = CachedLookup(
            ttl=lambda d: allowed_ttl_seconds if d.allowed else denied_ttl_seconds, clock=clock
        )

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> AccessDecision:
        if self._always.intersection(user.groups):
            return AccessDecision(True, "member of an always-allowed group")
        key = json.dumps(review_spec(user, attributes), sort_keys=True, separators=(",", ":"))
        return await self._cache.get(key, lambda: self._reviewer.review(user, attributes))


class KubeAccessReviewer:
    """SubjectAccessReview (authorization.k8s.io/v1) through the adapter's ApiClient."""

    def __init__(self, api_client: client.ApiClient, *, timeout_seconds: float = REVIEW_TIMEOUT_SECONDS) -> None:
        self._api = client.AuthorizationV1Api(api_client)
        self._timeout = timeout_seconds

    async def review(self, user: UserInfo, attributes: RequestAttributes) -> AccessDecision:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": review_spec(user, attributes),
        }
        status = await create_review(self._api.create_subject_access_review, body, timeout=self._timeout)
        if status.get("evaluationError"):
            log.debug("SubjectAccessReview evaluation error: %s", status["evaluationError"])
        return AccessDecision(bool(status.get("allowed")), str(status.get("reason") or ""))
