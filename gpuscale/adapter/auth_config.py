"""Where trust comes from: the client CA and the front-proxy (requestheader) settings in force.

``--client-ca-file`` and ``--requestheader-*`` flags when given, otherwise the ConfigMap
``kube-system/extension-apiserver-authentication`` that kube-apiserver publishes, list+watched (relist on 410 Gone,
back off on errors) so CA rotations apply without a restart. As in k8s.io/apiserver, the client CA and the
requestheader settings are each taken from the flags *or* the ConfigMap: without ``--requestheader-client-ca-file``
every requestheader setting (CA, allowed names, header names) comes from the ConfigMap.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes_asyncio import client
from multidict import MultiMapping

from gpuscale.adapter.access_request import UserInfo
from gpuscale.adapter.delegation import SOURCE
from gpuscale.adapter.tls import CABundle, CertificateRejected
from gpuscale.errors import ConfigError, GpuscaleError, SourceUnavailable
from gpuscale.settings import AuthenticationFlags  # NB: the settings group, handed whole by cli/adapter.py
from gpuscale.sources.configmaps import ConfigMapWatch

__all__ = [
    "CONFIGMAP_NAME",
    "CONFIGMAP_NAMESPACE",
    "AuthenticationConfig",
    "AuthenticationConfigWatcher",
    "AuthenticationFlags",
    "RequestHeaderConfig",
    "certificate_common_name",
    "config_from_configmap",
    "flag_parts",
]

log = logging.getLogger(__name__)

CONFIGMAP_NAMESPACE = "kube-system"
CONFIGMAP_NAME = "extension-apiserver-authentication"
DEFAULT_USERNAME_HEADERS = ("X-Remote-User",)
DEFAULT_GROUP_HEADERS = ("X-Remote-Group",)
DEFAULT_EXTRA_HEADERS_PREFIXES = ("X-Remote-Extra-",)


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
        common_name = certificate_common_name(leaf)
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
    the one every cache shares (``sources.configmaps.ConfigMapWatch`` on ``reflector.Reflector``).
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


def _first_value(headers: MultiMapping[str], names: Iterable[str]) -> str:
    for name in names:
        value = headers.get(name, "")
        if value:
            return value
    return ""


def certificate_common_name(cert: x509.Certificate) -> str:
    values = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(values[0].value) if values else ""
