"""Delegated authentication and authorization, the way a Kubernetes aggregated API server does it.

What k8s.io/apiserver's ``DelegatingAuthenticationOptions`` and ``DelegatingAuthorizationOptions`` build, on
aiohttp::

    request ─▶ always-allowed path? (/healthz /livez /readyz) ─────────────────────────────────▶ handler
        │
        ▼  authentication (the first that succeeds wins; errors only count when none does)
        1. front proxy: the TLS client certificate chains to the requestheader CA and its CN is allowed
           → user from X-Remote-User / X-Remote-Uid / X-Remote-Group / X-Remote-Extra-*
        2. client certificate chaining to the client CA → user = CN, groups = O
        3. Authorization: Bearer → TokenReview (authentication.k8s.io/v1), cached 10 s (yes and no)
        4. nothing presented → system:anonymous if allowed, else 401;  something presented but bad → 401
        │
        ▼  authorization: system:masters → allowed; else SubjectAccessReview (authorization.k8s.io/v1)
           with the attributes apiserver's RequestInfo derives from the path, cached 10 s (allow and deny
           separately); denied → 403 in kube-apiserver's words
        handler

Trust rules that must not bend:

* Identity headers are read **only** after the connection's client certificate has been verified, per request,
  against the current requestheader CA (``tls.CABundle.verify``) and its CN against the allowed names (an empty
  list allows any CN that CA signed, as in kube-apiserver). A header over any other connection is ignored.
* Failing closed: a TokenReview that cannot be made is a 401, exactly as kube-apiserver answers it (the cause is
  logged, never sent); a SubjectAccessReview that cannot be made is a 403 whose message says the check could
  not be completed (kube-apiserver answers 500; a 403 keeps the answer a denial rather than inviting retries,
  and the message tells an operator it is not an RBAC decision). Neither outcome is cached.

The parts, one module each: who is asking and for what, and the Forbidden answer (access_request.py); where the
trust comes from, the flags or the watched ConfigMap (auth_config.py); authentication (authn.py); authorization
(authz.py); asking the API for a review and caching its answers (delegation.py). ``DelegatedAuth`` here wires all
of it from a kubernetes-asyncio ApiClient; ``make_auth_middleware`` is the seam the HTTP app sees.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from kubernetes_asyncio import client

from gpuscale.adapter.access_request import Unauthenticated, UserInfo, forbidden_response, request_attributes
from gpuscale.adapter.auth_config import AuthenticationConfigWatcher
from gpuscale.adapter.authn import Authenticator, KubeTokenReviewer
from gpuscale.adapter.authz import AccessDecision, Authorizer, KubeAccessReviewer
from gpuscale.adapter.delegation import REVIEW_TIMEOUT_SECONDS
from gpuscale.adapter.status import status_response
from gpuscale.adapter.tls import ServerTLS, peer_certificates
from gpuscale.errors import SourceUnavailable
from gpuscale.settings import AuthenticationFlags

__all__ = ["ALWAYS_ALLOW_PATHS", "AUTHORIZATION_UNAVAILABLE", "AUTH_USER", "DelegatedAuth", "make_auth_middleware"]

log = logging.getLogger(__name__)

ALWAYS_ALLOW_PATHS = ("/healthz", "/livez", "/readyz")
AUTHORIZATION_UNAVAILABLE = (
    "the authorization check could not be completed (SubjectAccessReview unavailable); denied until it can be"
)


AUTH_USER = web.RequestKey("user", UserInfo)


def make_auth_middleware(
    authenticator: Authenticator,
    authorizer: Authorizer,
    *,
    always_allow_paths: Iterable[str] = ALWAYS_ALLOW_PATHS,
) -> Middleware:
    """An aiohttp middleware: 401 unless authenticated, 403 unless authorized; ``request[AUTH_USER]`` after.

    ``always_allow_paths`` are served without either (exact paths; a trailing ``*`` makes a prefix). Place it
    after the app's error/metrics middleware so denials are counted and shaped like every other answer.
    """
    paths = list(always_allow_paths)
    exact = frozenset(p for p in paths if not p.endswith("*"))
    prefixes = tuple(p[:-1] for p in paths if p.endswith("*"))

    @web.middleware
    async def authenticate_and_authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in exact or (prefixes and path.startswith(prefixes)):
            return await handler(request)
        transport = request.transport
        ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
        try:
            user = await authenticator.authenticate(request.headers, peer_certificates(ssl_object))
        except Unauthenticated as e:
            # NB: debug, not info: kube-aggregator's availability probes present the proxy certificate and no
            # user, every few seconds per APIService. Review outages are logged as warnings where they happen.
            log.debug("unable to authenticate %s %s: %s", request.method, path, e)
            return status_response(401, "Unauthorized")
        attributes = request_attributes(request.method, path, request.query)
        try:
            decision = await authorizer.authorize(user, attributes)
        except SourceUnavailable as e:
            log.warning("cannot authorize %s %s for %s: %s", request.method, path, user.name, e)
            decision = AccessDecision(False, AUTHORIZATION_UNAVAILABLE)
        if not decision.allowed:
            log.debug("forbidden: %s %s for %s (%s)", request.method, path, user.name, decision.reason or "denied")
            return forbidden_response(user, attributes, decision.reason)
        request[AUTH_USER] = user
        return await handler(request)

    return authenticate_and_authorize


class DelegatedAuth:
    """Authentication and authorization delegated to the Kubernetes API, built from one ApiClient.

    Needs RBAC: ``system:auth-delegator`` (TokenReview, SubjectAccessReview) and, in kube-system, the Role
    ``extension-apiserver-authentication-reader`` (the ConfigMap). ``start()`` begins watching the ConfigMap and
    waits for the first read; ``serve_tls`` keeps a ``ServerTLS``'s client CAs equal to the config's. The cache
    TTLs are in seconds of ``clock`` (monotonic by default).
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        flags: AuthenticationFlags | None = None,
        authn_cache_ttl_seconds: float = 10.0,
        authz_cache_ttl_seconds: float = 10.0,
        allow_anonymous: bool = False,
        review_timeout_seconds: float = REVIEW_TIMEOUT_SECONDS,
        watch_timeout_seconds: int = 300,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = AuthenticationConfigWatcher(api_client, flags=flags, watch_timeout_seconds=watch_timeout_seconds)
        self.authenticator = Authenticator(
            lambda: self.config.current,
            token_reviewer=KubeTokenReviewer(api_client, timeout_seconds=review_timeout_seconds),
            cache_ttl_seconds=authn_cache_ttl_seconds,
            allow_anonymous=allow_anonymous,
            clock=clock,
        )
        self.authorizer = Authorizer(
            KubeAccessReviewer(api_client, timeout_seconds=review_timeout_seconds),
            allowed_ttl_seconds=authz_cache_ttl_seconds,
            denied_ttl_seconds=authz_cache_ttl_seconds,
            clock=clock,
        )

    def middleware(self, *, always_allow_paths: Iterable[str] = ALWAYS_ALLOW_PATHS) -> Middleware:
        return make_auth_middleware(self.authenticator, self.authorizer, always_allow_paths=always_allow_paths)

    def serve_tls(self, server_tls: ServerTLS) -> None:
        server_tls.set_client_cas(self.config.current.trusted_pem)
        self.config.subscribe(lambda config: server_tls.set_client_cas(config.trusted_pem))

    async def start(self, *, sync_timeout: float = 30.0) -> None:
        await self.config.start()
        await self.config.wait_synced(sync_timeout)

    async def stop(self) -> None:
        await self.config.stop()
