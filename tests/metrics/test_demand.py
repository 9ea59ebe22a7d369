"""The per-workload demand book: refreshes averaged into steps, absent until enough history, short gaps filled,
long gaps start over, horizons and capacities per workload, forgotten workloads dropped."""

from __future__ import annotations

import pytest

from gpuscale.metrics.demand import DemandBook, DemandSettings

A, B = "ns/a", "ns/b"


def _book(**overrides) -> DemandBook:
    options = {"step_s": 10.0, "model": "naive", "min_history_s": 50.0, "min_residuals": 3, **overrides}
    return DemandBook(DemandSettings(**options))


def _feed(book: DemandBook, start: float, end: float, rate, *, every: float = 5.0, horizon_s=20.0, capacity=None):
    t = start
    while t < end:
        book.observe(t, {A: rate(t)}, {A: horizon_s}, {A: capacity} if capacity else None)
        t += every


def test_absent_until_enough_history_then_served():
    book = _book()
    _feed(book, 0.0, 50.0, lambda t: 4.0)
    assert book.forecast(A) is None  # 4 finished steps (40 s) < 50 s
    status = book.status(A)
    assert status is not None and "40 s of request-rate history, needs 50 s" in status.reason
    _feed(book, 50.0, 70.0, lambda t: 4.0)
    got = book.forecast(A)
    assert got is not None and (got.now, got.mean, got.upper, got.horizon_s) == (4.0, 4.0, 4.0, 20.0)
    assert got.timestamp == 60.0  # the end of the last finished step
    assert book.forecast(B) is None and book.status(B) is None


def test_refreshes_are_averaged_per_step():
    book = _book()
    _feed(book, 0.0, 80.0, lambda t: 2.0 if (t // 5) % 2 == 0 else 6.0)  # 2, 6 within each 10 s step
    got = book.forecast(A)
    assert got is not None and got.now == 4.0


def test_the_upper_quantile_covers_a_ramp():
    book = _book(quantile=0.9)
    _feed(book, 0.0, 200.0, lambda t: t // 10)  # +1 req/s per step; naive at 2 steps is 2 low each time
    got = book.forecast(A)
    assert got is not None and got.upper == pytest.approx(got.mean + 2.0)


def test_desired_replicas_is_upper_over_capacity():
    book = _book()
    _feed(book, 0.0, 100.0, lambda t: 9.0, capacity=4.0)
    got = book.forecast(A)
    assert got is not None and got.desired_replicas == pytest.approx(2.25)
    _feed(book, 100.0, 110.0, lambda t: 9.0)
    assert book.forecast(A).desired_replicas is None  # capacity no longer known


def test_a_short_gap_is_filled_a_long_one_starts_over():
    book = _book(max_gap_s=30.0)
    _feed(book, 0.0, 100.0, lambda t: 3.0)
    _feed(book, 125.0, 130.0, lambda t: 3.0)  # 25 s without a refresh: filled
    assert book.forecast(A) is not None
    _feed(book, 200.0, 210.0, lambda t: 3.0)  # 70 s: history starts over
    assert book.forecast(A) is None
    assert book.status(A).history_s == 0.0


def test_a_reading_no_newer_than_the_last_is_not_a_step():
    book = _book()
    t = 0.0
    while t < 70.0:
        book.observe(t, {A: 4.0}, {A: 20.0}, sampled_at={A: t - 1})
        t += 5.0
    served = book.forecast(A)
    assert served is not None and served.timestamp == 59.0  # the newest sample the finished steps saw, not 60
    steps = book.status(A).history_s
    while t < 200.0:  # the source stopped: its last reading, sampled at 64, comes again at every refresh
        book.observe(t, {A: 4.0}, {A: 20.0}, sampled_at={A: 64.0})
        t += 5.0
    assert book.status(A).history_s == steps  # no step recorded
    assert book.forecast(A) is served  # nothing changed, its timestamp stays that of the last real sample
    book.observe(t, {A: 4.0}, {A: 20.0})  # without sample times a reading is sampled at ``now``: new
    assert book.status(A).history_s == 0.0  # 140 s since the last reading: a long gap starts over


def test_a_new_horizon_needs_new_residuals():
    book = _book()
    _feed(book, 0.0, 100.0, lambda t: 3.0)
    assert book.forecast(A) is not None
    _feed(book, 100.0, 105.0, lambda t: 3.0, horizon_s=60.0)
    assert book.forecast(A) is None
    assert "forecasts at the 60 s horizon" in book.status(A).reason


def test_workloads_not_seen_are_forgotten():
    book = _book(forget_after_s=100.0)
    book.observe(0.0, {A: 1.0, B: 1.0}, {A: 10.0, B: 10.0})
    book.observe(150.0, {A: 1.0}, {A: 10.0})
    assert list(book) == [A]


def test_an_unknown_model_is_refused_with_the_valid_names():
    with pytest.raises(ValueError, match="valid: naive, seasonal_naive, ses, holt, seasonal_holt"):
        DemandSettings(model="prophet")


def test_pods_are_grouped_by_their_owning_workload_in_one_pass():
    from types import SimpleNamespace

    from gpuscale.metrics.workload_demand import owners
    from gpuscale.model import ObjectRef

    def pod(name, owner, labels=None):
        return SimpleNamespace(name=name, owner=owner, labels=labels or {})

    pods = [
        pod("web-7d9f8-a", ("ReplicaSet", "web-7d9f8"), {"pod-template-hash": "7d9f8"}),
        pod("web-7d9f8-b", ("ReplicaSet", "web-7d9f8"), {"pod-template-hash": "7d9f8"}),
        pod("db-0", ("StatefulSet", "db")),
        pod("rs-only-x", ("ReplicaSet", "rs-only")),  # a bare ReplicaSet: no template hash, not a Deployment's
        pod("job-x", ("Job", "job")),
        pod("bare", None),
    ]
    got = {k: [p.name for p in v] for k, v in owners("ns", pods).items()}
    assert got == {
        ObjectRef("Deployment", "web", "ns"): ["web-7d9f8-a", "web-7d9f8-b"],
        ObjectRef("StatefulSet", "db", "ns"): ["db-0"],
    }
