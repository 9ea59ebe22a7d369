"""Large sequences turned into arrays, lists and dicts a chunk at a time, with the result of doing it in one call.

The adapter builds each snapshot on its event loop in time slices between HPA requests (pipeline.py), so nothing in
the build may run long without a pause. One C call over every series or object of a 10,000-GPU fleet — ``np.array``
of 20,000 floats, ``np.fromiter`` over 20,000 ``dict.__getitem__``, a dict built from 20,000 pairs, ``tolist`` of as
many values — took 1–7 ms (benchmarks/bench_gil_holds.py), and every request arriving meanwhile waited that long.
Each helper here is steps (metrics/steps.py): the same calls over ``CHUNK`` items at a time, a yield after each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from gpuscale.metrics.steps import Steps

__all__ = [
    "CHUNK",
    "columns",
    "flattened",
    "float_array",
    "free_in_chunks",
    "index_array",
    "int_array",
    "listed",
    "mapped",
    "spans",
]

CHUNK = 1024  # NB: ~0.1 ms of the slowest call here (np.array of floats and None) per chunk on a busy core

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")


def spans(n: int, chunk: int | None = None) -> Iterator[slice]:
    """The slices that cut ``range(n)`` into pieces of ``chunk`` items (default ``CHUNK``, read when called); none
    when ``n`` is 0."""
    step = chunk or CHUNK
    return (slice(start, start + step) for start in range(0, n, step))


def float_array(values: Sequence[Any], chunk: int | None = None) -> Steps[np.ndarray]:
    """``np.array(values, dtype=float)`` of a flat sequence (None reads as NaN), converted a chunk at a time."""
    out = np.empty(len(values), dtype=float)
    for piece in spans(len(values), chunk):
        out[piece] = np.array(values[piece], dtype=float)
        yield
    return out


def int_array(values: Sequence[int], chunk: int | None = None) -> Steps[np.ndarray]:
    """``np.array(values, dtype=np.int64)`` of a flat sequence of ints, converted a chunk at a time."""
    out = np.empty(len(values), dtype=np.int64)
    for piece in spans(len(values), chunk):
        out[piece] = np.array(values[piece], dtype=np.int64)
        yield
    return out


def listed(array: np.ndarray, chunk: int | None = None) -> Steps[list[Any]]:
    """``array.tolist()`` of a flat array, a chunk at a time."""
    out: list[Any] = []
    for piece in spans(len(array), chunk):
        out += array[piece].tolist()
        yield
    return out


def index_array(index: Mapping[K, int], keys: Sequence[K], chunk: int | None = None) -> Steps[np.ndarray]:
    """``np.fromiter(map(index.__getitem__, keys), dtype=np.intp)``, a chunk at a time (KeyError alike)."""
    out = np.empty(len(keys), dtype=np.intp)
    get = index.__getitem__
    for piece in spans(len(keys), chunk):
        part = keys[piece]
        out[piece] = np.fromiter(map(get, part), dtype=np.intp, count=len(part))
        yield
    return out


def mapped(function: Callable[[T], V], items: Sequence[T], chunk: int | None = None) -> Steps[list[V]]:
    """``list(map(function, items))``, a chunk at a time (pass a small ``chunk`` for a Python function)."""
    out: list[V] = []
    for piece in spans(len(items), chunk):
        out += map(function, items[piece])
        yield
    return out


def flattened(function: Callable[[T], V], groups: Sequence[Sequence[T]], chunk: int | None = None) -> Steps[list[V]]:
    """``[function(x) for group in groups for x in group]`` (for a C function), a yield after every ``chunk`` items
    however the groups are sized: one group may hold a whole namespace's devices, another one device."""
    step = chunk or CHUNK
    out: list[V] = []
    room = step
    for group in groups:
        start = 0
        while start < len(group):
            part = group[start : start + room]
            out += map(function, part)
            start += len(part)
            room -= len(part)
            if not room:
                room = step
                yield
    if room != step:
        yield
    return out


def columns(rows: Sequence[Sequence[Any]], width: int, chunk: int | None = None) -> Steps[list[list[Any]]]:
    """``zip(*rows, strict=True)`` as ``width`` lists (empty lists when there are no rows), a chunk at a time."""
    out: list[list[Any]] = [[] for _ in range(width)]
    for piece in spans(len(rows), chunk):
        for column, items in zip(out, zip(*rows[piece], strict=True), strict=True):
            column += items
        yield
    return out


def free_in_chunks(items: list[Any], chunk: int | None = None) -> Steps[None]:
    """Empty ``items`` from its end, ``chunk`` items per C call: what only the list held is freed a chunk at a time
    rather than all at once where its last reference goes (a function's return, an assignment)."""
    step = chunk or CHUNK
    while items:
        del items[-step:]
        yield
