"""One client for a Prometheus-compatible HTTP API (Prometheus, VictoriaMetrics, Thanos Query, Mimir), used by every
command that reads one: the adapter's and controller's and top's refreshes (``sources/prometheus.py``), the report's
history (``sources/history_fetch.py``, ``sources/summary_fetch.py``) and simulate's metric history.

One connection, one client (ENGINEERING.md §3.11, prometheus-adapter's ``makePromClient``): a command's
``PrometheusConnection`` settings group (``--prometheus-url``, ``--prometheus-token-file``, ``--prometheus-ca-file``,
``--prometheus-client-cert``/``--prometheus-client-key``, ``--prometheus-insecure-skip-verify``,
``--prometheus-timeout``) becomes a ``PrometheusClient`` through ``PrometheusClient.connect``, so every command gets
the same TLS, authentication and deadline per call (each command's own default; one reading on a cycle bounds it by
the cycle: ``within``). The command adds its other limits: a body cap (``max_body_bytes``, refused while it streams
in, never decoded: sources/bounded.py) and ``retries`` with doubling backoff.

Credential files rotate (Kubernetes swaps projected tokens and mounted certificates through a ``..data`` symlink):
each is stat'ed before every request and read again when it changed, within files.py's limits; one that cannot be
used raises ``CredentialFileError`` naming it. ``connect`` reads them all once first, so a bad file given on the
command line fails the start (ConfigError, one line) rather than the first refresh.

Two ways to call: ``call`` (and ``query``/``query_range``/``label_values`` on it) decodes JSON, retries timeouts,
refused connections and HTTP 429/5xx, and raises ``SourceUnavailable`` with the server's words; ``post`` returns the
raw bounded body for a caller that decodes elsewhere (the refresh's decoder process) and keeps its own deadline.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from gpuscale.backoff import Backoff
from gpuscale.errors import ConfigError, SourceUnavailable, one_line
from gpuscale.settings import PrometheusConnection
from gpuscale.sources.bounded import read_bounded, read_bounded_parts, size_text
from gpuscale.sources.credentials import read_pem, read_token, verifying_context
from gpuscale.sources.prom_answer import answer_warnings

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_TIMEOUT_SECONDS",
    "CredentialFileError",
    "PrometheusClient",
    "TooManySamples",
    "check_credentials",
]

# NB: at 100,000 GPUs the largest answer (one DCGM field) is ~35 MB; decoding 64 MiB takes ~1 GB for a moment.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 5.0
_TOO_LARGE = re.compile(
    r"too many|exceeded maximum resolution|max-samples|maxSamples|cannot select more than|"
    r"search\.max|more than .* (points|series|samples)|query processing would load",
    re.IGNORECASE,
)
_RETRY_STATUS = {429, 500, 502, 503, 504}


def _server_words(text: str) -> str:
    """A server's error in one line of at most 300 characters. VictoriaMetrics quotes the whole query before its
    reason (``error when executing query="…" on the time range …: reason``): the reason, at the end, is kept."""
    words = one_line(text, 100_000)
    if len(words) <= 300:
        return words
    return words[:100] + " … " + words[-197:]


RETRY_MAX_SECONDS = 30.0
"""The longest wait between two attempts of one call."""
WARNINGS_KEPT = 100
"""The most server warnings one client keeps over its calls."""


class CredentialFileError(Exception):
    """A credential file (token, CA, client certificate) cannot be used; ``str()`` says which and why."""


class TooManySamples(Exception):
    """The server refused a query for its size (Prometheus' ``query.max-samples``, VictoriaMetrics' ``-search.max*``):
    the caller asks again for less. ``str()`` is the server's words."""


def check_credentials(connection: PrometheusConnection) -> None:
    """Each credential file ``connection`` names is a regular, readable file within its limit (and the CA file a
    certificate bundle); ConfigError naming the file and the flag otherwise. A command calls this before it connects
    or listens anywhere."""
    if connection.token_file is not None:
        read_token(connection.token_file, flag="--prometheus-token-file")
    if connection.ca_file is not None:
        verifying_context(connection.ca_file, flag="--prometheus-ca-file")
    for flag, path, what in (
        ("--prometheus-client-cert", connection.client_cert, "client certificate"),
        ("--prometheus-client-key", connection.client_key, "client key"),
    ):
        if path is not None:
            read_pem(path, flag=flag, what=what)


