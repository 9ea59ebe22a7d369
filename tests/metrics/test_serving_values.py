"""LLM serving signals (vLLM, SGLang, TGI, NIM) through the real pipeline, from fixture scrapes 60 s apart.

Expected values are computed by hand from the increases written in tests/fixtures/README.md ("llm/*.prom"),
not from the fixture files: the fixtures encode the increases, the tests restate them.
"""

from __future__ import annotations

import pytest

from gpuscale.adapter.provider import MetricsProvider
from gpuscale.metrics.aggregation import finish_parts
from gpuscale.metrics.attribution import Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.model import namespace, pod
from gpuscale.selectors import LabelSelector
from tests.helpers import FIXTURES, T0, fixture_store

LLM = FIXTURES / "llm"
URL = "http://10.42.0.5:8000/metrics"
POD = pod("inference", "llm-7c9d5b8f6-k2x9p")


def serving(name: str, *, t0: bool = True):
    scrapes = [(URL, LLM / f"{name}.prom", T0 + 60)]
    if t0:
        scrapes.insert(0, (URL, LLM / f"{name}-t0.prom", T0))
    return fixture_store(scrapes, targets={URL: Target(URL, POD, "node-a")})


def value(store, metric):
    point = store.point(metric, POD)
    assert point is not None and not point.stale, metric
    return point.value


def test_vllm_v1_two_engines():
    store = serving("vllm-v0.11")
    assert value(store, "inference_queue_depth") == 7 + 5  # summed over data-parallel engines
    assert value(store, "inference_batch_size") == 48 + 40
    assert value(store, "inference_kv_cache_usage") == pytest.approx(81.25)  # the fuller engine, percent
    # TTFT: engine 0's window has 200 requests (rank 190 falls 10/16 into (0.25, 0.5]); engine 1's p95 is 0.055.
    assert value(store, "inference_ttft_p95_seconds") == pytest.approx(0.25 + 0.25 * 10 / 16)
    assert value(store, "inference_ttft_p50_seconds") == pytest.approx(0.08 + 0.02 * 10 / 50)
    # ITL: 24,000 tokens; rank 22,800 falls 800/1,500 into (0.05, 0.075]. The deprecated alias carries the same.
    assert value(store, "inference_itl_p95_seconds") == pytest.approx(0.05 + 0.025 * 800 / 1500)
    assert value(store, "inference_prompt_tokens_per_second") == pytest.approx((96000 + 24000) / 60)
    assert value(store, "inference_generation_tokens_per_second") == pytest.approx((24200 + 6000) / 60)
    assert value(store, "inference_requests_per_second") == pytest.approx((150 + 50 + 100) / 60)
    assert value(store, "inference_preemptions_per_second") == pytest.approx(30 / 60)
    assert store.point("inference_ttft_p95_seconds", POD).window_seconds == 60


def test_vllm_before_the_kv_cache_rename():
    store = serving("vllm-v0.8", t0=False)
    assert value(store, "inference_kv_cache_usage") == pytest.approx(25.0)  # vllm:gpu_cache_usage_perc
    assert value(store, "inference_queue_depth") == 0 and value(store, "inference_batch_size") == 3
    assert store.point("inference_ttft_p95_seconds", POD) is None  # one scrape: no window, no value (not 0)


def test_sglang():
    store = serving("sglang")
    assert value(store, "inference_queue_depth") == 4 and value(store, "inference_batch_size") == 20
    assert value(store, "inference_kv_cache_usage") == pytest.approx(93.0)
    assert value(store, "inference_ttft_p95_seconds") == pytest.approx(0.75 + 0.25 * 2.5 / 5)
    assert value(store, "inference_ttft_p50_seconds") == pytest.approx(0.25 + 0.25 * 15 / 20)
    assert value(store, "inference_itl_p95_seconds") == pytest.approx(0.03 + 0.01 * 50 / 100)
    assert value(store, "inference_prompt_tokens_per_second") == pytest.approx(500)
    assert value(store, "inference_generation_tokens_per_second") == pytest.approx(200)
    assert value(store, "inference_requests_per_second") == pytest.approx(50 / 60)
    assert value(store, "inference_preemptions_per_second") == pytest.approx(12 / 60)  # retracted requests


def test_tgi_has_queue_batch_and_tokens_but_no_kv_cache_or_ttft():
    store = serving("tgi")
    assert value(store, "inference_queue_depth") == 9 and value(store, "inference_batch_size") == 32
    assert value(store, "inference_requests_per_second") == pytest.approx(120 / 60)
    assert value(store, "inference_prompt_tokens_per_second") == pytest.approx(60000 / 60)  # input_length _sum
    assert value(store, "inference_generation_tokens_per_second") == pytest.approx(18000 / 60)
    for metric in ("inference_kv_cache_usage", "inference_ttft_p95_seconds", "inference_preemptions_per_second"):
        assert store.point(metric, POD) is None, metric


def test_nim_unprefixed_names():
    store = serving("nim-llm")
    assert value(store, "inference_queue_depth") == 2 and value(store, "inference_batch_size") == 6
    assert value(store, "inference_kv_cache_usage") == pytest.approx(41.0)
    assert value(store, "inference_ttft_p95_seconds") == pytest.approx(0.25 + 0.25 * 1.5 / 2)
    assert value(store, "inference_itl_p95_seconds") == pytest.approx(0.025 + 0.025 * 1840.5 / 1990)
    assert value(store, "inference_prompt_tokens_per_second") == pytest.approx(100)
    assert value(store, "inference_requests_per_second") == pytest.approx(10 / 60)


def test_per_model_and_engine_labels_stay_for_external_metrics():
    store = serving("vllm-v0.11")
    catalogue = load_catalogue()
    parts = store.parts("inference_ttft_p95_seconds", namespace("inference"))
    engine1 = [p for p in parts if dict(p.labels).get("engine") == "1"]
    assert {dict(p.labels)["model_name"] for p in parts} == {"meta-llama/Llama-3.1-8B-Instruct"}
    point = finish_parts(catalogue.get("inference_ttft_p95_seconds"), engine1)
    assert point.value == pytest.approx(0.04 + 0.02 * 15 / 20)  # engine 1 alone: rank 95 in (0.04, 0.06]
    queue = store.parts("inference_queue_depth", namespace("inference"))
    assert finish_parts(catalogue.get("inference_queue_depth"), queue).value == 12


def test_an_external_metric_selects_one_of_several_models_served_by_one_pod(tmp_path):
    """A pod serving two models (served names without '/', as label selectors require) → one model's queue."""
    text = (LLM / "vllm-v0.8.prom").read_text()
    two = text + "".join(
        line.replace("mistralai/Mistral-7B-Instruct-v0.3", "phi-3-mini").replace(" 0.0", " 6.0") + "\n"
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_waiting{")
    )
    (tmp_path / "two.prom").write_text(two.replace("mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"))
    store = fixture_store([(URL, tmp_path / "two.prom", T0)], targets={URL: Target(URL, POD, "node-a")})
    provider = MetricsProvider(load_catalogue(), store, None, clock=lambda: T0 + 1)
    assert value(store, "inference_queue_depth") == 0 + 6
    (item,) = provider.external("inference", "inference_queue_depth", LabelSelector.parse("model_name=phi-3-mini"))
    assert item.point.value == 6 and item.labels == {"model_name": "phi-3-mini"}
    (item,) = provider.external("inference", "inference_queue_depth", LabelSelector.parse("model_name=mistral-7b"))
    assert item.point.value == 0
