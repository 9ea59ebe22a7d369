"""The one backoff rule (gpuscale/backoff.py): doubling from the initial delay up to the cap, back to the start
after a success, jitter within its ratio and reproducible from a seed."""

from __future__ import annotations

import random

import pytest

from gpuscale.backoff import Backoff, doubling_delay


@pytest.mark.parametrize(
    ("failures", "initial", "cap", "expected"),
    [
        (0, 0.5, 30.0, 0.5),
        (1, 0.5, 30.0, 1.0),
        (5, 0.5, 30.0, 16.0),
        (6, 0.5, 30.0, 30.0),  # 32 s capped
        (-1, 60.0, 1800.0, 60.0),  # "no failure yet" waits the initial delay, never less
        (10_000, 0.5, 30.0, 30.0),  # no OverflowError however long the outage
    ],
)
def test_the_delay_doubles_per_failure_up_to_the_cap(failures, initial, cap, expected):
    assert doubling_delay(failures, initial_seconds=initial, max_seconds=cap) == expected


def test_without_jitter_the_delays_double_then_stay_at_the_cap_and_a_success_starts_over():
    backoff = Backoff(initial_seconds=2.0, max_seconds=20.0)
    assert [backoff.next_delay() for _ in range(6)] == [2.0, 4.0, 8.0, 16.0, 20.0, 20.0]
    assert backoff.failures == 6
    backoff.reset()
    assert backoff.current_seconds == 2.0 and backoff.next_delay() == 2.0


def test_an_initial_delay_above_the_cap_is_lowered_to_it():
    assert Backoff(initial_seconds=0.5, max_seconds=0.2).next_delay() == 0.2


def test_jitter_stays_within_its_ratio_and_is_reproducible_from_a_seed():
    first = Backoff(initial_seconds=1.0, max_seconds=8.0, jitter=0.2, rng=random.Random(7))
    again = Backoff(initial_seconds=1.0, max_seconds=8.0, jitter=0.2, rng=random.Random(7))
    delays = [first.next_delay() for _ in range(200)]
    assert delays == [again.next_delay() for _ in range(200)]
    for failures, delay in enumerate(delays):
        base = min(2.0**failures, 8.0)
        assert 0.8 * base <= delay <= 1.2 * base
    assert len({round(d, 9) for d in delays[10:]}) > 100  # jittered at the cap, not one fixed value


@pytest.mark.parametrize("jitter", [-0.1, 1.0, 1.5])
def test_a_jitter_outside_0_to_1_is_refused(jitter):
    with pytest.raises(ValueError, match="jitter is a ratio"):
        Backoff(initial_seconds=1.0, jitter=jitter)
