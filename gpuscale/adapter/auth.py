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

Where the trust comes from (``AuthenticationConfig``): ``--client-ca-file`` and ``--requestheader-*`` flags when
given, otherwise the ConfigMap ``kube-system/extension-apiserver-authentication`` that kube-apiserver publishes,
list+watched (relist on 410 Gone, back off on errors) so CA rotations apply without a restart. As in
k8s.io/apiserver, the client CA and the requestheader settings are each taken from the flags *or* the ConfigMap:
without ``--requestheader-client-ca-file`` every requestheader setting (CA, allowed names, header names) comes from
the ConfigMap.

``DelegatedAuth`` wires all of it from a kubernetes-asyncio ApiClient; ``make_auth_middleware`` is the seam the
HTTP app sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client
from multidict import MultiMapping

from gpuscale.adapter.status import status_response
from gpuscale.adapter.tls import CABundle, CertificateRejected, ServerTLS, peer_certificates
from gpuscale.errors import ConfigError, GpuscaleError, SourceUnavailable
from gpuscale.settings import AuthenticationFlags  # NB: the settings group, handed whole by cli/adapter.py
from gpuscale.sources.configmaps import ConfigMapWatch
from gpuscale.sources.reflector import WatchExpired, read_json

__all__ = [
    "ALWAYS_ALLOW_PATHS",
    "ANONYMOUS",
    "AUTH_USER",
    "AccessDecision",
    "AccessReviewer",
    "AuthenticationConfig",
    "AuthenticationConfigWatcher",
    "AuthenticationFlags",
    "Authenticator",
    "Authorizer",
    "DelegatedAuth",
    "KubeAccessReviewer",
    "KubeTokenReviewer",
    "RequestAttributes",
    "RequestHeaderConfig",
    "TokenReviewer",
    "Unauthenticated",
    "UserInfo",
    "config_from_configmap",
    "flag_parts",
    "forbidden_message",
    "make_auth_middleware",
    "request_attributes",
    "review_spec",
]

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
CONFIGMAP_NAMESPACE = "kube-system"
CONFIGMAP_NAME = "extension-apiserver-authentication"
ALWAYS_ALLOW_PATHS = ("/healthz", "/livez", "/readyz")
ALWAYS_ALLOW_GROUPS = ("system:masters",)
DEFAULT_USERNAME_HEADERS = ("X-Remote-User",)
DEFAULT_GROUP_HEADERS = ("X-Remote-Group",)
DEFAULT_EXTRA_HEADERS_PREFIXES = ("X-Remote-Extra-",)
AUTHENTICATED_GROUP = "system:authenticated"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
AUTHORIZATION_UNAVAILABLE = (
    "the authorization check could not be completed (SubjectAccessReview unavailable); denied until it can be"
)
_REVIEW_TIMEOUT_SECONDS = 5.0
_CACHE_ENTRIES = 4096


class Unauthenticated(GpuscaleError):
    """The request carries no acceptable credentials (→ 401 Unauthorized; the reason is logged, not sent)."""


