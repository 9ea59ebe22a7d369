"""Large sequences turned into arrays, lists and dicts a chunk at a time, with the result of doing it in one call.

The adapter builds each snapshot in a worker thread while its event loop serves HPA requests (pipeline.py), and the
interpreter hands its lock from one thread to the other only between bytecodes. One C call over every series or
object of a 10,000-GPU fleet — ``np.array`` of 20,000 floats, ``np.fromiter`` over 20,000 ``dict.__getitem__``, a
dict built from 20,000 pairs, ``tolist`` of as many values — is one bytecode that held the lock for 1–7 ms, and every
request arriving meanwhile waited that long (benchmarks/bench_gil_holds.py). The same calls over ``CHUNK`` items at
a time hold it for a small fraction of a millisecond each, and the loop runs in between.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

__all__ = ["CHUNK", "columns", "float_array", "free_in_chunks", "index_array", "mapped", "spans"]

CHUNK = 2048  # NB: ~0.2 ms of the slowest call here (np.array of floats and None) per chunk on a busy core

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


def spans(n: int, chunk: int | None = None) -> Iterator[slice]:
    """The slices that cut ``range(n)`` into pieces of ``chunk`` items (default ``CHUNK``, read when called); none
    when ``n`` is 0."""
    step = chunk or CHUNK
    return (slice(start, start + step) for start in range(0, n, step))


def float_array(values: Sequence[Any], chunk: int | None = None) -> np.ndarray:
    """``np.array(values, dtype=float)`` of a flat sequence (None reads as NaN), converted a chunk at a time."""
    out = np.empty(len(values), dtype=float)
    for piece in spans(len(values), chunk):
        out[piece] = np.array(values[piece], dtype=float)
    return out


def index_array(index: Mapping[K, int], keys: Sequence[K], chunk: int | None = None) -> np.ndarray:
    """``np.fromiter(map(index.__getitem__, keys), dtype=np.intp)``, a chunk at a time (KeyError alike)."""
    out = np.empty(len(keys), dtype=np.intp)
    get = index.__getitem__
    for piece in spans(len(keys), chunk):
        part = keys[piece]
        out[piece] = np.fromiter(map(get, part), dtype=np.intp, count=len(part))
    return out


def mapped(function: Callable[[T], V], items: Sequence[T], chunk: int | None = None) -> list[V]:
    """``list(map(function, items))``, a chunk at a time (for a C function such as ``id``: a Python one lets the
    lock go anyway)."""
    out: list[V] = []
    for piece in spans(len(items), chunk):
        out += map(function, items[piece])
    return out


def columns(rows: Sequence[Sequence[Any]], width: int, chunk: int | None = None) -> list[list[Any]]:
    """``zip(*rows, strict=True)`` as ``width`` lists (empty lists when there are no rows), a chunk at a time."""
    out: list[list[Any]] = [[] for _ in range(width)]
    for piece in spans(len(rows), chunk):
        for column, items in zip(out, zip(*rows[piece], strict=True), strict=True):
            column += items
    return out


def free_in_chunks(items: list[Any], chunk: int | None = None) -> None:
    """Empty ``items`` from its end, ``chunk`` items per C call: what only the list held is freed a chunk at a time
    rather than all at once where its last reference goes (a function's return, an assignment)."""
    step = chunk or CHUNK
    while items:
        del items[-step:]
