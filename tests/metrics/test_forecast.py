"""The forecast core against values worked out by hand: each model's recursion, the empirical upper quantile
by horizon, absence while history is short, the backtest's scoring on common steps, and the rate series."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuscale.metrics.forecast import (
    DampedHolt,
    Forecaster,
    Naive,
    SeasonalHolt,
    SeasonalNaive,
    backtest,
    model_spec,
    pinball_loss,
    rate_series,
    sorted_quantile,
    walk_forward,
)


def test_naive_is_the_last_value():
    m = Naive()
    assert m.predict(3) is None
    for y in (4.0, 7.0):
        m.update(y)
    assert m.predict(1) == m.predict(12) == 7.0


def test_seasonal_naive_repeats_the_last_season_at_the_same_phase():
    m = SeasonalNaive(3)
    for y in (1.0, 2.0):
        m.update(y)
    assert m.predict(1) is None  # not a whole season yet
    m.update(3.0)
    # t = 2 (y=3): t+1 ↔ t−2 (1), t+2 ↔ t−1 (2), t+3 ↔ t (3), t+4 ↔ t+1−3 (1)
    assert [m.predict(h) for h in (1, 2, 3, 4, 5)] == [1.0, 2.0, 3.0, 1.0, 2.0]
    m.update(10.0)
    assert [m.predict(h) for h in (1, 2, 3)] == [2.0, 3.0, 10.0]


def test_damped_holt_by_hand():
    m = DampedHolt(alpha=0.5, beta=0.5, phi=0.5)
    m.update(10.0)  # ℓ = 10, b = 0
    assert m.predict(1) == 10.0
    m.update(14.0)  # ℓ = .5·14 + .5·(10 + 0) = 12;  b = .5·(12 − 10) + .5·.5·0 = 1
    assert (m.level, m.trend) == (12.0, 1.0)
    assert m.predict(1) == pytest.approx(12.5)  # 12 + .5·1
    assert m.predict(2) == pytest.approx(12.75)  # 12 + (.5 + .25)·1
    m.update(16.0)  # ℓ = 8 + .5·(12 + .5) = 14.25;  b = .5·2.25 + .5·.5·1 = 1.375
    assert m.level == pytest.approx(14.25) and m.trend == pytest.approx(1.375)
    assert m.predict(1) == pytest.approx(14.9375)


def test_undamped_holt_extrapolates_a_straight_line():
    m = DampedHolt(alpha=1.0, beta=1.0, phi=1.0)
    for y in (3.0, 5.0, 7.0):
        m.update(y)
    assert [m.predict(h) for h in (1, 4)] == [9.0, 15.0]


def test_seasonal_holt_adds_the_growth_over_last_season():
    m = SeasonalHolt(2, alpha=1.0, beta=1.0, phi=1.0)
    for y in (1.0, 2.0, 2.0, 3.0):  # changes vs one season earlier: 1, 1
        m.update(y)
    # seasonal naive for t+1 is y(t−1) = 2; the season-over-season change holds at 1 → 3
    assert m.predict(1) == pytest.approx(3.0)
    assert m.predict(2) == pytest.approx(4.0)  # y(t) = 3, plus 1


def test_upper_quantile_is_the_residual_quantile_by_horizon():
    f = Forecaster(Naive(), horizon_steps=1, quantile=0.9, min_history=3, min_residuals=4)
    for y in (0.0, 1.0, 3.0, 6.0):
        f.observe(y)
    assert f.forecast() is None  # 3 residuals (1, 2, 3) < 4: absent, never a guess
    f.observe(10.0)  # residuals 1, 2, 3, 4
    got = f.forecast()
    assert got is not None
    # np.quantile (linear) of [1, 2, 3, 4] at 0.9: position 2.7 → 3 + .7·(4 − 3) = 3.7
    assert (got.mean, got.upper, got.residuals, got.history_steps) == (10.0, pytest.approx(13.7), 4, 5)


def test_sorted_quantile_is_numpys_to_the_bit():
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 17, 240):
        for q in (0.0, 0.01, 0.5, 0.9, 0.99, 1.0):
            values = rng.normal(0, 10, n)
            assert sorted_quantile(sorted(values.tolist()), q) == float(np.quantile(values, q)), (n, q)


def test_upper_is_the_quantile_of_the_last_window_of_residuals():
    """The window slides (the oldest residual leaves as each new one comes) and a new horizon empties it: the
    sorted copy the quantile is read from stays the window's."""
    rng = np.random.default_rng(8)
    f = Forecaster(Naive(), horizon_steps=1, residual_window=10, min_history=1, min_residuals=1)
    ys = rng.uniform(0, 20, 60).round(1)  # rounded: ties between residuals, removed one at a time
    for i, y in enumerate(ys):
        if i == 30:
            f.reset_horizon(2)
        f.observe(float(y))
        got = f.forecast()
        h = f.horizon_steps
        start = 30 if i >= 30 else 0
        residuals = [ys[t] - ys[t - h] for t in range(max(start + h, i - 9), i + 1)]
        if not residuals:
            assert got is None
            continue
        assert got is not None and got.residuals == len(residuals) == f.residual_count
        assert got.upper == max(got.mean, got.mean + float(np.quantile(residuals, 0.9)))


