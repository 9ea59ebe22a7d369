"""The replay: serving model sanity, the HPA in the loop, determinism, and the CLI's errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpuscale.cli.main import main
from gpuscale.errors import ConfigError
from gpuscale.hpa import parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.serving import ServingModel, ServingProfile
from gpuscale.replay.signals import check_metrics
from gpuscale.replay.trace_replay import ReplaySettings, replay
from gpuscale.replay.traces import Trace, read_trace

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"

HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: {name}}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: llm}}
  minReplicas: 1
  maxReplicas: {max}
  metrics:
    - type: Pods
      pods:
        metric: {{name: {metric}}}
        target: {{type: AverageValue, averageValue: "{target}"}}
"""


def hpa(metric: str, target: str, *, name: str = "x", max: int = 10):
    return parse_manifests(HPA.format(name=name, metric=metric, target=target, max=max), source="x.yaml")[0]


def steady(rps: float, seconds: float, *, inp: int = 1000, out: int = 200) -> Trace:
    n = int(rps * seconds)
    return Trace("steady", np.arange(n) / rps, np.full(n, inp), np.full(n, out))


def test_one_request_costs_what_the_profile_says():
    p = ServingProfile()
    model = ServingModel(Trace("one", np.array([0.0]), np.array([1000]), np.array([100])), profile=p, step_s=0.25)
    model.add_replica(0.0, startup_s=0.0)
    t = 0.0
    while not model.done():
        model.advance(t)
        t += 0.25
    prefill = p.prefill_s(1000)
    decode = sum(p.decode_iteration_s + p.decode_s_per_kv_token * (1000 + k) for k in range(100))
    assert model.requests.first_token[0] == pytest.approx(prefill, rel=1e-6)
    assert model.requests.finished[0] == pytest.approx(prefill + decode, rel=0.01)


def test_gpu_util_saturates_while_sm_activity_follows_the_batch():
    """The util trap, reproduced: one request in flight reads 100 % GPU util, but few SMs."""
    p = ServingProfile()
    readings = []
    for rps in (0.1, 20):
        model = ServingModel(steady(rps, 60, inp=100, out=2000), profile=p)
        model.add_replica(0.0, startup_s=0.0)
        for k in range(200):
            model.advance(k * 0.25)
        readings.append(model.gpu_activity(model.replicas[0]))
    (util_light, sm_light, _), (util_full, sm_full, tensor_full) = readings
    assert util_light == util_full == pytest.approx(100.0)
    assert sm_light < 25 and sm_full > 55 and tensor_full < sm_full


def test_queue_forms_only_beyond_capacity_and_hpa_on_queue_scales_out():
    cat = load_catalogue()
    trace = steady(30, 600)  # ~2 replicas' worth of prefill
    settings = ReplaySettings(startup_s=60)
    out = replay(
        trace, hpa("inference_queue_depth", "2", max=8), catalogue=cat, profile=ServingProfile(), settings=settings
    )
    assert out.max_replicas >= 3 and out.events[0].to_replicas > out.events[0].from_replicas
    assert out.requests["completed"] == len(trace)
    idle = replay(
        steady(1, 600), hpa("inference_queue_depth", "2"), catalogue=cat, profile=ServingProfile(), settings=settings
    )
    assert idle.max_replicas == 1 and idle.queue_time_s["p99"] < 0.3 and not idle.events


