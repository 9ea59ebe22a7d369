"""read_answer's label-set sharing (LabelSets): one dict per distinct label set within a refresh.

The positional hint (series i of an answer usually has the labels of series i of the previous answer of
the same length) is only a shortcut: these tests check that it never attaches one series' labels or
target to another, whatever order the answers list their series in.
"""

from __future__ import annotations

import random

import pytest

from gpuscale.errors import SourceUnavailable
from gpuscale.sources.prometheus import LabelSets, PlannedQuery, read_answer

SOURCE = "http://prometheus:9090"


def body(rows: list[tuple[dict[str, str], str]], t: float = 1000.0) -> dict:
    """A fresh decoded body, as json.loads returns it (read_answer pops __name__ from the dicts)."""
    result = [{"metric": dict(labels), "value": [t, value]} for labels, value in rows]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def gpu(n: int, name: str = "DCGM_FI_DEV_GPU_UTIL", **extra: str) -> dict[str, str]:
    return {"__name__": name, "UUID": f"GPU-{n}", "gpu": str(n % 8), "instance": f"10.0.0.{n // 8}:9400", **extra}


def read(rows, name="DCGM_FI_DEV_GPU_UTIL", sets=None, **planned):
    return read_answer(body(rows), PlannedQuery(name, name, **planned), source=SOURCE, label_sets=sets).values


def without_name(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != "__name__"}


def test_equal_label_sets_of_two_answers_share_one_dict_in_any_order():
    sets = LabelSets()
    used = read([(gpu(n, "DCGM_FI_DEV_FB_USED"), str(n)) for n in range(20)], "DCGM_FI_DEV_FB_USED", sets)
    order = list(range(20))
    random.Random(7).shuffle(order)
    free = read([(gpu(n, "DCGM_FI_DEV_FB_FREE"), str(100 + n)) for n in order], "DCGM_FI_DEV_FB_FREE", sets)
    by_uuid = {v.labels["UUID"]: v for v in used}
    for n, v in zip(order, free, strict=True):
        assert v.labels == without_name(gpu(n)) and v.value == 100 + n
        assert v.labels is by_uuid[f"GPU-{n}"].labels  # the same dict, found through the index
        assert v.target == f"http://10.0.0.{n // 8}:9400/metrics"


def test_a_different_label_set_at_the_same_position_keeps_its_own_labels_and_target():
    sets = LabelSets()
    first = read([(gpu(0), "1"), (gpu(1), "2"), (gpu(2), "3")], sets=sets)
    # Same length, so the positions of the first answer are the hint; every position differs in one way.
    changed = [
        (gpu(0, pod="trainer-0"), "4"),  # one label more
        ({**gpu(1), "instance": "10.9.9.9:9400"}, "5"),  # another instance, so another target
        (gpu(0), "6"),  # the label set of position 0, now at position 2
    ]
    second = read(changed, sets=sets)
    assert [v.labels for v in second] == [without_name(labels) for labels, _ in changed]
    assert [v.target for v in second] == [
        "http://10.0.0.0:9400/metrics",
        "http://10.9.9.9:9400/metrics",
        "http://10.0.0.0:9400/metrics",
    ]
    assert second[2].labels is first[0].labels
    assert second[0].labels is not first[0].labels and second[1].labels is not first[1].labels


def test_series_left_out_by_match_or_as_blanks_do_not_shift_the_others():
    sets = LabelSets()
    read([(gpu(n), "1") for n in range(4)], sets=sets)
    rows = [(gpu(0, model="a"), "1"), (gpu(1), "140737488355328"), (gpu(2, model="a"), "3"), (gpu(3), "4")]
    kept = read(rows, sets=sets, match=(("model", "a"),))
    assert [(v.labels["UUID"], v.value) for v in kept] == [("GPU-0", 1.0), ("GPU-2", 3.0)]
    blanks_dropped = read([(gpu(n), "140737488355328" if n == 1 else str(n)) for n in range(4)], sets=sets)
    assert [(v.labels["UUID"], v.value) for v in blanks_dropped] == [("GPU-0", 0.0), ("GPU-2", 2.0), ("GPU-3", 3.0)]


def test_without_label_sets_an_answer_is_still_read_whole():
    values = read([(gpu(n), str(n)) for n in range(3)])
    assert [(v.name, v.labels, v.value) for v in values] == [
        ("DCGM_FI_DEV_GPU_UTIL", without_name(gpu(n)), float(n)) for n in range(3)
    ]


def test_a_label_value_that_is_not_a_string_is_a_malformed_answer():
    with pytest.raises(SourceUnavailable, match=r"result\[1\]\.metric has a value that is not a string"):
        read([(gpu(0), "1"), ({**gpu(1), "pod": ["a", "b"]}, "2")], sets=LabelSets())
