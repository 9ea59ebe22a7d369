"""The shipped example HPAs hold the SLO on a held-out replay, at no more GPU-hours than a tuned util HPA (issue 34).

benchmarks/examples_vs_naive.py tuned the examples and a naive ``gpu_utilization`` HPA with the same search on
the Azure LLM traces ×3; docs/examples.md has its full table. Here one held-out case of it is replayed (the
demo's 30-minute slice of the conversation trace ×4, from 4 ready replicas, as the benchmark does; a few
seconds): every shipped LLM example must meet the SLO (p95 queue time ≤ 2 s in all but one minute in twenty)
with no more GPU-hours than the naive HPA as the search tuned it, given the example's min/max. And the demo's
HPA must not saw-tooth: no replicas given back that are asked for again later, on the demo's load as
`gpuscale simulate` replays it (the issue saw 6 → 3 replicas with 175 requests queued, then back to 6).
"""

from __future__ import annotations

import copy
import math
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from gpuscale.hpa import parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.results import Outcome
from gpuscale.replay.serving import ServingProfile
from gpuscale.replay.trace_replay import ReplaySettings, replay
from gpuscale.replay.traces import Trace, read_trace

ROOT = Path(__file__).parents[2]
SLICE = ROOT / "gpuscale" / "replay" / "data" / "azure-conv-15-45min.csv.gz"
DEMO = ROOT / "gpuscale" / "replay" / "data" / "demo-hpa.yaml"
EXAMPLES = [
    ROOT / "deploy" / "examples" / "vllm-hpa.yaml",
    ROOT / "deploy" / "examples" / "llm-hpa.yaml",
    ROOT / "deploy" / "examples" / "triton-hpa.yaml",
    DEMO,
]
# The naive HPA as benchmarks/examples_vs_naive.py tuned it (docs/examples.md says the same; checked below)
NAIVE_TARGET = "70"
NAIVE_SCALE_DOWN = {"stabilizationWindowSeconds": 600, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]}


@cache
def demo_load(scale: float) -> Trace:
    return read_trace(SLICE).scaled(scale, seed=0)


def replayed(doc: dict, *, scale: float = 4.0, initial_replicas: int | None = 4) -> Outcome:
    hpa = parse_manifests(yaml.safe_dump(doc), source=doc["metadata"]["name"])[0]
    settings = ReplaySettings(initial_replicas=initial_replicas)
    return replay(demo_load(scale), hpa, catalogue=load_catalogue(), profile=ServingProfile(), settings=settings)


@cache
def naive(min_replicas: int, max_replicas: int) -> Outcome:
    doc = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "naive-gpu-util"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "gpu_utilization"},
                        "target": {"type": "AverageValue", "averageValue": NAIVE_TARGET},
                    },
                }
            ],
            "behavior": {"scaleDown": copy.deepcopy(NAIVE_SCALE_DOWN)},
        },
    }
    return replayed(doc)


def largest_drop_and_recover(desired: list[int]) -> int:
    """Replicas given back and later asked for again: max over i < j < k of min(d[i], d[k]) − d[j]."""
    worst = 0
    for j, low in enumerate(desired):
        before, after = max(desired[: j + 1]), max(desired[j:])
        worst = max(worst, min(before, after) - low)
    return worst


def test_the_saw_tooth_measure_sees_one():
    assert largest_drop_and_recover([1, 6, 6, 3, 3, 6, 6]) == 3
    assert largest_drop_and_recover([1, 4, 8, 8, 7, 6, 5]) == 0  # a scale-down at the end is not a saw-tooth
    assert largest_drop_and_recover([2, 4, 3, 4, 4]) == 1


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_meets_the_slo_at_no_more_gpu_hours_than_the_tuned_naive_hpa(path):
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    out = replayed(doc).to_json()
    base = naive(doc["spec"].get("minReplicas", 1), doc["spec"]["maxReplicas"]).to_json()
    slo = out["slo"]
    assert slo["violating_minutes"] <= math.ceil(slo["minutes"] / 20), (path.name, slo, out["queue_time_s"])
    assert out["gpu_hours"] <= base["gpu_hours"], (path.name, out["gpu_hours"], base["gpu_hours"], base["slo"])


@pytest.mark.parametrize("initial_replicas", [1, 4])
def test_the_demo_hpa_does_not_saw_tooth_on_the_demo_load(initial_replicas):
    """From the demo's 1 replica (simulate's default: the issue's run) and from 4; at most one replica of jitter."""
    out = replayed(yaml.safe_load(DEMO.read_text(encoding="utf-8")), initial_replicas=initial_replicas).to_json()
    desired = [s["desired"] for s in out["timeline"]]
    assert largest_drop_and_recover(desired) <= 1, desired


def test_the_readme_hpa_is_the_vllm_example():
    """README shows deploy/examples/vllm-hpa.yaml's spec, so the table in docs/examples.md is about it too."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?kind: HorizontalPodAutoscaler.*?)```", readme, re.DOTALL)
    assert block, "README has no HPA snippet"
    shown = yaml.safe_load(block.group(1))
    shipped = yaml.safe_load(EXAMPLES[0].read_text(encoding="utf-8"))
    assert shown["spec"] == shipped["spec"]


def test_docs_state_the_naive_hpa_the_test_replays():
    text = (ROOT / "docs" / "examples.md").read_text(encoding="utf-8")
    assert f"`gpu_utilization` {NAIVE_TARGET}" in text