def test_same_inputs_same_bytes():
    trace = read_trace(TRACES / "AzureLLMInferenceTrace_code.csv.gz").window(duration_s=600).scaled(3.5, seed=4)
    cat = load_catalogue()
    runs = [
        json.dumps(
            replay(
                trace,
                hpa("inference_queue_compute_ratio", "500m"),
                catalogue=cat,
                profile=ServingProfile(),
                settings=ReplaySettings(),
            ).to_json(),
            sort_keys=True,
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert json.loads(runs[0])["scale_ups"] >= 1


def test_metrics_the_catalogue_or_the_model_lacks_are_errors():
    cat = load_catalogue()
    with pytest.raises(
        ConfigError,
        match=r"a\.yaml: spec\.metrics\[0\]\.pods\.metric\.name: 'gpu_magic' is not in the metric catalogue",
    ):
        check_metrics([("a.yaml", hpa("gpu_magic", "1"))], cat)
    with pytest.raises(ConfigError, match="does not produce it"):
        check_metrics([("a.yaml", hpa("gpu_power_watts", "300"))], cat)


def test_cli_json_and_table(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n" + "".join(f"{i / 4},800,50\n" for i in range(400)))
    manifest = tmp_path / "q.yaml"
    manifest.write_text(HPA.format(name="queue", metric="inference_queue_depth", target="4", max=4))
    assert main(["simulate", "--trace", str(trace), "--hpa", str(manifest), "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "gpuscale.simulate/v2" and doc["trace"]["requests"] == 400
    [r] = doc["results"]
    assert r["hpa"] == "queue" and r["requests"]["completed"] == 400 and r["gpu_hours"] > 0
    page = tmp_path / "out.html"
    assert main(["simulate", "--trace", str(trace), "--hpa", str(manifest), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert "queue" in out and page.read_text().count("<svg") == 3  # request rate, replicas and queue, GPUs
    assert "t.csv: request rate" in page.read_text() and doc["trace"]["requests_per_s_by_minute"] == [4.0, 2.6667]
    assert "queue: scaling events" in out or "queue: no scaling events" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        HPA.format(name="b", metric="inference_queue_depth", target="4", max=4).replace(
            "minReplicas: 1", "minReplicas: 9"
        )
    )
    assert main(["simulate", "--trace", str(trace), "--hpa", str(bad)]) == 2
    assert f"{bad}: spec: maxReplicas (4) must be greater than or equal to minReplicas" in capsys.readouterr().err


def test_cli_window_rate_scale_and_an_empty_window(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,input_tokens,output_tokens\n" + "".join(f"{i},800,50\n" for i in range(120)))
    manifest = tmp_path / "q.yaml"
    manifest.write_text(HPA.format(name="queue", metric="inference_queue_depth", target="4", max=4))
    args = ["simulate", "--trace", str(trace), "--hpa", str(manifest), "--output", "json"]
    assert main([*args, "--start", "30s", "--duration", "1m", "--rate-scale", "2", "--initial-replicas", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["trace"]["requests"] == 120 and doc["trace"]["rate_scale"] == 2.0  # 60 requests, each twice
    assert doc["settings"]["initial_replicas"] == 2
    assert main([*args, "--start", "10m"]) == 2
    assert "t.csv: no requests in the chosen window (--start/--duration)" in capsys.readouterr().err


def test_llm_server_signals_are_reported():
    """Batch size (running sequences), KV-cache usage, token rates and TTFT quantiles, as vLLM/SGLang report
    them through the catalogue, from the same serving model; an HPA can scale on them."""
    from gpuscale.replay.signals import AdapterView

    p = ServingProfile()
    model = ServingModel(steady(4, 120, inp=1000, out=200), profile=p)
    model.add_replica(0.0, startup_s=0.0)
    view = AdapterView(model, catalogue=load_catalogue())
    for k in range(int(90 / 0.25)):
        if k % 20 == 0:
            view.refresh(k * 0.25)
        model.advance(k * 0.25)
    view.refresh(90.0)  # NB: read now, to compare with the replica's state now
    [values] = view.latest.values()
    r = model.replicas[0]
    assert values["inference_batch_size"][0] == r.running > 0
    assert values["inference_kv_cache_usage"][0] == pytest.approx(100 * r.kv_reserved / p.kv_capacity_tokens)
    assert values["inference_prompt_tokens_per_second"][0] == pytest.approx(4 * 1000, rel=0.1)
    assert values["inference_generation_tokens_per_second"][0] == pytest.approx(4 * 200, rel=0.15)
    p50, p95 = values["inference_ttft_p50_seconds"][0], values["inference_ttft_p95_seconds"][0]
    assert p.prefill_s(1000) <= p50 <= p95 < 1.0
    out = replay(
        steady(20, 300),
        hpa("inference_kv_cache_usage", "5"),
        catalogue=load_catalogue(),
        profile=p,
        settings=ReplaySettings(startup_s=30),
    )
    assert out.max_replicas > 1 and "inference_kv_cache_usage=" in out.events[0].why
