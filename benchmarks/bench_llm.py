"""LLM serving signals at 1,000 vLLM pods: the cost of a scrape-source refresh and of histogram quantiles.

1,000 vLLM pods (the simulated vLLM 0.11 page of gpuscale.sim.exporters.llm: gauges, counters, TTFT and ITL
histograms with 22 and 20 buckets) scraped twice 60 s apart. Measured (CPU time of this process):

* refresh: parse + ingest of the second scrape + build_snapshot of the whole shipped catalogue (three
  histogram-quantile terms, five rates, gauges), i.e. everything after the bytes arrived;
  peer: prometheus_client's parser reading the same pages alone;
* quantiles: reading the TTFT p95 term (bucket increases over the window, then the quantile per series);
  peer: reading the same ``_bucket`` counters' increases without the quantile (what any rate costs).

Usage: .venv/bin/python benchmarks/bench_llm.py [--pods 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time


def pages(pods: int, *, seconds: int) -> list[str]:
    from gpuscale.sim.exporters.llm import LlmServer, LlmState, llm_rates, render_llm
    from gpuscale.sim.serving_queue import replica_queue

    out = []
    for p in range(pods):
        server = LlmServer(model=f"model-{p % 7}", max_num_seqs=64 + p % 64)
        state = LlmState(server)
        for _ in range(seconds):
            queue = replica_queue(5.0 + p % 11, capacity_rps=10.0, backlog=state.backlog, timeout_s=300)
            state.integrate(llm_rates(server, queue), 1.0)
        out.append(render_llm(state))
    return out


def main() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gpuscale.metrics.aggregation import build_snapshot
    from gpuscale.metrics.attribution import Attributor, Target
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.exposition import parse_samples
    from gpuscale.model import pod
    from gpuscale.pipeline import cyclic_gc_paused
    from gpuscale.sources.base import TermQuery
    from gpuscale.sources.scrape import ScrapeSource

    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    first, second = pages(args.pods, seconds=60), pages(args.pods, seconds=120)  # not measured
    catalogue = load_catalogue()
    urls = [f"http://10.2.{p // 250}.{p % 250}:8000/metrics" for p in range(args.pods)]
    targets = {u: Target(u, pod(f"team-{p % 20}", f"vllm-{p:05d}")) for p, u in enumerate(urls)}
    t0 = time.time() - 60
    ttft = TermQuery(("vllm:time_to_first_token_seconds",), "histogram_quantile", 60.0, quantile=0.95)
    buckets = TermQuery(("vllm:time_to_first_token_seconds_bucket",), "increase", 60.0)
    refresh, quantile, increase = [], [], []
    for _ in range(args.repeats):
        source = ScrapeSource(
            [], series=catalogue.series_names, windowed_series=catalogue.windowed_series, history_seconds=600
        )
        for url, text in zip(urls, first, strict=True):
            source.ingest(url, parse_samples(text), timestamp=t0)
        attributor = Attributor(lambda url: targets.get(url, Target(url)))
        with cyclic_gc_paused():  # as Pipeline.refresh_once runs a scrape refresh
            c0 = time.process_time()
            for url, text in zip(urls, second, strict=True):
                source.ingest(url, parse_samples(text), timestamp=t0 + 60)
            attributor.begin_refresh()
            snapshot = build_snapshot(catalogue, source.read, attributor, now=t0 + 60)
            refresh.append(time.process_time() - c0)
            c0 = time.process_time()
            values = source.read(ttft)
            quantile.append(time.process_time() - c0)
            c0 = time.process_time()
            raw = source.read(buckets)
            increase.append(time.process_time() - c0)
    with cyclic_gc_paused():
        c0 = time.process_time()
        for text in second:
            for family in text_string_to_metric_families(text):
                list(family.samples)
        peer = time.process_time() - c0
    pods_with_ttft = len([o for o in snapshot.values["inference_ttft_p95_seconds"] if o.kind == "Pod"])
    assert pods_with_ttft == args.pods and len(values) == args.pods

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    print(f"{args.pods} vLLM pods, {snapshot.series_count} series read, {len(raw)} TTFT bucket series")
    print(
        f"  refresh (parse + ingest + whole catalogue): median {med(refresh):.3f} s [best {min(refresh):.3f}]; "
        f"peer prometheus_client parsing the pages alone {peer:.3f} s ({peer / min(refresh):.1f}x gpuscale)"
    )
    print(
        f"  TTFT p95 term: median {1000 * med(quantile):.1f} ms [best {1000 * min(quantile):.1f}]; "
        f"peer: the same buckets' increases without the quantile {1000 * med(increase):.1f} ms "
        f"[{1000 * min(increase):.1f}] -> quantile costs {min(quantile) / min(increase):.2f}x a plain increase"
    )


if __name__ == "__main__":
    main()
