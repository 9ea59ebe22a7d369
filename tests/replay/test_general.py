"""The general service model through the CLI: service-time traces, --service-time, --concurrency, start-up
and swap distributions, --external, and the errors that refuse input rather than ignore it."""

from __future__ import annotations

import json
from importlib.resources import files

import numpy as np
import pytest

from gpuscale.cli.main import main
from gpuscale.errors import ConfigError
from gpuscale.replay.distributions import parse_distribution
from gpuscale.replay.general import GeneralServingModel, ServiceProfile
from gpuscale.replay.traces import Trace

IMAGE_TRACE = str(files("gpuscale.replay") / "data" / "text-to-image-2h.csv.gz")

HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {name}}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: svc}}
  minReplicas: {min}
  maxReplicas: {max}
  metrics:
    - type: {type}
      {body}
"""
QUEUE = 'pods: {metric: {name: inference_queue_depth}, target: {type: AverageValue, averageValue: "2"}}'
FORECAST = 'external: {metric: {name: forecast_rps}, target: {type: AverageValue, averageValue: "1"}}'


def manifest(tmp_path, *, name="q", lo=1, hi=10, type="Pods", body=QUEUE):
    path = tmp_path / f"{name}.yaml"
    path.write_text(HPA.format(name=name, min=lo, max=hi, type=type, body=body))
    return str(path)


def test_distributions_parse_and_draw_as_written(tmp_path):
    rng = np.random.default_rng(0)
    assert parse_distribution("250ms", flag="--x").draw(rng) == 0.25
    assert parse_distribution("0", flag="--x").draw(rng) == 0.0
    exp = parse_distribution("exp:mean=2s", flag="--x").draw(rng, 200_000)
    assert exp.mean() == pytest.approx(2.0, rel=0.02)
    logn = parse_distribution("lognormal:p50=22.7s,p95=45.4s", flag="--startup").draw(rng, 200_000)
    assert np.quantile(logn, [0.5, 0.95]) == pytest.approx([22.7, 45.4], rel=0.03)
    samples = tmp_path / "loads.csv"
    samples.write_text("seconds\n20\n\n30\n40\n")
    drawn = parse_distribution(f"@{samples}", flag="--startup").draw(rng, 3000)
    assert set(drawn) == {20.0, 30.0, 40.0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fast", "--service-time: a duration is not a duration like 1.8s or 250ms (got 'fast')"),
        ("-1s", "--service-time: a duration is not a duration"),
        ("exp:avg=1s", "--service-time: 'exp:avg=1s' needs exactly mean (got avg)"),
        ("lognormal:p50=4s,p95=1s", "--service-time: lognormal needs 0 < p50 < p95"),
        ("gamma:k=2", "--service-time: unknown distribution 'gamma'"),
        ("@/nonexistent.csv", "/nonexistent.csv: --service-time: cannot read samples"),
    ],
)
def test_bad_distributions_are_one_line_errors(text, message):
    with pytest.raises(ConfigError) as err:
        parse_distribution(text, flag="--service-time")
    assert message in str(err.value) and "\n" not in str(err.value)


def run(capsys, *args) -> dict:
    assert main(["simulate", *args, "--output", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_service_time_trace_with_duplicates_and_zero_costs(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,service_time\n" + "".join(f"{i // 3 * 2},{(i % 4) * 0.5}\n" for i in range(300)))
    doc = run(capsys, "--trace", str(trace), "--hpa", manifest(tmp_path), "--concurrency", "2")
    assert doc["model"] == "general" and doc["profile"]["concurrency"] == 2
    [r] = doc["results"]
    assert r["requests"] == {"completed": 300, "rejected": 0, "unfinished": 0} and r["dropped"] == 0
    assert min(r["queue_wait_s"].values()) >= 0 and min(r["ttft_s"].values()) >= 0
    # 3 requests at once every 2 s on 2 slots: the third waits for the shorter of the first two
    assert 0 < r["queue_wait_s"]["mean"] < 1.0


def test_service_time_flag_turns_any_trace_into_a_general_service(tmp_path, capsys):
    trace = tmp_path / "llm.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n" + "".join(f"{i / 4},800,50\n" for i in range(400)))
    one = run(capsys, "--trace", str(trace), "--hpa", manifest(tmp_path, hi=1), "--service-time", "0.25s")
    more = run(capsys, "--trace", str(trace), "--hpa", manifest(tmp_path, hi=1), "--service-time", "1s")
    # 4 requests/s at 0.25 s each keeps one slot exactly busy: no wait; at 1 s each the queue only grows
    assert one["results"][0]["queue_wait_s"]["p99"] == 0
    assert more["results"][0]["queue_wait_s"]["p99"] > 200
    assert one["settings"]["service_time"] == "0.25s"


def test_swaps_cost_what_the_swap_time_says_and_lru_keeps_what_is_used():
    # one replica, two models alternating: with room for one model every request but the first swaps,
    # with room for two none does
    n = 40
    arrival = np.arange(n) * 10.0
    zeros = np.zeros(n, dtype=np.int64)
    trace = Trace("swaps", arrival, zeros, zeros, service_s=np.full(n, 1.0), model=np.arange(n) % 2, models=("a", "b"))
    for room, swaps in ((1, n - 1), (2, 1)):
        model = GeneralServingModel(
            trace, profile=ServiceProfile(models_per_replica=room), service_s=trace.service_s, swap_s=np.full(n, 3.0)
        )
        model.add_replica(0.0, startup_s=0.0)
        t = 0.0
        while not model.done():
            model.advance(t)
            t += model.step_s
        took = model.requests.finished - model.requests.admitted
        assert model.swaps == swaps
        assert sorted(set(np.round(took, 9))) == ([1.0, 4.0] if swaps else [1.0])


def test_shipped_image_trace_with_startup_and_swap_distributions(tmp_path, capsys):
    args = ["--trace", IMAGE_TRACE, "--hpa", manifest(tmp_path, hi=20), "--concurrency", "2"]
    args += ["--startup", "lognormal:p50=22.7s,p95=45.4s", "--swap-time", "lognormal:p50=4s,p95=9s"]
    one = run(capsys, *args, "--models-per-replica", "1")
    four = run(capsys, *args, "--models-per-replica", "4")
    a, b = one["results"][0], four["results"][0]
    assert a["swaps"] > b["swaps"] and b["swaps"] <= 4 * b["max_replicas"] * (b["scale_ups"] + 1)
    assert one["settings"]["startup"] == "lognormal:p50=22.7s,p95=45.4s"
    assert one["settings"]["startup_s"] == pytest.approx(22.7 * np.exp((np.log(2) / 1.6448536) ** 2 / 2), rel=1e-3)
    assert min(a["queue_wait_s"].values()) >= 0 and a["dropped"] == 0
    assert run(capsys, *args, "--models-per-replica", "1") == one  # seeded: same bytes


def test_swap_time_without_a_model_column_is_refused(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,service_time\n0,1\n")
    assert main(["simulate", "--trace", str(trace), "--hpa", manifest(tmp_path), "--swap-time", "2s"]) == 2
    assert "t.csv: --swap-time needs a trace with a 'model' column" in capsys.readouterr().err


def test_external_metric_fed_from_a_file_drives_the_hpa(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,service_time\n" + "".join(f"{1000 + i},0.1\n" for i in range(600)))
    forecast = tmp_path / "forecast.csv"
    forecast.write_text("timestamp,value\n1000,2\n1300,6\n")
    hpa = manifest(tmp_path, name="f", type="External", body=FORECAST)
    doc = run(capsys, "--trace", str(trace), "--hpa", hpa, "--external", f"forecast_rps=@{forecast}")
    replicas = [s["desired"] for s in doc["results"][0]["timeline"]]
    # 2 before the forecast's step at t=300 s of the trace, then 6 (AverageValue 1 per replica)
    assert replicas[0] == 2 and max(replicas) == 6 and replicas.index(6) * 15 >= 300
    assert main(["simulate", "--trace", str(trace), "--hpa", hpa]) == 2
    assert "'forecast_rps' is not in the metric catalogue" in capsys.readouterr().err


def test_history_without_a_metric_an_hpa_uses_is_refused(tmp_path, capsys):
    history = tmp_path / "h.csv"
    history.write_text(
        "timestamp,pod,metric,value\n" + "".join(f"{t},p0,gpu_utilization,50\n" for t in range(0, 300, 15))
    )
    hpa = manifest(tmp_path, name="queue-hpa")
    assert main(["simulate", "--history", str(history), "--hpa", hpa]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "'inference_queue_depth' is not in the history" in err and "'queue-hpa'" in err and str(history) in err
    forecast = tmp_path / "forecast.csv"
    forecast.write_text("timestamp,value\n0,3\n")
    ext = manifest(tmp_path, name="f", type="External", body=FORECAST)
    doc = run(capsys, "--history", str(history), "--hpa", ext, "--external", f"forecast_rps=@{forecast}")
    assert doc["results"][0]["timeline"][0]["desired"] == 3


def test_scale_to_zero_in_the_quiet_and_from_zero_on_the_gateway_queue(tmp_path, capsys):
    # two bursts 20 minutes apart: an HPA with minReplicas 0 on the whole queue (External) goes to 0
    # between them and back up when requests wait with no replica to serve them
    trace = tmp_path / "t.csv"
    rows = [f"{t},{2.0}" for t in range(0, 120)] + [f"{t},{2.0}" for t in range(1500, 1620)]
    trace.write_text("timestamp,service_time\n" + "\n".join(rows) + "\n")
    body = 'external: {metric: {name: inference_queue_depth}, target: {type: AverageValue, averageValue: "1"}}'
    hpa = manifest(tmp_path, name="zero", lo=0, hi=8, type="External", body=body)
    doc = run(capsys, "--trace", str(trace), "--hpa", hpa, "--startup", "30s", "--initial-replicas", "1")
    [r] = doc["results"]
    desired = [s["desired"] for s in r["timeline"]]
    first_zero = desired.index(0)
    assert any(d > 0 for d in desired[first_zero:]), desired  # woke up for the second burst
    assert r["requests"]["completed"] == 240 and r["dropped"] == 0
    # the second burst's first requests waited for a replica's start-up (30 s) at least
    assert r["queue_time_s"]["max"] >= 30