# --- who is asking, and for what ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserInfo:
    """An authenticated identity, as Kubernetes' ``user.Info``: name, uid, groups and extra (key → values)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


ANONYMOUS = UserInfo("system:anonymous", groups=(UNAUTHENTICATED_GROUP,))


@dataclass(frozen=True, slots=True)
class RequestAttributes:
    """What a request asks to do, as apiserver's ``RequestInfo`` derives it from method and path.

    A resource request has group/version/resource (and maybe namespace, name, subresource); any other request
    is a non-resource request on ``path``. ``verb`` is the Kubernetes verb (get, list, create…) for the first,
    the lower-case HTTP method for the second.
    """

    verb: str
    path: str
    resource_request: bool = False
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""


_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def request_attributes(method: str, path: str, query: Mapping[str, str]) -> RequestAttributes:
    """apiserver's ``RequestInfoFactory.NewRequestInfo`` for the ``/api`` and ``/apis`` prefixes.

    ``/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/pods/*/m`` → get pods, name ``*``, subresource ``m`` in
    ``ns``; ``…/namespaces/ns/metrics/m`` → get ``metrics`` named ``m``; ``/apis/external.metrics.k8s.io/v1beta1/
    namespaces/ns/m`` → list ``m`` (no name); ``/apis/custom.metrics.k8s.io/v1beta1`` (discovery) and everything
    outside ``/api(s)`` → non-resource. Resource names are taken verbatim (``deployments.apps``). The legacy
    ``/watch/`` and ``/proxy/`` path prefixes are not interpreted.
    """
    non_resource = RequestAttributes(verb=method.lower(), path=path)
    parts = [p for p in path.strip("/").split("/")] if path.strip("/") else []
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return non_resource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    verb = _METHOD_VERBS.get(method.upper(), "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch", "").lower() in ("1", "t", "true") else "list"
        for term in query.get("fieldSelector", "").split(","):
            key, _, value = term.replace("==", "=").partition("=")
            if key.strip() == "metadata.name" and value.strip() and "/" not in value:
                name = value.strip()
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestAttributes(verb, path, True, group, version, namespace, resource, subresource, name)


def _q(text: str) -> str:
    """Go's %q, near enough for names and paths."""
    return json.dumps(text, ensure_ascii=False)


def forbidden_message(user: UserInfo, attributes: RequestAttributes, reason: str = "") -> str:
    """kube-apiserver's Forbidden message (``responsewriters.Forbidden`` wrapped by ``apierrors.NewForbidden``)."""
    a = attributes
    if not a.resource_request:
        what = f"User {_q(user.name)} cannot {a.verb} path {_q(a.path)}"
    else:
        resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
        where = f"in the namespace {_q(a.namespace)}" if a.namespace else "at the cluster scope"
        what = f"User {_q(user.name)} cannot {a.verb} resource {_q(resource)} in API group {_q(a.api_group)} {where}"
    if reason:
        what = f"{what}: {reason}"
    if not a.resource_request or not (a.resource or a.api_group):
        return f"forbidden: {what}"
    qualified = f"{a.resource}.{a.api_group}" if a.api_group else a.resource
    if a.name:
        return f"{qualified} {_q(a.name)} is forbidden: {what}"
    return f"{qualified} is forbidden: {what}"


def forbidden_response(user: UserInfo, attributes: RequestAttributes, reason: str = "") -> web.Response:
    details = None
    if attributes.resource_request:
        details = {
            k: v
            for k, v in (("group", attributes.api_group), ("kind", attributes.resource), ("name", attributes.name))
            if v
        }
    return status_response(403, forbidden_message(user, attributes, reason), details=details or None)


def review_spec(user: UserInfo, attributes: RequestAttributes) -> dict[str, Any]:
    """The ``spec`` of a SubjectAccessReview for this user and request (what the webhook authorizer sends)."""
    spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups)}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in sorted(user.extra.items())}
    a = attributes
    if a.resource_request:
        resource = {"verb": a.verb, "group": a.api_group, "version": a.api_version, "resource": a.resource}
        resource.update({k: v for k, v in (("namespace", a.namespace), ("subresource", a.subresource)) if v})
        if a.name:
            resource["name"] = a.name
        spec["resourceAttributes"] = resource
    else:
        spec["nonResourceAttributes"] = {"path": a.path, "verb": a.verb}
    return spec


# --- where trust comes from ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestHeaderConfig:
    """Front-proxy (requestheader) authentication: who may assert identities, and in which headers."""

    ca: CABundle
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = DEFAULT_USERNAME_HEADERS
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = DEFAULT_GROUP_HEADERS
    extra_headers_prefixes: tuple[str, ...] = DEFAULT_EXTRA_HEADERS_PREFIXES

    def authenticate(self, headers: MultiMapping[str], chain: Sequence[bytes], *, now: dt.datetime) -> UserInfo | None:
        """The user the headers name, if ``chain`` is a front proxy's; None when no username header is set.

        CertificateRejected when the certificate is not the requestheader CA's or its CN is not allowed — then
        the headers are never read.
        """
        leaf = self.ca.verify(chain, now=now)
        common_name = _common_name(leaf)
        if self.allowed_names and common_name not in self.allowed_names:
            raise CertificateRejected(f"front-proxy certificate CN {common_name!r} is not an allowed name")
        name = _first_value(headers, self.username_headers)
        if not name:
            return None
        groups = tuple(v for h in self.group_headers for v in headers.getall(h, ()) if v)
        extra: dict[str, list[str]] = {}
        for prefix in self.extra_headers_prefixes:
            low = prefix.lower()
            for header, value in headers.items():
                if header.lower().startswith(low):
                    extra.setdefault(unquote(header[len(prefix) :].lower()), []).append(value)
        return UserInfo(
            name,
            uid=_first_value(headers, self.uid_headers),
            groups=groups,
            extra={k: tuple(v) for k, v in extra.items()},
        )


@dataclass(frozen=True)
class AuthenticationConfig:
    """The CAs and requestheader settings in force; replaced as a whole when the source changes."""

    client_ca: CABundle = field(default_factory=CABundle)
    request_header: RequestHeaderConfig | None = None

    @property
    def trusted_pem(self) -> str:
        """Every CA a client certificate may chain to, for the TLS handshake (``ServerTLS.set_client_cas``)."""
        bundles = [self.client_ca.pem, self.request_header.ca.pem if self.request_header else ""]
        return "\n".join(b.strip() for b in bundles if b.strip())


def _json_list(data: Mapping[str, str], key: str, source: str) -> tuple[str, ...]:
    raw = data.get(key, "")
    if not raw.strip():
        return ()
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{source} key {key}: not a JSON list of strings: {e}") from e
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{source} key {key}: not a JSON list of strings: {raw!r}")
    return tuple(value)


def config_from_configmap(data: Mapping[str, str] | None) -> AuthenticationConfig:
    """The ``extension-apiserver-authentication`` ConfigMap's data as a config (None/{} = nothing trusted).

    List values are JSON strings (``'["X-Remote-User"]'``); a missing header list stays empty, as in
    k8s.io/apiserver (and then no front-proxy request can authenticate — logged as a warning).
    """
    data = data or {}
    source = f"ConfigMap {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}"
    client_ca = CABundle.parse(data.get("client-ca-file", ""), source=f"{source} key client-ca-file")
    request_header = None
    if data.get("requestheader-client-ca-file", "").strip():
        request_header = RequestHeaderConfig(
            ca=CABundle.parse(
                data["requestheader-client-ca-file"], source=f"{source} key requestheader-client-ca-file"
            ),
            allowed_names=_json_list(data, "requestheader-allowed-names", source),
            username_headers=_json_list(data, "requestheader-username-headers", source),
            uid_headers=_json_list(data, "requestheader-uid-headers", source),
            group_headers=_json_list(data, "requestheader-group-headers", source),
            extra_headers_prefixes=_json_list(data, "requestheader-extra-headers-prefix", source),
        )
        if not request_header.username_headers:
            log.warning("%s has no requestheader-username-headers: front-proxy requests cannot authenticate", source)
    return AuthenticationConfig(client_ca, request_header)


def flag_parts(flags: AuthenticationFlags) -> tuple[CABundle | None, RequestHeaderConfig | None]:
    """(client CA, requestheader config) from the flags' files; None for a part the cluster must supply."""
    client_ca = CABundle.from_file(flags.client_ca_file, flag="--client-ca-file") if flags.client_ca_file else None
    request_header = None
    if flags.requestheader_client_ca_file:
        request_header = RequestHeaderConfig(
            ca=CABundle.from_file(flags.requestheader_client_ca_file, flag="--requestheader-client-ca-file"),
            allowed_names=tuple(flags.requestheader_allowed_names),
            username_headers=tuple(flags.requestheader_username_headers) or DEFAULT_USERNAME_HEADERS,
            uid_headers=tuple(flags.requestheader_uid_headers),
            group_headers=tuple(flags.requestheader_group_headers) or DEFAULT_GROUP_HEADERS,
            extra_headers_prefixes=tuple(flags.requestheader_extra_headers_prefix) or DEFAULT_EXTRA_HEADERS_PREFIXES,
        )
    return client_ca, request_header


class AuthenticationConfigWatcher:
    """The current ``AuthenticationConfig``: the flags' parts, the rest from the ConfigMap, list+watched.

    ``current`` is always usable (before the first list it holds the flags' parts only). ``subscribe`` callbacks
    run with each new config. ``start()`` launches the loop (a no-op when the flags give everything or there is
    no ApiClient); ``wait_synced`` waits for the first list. A ConfigMap that cannot be parsed is logged and
    ignored (the previous config stays); a deleted or absent one trusts nothing from the cluster. The loop is
    the one every cache shares (``sources.configmaps.ConfigMapWatch`` on ``kube.Reflector``).
    """

    def __init__(
        self,
        api_client: client.ApiClient | None,
        *,
        flags: AuthenticationFlags | None = None,
        namespace: str = CONFIGMAP_NAMESPACE,
        name: str = CONFIGMAP_NAME,
        watch_timeout_seconds: int = 300,
        backoff_max_seconds: float = 30.0,
    ) -> None:
        self._fixed_client_ca, self._fixed_request_header = flag_parts(flags or AuthenticationFlags())
        self._namespace, self._name = namespace, name
        needs_cluster = api_client is not None and (self._fixed_client_ca is None or self._fixed_request_header is None)
        self._watch = (
            ConfigMapWatch(
                api_client,
                namespace=namespace,
                name=name,
                on_data=self._apply,
                missing_note="only the flags' CAs are trusted until it appears",
                watch_timeout_seconds=watch_timeout_seconds,
                backoff_max_seconds=backoff_max_seconds,
            )
            if needs_cluster and api_client is not None
            else None
        )
        self._current = self._merge(AuthenticationConfig())
        self._subscribers: list[Callable[[AuthenticationConfig], None]] = []

    @property
    def current(self) -> AuthenticationConfig:
        return self._current

    @property
    def synced(self) -> bool:
        return self._watch is None or self._watch.synced

    @property
    def last_error(self) -> str | None:
        """The last error of the loop (cleared by the next successful list or watch); for readiness messages."""
        return self._watch.last_error if self._watch is not None else None

    def subscribe(self, callback: Callable[[AuthenticationConfig], None]) -> None:
        self._subscribers.append(callback)

    async def start(self) -> None:
        if self._watch is not None:
            await self._watch.start()

    async def stop(self) -> None:
        if self._watch is not None:
            await self._watch.stop()

    async def wait_synced(self, timeout: float) -> None:
        """Wait for the first list; SourceUnavailable naming the last error after ``timeout`` seconds."""
        if self._watch is None:
            return
        try:
            await self._watch.wait_synced(timeout)
        except SourceUnavailable:
            reason = f"ConfigMap {self._namespace}/{self._name} not read after {timeout:g}s"
            raise SourceUnavailable(SOURCE, f"{reason}: {self.last_error}" if self.last_error else reason) from None

    async def refresh_once(self) -> None:
        """List the ConfigMap once and apply it (SourceUnavailable if the API cannot be read)."""
        if self._watch is not None:
            await self._watch.refresh_once()

    def _merge(self, from_cluster: AuthenticationConfig) -> AuthenticationConfig:
        return AuthenticationConfig(
            client_ca=self._fixed_client_ca if self._fixed_client_ca is not None else from_cluster.client_ca,
            request_header=self._fixed_request_header
            if self._fixed_request_header is not None
            else from_cluster.request_header,
        )

    def _apply(self, data: Mapping[str, str] | None) -> None:
        try:
            config = self._merge(config_from_configmap(data))
        except ConfigError as e:
            log.error("ignoring the change (keeping the previous authentication config): %s", e)
            return
        if config == self._current:
            return
        self._current = config
        log.info(
            "authentication config: client CA %s, requestheader CA %s",
            config.client_ca.fingerprint[:12] or "none",
            config.request_header.ca.fingerprint[:12] if config.request_header else "none",
        )
        for callback in self._subscribers:
            try:
                callback(config)
            except GpuscaleError as e:
                log.error("applying the new authentication config failed: %s", e)


# --- caching ------------------------------------------------------------------------------------------------

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _CachedLookup(Generic[K, V]):
    """Answers of an async lookup kept ``ttl(answer)`` seconds per key; concurrent misses share one call.

    Exceptions are not cached (a failed TokenReview or SubjectAccessReview is asked again next time).
    """

    def __init__(
        self, *, ttl: Callable[[V], float], clock: Callable[[], float], max_entries: int = _CACHE_ENTRIES
    ) -> None:
        self._ttl = ttl
        self._clock = clock
        self._max_entries = max_entries
        self._entries: OrderedDict[K, tuple[float, V]] = OrderedDict()
        self._inflight: dict[K, asyncio.Task[V]] = {}

    async def get(self, key: K, lookup: Callable[[], Awaitable[V]]) -> V:
        hit = self._entries.get(key)
        if hit is not None:
            if hit[0] > self._clock():
                return hit[1]
            del self._entries[key]
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(self._fill(key, lookup))
            task.add_done_callback(_retrieve)
            self._inflight[key] = task
        # NB: shielded, so a client that hangs up does not cancel the lookup other requests wait for.
        return await asyncio.shield(task)

    async def _fill(self, key: K, lookup: Callable[[], Awaitable[V]]) -> V:
        try:
            value = await lookup()
        finally:
            self._inflight.pop(key, None)
        ttl = self._ttl(value)
        if ttl > 0:
            self._entries[key] = (self._clock() + ttl, value)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)
        return value


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # marks it retrieved: the waiters got it, or nobody waits any more


# --- authentication -----------------------------------------------------------------------------------------


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
        self._tokens: _CachedLookup[str, UserInfo | None] = _CachedLookup(ttl=lambda _: cache_ttl_seconds, clock=clock)
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
                    common_name = _common_name(leaf)
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


def _first_value(headers: MultiMapping[str], names: Iterable[str]) -> str:
    for name in names:
        value = headers.get(name, "")
        if value:
            return value
    return ""


def _common_name(cert: x509.Certificate) -> str:
    values = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(values[0].value) if values else ""


def _organizations(cert: x509.Certificate) -> tuple[str, ...]:
    return tuple(str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME))


def _with_authenticated_group(user: UserInfo) -> UserInfo:
    if AUTHENTICATED_GROUP in user.groups or UNAUTHENTICATED_GROUP in user.groups:
        return user
    return UserInfo(user.name, user.uid, (*user.groups, AUTHENTICATED_GROUP), user.extra)


# --- authorization ------------------------------------------------------------------------------------------


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
        self._cache: _CachedLookup[str, AccessDecision] = _CachedLookup(
            ttl=lambda d: allowed_ttl_seconds if d.allowed else denied_ttl_seconds, clock=clock
        )

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> AccessDecision:
        if self._always.intersection(user.groups):
            return AccessDecision(True, "member of an always-allowed group")
        key = json.dumps(review_spec(user, attributes), sort_keys=True, separators=(",", ":"))
        return await self._cache.get(key, lambda: self._reviewer.review(user, attributes))


# --- the delegated reviews (kubernetes-asyncio) ---------------------------------------------------------------


async def _create_review(call: Callable[..., Awaitable[Any]], body: dict[str, Any], *, timeout: float) -> dict:
    """POST a review object; its ``status``. SourceUnavailable (with the cause) when the API does not answer."""
    kind = body["kind"]
    try:
        response = await call(body, _preload_content=False, _request_timeout=timeout)
        try:
            answer = await read_json(response)
        finally:
            response.release()
    except (client.ApiException, aiohttp.ClientError, OSError, TimeoutError, ValueError, WatchExpired) as e:
        if isinstance(e, client.ApiException):
            detail = f"HTTP {e.status} {e.reason}"
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                detail += f": {json.loads(e.body or b'{}').get('message', '')}"
        else:
            detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise SourceUnavailable(SOURCE, f"{kind} failed: {detail}") from e
    status = answer.get("status")
    return status if isinstance(status, dict) else {}


class KubeTokenReviewer:
    """TokenReview (authentication.k8s.io/v1) through the adapter's ApiClient (RBAC: system:auth-delegator)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        timeout_seconds: float = _REVIEW_TIMEOUT_SECONDS,
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
        status = await _create_review(self._api.create_token_review, body, timeout=self._timeout)
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


class KubeAccessReviewer:
    """SubjectAccessReview (authorization.k8s.io/v1) through the adapter's ApiClient."""

    def __init__(self, api_client: client.ApiClient, *, timeout_seconds: float = _REVIEW_TIMEOUT_SECONDS) -> None:
        self._api = client.AuthorizationV1Api(api_client)
        self._timeout = timeout_seconds

    async def review(self, user: UserInfo, attributes: RequestAttributes) -> AccessDecision:
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": review_spec(user, attributes),
        }
        status = await _create_review(self._api.create_subject_access_review, body, timeout=self._timeout)
        if status.get("evaluationError"):
            log.debug("SubjectAccessReview evaluation error: %s", status["evaluationError"])
        return AccessDecision(bool(status.get("allowed")), str(status.get("reason") or ""))


# --- HTTP -----------------------------------------------------------------------------------------------------

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
        review_timeout_seconds: float = _REVIEW_TIMEOUT_SECONDS,
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
