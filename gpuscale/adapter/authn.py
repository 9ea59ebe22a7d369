"""Who a request comes from, the way k8s.io/apiserver's delegating authenticator decides it.

The first that succeeds wins; errors only count when none does:

1. front proxy: the TLS client certificate chains to the requestheader CA and its CN is allowed
   → user from X-Remote-User / X-Remote-Uid / X-Remote-Group / X-Remote-Extra-*
2. client certificate chaining to the client CA → user = CN, groups = O
3. Authorization: Bearer → TokenReview (authentication.k8s.io/v1), cached 10 s (yes and no)
4. nothing presented → system:anonymous if allowed, else 401;  something presented but bad → 401

A TokenReview that cannot be made is a 401, as kube-apiserver answers it (the cause is logged, never sent), and is
not cached.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client
from multidict import MultiMapping

from gpuscale.adapter.access_request import (
    ANONYMOUS,
    AUTHENTICATED_GROUP,
    UNAUTHENTICATED_GROUP,
    Unauthenticated,
    UserInfo,
)
from gpuscale.adapter.auth_config import AuthenticationConfig, certificate_common_name
from gpuscale.adapter.delegation import REVIEW_TIMEOUT_SECONDS, SOURCE, CachedLookup, create_review
from gpuscale.adapter.tls import CertificateRejected
from gpuscale.errors import SourceUnavailable

__all__ = ["Authenticator", "KubeTokenReviewer", "TokenReviewer"]

log = logging.getLogger(__name__)


class TokenReviewer(Protocol):
    async def review(self, token: str) -> UserInfo | None:
        """The token's user, None when the token is not valid; SourceUnavailable when no answer can be had."""
        ...


class Authenticator:
    """Who a request comes from (module docstring, steps 1-4). ``config`` returns the config in force."""

    def __init__(
        self,
        config: Callable[[], AuthenticationConfig],
        *,
        token_reviewer: TokenReviewer | None = None,
        cache_ttl_seconds: float = 10.0,
        allow_anonymous: bool = False,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self._config = config
        self._token_reviewer = token_reviewer
        self._tokens: CachedLookup[str, UserInfo | None] = CachedLookup(ttl=lambda _: cache_ttl_seconds, clock=clock)
        self.allow_anonymous = allow_anonymous
        self._now = wall_clock

    async def authenticate(self, headers: MultiMapping[str], peer_chain: Sequence[bytes] = ()) -> UserInfo:
        """The user; Unauthenticated (reason inside) when the request presents nothing acceptable."""
        config = self._config()
        errors: list[str] = []
        if peer_chain:
            now = self._now()
            front_proxy = config.request_header
            if front_proxy is not None and not front_proxy.ca.empty:
                try:
                    user = front_proxy.authenticate(headers, peer_chain, now=now)
                except CertificateRejected as e:
                    errors.append(f"front proxy: {e}")
                else:
                    if user is not None:
                        return _with_authenticated_group(user)
            if not config.client_ca.empty:
                try:
                    leaf = config.client_ca.verify(peer_chain, now=now)
                except CertificateRejected as e:
                    errors.append(f"client certificate: {e}")
                else:
                    common_name = certificate_common_name(leaf)
                    if common_name:
                        return _with_authenticated_group(UserInfo(common_name, groups=_organizations(leaf)))
        token = _bearer_token(headers)
        if token:
            try:
                user = await self._review(token)
            except SourceUnavailable as e:
                log.warning("cannot review a bearer token: %s", e)
                errors.append(f"token: {e}")
            else:
                if user is not None:
                    return _with_authenticated_group(user)
                errors.append("invalid bearer token")
        if errors:
            raise Unauthenticated("; ".join(errors))
        if self.allow_anonymous:
            return ANONYMOUS
        raise Unauthenticated("no credentials")

    async def _review(self, token: str) -> UserInfo | None:
        reviewer = self._token_reviewer
        if reviewer is None:
            raise SourceUnavailable(SOURCE, "no token reviewer is configured")
        key = hashlib.sha256(token.encode()).hexdigest()  # NB: tokens themselves are never kept
        return await self._tokens.get(key, lambda: reviewer.review(token))


def _bearer_token(headers: MultiMapping[str]) -> str:
    """kube's bearertoken authenticator: ``Authorization: Bearer <token>`` (scheme case-insensitive)."""
    parts = headers.get("Authorization", "").strip().split(" ", 2)
    if len(parts) < 2 or parts[0].lower() != "bearer":
        return ""
    return parts[1]


def _organizations(cert: x509.Certificate) -> tuple[str, ...]:
    return tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))


def _with_authenticated_group(user: UserInfo) -> UserInfo:
    if AUTHENTICATED_GROUP in user.groups or UNAUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED_GROUP), user.extra)


class KubeTokenReviewer:
    """TokenReview (authentication.k8s.io/v1) through the adapter's ApiClient (RBAC: system:auth-delegator)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        timeout_seconds: float = REVIEW_TIMEOUT_SECONDS,
        audiences: Sequence[str] = (),
    ) -> None:
        self._api = client.AuthenticationV1Api(api_client)
        self._timeout = timeout_seconds
        self._audiences = list(audiences)

    async def review(self, token: str) -> UserInfo | None:
        spec: dict[str, Any] = {"token": token}
        if self._audiences:
            spec["audiences"] = self._audiences
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        status = await create_review(self._api.create_token_review, body, timeout=self._timeout)
        if not status.get("authenticated"):
            if status.get("error"):
                log.debug("TokenReview: %s", status["error"])
            return None
        user = status.get("user") or {}
        extra = user.get("extra") or {}
        return UserInfo(
            str(user.get("username", "")),
            uid=str(user.get("uid", "")),
            groups=tuple(user.get("groups") or ()),
            extra={str(k): tuple(v or ()) for k, v in extra.items()},
        )
