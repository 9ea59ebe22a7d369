"""`gpuscale backtest` (issue 38): the adapter's served forecast on a user's traffic, scored against what followed.

A trace, a recorded rate and a Prometheus range answer all go through the adapter's own DemandBook
(replay/served_forecast.py); the same readings give the same figures whichever way they come in. On steady
Poisson traffic, where smoothing helps, and on a random walk, where the last value is the best guess, the served
p90 is no worse than naive's; bad input is a one-line error.
"""

from __future__ import annotations

import json

import numpy as np
from aiohttp import web

from gpuscale.cli.backtest import BacktestSettings, _prometheus_rate
from gpuscale.cli.main import main
from gpuscale.replay.served_forecast import trace_readings


def _backtest(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["backtest", *args, "--output", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _poisson(rate: float, duration_s: float, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, int(rate * duration_s * 1.2)))
    return t[t < duration_s]


def test_a_trace_and_its_readings_as_a_rate_give_the_same_figures(tmp_path, capsys):
    arrivals = _poisson(4.0, 3600)
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n" + "".join(f"{a:.4f},10,10\n" for a in arrivals))
    times, rates = trace_readings(arrivals - arrivals[0])
    rate = tmp_path / "rate.csv"
    rate.write_text(
        "timestamp,value\n" + "".join(f"{t:.1f},{r!r}\n" for t, r in zip(times.tolist(), rates.tolist(), strict=True))
    )
    by_trace = _backtest(capsys, "--trace", str(trace), "--horizon", "1m", "--horizon", "3m")
    by_rate = _backtest(capsys, "--rate", str(rate), "--horizon", "1m", "--horizon", "3m")
    assert by_trace["results"] == by_rate["results"]
    for r in by_trace["results"]:
        # steady traffic: about 2 checked forecasts per minute after the 10 min history, scored at each step
        assert r["points"] > 150
        assert r["loss_ratio"] <= 1.03, r  # never worse than the last value by more than the stated 3 %
        assert 0.85 <= r["coverage"] <= 0.95, r


def test_on_a_random_walk_the_last_value_serves(tmp_path, capsys):
    rng = np.random.default_rng(11)
    times = np.arange(5.0, 4 * 3600, 5.0)
    # a rate that wanders in 15 s steps (held for the step's three readings): no level to smooth towards
    steps = np.maximum(0.0, 20 + np.cumsum(rng.normal(0, 1.0, len(times) // 3 + 1)))
    rates = np.repeat(steps, 3)[: len(times)]
    rate = tmp_path / "rate.csv"
    rate.write_text(
        "timestamp,value\n" + "".join(f"{t:.1f},{r!r}\n" for t, r in zip(times.tolist(), rates.tolist(), strict=True))
    )
    doc = _backtest(capsys, "--rate", str(rate), "--horizon", "1m")
    (r,) = doc["results"]
    assert r["loss_ratio"] <= 1.03, r
    assert r["model_share"] < 0.5, r


async def test_a_prometheus_range_answer_is_read_as_one_rate(aiohttp_server):
    asked = {}

    async def query_range(request: web.Request) -> web.Response:
        asked.update(await request.post())
        values = [[1_700_000_000 + 15 * i, str(3.0 + i % 2)] for i in range(10)]
        return web.json_response(
            {"status": "success", "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}}
        )

    app = web.Application()
    app.router.add_post("/api/v1/query_range", query_range)
    app.router.add_get("/api/v1/query_range", query_range)
    server = await aiohttp_server(app)
    settings = BacktestSettings(
        prometheus={"url": str(server.make_url(""))},
        query="sum(rate(vllm:request_success_total[1m]))",
        history_end="1700000135",
        history_span=135.0,
    )
    _, times, rates = await _prometheus_rate(settings)
    assert asked["query"] == "sum(rate(vllm:request_success_total[1m]))" and float(asked["step"]) == 15.0
    assert times.tolist() == [1_700_000_000 + 15 * i for i in range(10)]
    assert rates.tolist() == [3.0, 4.0] * 5


def test_bad_input_is_one_line(tmp_path, capsys):
    rate = tmp_path / "rate.csv"
    rate.write_text("timestamp,value\n1,2\n0,3\n")
    cases = [
        ([], "give one of --trace FILE, --rate FILE or --prometheus-url URL --query PROMQL"),
        (["--rate", str(rate)], "timestamp goes back in time"),
        (["--rate", str(rate), "--horizon", "soon"], "--horizon: invalid duration 'soon'"),
        (["--rate", str(rate), "--model", "arima"], "--model: unknown model 'arima'"),
        (["--query", "up", "--rate", str(rate)], "--query: only with --prometheus-url"),
    ]
    for args, message in cases:
        capsys.readouterr()
        assert main(["backtest", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, (args, err)
