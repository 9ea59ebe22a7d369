"""The chunked conversions (metrics/chunked.py) give what the one-call forms give, at every chunk boundary, pausing
once per chunk; and a snapshot built in chunks and steps of 1–3 items equals one built in a single chunk, value for
value and in the same order."""

from __future__ import annotations

import math
import weakref

import numpy as np
import pytest

from gpuscale.metrics import aggregation, chunked
from gpuscale.metrics.aggregation import build_snapshot
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.chunked import (
    columns,
    flattened,
    float_array,
    free_in_chunks,
    index_array,
    int_array,
    listed,
    mapped,
    spans,
)
from tests.helpers import run_counting_pauses
from tests.metrics.test_refresh_snapshot import NOW, catalogue, cluster  # noqa: F401 (catalogue: a fixture)

CHUNK = 3


def _chunks(n: int) -> int:
    return len(list(spans(n, CHUNK)))


# empty, shorter than a chunk, one chunk, one over, several chunks and a partial one
SIZES = (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 2)


@pytest.mark.parametrize("n", SIZES)
def test_spans_cover_every_index_once_in_order(n):
    covered = [i for piece in spans(n, CHUNK) for i in range(n)[piece]]
    assert covered == list(range(n))
    assert all(len(range(n)[piece]) <= CHUNK for piece in spans(n, CHUNK))


@pytest.mark.parametrize("n", SIZES)
def test_float_array_is_np_array_of_floats_with_none_as_nan(n):
    values = [None if i % 4 == 1 else (math.inf if i % 5 == 2 else i * 0.5 - 1) for i in range(n)]
    (got, paused), want = run_counting_pauses(float_array(values, CHUNK)), np.array(values, dtype=float)
    assert paused == _chunks(n)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("n", SIZES)
def test_index_array_is_fromiter_of_the_lookups(n):
    keys = [f"k{(i * 7) % (n or 1)}" for i in range(n)]
    index = {k: i * 10 for i, k in enumerate(sorted(set(keys)))}
    got, paused = run_counting_pauses(index_array(index, keys, CHUNK))
    assert paused == _chunks(n)
    want = np.fromiter(map(index.__getitem__, keys), dtype=np.intp, count=len(keys))
    assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_index_array_raises_for_a_missing_key_as_the_lookup_does():
    with pytest.raises(KeyError):
        run_counting_pauses(index_array({"a": 0}, ["a"] * CHUNK + ["b"], CHUNK))


@pytest.mark.parametrize("n", SIZES)
def test_mapped_and_columns_are_map_and_zip(n):
    rows = [(f"name{i}", {"i": str(i)}, float(i), NOW - i, f"url{i % 2}", None) for i in range(n)]
    assert run_counting_pauses(mapped(id, rows, CHUNK)) == (list(map(id, rows)), _chunks(n))
    want = [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(6)]
    assert run_counting_pauses(columns(rows, 6, CHUNK)) == (want, _chunks(n))


@pytest.mark.parametrize("n", SIZES)
def test_int_array_and_listed_are_np_array_and_tolist(n):
    values = [(i * 7919) % 1000 - 500 for i in range(n)]
    (got, paused), want = run_counting_pauses(int_array(values, CHUNK)), np.array(values, dtype=np.int64)
    assert paused == _chunks(n) and got.dtype == want.dtype and got.tolist() == want.tolist()
    assert run_counting_pauses(listed(want, CHUNK)) == (want.tolist(), _chunks(n))


@pytest.mark.parametrize("sizes", [(), (0,), (1,), (CHUNK,), (3 * CHUNK + 1,), (1, 0, 2, CHUNK + 2, 1), (2,) * 7])
def test_flattened_maps_every_item_of_every_group_and_pauses_every_chunk_items(sizes):
    groups = [[f"g{g}i{i}" for i in range(size)] for g, size in enumerate(sizes)]
    steps = flattened(str.upper, groups, CHUNK)
    got, paused = run_counting_pauses(steps)
    assert got == [x.upper() for group in groups for x in group]
    # NB: a pause after every CHUNK items whatever the groups' sizes, and one after a partial last piece
    assert paused == _chunks(sum(sizes))


def test_columns_refuses_rows_of_differing_length_as_zip_strict_does():
    with pytest.raises(ValueError, match="zip"):
        run_counting_pauses(columns([(1, 2), (3, 4), (5,)], 2, CHUNK))


@pytest.mark.parametrize("n", SIZES)
def test_free_in_chunks_empties_the_list_and_frees_what_only_it_held(n):
    class Item:
        pass

    items = [Item() for _ in range(n)]
    kept = items[:1]  # NB: one item held elsewhere too survives
    held = [weakref.ref(i) for i in items]
    assert run_counting_pauses(free_in_chunks(items, CHUNK)) == (None, _chunks(n))
    assert items == []
    assert [r() is not None for r in held] == [i == 0 for i in range(n)]
    assert kept == [r() for r in held[:1]]


def _built(metrics, seed: int):
    by_name, targets = cluster(seed)
    return build_snapshot(
        metrics,
        lambda q: [v for n in q.series for v in by_name.get(n, [])],
        Attributor(lambda url: targets.get(url, Target(url))),
        now=NOW,
    )


def _plain(snapshot) -> tuple:
    """Everything a snapshot holds, NaN made comparable, orders kept (dicts as lists of items)."""

    def floats(point) -> tuple:
        return tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in point)

    values = {m: [(obj, floats(p)) for obj, p in points.items()] for m, points in snapshot.values.items()}
    members = [(obj, [d.physical for d in devices]) for obj, devices in snapshot.members.items()]
    partials = {
        m: (c.present.tolist(), {k: np.nan_to_num(v, nan=-7.0).tolist() for k, v in c.columns.items()})
        for m, c in snapshot.device_partials.items()
    }
    return values, members, partials, sorted(snapshot.dropped.items()), snapshot.series_count, snapshot.device_count


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_a_snapshot_built_in_small_chunks_equals_one_built_in_one(monkeypatch, catalogue, seed, chunk):  # noqa: F811
    whole = _plain(_built(catalogue, seed))
    monkeypatch.setattr(chunked, "CHUNK", chunk)
    monkeypatch.setattr(aggregation, "POINTS_PER_CHUNK", chunk)
    monkeypatch.setattr(aggregation, "STEP", chunk)
    pieces = _plain(_built(catalogue, seed))
    assert pieces == whole
    assert any(len(v) > chunk for v in whole[0].values()), "the cluster must span several chunks"