def test_residuals_are_those_of_forecasts_made_h_steps_earlier():
    f = Forecaster(Naive(), horizon_steps=2, min_history=1, min_residuals=1, quantile=0.5)
    for y in (0.0, 1.0, 2.0, 3.0):  # forecasts made at t for t+2 are y(t): every residual is 2
        f.observe(y)
    got = f.forecast()
    assert got is not None and got.residuals == 2 and got.upper == pytest.approx(5.0)


def test_upper_never_below_mean_and_rates_never_negative():
    f = Forecaster(DampedHolt(alpha=1.0, beta=1.0, phi=1.0), horizon_steps=3, min_history=2, min_residuals=1)
    for y in (10.0, 8.0, 6.0, 4.0, 2.0, 0.0):
        f.observe(y)
    got = f.forecast()
    assert got is not None and got.mean == 0.0 and got.upper >= got.mean


def test_history_too_short_is_absent():
    f = Forecaster(Naive(), horizon_steps=4, min_history=40, min_residuals=20)
    for _ in range(39):
        f.observe(5.0)
    assert f.forecast() is None
    f.observe(5.0)
    assert f.forecast() is not None  # 40 steps seen, 36 forecasts checked


def test_a_new_horizon_forgets_the_old_residuals():
    f = Forecaster(Naive(), horizon_steps=1, min_history=1, min_residuals=2)
    for y in range(5):
        f.observe(float(y))
    assert f.forecast() is not None
    f.reset_horizon(3)
    assert f.forecast() is None and f.residual_count == 0


def test_a_non_finite_rate_is_refused():
    with pytest.raises(ValueError, match="finite"):
        Forecaster(Naive(), horizon_steps=1).observe(math.nan)


def test_unknown_model_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown forecast model 'arima'; valid: naive, seasonal_naive, ses, holt"):
        model_spec("arima")


def test_pinball_loss_by_hand():
    actual = np.array([10.0, 10.0])
    assert pinball_loss(actual, np.array([8.0, 8.0]), 0.9) == pytest.approx(1.8)  # under by 2: .9·2
    assert pinball_loss(actual, np.array([12.0, 12.0]), 0.9) == pytest.approx(0.2)  # over by 2: .1·2
    assert pinball_loss(actual, np.array([8.0, 12.0]), 0.5) == pytest.approx(1.0)


def test_walk_forward_puts_each_forecast_at_its_target_step():
    y = np.arange(10, dtype=float)
    means, _ = walk_forward(y, model="naive", horizon_steps=2, min_history=1, min_residuals=1)
    # the first residual needs a forecast made at t=0 checked at t=2: the first answer is after t=2 → target 4
    assert np.isnan(means[:4]).all()
    assert means[4:].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def test_backtest_scores_every_model_on_the_same_steps():
    y = np.tile([1.0, 5.0, 9.0, 5.0], 30)  # a season of 4 steps, no noise: seasonal naive is exact
    scores = backtest(y, models=["naive", "seasonal_naive"], horizon_steps=1, season_steps=4)
    naive, seasonal = scores
    assert naive.points == seasonal.points > 0
    assert seasonal.mae == 0.0 and seasonal.coverage == 1.0
    assert naive.mae == pytest.approx(4.0)  # every step moves by 4
    assert naive.mape_percent == pytest.approx(100 * np.mean([4 / 1, 4 / 5, 4 / 9, 4 / 5]))  # |Δ| 4 over 1, 5, 9, 5


def test_rate_series_counts_requests_per_step():
    arrivals = np.array([0.0, 1.0, 14.9, 15.0, 29.0, 44.0])
    assert rate_series(arrivals, step_s=15.0).tolist() == pytest.approx([3 / 15, 2 / 15, 1 / 15])
    assert rate_series(arrivals, step_s=15.0, duration_s=60.0).tolist() == pytest.approx([3 / 15, 2 / 15, 1 / 15, 0])
    assert len(rate_series(arrivals, step_s=15.0, duration_s=45.0)) == 3  # 44 s is in the third step


def _chosen(y: np.ndarray, **options) -> tuple[str, dict[str, float]]:
    f = Forecaster(DampedHolt(), horizon_steps=4, name="holt", choose=True, **options)
    for v in y:
        f.observe(float(v))
    got = f.forecast()
    assert got is not None
    return got.model, dict(got.losses)


def test_the_model_is_chosen_where_its_recent_p90_loss_is_lower():
    rng = np.random.default_rng(3)
    noise = 10 + rng.normal(0, 1, 400)  # white noise: smoothing beats the last value
    model, losses = _chosen(noise)
    assert model == "holt" and losses["holt"] < losses["naive"]
    walk = 50 + np.cumsum(rng.normal(0, 1, 400))  # a random walk: the last value is the best guess
    model, losses = _chosen(walk)
    assert model == "naive" and losses["naive"] <= losses["holt"]


def test_naive_serves_until_the_model_has_a_whole_window_of_checked_forecasts():
    rng = np.random.default_rng(4)
    noise = 10 + rng.normal(0, 1, 400)
    f = Forecaster(DampedHolt(), horizon_steps=4, name="holt", choose=True, loss_window=60, min_history=10)
    models = []
    for v in noise:
        f.observe(float(v))
        got = f.forecast()
        models.append(got.model if got is not None else None)
    first = models.index("holt")
    # upper quantiles need 20 residuals (the 24th step on), and each is checked 4 steps later: 60 checked at 84
    assert first >= 20 + 4 + 60 - 1 and set(models[:first]) <= {None, "naive"}
    assert len(Forecaster(Naive(), horizon_steps=1, choose=True)._tracks) == 1  # naive needs no rival