# --- files that rotate ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Watched:
    """A file read again whenever it changes (Kubernetes rotates projected tokens and mounted certs)."""

    what: str  # "CA file", "bearer token file", … for error messages
    path: str
    stamp: tuple[int, int, int] | None = None

    def changed(self) -> bool:
        try:
            st = os.stat(self.path)  # NB: follows the ..data symlink Kubernetes swaps atomically
        except OSError as e:
            self.stamp = None
            raise CredentialFileError(f"{self.what} {self.path}: {e.strerror or e}") from e
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self.stamp:
            return False
        self.stamp = stamp
        return True


class _BearerToken:
    def __init__(self, token: str | None, path: str | None) -> None:
        self._token = token
        self._file = _Watched("bearer token file", path) if path is not None else None

    def current(self) -> str | None:
        if self._file is None:
            return self._token
        if self._file.changed() or self._token is None:
            try:
                # NB: bounded like every file we read: a token rotated into a FIFO or 100 MB fails this read only
                self._token = read_token(self._file.path, flag="--prometheus-token-file")
            except ConfigError as e:
                self._file.stamp = None  # NB: try again next refresh
                raise CredentialFileError(str(e)) from e
        return self._token


class _TlsContext:
    """The client's SSLContext, rebuilt when the CA, certificate or key file changes."""

    def __init__(
        self, *, ca_file: str | None, client_cert: str | None, client_key: str | None, insecure_skip_verify: bool
    ) -> None:
        self._ca_file = ca_file
        self._cert = client_cert
        self._key = client_key
        self._insecure = insecure_skip_verify
        named = (("CA file", ca_file), ("client certificate", client_cert), ("client key", client_key))
        self._files = [_Watched(what, path) for what, path in named if path]
        self._context: ssl.SSLContext | None = None

    def current(self) -> ssl.SSLContext:
        changed = [f.changed() for f in self._files]  # NB: stat every file, so every stamp stays current
        if self._context is None or any(changed):
            try:
                self._context = self._build()
            except CredentialFileError:
                for f in self._files:
                    f.stamp = None  # NB: never keep serving an old context silently; retry next refresh
                raise
        return self._context

    def _build(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if self._ca_file:
            try:
                context = verifying_context(self._ca_file, flag="--prometheus-ca-file")
            except ConfigError as e:
                raise CredentialFileError(str(e)) from e
        if self._cert:
            try:
                # NB: read within limits first (a FIFO would block OpenSSL's own open, /dev/zero never end)
                read_pem(self._cert, flag="--prometheus-client-cert", what="client certificate")
                if self._key:
                    read_pem(self._key, flag="--prometheus-client-key", what="client key")
                context.load_cert_chain(self._cert, self._key)
            except ConfigError as e:
                raise CredentialFileError(str(e)) from e
            except (OSError, ssl.SSLError) as e:
                raise CredentialFileError(
                    f"client certificate {self._cert} (key {self._key or 'in the same file'}): {e}"
                ) from e
        if self._insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


# --- the client -----------------------------------------------------------------------------------------


class PrometheusClient:
    """The Prometheus HTTP API calls gpuscale makes, over one session, with the connection's credentials.

    ``bearer_token`` or ``bearer_token_file`` (read again whenever it changes) authenticate, or ``user:password``
    in the URL; ``ca_file`` verifies the server, ``client_cert``/``client_key`` authenticate with a certificate
    (re-read when they change); ``insecure_skip_verify`` is for development only. ``headers`` are sent with every
    request. ``timeout_seconds`` bounds one ``call`` attempt, body included; ``max_body_bytes`` bounds each answer
    (``max_body_flag`` names the setting and ``too_large_hint`` says what to do in the refusal). ``retries`` and
    ``backoff_seconds`` (doubling) apply to ``call``. ``session``: a caller's session, left open by ``close``;
    without one the client opens its own on first use, on the loop that uses it.
    Unreadable credential files raise ConfigError here, so a bad flag fails at start.
    """

    def __init__(
        self,
        url: str,
        *,
        bearer_token: str | None = None,
        bearer_token_file: str | Path | None = None,
        ca_file: str | Path | None = None,
        client_cert: str | Path | None = None,
        client_key: str | Path | None = None,
        insecure_skip_verify: bool = False,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_body_flag: str | None = None,
        too_large_hint: str = "",
        retries: int = 0,
        backoff_seconds: float = 1.0,
        session: aiohttp.ClientSession | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"Prometheus URL {url!r} is not an http(s) URL")
        if bearer_token is not None and bearer_token_file is not None:
            raise ConfigError("give a Prometheus bearer token or a token file, not both")
        if "@" in parts.netloc and (bearer_token is not None or bearer_token_file is not None):
            raise ConfigError("the Prometheus URL carries user:password; give that or a bearer token, not both")
        if client_key is not None and client_cert is None:
            raise ConfigError("a Prometheus client key needs a client certificate")
        if not (math.isfinite(timeout_seconds) and timeout_seconds > 0):
            raise ConfigError(f"Prometheus timeout must be a positive number of seconds, got {timeout_seconds!r}")
        self.url = url.rstrip("/")
        # NB: health, logs and errors show the URL without user:password.
        self.display_url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/")
        self._token = _BearerToken(bearer_token, str(bearer_token_file) if bearer_token_file is not None else None)
        self._tls: _TlsContext | None = None
        if parts.scheme == "https" or ca_file or client_cert:
            self._tls = _TlsContext(
                ca_file=str(ca_file) if ca_file else None,
                client_cert=str(client_cert) if client_cert else None,
                client_key=str(client_key) if client_key else None,
                insecure_skip_verify=insecure_skip_verify,
            )
        self._headers = dict(headers or {})
        self.timeout_seconds = float(timeout_seconds)
        self.max_body_bytes = max_body_bytes
        self._max_body_flag = max_body_flag
        self._too_large_hint = too_large_hint
        self._retries = retries
        self._backoff_seconds = backoff_seconds
        self.session = session
        self._own_session = session is None
        self._sleep = sleep
        self.queries = 0  # calls sent, retries included
        self.warnings: list[str] = []  # partial answers ``call`` accepted, one line each
        try:
            self.credentials()
        except CredentialFileError as e:
            raise ConfigError(str(e)) from e

    @classmethod
    def connect(cls, connection: PrometheusConnection, *, within: float = math.inf, **limits: Any) -> PrometheusClient:
        """The client of a command's ``--prometheus-*`` flags, its deadline ``--prometheus-timeout``, or ``within``
        seconds if that is shorter (a read never outlasts the refresh or reconcile it belongs to); ``limits``: the
        other keyword arguments after the credentials (body cap, retries, session…)."""
        if connection.url is None:
            raise ConfigError("--prometheus-url: not given")
        return cls(
            connection.url,
            bearer_token_file=connection.token_file,
            ca_file=connection.ca_file,
            client_cert=connection.client_cert,
            client_key=connection.client_key,
            insecure_skip_verify=connection.insecure_skip_verify,
            timeout_seconds=min(connection.timeout, within),
            **limits,
        )

    def limit_text(self) -> str:
        """The body cap as the user set it: ``64 MiB (--prometheus-max-response-size)``."""
        return size_text(self.max_body_bytes) + (f" ({self._max_body_flag})" if self._max_body_flag else "")

    def credentials(self) -> tuple[dict[str, str], ssl.SSLContext | bool]:
        """The headers and TLS context of the next request (files re-read if they changed); CredentialFileError."""
        token = self._token.current()
        headers = {**self._headers, **({"Authorization": f"Bearer {token}"} if token else {})}
        return headers, self._tls.current() if self._tls is not None else True

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession(headers={"User-Agent": "gpuscale", "Accept": "application/json"})
        return self.session

    async def close(self) -> None:
        if self._own_session and self.session is not None:
            await self.session.close()
        self.session = None

    # --- raw: the caller decodes and keeps the deadline ------------------------------------------------------

    async def post(
        self,
        path: str,
        form: Mapping[str, str],
        *,
        headers: Mapping[str, str],
        ssl_context: ssl.SSLContext | bool,
        too_large: Callable[[], Exception],
    ) -> tuple[list[bytes], int, str]:
        """(body as the chunks it came in, HTTP status, Content-Type) of one POST; SourceUnavailable when the server
        cannot be reached, ``too_large()`` once the body passes ``max_body_bytes``. No retries, no deadline (the
        caller's)."""
        try:
            async with self._session().post(
                self.url + path, data=dict(form), headers=dict(headers), ssl=ssl_context
            ) as resp:
                body = await read_bounded_parts(resp, limit_bytes=self.max_body_bytes, too_large=too_large)
                return body, resp.status, resp.headers.get("Content-Type", "")
        except aiohttp.ClientConnectorError as e:
            raise SourceUnavailable(self.display_url, f"cannot connect: {e.os_error or e}", kind="connection") from e
        except aiohttp.ClientError as e:
            raise SourceUnavailable(
                self.display_url, f"{type(e).__name__}: {one_line(str(e), 200)}", kind="connection"
            ) from e

    # --- decoded, with retries ------------------------------------------------------------------------------

    async def call(self, path: str, form: dict[str, str], *, method: str = "POST") -> Any:
        """The ``data`` of a successful answer. Retries timeouts, refused connections and HTTP 429/5xx with doubling
        backoff; TooManySamples for a refusal by size; SourceUnavailable otherwise, with the server's words."""
        last = ""
        # NB: capped and jittered as every other retry loop: --retries 10 doubling from 1 s would wait 17 minutes
        backoff = Backoff(initial_seconds=self._backoff_seconds, max_seconds=RETRY_MAX_SECONDS, jitter=0.2)
        for attempt in range(self._retries + 1):
            if attempt:
                await self._sleep(backoff.next_delay())
            self.queries += 1
            try:
                headers, ssl_context = self.credentials()
            except CredentialFileError as e:
                raise ConfigError(str(e)) from e
            try:
                # NB: POST form data (no URL length limit) where the API allows it; label values are GET only.
                async with self._session().request(
                    method,
                    self.url + path,
                    data=form if method == "POST" else None,
                    params=form if method == "GET" else None,
                    headers=headers,
                    ssl=ssl_context,
                    timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
                ) as resp:
                    text = await self._read_text(resp, path, form)
                    status = resp.status
            except TimeoutError:
                last = f"timed out after {self.timeout_seconds:g}s"
                continue
            except aiohttp.ClientError as e:
                last = f"{type(e).__name__}: {e}"
                continue
            try:
                body = json.loads(text)
            except ValueError:
                body = None
            error = body.get("error") if isinstance(body, dict) else None
            if status == 200 and isinstance(body, dict) and body.get("status") == "success":
                message = ""  # NB: not _server_words of the whole body: 3.7 M characters took 1.9 s of a 4 s report
            elif status == 200 and body is None:
                message = f"the answer is not JSON (cut short?): {one_line(text, 120)}"
            else:
                message = _server_words(str(error or text))
            if status in (400, 422, 503) and _TOO_LARGE.search(str(error or text)):
                raise TooManySamples(message)
            if status in _RETRY_STATUS:
                last = f"HTTP {status}: {message}"
                continue
            if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
                raise SourceUnavailable(
                    self.display_url, f"{path} {_short(form)} refused: HTTP {status}: {message}", kind="http_status"
                )
            # NB: a hostile answer's warnings are as many as fit in the body cap: a few kept per answer, and a long
            # fetch keeps at most WARNINGS_KEPT in all (the report lists them as gaps)
            for w in answer_warnings(body):
                if len(self.warnings) < WARNINGS_KEPT:
                    self.warnings.append(f"{_short(form)}: {one_line(w, 200)}")
            if body.get("isPartial") is True and len(self.warnings) < WARNINGS_KEPT:
                self.warnings.append(f"{_short(form)}: the server answered with partial data (isPartial)")
            return body.get("data")
        raise SourceUnavailable(
            self.display_url,
            f"{path} {_short(form)} failed after {self._retries + 1} attempts: {last}",
            kind="timeout" if "timed out" in last else "connection",
        )

    async def _read_text(self, resp: aiohttp.ClientResponse, path: str, form: dict[str, str]) -> str:
        """The body, read within the request's timeout; SourceUnavailable once it passes ``max_body_bytes``."""

        def too_large() -> SourceUnavailable:
            hint = f"; {self._too_large_hint}" if self._too_large_hint else ""
            return SourceUnavailable(
                self.display_url,
                f"{path} {_short(form)}: the answer is larger than {self.limit_text()}{hint}",
                kind="too_large",
            )

        body = await read_bounded(resp, limit_bytes=self.max_body_bytes, too_large=too_large)
        return body.decode(resp.get_encoding() if resp.charset else "utf-8", errors="replace")

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = await self.call(
            "/api/v1/query_range",
            {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}", "nocache": "1"},
        )
        return self._result(data, promql)

    async def query(self, promql: str, *, at: float) -> list[dict[str, Any]]:
        data = await self.call("/api/v1/query", {"query": promql, "time": f"{at:.3f}", "nocache": "1"})
        return self._result(data, promql)

    async def label_values(self, label: str, *, match: str, start: float, end: float) -> list[str]:
        data = await self.call(
            f"/api/v1/label/{label}/values",
            {"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"},
            method="GET",
        )
        if not isinstance(data, list) or not all(isinstance(v, str) for v in data):
            raise SourceUnavailable(
                self.display_url, f"label values of {label}: not a list of strings", kind="malformed"
            )
        return data

    def _result(self, data: Any, promql: str) -> list[dict[str, Any]]:
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise SourceUnavailable(
                self.display_url, f"{one_line(promql, 120)}: the answer has no result list", kind="malformed"
            )
        return data["result"]


def _short(form: Mapping[str, str]) -> str:
    return one_line(form.get("query") or form.get("match[]") or "", 160)
