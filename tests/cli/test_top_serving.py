"""`gpuscale top pods` with LLM servers: the serving columns and verdict, from real fixture scrapes.

The H100 fixture's GPU 1 is held by ``nim/llama3-8b-instruct-5c6b9d8f47-qz7mh`` at 100 % GPU util but
SM_ACTIVE 0.38; the NIM fixture (60 s apart) says 2 requests wait at batch 6 with the KV cache 41 % full:
requests queue on an under-filled GPU, so the verdict is ``batch-limited``.
"""

from __future__ import annotations

from gpuscale.metrics.aggregation import build_snapshot
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.devices import DEVICE_SERIES, gpu_statuses, read_devices
from gpuscale.metrics.diagnosis import ServingCode, load_policy
from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.rollups import inference_stats, pod_statuses
from gpuscale.model import pod
from gpuscale.sources.scrape import ScrapeSource
from gpuscale.top.columns import RenderOptions
from gpuscale.top.document import GpuTopList, Scope
from gpuscale.top.render import render
from tests.helpers import FIXTURES, H100, T0

POLICY = load_policy()
NIM_POD = pod("nim", "llama3-8b-instruct-5c6b9d8f47-qz7mh")
DCGM_URL, NIM_URL = "http://10.0.0.9:9400/metrics", "http://10.0.0.17:8000/v1/metrics"


def pods():
    catalogue = load_catalogue()
    source = ScrapeSource(
        [], series=set(DEVICE_SERIES) | catalogue.series_names, windowed_series=catalogue.windowed_series
    )
    source.ingest(NIM_URL, parse_samples((FIXTURES / "llm" / "nim-llm-t0.prom").read_text()), timestamp=T0)
    source.ingest(NIM_URL, parse_samples((FIXTURES / "llm" / "nim-llm.prom").read_text()), timestamp=T0 + 60)
    source.ingest(DCGM_URL, parse_samples(H100.read_text()), timestamp=T0 + 60)
    attributor = Attributor(lambda url: Target(url, NIM_POD, None) if url == NIM_URL else Target(url))
    gpus = gpu_statuses(read_devices(source.read, attributor), POLICY)
    snapshot = build_snapshot(catalogue, source.read, attributor, now=T0 + 60)
    stats = inference_stats(snapshot.values, now=T0 + 60, max_age_seconds=60)
    return pod_statuses(gpus, POLICY, inference=stats)


def test_an_llm_pod_gets_its_serving_signals_and_verdict():
    nim = next(p for p in pods() if (p.namespace, p.name) == (NIM_POD.namespace, NIM_POD.name))
    assert nim.verdict.code == "under-filled"  # the GPU verdict: 100 % util, 38 % SM active
    assert (nim.inference.queue_depth, nim.inference.batch_size, nim.inference.kv_cache_usage) == (2, 6, 41)
    assert nim.inference.ttft_p95_seconds == 0.25 + 0.25 * 1.5 / 2
    assert nim.serving.code == ServingCode.BATCH_LIMITED


def test_the_pods_table_shows_serving_columns_only_when_a_pod_serves_an_llm():
    items = pods()
    options = RenderOptions(POLICY, scope=Scope(all_namespaces=True), width=None)
    lines = render(GpuTopList(view="pods", generated_at=T0, items=items), "table", options).lines
    header = lines[0].split()
    assert header[header.index("QUEUE") + 1 : header.index("QUEUE") + 4] == ["BATCH", "KV", "TTFT95"]
    assert header[-1] == "SERVING"
    row = next(line for line in lines if NIM_POD.name in line).split()
    assert row[header.index("BATCH")] == "6" and row[header.index("KV")] == "41%"
    assert row[header.index("TTFT95")] == "0.44s" and row[-1] == "batch-limited"
    others = [p for p in items if p.inference is None]
    plain = render(GpuTopList(view="pods", generated_at=T0, items=others), "table", options).lines[0].split()
    assert "BATCH" not in plain and "SERVING" not in plain
