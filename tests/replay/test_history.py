"""Metric-history mode: the CSV format and its errors, the replay through an HPA, and the CLI."""

from __future__ import annotations

import json

import pytest

from gpuscale.cli.main import main
from gpuscale.errors import ConfigError
from gpuscale.hpa import parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.metric_history import history_from_samples, parse_history_csv, promql_for, replay_history

HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: q}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm}
  minReplicas: 1
  maxReplicas: 10
  metrics:
    - type: Pods
      pods:
        metric: {name: inference_queue_depth}
        target: {type: AverageValue, averageValue: "4"}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 0}
"""


def csv_of(rows) -> str:
    return "timestamp,pod,metric,value\n" + "".join(f"{t},{p},{m},{v}\n" for t, p, m, v in rows)


def test_values_are_read_as_the_adapter_served_them():
    h = parse_history_csv(csv_of([(0, "a", "m", 1), (10, "a", "m", 2), (10, "b", "m", 5)]), source="h.csv")
    assert h.at("m", 9) == {"a": 1.0}
    assert h.at("m", 10) == {"a": 2.0, "b": 5.0}
    assert h.at("m", 10 + 301) == {}  # older than Prometheus's 5-minute staleness
    assert h.pods_at(10) == {"a", "b"} and (h.start, h.end) == (0.0, 10.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,pod,metric,value\n", "h.csv: line 1: expected the header timestamp,pod,metric,value"),
        (csv_of([(5, "a", "m", 1), (4, "a", "m", 1)]), "h.csv: line 3: timestamp goes back in time"),
        (csv_of([(5, "", "m", 1)]), "h.csv: line 2: pod is missing"),
        (csv_of([(5, "a", "m", "x")]), "h.csv: line 2: value is not a number (got 'x')"),
        (csv_of([(5, "a", "m", "nan")]), "h.csv: line 2: value must be finite"),
        ("timestamp,pod,metric,value\n", "h.csv: no samples in the history"),
    ],
)
def test_bad_histories(text, message):
    with pytest.raises(ConfigError) as err:
        parse_history_csv(text, source="h.csv")
    assert message in str(err.value)


def test_conserved_load_follows_the_hpa_replicas():
    """3 pods each with 8 waiting requests (24 in all) and a target of 4 per pod: the HPA goes to 6, and with
    the load spread over 6 replicas (4 each) it stays there."""
    samples = {"inference_queue_depth": {f"p{i}": [(float(t), 8.0) for t in range(0, 600, 15)] for i in range(3)}}
    hpa = parse_manifests(HPA, source="q.yaml")[0]
    out = replay_history(history_from_samples(samples), hpa).to_json()
    assert [(e["from"], e["to"]) for e in out["events"]] == [(3, 6)]
    assert out["timeline"][-1] == {"t": 585.0, "observed": 3, "desired": 6}
    seen = replay_history(history_from_samples(samples), hpa, conserve=False).to_json()
    # replayed as seen, the proposal is 2 × the 3 pods that reported, every time
    assert [(e["from"], e["to"]) for e in seen["events"]] == [(3, 6)] and seen["max_replicas"] == 6


def test_promql_for_catalogue_metrics():
    cat = load_catalogue()
    # Several servers' series under one name: one selector over all of them, so a pod reporting only one of
    # them keeps its value (`sum(a) + sum(b)` would keep only pods present on both sides).
    depth = cat.get("inference_queue_depth")
    assert len(depth.terms[0].series) > 1
    names = "|".join(depth.terms[0].series)
    assert promql_for(depth, window_s=60) == f'sum by (pod) ({{__name__=~"{names}"}})'
    ratio = promql_for(cat.get("inference_queue_compute_ratio"), window_s=60)
    assert ratio == (
        "(sum by (pod) (increase(nv_inference_queue_duration_us[60s]))) / "
        "clamp_min(sum by (pod) (increase(nv_inference_compute_infer_duration_us[60s])), 1)"
    )
    assert promql_for(cat.get("gpu_sm_active"), window_s=60) == "(avg by (pod) (DCGM_FI_PROF_SM_ACTIVE)) * 100"


def test_cli_history(tmp_path, capsys):
    rows = [(t, f"p{i}", "inference_queue_depth", 8) for t in range(0, 600, 15) for i in range(3)]
    history = tmp_path / "h.csv"
    history.write_text(csv_of(rows))
    manifest = tmp_path / "q.yaml"
    manifest.write_text(HPA)
    assert main(["simulate", "--history", str(history), "--hpa", str(manifest), "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mode"] == "history" and doc["results"][0]["max_replicas"] == 6
    page = tmp_path / "h.html"
    assert main(["simulate", "--history", str(history), "--hpa", str(manifest), "--html", str(page)]) == 0
    assert "observed replica-h" in capsys.readouterr().out and page.read_text().count("<svg") == 1
    assert main(["simulate", "--history", str(history), "--trace", str(history), "--hpa", str(manifest)]) == 2
    assert "give one of --trace, --history or --prometheus-url" in capsys.readouterr().err
    unknown = tmp_path / "u.yaml"
    unknown.write_text(HPA.replace("inference_queue_depth", "vram_magic"))
    assert main(["simulate", "--history", str(history), "--hpa", str(unknown)]) == 2
    assert (
        "u.yaml: spec.metrics[0].pods.metric.name: 'vram_magic' is not in the metric catalogue"
        in capsys.readouterr().err
    )


def test_every_catalogue_metric_gets_valid_promql(tmp_path):
    """promtool (Debian package prometheus) parses the expression of every shipped catalogue metric."""
    import shutil
    import subprocess

    import yaml

    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (bash .ci/setup --test)"
    cat = load_catalogue()
    rules = [{"record": f"gpuscale:{m.name}", "expr": promql_for(m, window_s=cat.window(m))} for m in cat]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "gpuscale", "rules": rules}]}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    ttft = promql_for(cat.get("inference_ttft_p95_seconds"), window_s=60)
    assert ttft.startswith("max by (pod) (histogram_quantile(0.95, sum by (pod, le) (rate({__name__=~")
    assert "vllm:time_to_first_token_seconds_bucket" in ttft
