"""Credential files a connection names — bearer tokens, CA bundles, client certificates and keys — read within
files.py's limits (issue 32 item 4).

A flag such as ``--prometheus-token-file`` or a kubeconfig's ``certificate-authority`` can name a FIFO, ``/dev/zero``,
a directory or a 100 MB file. Read with ``open(path).read()`` (or by OpenSSL's ``load_verify_locations``) that hangs
or takes gigabytes. Here each is read once, bounded, and refused with one line naming the file and the flag (or
the kubeconfig entry) that named it: ``<file>: <flag>: <reason>``.
"""

from __future__ import annotations

import re
import ssl

from gpuscale.errors import ConfigError
from gpuscale.files import PEM_LIMIT_BYTES, TOKEN_LIMIT_BYTES, decode_utf8, named_by, read_bytes

__all__ = ["read_pem", "read_token", "verifying_context"]


_TOKEN68 = re.compile(r"[A-Za-z0-9._~+/-]+=*")  # RFC 6750 b64token


def read_token(path: str, *, flag: str) -> str:
    """The bearer token in ``path`` without surrounding whitespace (client-go trims it too), at most
    TOKEN_LIMIT_BYTES of UTF-8."""
    with named_by(flag):
        token = decode_utf8(read_bytes(path, limit_bytes=TOKEN_LIMIT_BYTES, what="bearer token"), path=path).strip()
        # NB: the token becomes an Authorization header: a newline inside would make the HTTP client raise for
        # every request, a non-ASCII one be sent as bytes the server cannot match, an empty one send none at all
        if not token:
            raise ConfigError("the bearer token file is empty", path=path)
        if not _TOKEN68.fullmatch(token):
            raise ConfigError(
                "not a bearer token: only letters, digits and - . _ ~ + / (then '=') may appear, "
                "no spaces, control or non-ASCII characters",
                path=path,
            )
        return token


def read_pem(path: str, *, flag: str, what: str) -> bytes:
    """The PEM text in ``path`` (``what``: "CA bundle", "client certificate"…), at most PEM_LIMIT_BYTES; not parsed
    here."""
    with named_by(flag):
        return read_bytes(path, limit_bytes=PEM_LIMIT_BYTES, what=what)


def verifying_context(ca_file: str | None, *, flag: str) -> ssl.SSLContext:
    """A client context trusting the certificates of ``ca_file`` (bounded read), else the system's."""
    if ca_file is None:
        return ssl.create_default_context()
    with named_by(flag):
        text = decode_utf8(read_bytes(ca_file, limit_bytes=PEM_LIMIT_BYTES, what="CA bundle"), path=ca_file)
        if not text.strip():  # NB: ssl takes empty cadata as "add nothing": the system's CAs would be trusted instead
            raise ConfigError("the CA bundle is empty", path=ca_file)
        try:
            return ssl.create_default_context(cadata=text)
        except ssl.SSLError as e:
            raise ConfigError(f"not a PEM certificate bundle ({e.reason or e})", path=ca_file) from None
