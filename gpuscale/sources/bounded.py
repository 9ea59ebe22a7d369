"""Reading an HTTP body with a size limit: the one way every source reads an answer it did not size itself.

A TSDB answer or an exporter page can be far larger than anyone planned for (a query over a fleet that grew,
a misconfigured relabelling): a 300 MB Prometheus answer once took 5.8 GB of memory and 88 s to decode
despite a 5 s timeout. So the body is streamed in chunks and the read stops at the limit — before decoding
and before the rest is even received — and the caller turns that into a one-line reason naming the flag.
Memory stays at most the limit plus one chunk. The deadline is the caller's (``asyncio.timeout`` or the
session's ``ClientTimeout`` around the request), so it covers the body as well as the headers.
"""

from __future__ import annotations

from collections.abc import Callable

import aiohttp

CHUNK_BYTES = 256 * 1024


def size_text(n_bytes: int) -> str:
    """``128 MiB``, ``2 MiB``, ``64 KiB`` or ``1000 bytes``: a limit as a user would write it."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:g} {unit}"
    return f"{n_bytes} bytes"


async def read_bounded(
    resp: aiohttp.ClientResponse, *, limit_bytes: int, too_large: Callable[[], Exception]
) -> bytearray:
    """The whole body, or ``too_large()`` raised as soon as the declared or received size passes the limit.

    A bytearray (``json.loads`` and ``.decode`` take it as it is): no second copy of a large body.
    """
    return bytearray().join(await read_bounded_parts(resp, limit_bytes=limit_bytes, too_large=too_large))


async def read_bounded_parts(
    resp: aiohttp.ClientResponse, *, limit_bytes: int, too_large: Callable[[], Exception]
) -> list[bytes]:
    """The body as the chunks it came in (``read_bounded``'s limit), for a reader that never needs it whole.

    NB: grown chunk by chunk into one buffer, a 4 MB Prometheus answer was copied by every realloc: 14 single C
    calls of 1-4 ms per 10,000-GPU refresh holding the interpreter lock (benchmarks/bench_gil_holds.py); the
    adapter's answers go to the decoder process as they came (sources/decoder_process.py).
    """
    if resp.content_length is not None and resp.content_length > limit_bytes:
        raise too_large()
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit_bytes:
            raise too_large()  # NB: leaving the response context closes the connection: nothing more is read
        parts.append(chunk)
    return parts
