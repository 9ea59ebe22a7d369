"""Reading a file someone else wrote, within stated limits: every file a command or a server reads comes here.

A file named on a command line or mounted from a ConfigMap or Secret can be anything: a FIFO nobody writes to,
``/dev/zero``, a directory, 100 MB of YAML, a gzip bomb. Reading it must end quickly with one line naming the
file, never hang or exhaust memory (issue 32). The rules, the same for every file:

- Only a regular file is read. NB: the file is opened non-blocking and checked on its descriptor (fstat), so
  a FIFO cannot block the open and the check is on the file actually read, not on a name swapped in between.
- At most ``limit_bytes`` are read (a larger file is refused with its size and the limit); a gzip file (by
  its magic bytes, when the caller accepts gzip) is decompressed as a stream and refused as soon as what it
  holds passes the limit, so a 10 KB file that inflates to 10 GB costs ``limit_bytes`` at most.
- Text is UTF-8, with or without a byte-order mark (spreadsheets write one); a bad byte is refused naming its
  line.

The limits, by kind of file (generous for real files: the shipped policies are < 10 KiB, a kubeconfig with a
hundred clusters < 1 MiB, the longest trace docs/simulate.md measures ~100 MiB):
"""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import zlib
from collections.abc import Iterator
from importlib.abc import Traversable
from typing import BinaryIO

from gpuscale.errors import ConfigError

MiB = 1024 * 1024
CONFIG_LIMIT_BYTES = 4 * MiB
"""Policies, ``--config`` catalogues, HPA manifests, kubeconfigs."""
PEM_LIMIT_BYTES = 4 * MiB
"""CA bundles, certificates and keys (the Mozilla CA bundle is ~0.2 MiB)."""
TOKEN_LIMIT_BYTES = 64 * 1024
"""Bearer tokens (a service-account JWT is ~1 KiB)."""
DATA_LIMIT_BYTES = 256 * MiB
"""Traces, metric histories, ``@file`` samples and ``--external`` series, once decompressed."""

_GZIP_MAGIC = b"\x1f\x8b"

FilePath = str | os.PathLike[str] | Traversable


def read_bytes(path: FilePath, *, limit_bytes: int, what: str = "file", gunzip: bool = False) -> bytes:
    """The bytes of the regular file ``path`` (decompressed when ``gunzip`` and it is gzip), at most
    ``limit_bytes`` of them; ConfigError naming the file and ``what`` it was read as otherwise."""
    if not isinstance(path, str | os.PathLike):
        return _read_packaged(path, limit_bytes=limit_bytes, what=what)
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror or e}", path=name) from None
    try:
        _check_regular(os.fstat(fd), limit_bytes=limit_bytes, what=what, name=name)
    except ConfigError:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        try:
            head = f.peek(2)[:2]
            if gunzip and head == _GZIP_MAGIC:
                return _gunzip(f, limit_bytes=limit_bytes, what=what, name=name)
            data = f.read(limit_bytes + 1)  # NB: one byte more tells "exactly the limit" from "larger"
        except OSError as e:
            raise ConfigError(f"cannot read {what}: {e.strerror or e}", path=name) from None
    if len(data) > limit_bytes:
        raise ConfigError(f"{what} larger than the {_size(limit_bytes)} limit", path=name)
    return data


@contextlib.contextmanager
def named_by(flag: str) -> Iterator[None]:
    """A ConfigError raised inside says which flag (or entry) named the file: ``<file>: <flag>: <reason>``."""
    try:
        yield
    except ConfigError as e:
        raise ConfigError(f"{flag}: {str(e).removeprefix(f'{e.path}: ')}", path=e.path) from None


def _check_regular(info: os.stat_result, *, limit_bytes: int, what: str, name: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"cannot read {what}: {_kind(info.st_mode)}, not a regular file", path=name)
    if info.st_size > limit_bytes:  # NB: compressed or not, refused before a byte is read
        raise ConfigError(f"{what} larger than the {_size(limit_bytes)} limit ({_size(info.st_size)})", path=name)


def read_text(path: FilePath, *, limit_bytes: int, what: str = "file", gunzip: bool = False) -> str:
    """``read_bytes`` decoded as UTF-8 (a leading byte-order mark dropped)."""
    return decode_utf8(read_bytes(path, limit_bytes=limit_bytes, what=what, gunzip=gunzip), path=str(path))


def decode_utf8(raw: bytes, *, path: str) -> str:
    """``raw`` as UTF-8 text without its byte-order mark; ConfigError naming the line of a bad byte."""
    start = 3 if raw.startswith(b"\xef\xbb\xbf") else 0
    view = memoryview(raw)[start:]  # NB: no copy of a 256 MiB trace to drop three bytes
    try:
        return str(view, "utf-8")
    except UnicodeDecodeError as e:
        offset = start + e.start
        line = raw.count(b"\n", 0, offset) + 1
        raise ConfigError(
            f"line {line}: not UTF-8 text (byte 0x{raw[offset]:02x} at offset {offset}); save the file as UTF-8",
            path=path,
        ) from None


def _gunzip(f: BinaryIO, *, limit_bytes: int, what: str, name: str) -> bytes:
    try:
        with gzip.GzipFile(fileobj=f) as z:
            data = z.read(limit_bytes + 1)  # NB: GzipFile inflates in bounded chunks: the bomb stops here
    except (OSError, EOFError, zlib.error) as e:
        raise ConfigError(f"cannot read {what}: not valid gzip ({e})", path=name) from None
    if len(data) > limit_bytes:
        raise ConfigError(f"{what} holds more than the {_size(limit_bytes)} limit once decompressed", path=name)
    return data


def _read_packaged(path: Traversable, *, limit_bytes: int, what: str) -> bytes:
    """A file shipped inside the package (a zip import): ours, so read whole, but held to the same limit."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror or e}", path=str(path)) from None
    if len(data) > limit_bytes:
        raise ConfigError(f"{what} larger than the {_size(limit_bytes)} limit", path=str(path))
    return data


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // 1024} KiB"
