"""A replay of the predictive HPA (issue 26): the forecast the adapter would serve on a trace, fed to
`gpuscale simulate --external`, against the same HPA without it — on a ramp the forecast sees coming (the queue
stays short: the queue-only HPA, once its new replicas drain the queue, scales down to 1 and has to start over a
start-up late), and on a step with no precursor (no forecast can see it; it scales no earlier)."""

from __future__ import annotations

import json

import numpy as np

from gpuscale.cli.main import main
from gpuscale.metrics.demand import DemandSettings
from gpuscale.replay.served_forecast import series_csv, served_forecast

ORIGIN = 1_764_806_400.0
HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {name}}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: svc}}
  minReplicas: 1
  maxReplicas: 30
  metrics:
    - type: Pods
      pods: {{metric: {{name: inference_queue_depth}}, target: {{type: AverageValue, averageValue: "2"}}}}{extra}
"""
FORECAST = """
    - type: External
      external: {metric: {name: forecast_desired_replicas}, target: {type: AverageValue, averageValue: "1"}}"""


def _arrivals(rate_of_t, duration_s: float, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    peak = max(rate_of_t(t) for t in np.arange(0, duration_s, 10.0))
    t = np.cumsum(rng.exponential(1 / peak, int(duration_s * peak * 1.3)))
    t = t[t < duration_s]
    return t[rng.random(len(t)) < np.array([rate_of_t(x) for x in t]) / peak]


def _replay(tmp_path, capsys, arrivals: np.ndarray) -> dict[str, dict]:
    service_s, concurrency = 1.0, 2
    capacity = 0.75 * concurrency / service_s
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,service_time\n" + "".join(f"{ORIGIN + a:.3f},{service_s}\n" for a in arrivals))
    times, values = served_forecast(
        arrivals, horizon_s=90.0, capacity=capacity, settings=DemandSettings(min_history_s=300.0)
    )
    assert len(times) and times[0] >= 300.0  # nothing served before the history is long enough
    forecast = tmp_path / "forecast.csv"
    forecast.write_text(series_csv(times, values, origin=ORIGIN))
    hpas = []
    for name, extra in (("reactive", ""), ("predictive", FORECAST)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(HPA.format(name=name, extra=extra))
        hpas += ["--hpa", str(path)]
    args = ["simulate", "--trace", str(trace), *hpas, "--concurrency", str(concurrency), "--startup", "90s"]
    args += ["--external", f"forecast_desired_replicas=@{forecast}", "--output", "json"]
    capsys.readouterr()
    assert main(args) == 0
    return {r["hpa"]: r for r in json.loads(capsys.readouterr().out)["results"]}


def _first_above(result: dict, replicas: int) -> float:
    return next(s["t"] for s in result["timeline"] if s["desired"] >= replicas)


def test_on_a_ramp_the_predictive_hpa_holds_the_replicas_the_queue_alone_drops(tmp_path, capsys):
    # 10 min at 1 req/s, then +1 req/s every 2 minutes for 20 minutes, then 10 minutes flat at 11 req/s
    def rate(t):
        return 1.0 + float(np.clip((t - 600) / 120, 0, 10))

    got = _replay(tmp_path, capsys, _arrivals(rate, 2400))
    reactive, predictive = got["reactive"], got["predictive"]
    late = [s for s in predictive["timeline"] if s["t"] >= 1500]  # the ramp's second half and the plateau
    # 11 req/s at 1.5 per replica needs 8: the forecast keeps at least 5; the queue alone falls back to 1
    assert min(s["desired"] for s in late) >= 5
    assert min(s["desired"] for s in reactive["timeline"] if s["t"] >= 1500) == 1
    assert predictive["queue_wait_s"]["p95"] < reactive["queue_wait_s"]["p95"] / 10
    assert predictive["slo_violation_minutes"] < reactive["slo_violation_minutes"]
    assert predictive["gpu_hours"] < reactive["gpu_hours"]  # the queue-only HPA overshoots after each collapse


def test_a_step_with_no_precursor_is_not_seen_coming(tmp_path, capsys):
    # 15 min at 1 req/s, then 9 req/s at once: the forecast can only follow, like the queue
    got = _replay(tmp_path, capsys, _arrivals(lambda t: 1.0 if t < 900 else 9.0, 1800))
    reactive, predictive = got["reactive"], got["predictive"]
    assert _first_above(predictive, 3) >= 900 and _first_above(reactive, 3) >= 900
    assert abs(_first_above(predictive, 3) - _first_above(reactive, 3)) <= 30  # within two syncs


def test_simulate_computes_the_forecast_an_hpa_names_as_the_adapter_would_serve_it(tmp_path, capsys):
    """No --external: simulate walks the trace through the adapter's DemandBook itself, and replays exactly what the
    hand-made file of the same forecast replays; an HPA naming forecast_desired_replicas needs the capacity."""
    arrivals = _arrivals(lambda t: 1.0 if t < 900 else 4.0, 1800)
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,service_time\n" + "".join(f"{ORIGIN + a:.3f},1.0\n" for a in arrivals))
    hpa = tmp_path / "predictive.yaml"
    hpa.write_text(HPA.format(name="predictive", extra=FORECAST))
    times, values = served_forecast(arrivals - arrivals[0], horizon_s=90.0, capacity=1.5)
    forecast = tmp_path / "forecast.csv"
    forecast.write_text(series_csv(times, values, origin=ORIGIN + arrivals[0]))
    args = ["simulate", "--trace", str(trace), "--hpa", str(hpa), "--concurrency", "2", "--startup", "90s"]
    runs = []
    for extra in (["--external", f"forecast_desired_replicas=@{forecast}"], ["--forecast-capacity", "1.5"]):
        capsys.readouterr()
        assert main([*args, *extra, "--output", "json"]) == 0
        (result,) = json.loads(capsys.readouterr().out)["results"]
        runs.append(result)
    by_file, computed = runs
    assert computed["timeline"] == by_file["timeline"]
    assert max(s["desired"] for s in computed["timeline"]) >= 3  # the forecast took part (4 req/s ÷ 1.5)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "give --forecast-capacity" in err and "\n" not in err
