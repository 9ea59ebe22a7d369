"""TLS for the adapter: the serving certificate, client-certificate trust that can be rotated, chain checks.

An aggregated API server is reached over HTTPS by kube-aggregator, which presents the front-proxy client
certificate (signed by the requestheader CA); other clients may present certificates signed by the cluster's
client CA. Both CA bundles come from ``kube-system/extension-apiserver-authentication`` and rotate, so trust must
change without a restart. Three pieces:

* **Serving certificate** — ``--tls-cert-file``/``--tls-private-key-file``, or ``ensure_self_signed_cert``: a
  self-signed CA and a serving certificate for ``localhost``, ``127.0.0.1`` and the pod's hostname (1 year), kept
  in ``--cert-dir`` as ``apiserver.crt`` (serving certificate + its CA, the chain), ``apiserver.key`` and
  ``apiserver-ca.crt`` (what a client or an APIService ``caBundle`` trusts). Reused while present and valid, the
  way k8s.io/apiserver's ``MaybeDefaultWithSelfSignedCerts`` does.

* **``ServerTLS``** — the ``ssl.SSLContext`` handed to aiohttp. Client certificates are requested but optional
  (``CERT_OPTIONAL``) and verified during the handshake against the union of the two CA bundles. The serving
  certificate is re-read when its files change (``reload_serving_cert``, every ``--tls-reload-interval``), so a
  renewal needs no restart.

  Rotation design: Python cannot remove a CA from a live ``SSLContext`` (``load_verify_locations`` only adds), so
  ``set_client_cas`` builds a *new* context and the context given to aiohttp switches every new connection to it
  from its SNI callback (``ssl_object.context = current``; OpenSSL's ``SSL_set_SSL_CTX``, which also moves the
  verification store). The SNI callback runs on every ClientHello, with or without a server name. A CA that
  was removed stops passing handshakes at once, and nothing has to restart the listener.

  NB: OpenSSL fails the handshake when a presented certificate chains to neither bundle (Python exposes no verify
  callback that would let it through); kube-apiserver, with Go's ``RequestClientCert``, lets it through and
  ignores the certificate. The outcome is the same — such a certificate never authenticates anyone — but the
  client sees a TLS alert instead of a 401.

* **``CABundle.verify``** — the handshake is only the first gate. Which bundle a certificate chains to decides
  *what it may do* (the requestheader CA may assert any user in headers; the client CA only its own CN), a
  keep-alive connection outlives a rotation, and a resumed TLS session is not re-verified. So every request's
  peer chain (``peer_certificates``) is checked again against the *current* bundle it claims, as the Go x509
  authenticator does per request: leaf validity now, ``clientAuth`` usage, and a signature path through the
  presented intermediates to a certificate of the bundle. Results are memoised per bundle (the validity window
  is re-checked on every hit), so a request pays a dictionary lookup.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuscale.errors import ConfigError, GpuscaleError
from gpuscale.files import PEM_LIMIT_BYTES, named_by, read_bytes

__all__ = [
    "CABundle",
    "CertificateRejected",
    "ServerTLS",
    "ServingCertFiles",
    "client_ssl_context",
    "default_hosts",
    "ensure_self_signed_cert",
    "peer_certificates",
    "serving_cert_files",
]

log = logging.getLogger(__name__)

PAIR_NAME = "apiserver"
SELF_SIGNED_DAYS = 365
# A self-signed certificate this close to expiry is replaced at start rather than reused.
RENEW_BEFORE = dt.timedelta(days=1)
_MAX_CHAIN_DEPTH = 8
_VERIFY_CACHE_ENTRIES = 1024


class CertificateRejected(GpuscaleError):
    """A client certificate does not chain to the bundle, is outside its validity, or is not for client auth."""


# --- the serving certificate ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServingCertFiles:
    """Where the serving certificate chain and key are; ``ca_file`` is set when gpuscale generated them."""

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None


def default_hosts() -> list[str]:
    """``localhost``, ``127.0.0.1`` and this host's name (a pod's hostname is its name)."""
    hosts = ["localhost", "127.0.0.1"]
    name = socket.gethostname()
    if name and name not in hosts:
        hosts.append(name)
    return hosts


def serving_cert_files(
    *,
    cert_file: str | os.PathLike[str] | None,
    key_file: str | os.PathLike[str] | None,
    cert_dir: str | os.PathLike[str],
    hosts: Iterable[str] | None = None,
) -> ServingCertFiles:
    """The given certificate and key (both or neither), else a self-signed pair kept in ``cert_dir``."""
    if bool(cert_file) != bool(key_file):
        raise ConfigError("--tls-cert-file and --tls-private-key-file must be given together")
    if cert_file and key_file:
        for flag, path, what in (
            ("--tls-cert-file", cert_file, "certificate"),
            ("--tls-private-key-file", key_file, "private key"),
        ):
            with named_by(flag):
                read_bytes(path, limit_bytes=PEM_LIMIT_BYTES, what=what)  # NB: a FIFO here would block OpenSSL
        return ServingCertFiles(Path(cert_file), Path(key_file))
    return ensure_self_signed_cert(cert_dir, hosts=hosts)


def ensure_self_signed_cert(
    cert_dir: str | os.PathLike[str],
    *,
    hosts: Iterable[str] | None = None,
    valid_days: int = SELF_SIGNED_DAYS,
    now: dt.datetime | None = None,
) -> ServingCertFiles:
    """Reuse ``<cert_dir>/apiserver.{crt,key}`` when valid for ``hosts`` now, else generate a new CA and pair.

    Valid means: both files parse, the key is the certificate's, the certificate is inside its validity and not
    within a day of its end, and its subjectAltNames cover every host. Files are written atomically; the key 0600.
    """
    hosts = list(dict.fromkeys(hosts if hosts is not None else default_hosts()))
    now = now or dt.datetime.now(dt.UTC)
    directory = Path(cert_dir)
    files = ServingCertFiles(
        directory / f"{PAIR_NAME}.crt", directory / f"{PAIR_NAME}.key", directory / f"{PAIR_NAME}-ca.crt"
    )
    problem = _reuse_problem(files, hosts, now)
    if problem is None:
        log.info("reusing the self-signed serving certificate in %s", directory)
        return files
    log.info("generating a self-signed serving certificate in %s (%s)", directory, problem)
    ca_pem, cert_pem, key_pem = _self_signed(hosts, now=now, valid_days=valid_days)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _write_atomically(files.key_file, key_pem, mode=0o600)
        _write_atomically(files.cert_file, cert_pem + ca_pem, mode=0o644)
        assert files.ca_file is not None
        _write_atomically(files.ca_file, ca_pem, mode=0o644)
    except OSError as e:
        raise ConfigError(f"--cert-dir {directory}: cannot write the self-signed certificate: {e}") from e
    return files


def _reuse_problem(files: ServingCertFiles, hosts: list[str], now: dt.datetime) -> str | None:
    """Why the files in the cert dir cannot be reused (None = they can)."""
    if not (files.cert_file.exists() or files.key_file.exists()):
        return "none present"
    try:
        chain = x509.load_pem_x509_certificates(read_bytes(files.cert_file, limit_bytes=PEM_LIMIT_BYTES))
        key = serialization.load_pem_private_key(read_bytes(files.key_file, limit_bytes=PEM_LIMIT_BYTES), None)
    except (ConfigError, ValueError, TypeError) as e:
        return f"unreadable: {e}"
    leaf = chain[0]
    if key.public_key().public_bytes(*_SPKI) != leaf.public_key().public_bytes(*_SPKI):
        return "the key does not belong to the certificate"
    if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc - RENEW_BEFORE:
        return f"valid {leaf.not_valid_before_utc:%Y-%m-%d} to {leaf.not_valid_after_utc:%Y-%m-%d}"
    missing = set(hosts) - _san_names(leaf)
    if missing:
        return f"not valid for {', '.join(sorted(missing))}"
    return None


_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _san_names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}


def _self_signed(hosts: list[str], *, now: dt.datetime, valid_days: int) -> tuple[bytes, bytes, bytes]:
    """A CA and a serving certificate it signed (k8s.io/client-go ``GenerateSelfSignedCertKey``'s shape)."""
    stamp = int(now.timestamp())
    first = next((h for h in hosts if not _is_ip(h) and h != "localhost"), hosts[0] if hosts else "localhost")
    begin, end = now - dt.timedelta(hours=1), now + dt.timedelta(days=valid_days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{first}-ca@{stamp}")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address(h)) if _is_ip(h) else x509.DNSName(h) for h in hosts
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{first}@{stamp}")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pem = serialization.Encoding.PEM
    return ca.public_bytes(pem), cert.public_bytes(pem), key_pem


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not cert_sign,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- the server context -----------------------------------------------------------------------------


class ServerTLS:
    """The adapter's server-side TLS; ``context`` goes to ``web.TCPSite(..., ssl_context=...)``.

    ``client_ca_pem`` is every CA a client certificate may chain to (requestheader CA + client CA, concatenated
    PEM; empty = none). ``set_client_cas`` replaces it for every later handshake; see the module docstring.
    Errors in the certificate or key raise ConfigError naming the files.
    """

    def __init__(
        self,
        cert_file: str | os.PathLike[str],
        key_file: str | os.PathLike[str],
        *,
        client_ca_pem: str = "",
    ) -> None:
        self._cert_file = os.fspath(cert_file)
        self._key_file = os.fspath(key_file)
        self._client_ca_pem = client_ca_pem
        # NB: the files' fingerprint before loading them: a change in between is then seen by the next reload.
        self._fingerprint = self._files_fingerprint()
        self._refused: str | None = None  # the last pair that did not load, so that it is logged once
        self._current = self._build(client_ca_pem)
        self.context: ssl.SSLContext = self._current
        """The context aiohttp serves with; it stays the same object, its SNI callback picks the current one."""

    @property
    def client_ca_pem(self) -> str:
        return self._client_ca_pem

    def set_client_cas(self, pem: str) -> None:
        """Trust exactly these CAs for client certificates from the next handshake on (ConfigError if invalid)."""
        if pem == self._client_ca_pem:
            return
        self._current = self._build(pem)
        self._client_ca_pem = pem

    def reload_serving_cert(self) -> bool:
        """Serve the certificate and key files' current contents from the next handshake on, if they changed.

        For renewals (cert-manager rewriting a mounted Secret, a rotated ``--tls-cert-file``): the same SNI
        switch as a client-CA rotation, so open connections keep their session and new ones get the new
        certificate. A pair that does not load — a key written before its certificate, a half-written file —
        is logged once and the previous pair keeps serving; the next call tries again. Returns whether the
        certificate was switched.
        """
        try:
            fingerprint = self._files_fingerprint()
        except ConfigError as e:  # NB: e.g. rotated into a FIFO or 100 MB: the running pair keeps serving
            self._refuse(str(e), f"unreadable: {e}")
            return False
        if fingerprint == self._fingerprint:
            return False
        try:
            context = self._build(self._client_ca_pem)
        except ConfigError as e:
            self._refuse(fingerprint, str(e))
            return False
        self._current, self._fingerprint, self._refused = context, fingerprint, None
        log.info("serving certificate reloaded from %s", self._cert_file)
        return True

    def _refuse(self, what: str, reason: str) -> None:
        if what != self._refused:
            log.warning("keeping the previous serving certificate: %s", reason)
            self._refused = what

    def _files_fingerprint(self) -> str:
        """A digest of both files, read within files.py's limits (ConfigError naming the file otherwise).

        NB: the check that they are regular files of at most PEM_LIMIT_BYTES, before OpenSSL's load_cert_chain
        opens them by name (it would block on a FIFO and read /dev/zero until memory ran out)."""
        digest = hashlib.sha256()
        for path, what in ((self._cert_file, "serving certificate"), (self._key_file, "serving key")):
            digest.update(read_bytes(path, limit_bytes=PEM_LIMIT_BYTES, what=what))
            digest.update(b"\0")
        return digest.hexdigest()

    def _build(self, ca_pem: str) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_RENEGOTIATION  # as Go's servers: one client certificate per connection
        try:
            context.load_cert_chain(self._cert_file, self._key_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(
                f"cannot load the serving certificate {self._cert_file} / key {self._key_file}: {e}"
            ) from e
        # NB: optional, not required: probes, and bearer-token clients such as kubectl, present no certificate.
        context.verify_mode = ssl.CERT_OPTIONAL
        if ca_pem.strip():
            try:
                context.load_verify_locations(cadata=ca_pem)
            except ssl.SSLError as e:
                raise ConfigError(f"client CA bundle is not valid PEM: {e}") from e
        context.sni_callback = self._select
        return context

    def _select(self, ssl_object: ssl.SSLObject, server_name: str | None, context: ssl.SSLContext) -> None:
        current = self._current
        if context is not current:
            ssl_object.context = current


def client_ssl_context(
    *,
    ca_file: str | os.PathLike[str] | None = None,
    ca_pem: str | None = None,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A client context that trusts ``ca_file``/``ca_pem`` (default: the system's) and presents ``cert_file``."""
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=os.fspath(ca_file) if ca_file else None, cadata=ca_pem
    )
    if cert_file:
        context.load_cert_chain(os.fspath(cert_file), os.fspath(key_file) if key_file else None)
    return context


# --- client certificate chains ----------------------------------------------------------------------


def peer_certificates(ssl_object: ssl.SSLObject | None) -> tuple[bytes, ...]:
    """The client's certificate chain as presented (DER, leaf first); () without TLS or a client certificate.

    NB: Python 3.13 made ``get_unverified_chain`` public; 3.10-3.12 have it on the private ``_sslobj``, where it
    lists the leaf first (or None when there is none). Without it, only the leaf is known, which suffices for
    certificates issued directly by a CA of the bundle (kube's front-proxy-client is).
    """
    if ssl_object is None:
        return ()
    leaf = ssl_object.getpeercert(binary_form=True)
    if not leaf:
        return ()
    getter = getattr(ssl_object, "get_unverified_chain", None) or getattr(
        getattr(ssl_object, "_sslobj", None), "get_unverified_chain", None
    )
    chain = [leaf]
    for cert in (getter() if getter else None) or []:
        if cert is None:
            continue
        der = cert if isinstance(cert, bytes) else cert.public_bytes(ssl._ssl.ENCODING_DER)  # type: ignore[attr-defined]
        if der not in chain:
            chain.append(der)
    return tuple(chain)


@dataclass(frozen=True, slots=True)
class _Verified:
    leaf: x509.Certificate
    not_before: dt.datetime
    not_after: dt.datetime


@dataclass(frozen=True)
class CABundle:
    """A set of trusted CA certificates, parsed once. Two bundles are equal when they hold the same certificates.

    ``verify`` checks a presented chain against this bundle alone (see the module docstring); results are memoised
    per chain, and the path's validity window is checked against ``now`` on every call.
    """

    pem: str = field(default="", compare=False)
    certificates: tuple[x509.Certificate, ...] = field(default=(), compare=False, repr=False)
    fingerprint: str = ""
    _cache: OrderedDict[tuple[bytes, ...], _Verified | str] = field(
        default_factory=OrderedDict, compare=False, repr=False
    )

    @classmethod
    def parse(cls, pem: str | bytes, *, source: str) -> CABundle:
        """Parse PEM certificates; ConfigError naming ``source`` when it holds anything else or none at all."""
        try:
            text = pem.decode() if isinstance(pem, bytes) else pem
        except UnicodeDecodeError as e:
            raise ConfigError(f"{source}: not a PEM certificate bundle (not UTF-8 text: {e.reason})") from None
        if not text.strip():
            return cls()
        try:
            certificates = tuple(x509.load_pem_x509_certificates(text.encode()))
        except ValueError as e:
            raise ConfigError(f"{source}: not a PEM certificate bundle: {e}") from e
        digest = hashlib.sha256()
        for cert in certificates:
            digest.update(cert.public_bytes(serialization.Encoding.DER))
        return cls(text, certificates, digest.hexdigest())

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, flag: str) -> CABundle:
        """The bundle in ``path``, read within files.py's limits; ConfigError naming the flag and the file."""
        with named_by(flag):
            pem = read_bytes(path, limit_bytes=PEM_LIMIT_BYTES, what="CA bundle")
        return cls.parse(pem, source=f"{flag} {os.fspath(path)}")

    @property
    def empty(self) -> bool:
        return not self.certificates

    def verify(self, chain: Sequence[bytes], *, now: dt.datetime | None = None) -> x509.Certificate:
        """The leaf of ``chain`` (DER, leaf first) if it chains to this bundle now; CertificateRejected otherwise."""
        if not chain:
            raise CertificateRejected("no client certificate")
        key = tuple(chain)
        result = self._cache.get(key)
        if result is None:
            result = self._verify(chain)
            self._cache[key] = result
            while len(self._cache) > _VERIFY_CACHE_ENTRIES:
                self._cache.popitem(last=False)
        if isinstance(result, str):
            raise CertificateRejected(result)
        now = now or dt.datetime.now(dt.UTC)
        if not result.not_before <= now <= result.not_after:
            raise CertificateRejected(f"certificate chain valid {result.not_before} to {result.not_after}, not now")
        return result.leaf

    def _verify(self, chain: Sequence[bytes]) -> _Verified | str:
        """The structural part of verification (signatures, CA flags, usage); a reason string when it fails."""
        if self.empty:
            return "no CA configured"
        try:
            leaf = x509.load_der_x509_certificate(chain[0])
            intermediates = [x509.load_der_x509_certificate(der) for der in chain[1:]]
        except ValueError as e:
            return f"unparseable certificate: {e}"
        if not _for_client_auth(leaf):
            return "certificate is not for client authentication (extendedKeyUsage)"
        window = self._path(leaf, intermediates, depth=0)
        if window is None:
            return f"certificate {leaf.subject.rfc4514_string()!r} is not signed by a trusted CA"
        return _Verified(leaf, *window)

    def _path(
        self, cert: x509.Certificate, intermediates: list[x509.Certificate], *, depth: int
    ) -> tuple[dt.datetime, dt.datetime] | None:
        """The validity window of a signature path from ``cert`` to a bundle certificate (None = no path)."""
        own = (cert.not_valid_before_utc, cert.not_valid_after_utc)
        for anchor in self.certificates:
            if cert == anchor:
                return own
            if _issued_by(cert, anchor):
                return max(own[0], anchor.not_valid_before_utc), min(own[1], anchor.not_valid_after_utc)
        if depth >= _MAX_CHAIN_DEPTH:
            return None
        for parent in intermediates:
            if parent is not cert and _issued_by(cert, parent):
                rest = self._path(parent, [i for i in intermediates if i is not parent], depth=depth + 1)
                if rest is not None:
                    return max(own[0], rest[0]), min(own[1], rest[1])
        return None


def _issued_by(cert: x509.Certificate, parent: x509.Certificate) -> bool:
    if cert.issuer != parent.subject:
        return False
    try:
        constraints = parent.extensions.get_extension_for_class(x509.BasicConstraints).value
        if not constraints.ca:
            return False
    except x509.ExtensionNotFound:
        pass  # NB: a v1 CA certificate has no extensions; Go and OpenSSL accept it as an anchor too
    try:
        cert.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _for_client_auth(cert: x509.Certificate) -> bool:
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True
    return ExtendedKeyUsageOID.CLIENT_AUTH in usages or ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usages
