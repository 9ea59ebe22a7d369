"""Simulated LLM servers: upstream exposition shapes, a load-driven state, and a fleet served over HTTP.

The format test compares each rendered page with the matching fixture in tests/fixtures/llm/ (whose
provenance is written down there): the same families, HELP and TYPE lines, and label names in the same order.
"""

from __future__ import annotations

import re

import pytest

from gpuscale.metrics.aggregation import build_snapshot
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.exposition import parse_samples
from gpuscale.model import pod
from gpuscale.sim.exporters import ManualClock, SimExporters
from gpuscale.sim.exporters.llm import LlmServer, LlmState, llm_rates, render_llm
from gpuscale.sim.gpu_nodes import SimNode
from gpuscale.sim.load import ConstantLoad
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.serving_queue import replica_queue
from gpuscale.sim.workloads import SimWorkload
from gpuscale.sources.scrape import ScrapeSource
from tests.helpers import FIXTURES

LLM = FIXTURES / "llm"
_SAMPLE = re.compile(r"^([^#\s{]+)(?:\{([^}]*)\})? ")


def shape(text: str) -> tuple[set[str], dict[str, tuple[str, ...]]]:
    """HELP/TYPE lines, and each sample name's label names in order."""
    meta = {line for line in text.splitlines() if line.startswith("#")}
    labels: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels[m.group(1)] = tuple(re.findall(r'(\w+)="', m.group(2) or ""))
    return meta, labels


def loaded_state(server: LlmServer, *, offered: float = 8.0, capacity: float = 10.0, seconds: int = 60) -> LlmState:
    state = LlmState(server)
    for _ in range(seconds):
        queue = replica_queue(offered, capacity_rps=capacity, backlog=state.backlog, timeout_s=300)
        state.integrate(llm_rates(server, queue), 1.0)
    return state


@pytest.mark.parametrize(
    ("fmt", "fixture"),
    [("vllm", "vllm-v0.11.prom"), ("sglang", "sglang.prom"), ("tgi", "tgi.prom"), ("nim", "nim-llm.prom")],
)
def test_rendered_pages_have_the_fixture_shape(fmt, fixture):
    text = render_llm(loaded_state(LlmServer(format=fmt)))
    meta, labels = shape(text)
    want_meta, want_labels = shape((LLM / fixture).read_text())
    assert meta <= want_meta, meta - want_meta
    assert labels == {k: want_labels[k] for k in labels}
    assert parse_samples(text, source=fmt)  # and the strict parser reads it


def test_load_fills_the_batch_then_the_queue_and_a_small_kv_cache_preempts():
    server = LlmServer(max_num_seqs=64, kv_cache_tokens=200_000)
    light = llm_rates(server, replica_queue(3.0, capacity_rps=10.0))
    full = llm_rates(server, replica_queue(14.0, capacity_rps=10.0, backlog=50.0, timeout_s=300))
    assert light.running < full.running == 64 and light.waiting < 1 < 50 <= full.waiting
    assert light.ttft_s < full.ttft_s and light.preemptions == full.preemptions == 0
    small = llm_rates(LlmServer(max_num_seqs=64, kv_cache_tokens=20_000), replica_queue(14.0, capacity_rps=10.0))
    assert small.kv_usage == 1.0 and small.preemptions > 0 and small.running < 64


async def test_a_vllm_fleet_served_over_http_gives_the_catalogue_its_serving_signals():
    node = SimNode.build("node-a", seed=3, instance_type="p5.48xlarge")
    scenario = Scenario(
        nodes=(node,),
        workloads=(SimWorkload("inference", "vllm-llama", replicas=2, capacity_rps=10, load=ConstantLoad(30)),),
        seed=3,
    )
    clock = ManualClock(1_000.0)
    catalogue = load_catalogue()
    exporters = SimExporters(llm={"inference/vllm-llama": LlmServer(max_num_seqs=32)})
    await exporters.start(scenario, clock=clock)
    try:
        urls = exporters.llm_urls
        assert len(urls) == 2
        pods = {o["metadata"]["name"]: o for o in exporters.kube_objects() if o["kind"] == "Pod"}
        for (_, name), port in exporters.llm_ports.items():
            assert pods[name]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
        source = ScrapeSource(
            urls.values(), series=catalogue.series_names, windowed_series=catalogue.windowed_series, clock=clock
        )
        for _ in range(2):
            clock.advance(30)
            await source.refresh(now=clock())
        await source.close()
        by_url = {url: key for key, url in urls.items()}
        attributor = Attributor(lambda url: Target(url, _pod(by_url.get(url)), "node-a"))
        snapshot = build_snapshot(catalogue, source.read, attributor, now=clock())
        key = next(iter(urls))
        state = exporters.llm_state(key)
        values = {m: snapshot.values[m][_pod(key)].value for m in snapshot.values if _pod(key) in snapshot.values[m]}
        # Offered 15/s per pod against 10/s: the batch is full and a backlog builds up.
        assert values["inference_batch_size"] == 32 == round(state.gauges.running)
        assert values["inference_queue_depth"] == round(state.gauges.waiting) > 32
        assert values["inference_requests_per_second"] == pytest.approx(10.0, rel=0.05)
        assert values["inference_generation_tokens_per_second"] == pytest.approx(2560.0, rel=0.05)
        assert 0.0 < values["inference_ttft_p50_seconds"] <= values["inference_ttft_p95_seconds"]
        assert values["inference_kv_cache_usage"] == pytest.approx(100 * state.gauges.kv_usage, abs=1e-3)
    finally:
        await exporters.stop()


def _pod(key):
    return pod(*key) if key else None
