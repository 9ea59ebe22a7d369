"""End to end: gpuscale's histogram quantiles against a real Prometheus's ``histogram_quantile``.

1. The algorithm, exactly: Prometheus scrapes the vLLM and SGLang fixture pages (served unchanged); for each
   histogram and several quantiles, ``histogram_quantile(q, X_bucket)`` must equal
   ``metrics.histograms.bucket_quantile`` on the same buckets, series by series.
2. The catalogue term over a window, live: a simulated vLLM fleet under constant load is scraped by Prometheus
   and by the embedded scrape source; the TTFT p95 term read through the Prometheus source (which sends
   ``histogram_quantile(0.95, rate(X_bucket[5s]))``) agrees with the scrape source's own computation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.histograms import bucket_quantile
from gpuscale.sim.exporters import ExporterServer, SimExporters
from gpuscale.sim.exporters.llm import LlmServer
from gpuscale.sim.gpu_nodes import SimNode
from gpuscale.sim.load import ConstantLoad
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.workloads import SimWorkload
from gpuscale.sources.base import TermQuery
from gpuscale.sources.prometheus import PrometheusSource
from gpuscale.sources.scrape import ScrapeSource
from tests.e2e.backends import Backends, static_job
from tests.helpers import FIXTURES

pytestmark = [pytest.mark.e2e]

HISTOGRAMS = {
    "vllm-v0.11.prom": ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"),
    "sglang.prom": ("sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds"),
}
QUANTILES = (0.01, 0.5, 0.9, 0.95, 0.99)
WINDOW = 5


def expected(text: str, name: str, q: float) -> dict[tuple, float]:
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for s in parse_samples(text):
        if s.name == f"{name}_bucket":
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            groups.setdefault(key, []).append((float(s.labels["le"]), s.value))
    return {key: bucket_quantile(q, buckets) for key, buckets in groups.items()}


async def test_bucket_quantile_equals_prometheus_histogram_quantile(tmp_path):
    server = ExporterServer()
    await server.start()
    try:
        texts = {f: (FIXTURES / "llm" / f).read_text() for f in HISTOGRAMS}
        for f, text in texts.items():
            await server.add(f, lambda text=text: text)
        async with Backends(tmp_path) as backends:
            prom = await backends.prometheus([static_job("fixtures", [server.url(f) for f in texts])])
            await prom.wait_ready(targets=len(texts))  # NB: `up` lands with the first scrape's samples
            compared = 0
            for f, names in HISTOGRAMS.items():
                for name in names:
                    for q in QUANTILES:
                        want = expected(texts[f], name, q)
                        got = {
                            tuple(
                                sorted((k, v) for k, v in r["metric"].items() if k not in ("instance", "job"))
                            ): float(r["value"][1])
                            for r in await prom.query(f"histogram_quantile({q}, {name}_bucket)")
                        }
                        assert got.keys() == want.keys(), (name, q)
                        for key, value in want.items():
                            assert got[key] == pytest.approx(value, rel=1e-12), (name, q, key)
                            compared += 1
            assert compared == 2 * 2 * len(QUANTILES) + 2 * 1 * len(QUANTILES)  # vLLM: 2 engines; SGLang: 1
    finally:
        await server.stop()


async def test_the_ttft_term_through_prometheus_agrees_with_the_scrape_source(tmp_path):
    node = SimNode.build("node-a", seed=5, instance_type="p5.48xlarge")
    scenario = Scenario(
        nodes=(node,),
        workloads=(SimWorkload("inference", "vllm", replicas=2, capacity_rps=100, load=ConstantLoad(160)),),
        seed=5,
    )
    term = TermQuery(
        series=("vllm:time_to_first_token_seconds",), input="histogram_quantile", window_seconds=WINDOW, quantile=0.95
    )
    exporters = SimExporters(llm={"inference/vllm": LlmServer(max_num_seqs=64)})
    await exporters.start(scenario, clock=time.time)
    scrape = ScrapeSource(
        exporters.llm_urls.values(),
        series={"vllm:time_to_first_token_seconds_bucket"},
        windowed_series={"vllm:time_to_first_token_seconds_bucket"},
        history_seconds=WINDOW + 5,
    )
    try:
        async with Backends(tmp_path) as backends:
            prom = await backends.prometheus([static_job("vllm", list(exporters.llm_urls.values()))])
            source = PrometheusSource(prom.url, queries=[term], timeout_seconds=5)
            try:
                await prom.wait_ready(targets=2, series="vllm:time_to_first_token_seconds_bucket")
                # A whole window of samples after the counters started (else rate() extrapolates towards zero).
                promql = f"min(count_over_time(vllm:time_to_first_token_seconds_count[2s] offset {WINDOW}s))"
                deadline = time.monotonic() + 30
                while True:
                    await scrape.refresh(now=time.time())
                    spans = [v.window_seconds or 0.0 for v in scrape.read(term)]
                    count = await prom.scalar(promql)
                    if count is not None and count >= 1 and len(spans) == 2 and min(spans) >= WINDOW - 1.5:
                        break
                    assert time.monotonic() < deadline, (count, spans)
                    await asyncio.sleep(1.0)
                await source.refresh(now=time.time())
                from_prometheus = {v.labels["instance"]: v.value for v in source.read(term)}
                from_scrape = {v.target.split("//")[1].split("/")[0]: v.value for v in scrape.read(term)}
            finally:
                await source.close()
        assert from_prometheus.keys() == from_scrape.keys() and len(from_scrape) == 2
        for instance, value in from_scrape.items():
            assert 0 < value < 10
            # NB: constant load gives a constant latency spread, so two 5 s windows ending ~1 s apart agree;
            # what is left is whole-observation rounding of the simulated buckets and Prometheus' extrapolation.
            assert from_prometheus[instance] == pytest.approx(value, rel=0.03), instance
    finally:
        with contextlib.suppress(Exception):
            await scrape.close()
        await exporters.stop()
