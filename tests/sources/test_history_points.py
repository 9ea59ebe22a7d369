"""A range answer's points are checked where they enter: what is no [timestamp, "value"] pair, or comes out of
time order, is dropped and counted; the rest is used. Table-driven: points in, kept timestamps and drops out."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.sources.history_fetch import matrix_points, matrix_series


@pytest.mark.parametrize(
    "values, kept, dropped",
    [
        ([[1, "0.5"], [2, "0.6"]], [1, 2], 0),
        ([[1.5, "NaN"], [2, "+Inf"]], [1.5, 2], 0),  # no sample later (clean), but well formed
        ([["x", "1"], [2, "abc"], [3, "1"]], [3], 2),
        ([[1, 5], [2, True], [3, None], [4, ["1"]], [5, "1"]], [5], 4),
        ([[1], "ab", {"t": 1}, [True, "1"], [1, "1", 2], [6, "1"]], [6], 5),
        ([[1, "1"], [1, "2"], [3, "1"], [2, "1"], [4, "1"]], [1, 3, 4], 2),  # a duplicate and a rewind
        ([[10**30, "1"], [10**31, "1"]], [1e30, 1e31], 0),
        ([], [], 0),
    ],
    ids=["clean", "non-finite", "bad-strings", "wrong-types", "not-pairs", "out-of-order", "huge-ints", "empty"],
)
def test_points(values, kept, dropped):
    ts, vs, n = matrix_points(values)
    assert ts.tolist() == kept and n == dropped and ts.size == vs.size


def test_the_first_of_duplicates_is_kept():
    _, vs, _ = matrix_points([[1, "1"], [1, "2"]])
    assert vs.tolist() == [1.0]


@pytest.mark.parametrize(
    "series, ok",
    [
        ({"metric": {"UUID": "a"}, "values": []}, True),
        ({"values": [[1, "1"]]}, True),
        ({"metric": "x", "values": []}, False),
        ({"metric": {}, "values": "abc"}, False),
        ("series", False),
        (None, False),
    ],
)
def test_series(series, ok):
    labels, _ = matrix_series(series)
    assert (labels is not None) == ok


def test_labels_that_are_not_strings_are_left_out():
    labels, _ = matrix_series({"metric": {"UUID": "a", "pod": 7, "ns": None}, "values": []})
    assert labels == {"UUID": "a"}
    assert np.isfinite(matrix_points([[1, "2"]])[1]).all()
