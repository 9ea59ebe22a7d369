"""Refresh cost at 10,000 GPUs / 5,000 pods: CPU per cycle and peak RSS, Prometheus and scrape sources.

A cluster of 1,250 nodes × 8 H100s, 5,000 pods with 2 GPUs each (every pod labelled by dcgm-exporter),
and 1,000 of those pods serving two Triton models. Two sources feed the same pipeline:

* prometheus — a fake Prometheus in a child process answers every instant query with the JSON a real
  Prometheus returns for these series (all labels kept, ``instance``/``job`` added; a
  ``{__name__=~"A|B"}`` selector gets the series of every name it lists); measured: CPU time of this
  process for one ``Pipeline.refresh_once`` (HTTP, JSON decoding, attribution, aggregation, store).
* scrape — 2,250 exposition bodies already in memory (1,250 dcgm-exporter pages, 1,000 Triton pages);
  measured: parse + ingest + aggregation, i.e. everything after the bytes arrived.

The peer figure printed beside each is the cost of only decoding the same input with the standard
library (``json.loads`` of the Prometheus answers) or prometheus_client's parser (the scrape pages), so
the ratio says how much of a refresh is gpuscale's own work. Goals (issue 3): ≤ 1 s CPU per cycle and
≤ 300 MB RSS at this size from Prometheus.

Usage: .venv/bin/python benchmarks/bench_refresh.py [--cycles 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import re
import resource
import time
from collections.abc import Callable, Iterator

NODES, GPUS_PER_NODE, TRITON_PODS = 1250, 8, 1000
DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": lambda g: 40 + g * 7,
    "DCGM_FI_PROF_SM_ACTIVE": lambda g: 0.3 + g / 20,
    "DCGM_FI_PROF_SM_OCCUPANCY": lambda g: 0.2 + g / 30,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda g: 0.1 + g / 40,
    "DCGM_FI_PROF_DRAM_ACTIVE": lambda g: 0.5,
    "DCGM_FI_DEV_FB_USED": lambda g: 40000 + g,
    "DCGM_FI_DEV_FB_FREE": lambda g: 41000 - g,
    "DCGM_FI_DEV_POWER_USAGE": lambda g: 400.5 + g,
}
TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)


def gpu_labels(n: int, g: int) -> dict[str, str]:
    pod = (n * GPUS_PER_NODE + g) // 2
    return {
        "gpu": str(g),
        "UUID": f"GPU-{n:05d}-{g}",
        "pci_bus_id": f"00000000:{g:02X}:00.0",
        "device": f"nvidia{g}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": f"node-{n:05d}",
        "DCGM_FI_DRIVER_VERSION": "580.95.05",
        "container": "main",
        "namespace": f"team-{pod % 50}",
        "pod": f"pod-{pod:05d}",
        "pod_uid": "",
    }


def triton_labels(p: int) -> list[dict[str, str]]:
    return [
        {"model": m, "version": "1", "pod": f"pod-{p:05d}", "namespace": f"team-{p % 50}"} for m in ("bert", "resnet")
    ]


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def scrape_pages(t: float) -> tuple[list[str], list[str]]:
    dcgm = []
    for n in range(NODES):
        lines = []
        for field, f in DCGM_FIELDS.items():
            lines.append(f"# HELP {field} x\n# TYPE {field} gauge")
            lines += [f"{field}{{{_label_text(gpu_labels(n, g))}}} {f(g)}" for g in range(GPUS_PER_NODE)]
        dcgm.append("\n".join(lines) + "\n")
    triton = []
    for _ in range(TRITON_PODS):
        lines = []
        for c in TRITON_COUNTERS:
            lines.append(f"# HELP {c} x\n# TYPE {c} counter")
            lines += [f'{c}{{model="{m}",version="1"}} {int(t * 1000) + i}' for i, m in enumerate(("bert", "r"))]
        lines.append("# HELP nv_inference_pending_request_count x\n# TYPE nv_inference_pending_request_count gauge")
        lines += [f'nv_inference_pending_request_count{{model="{m}",version="1"}} 3' for m in ("bert", "r")]
        triton.append("\n".join(lines) + "\n")
    return dcgm, triton


def prometheus_answers() -> dict[str, bytes]:
    """Series name → the JSON body of an instant query selecting it."""
    now = time.time()
    out = {}
    for field, f in DCGM_FIELDS.items():
        result = [
            {
                "metric": {
                    "__name__": field,
                    **gpu_labels(n, g),
                    "instance": f"10.0.{n // 250}.{n % 250}:9400",
                    "job": "dcgm-exporter",
                },
                "value": [now, str(f(g))],
            }
            for n in range(NODES)
            for g in range(GPUS_PER_NODE)
        ]
        out[field] = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    for name in (*TRITON_COUNTERS, "nv_inference_pending_request_count"):
        result = [
            {
                "metric": {**labels, "instance": f"10.1.{p // 250}.{p % 250}:8002", "job": "triton"},
                "value": [now, "12.5"],
            }
            for p in range(TRITON_PODS)
            for labels in triton_labels(p)
        ]
        out[name] = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
    return out


def _fake_prometheus(queue: mp.Queue) -> None:

    answers = prometheus_answers()
    names = sorted(answers, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(n) for n in names))
    combined: dict[str, bytes] = {}

    def answer(promql: str) -> bytes:
        # NB: a {__name__=~"A|B"} selector returns the series of every name, as Prometheus does; answering
        # it with A's alone would make the benchmark decode less than a real server sends.
        regex = re.search(r'__name__=~"([^"]*)"', promql)
        if regex:
            if promql not in combined:
                parts = [json.loads(answers[n]) for n in regex.group(1).split("|") if n in answers]
                result = [item for part in parts for item in part["data"]["result"]]
                combined[promql] = json.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": result}}
                ).encode()
            return combined[promql]
        m = pattern.search(promql)
        return answers[m.group(0)] if m else b'{"status":"success","data":{"resultType":"vector","result":[]}}'

    serve_instant_queries(answer, queue)


def serve_instant_queries(answer: Callable[[str], bytes], queue: mp.Queue) -> None:
    """Answer ``POST /api/v1/query`` with ``answer(promql)`` on a free loopback port, put on ``queue``; forever."""
    from aiohttp import web

    async def query(request: web.Request) -> web.Response:
        form = await request.post()
        return web.Response(body=answer(str(form.get("query", ""))), content_type="application/json")

    async def main() -> None:
        app = web.Application(client_max_size=1 << 22)
        app.router.add_post("/api/v1/query", query)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        queue.put(site._server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def bench_prometheus(port: int, cycles: int) -> None:
    from gpuscale.metrics.aggregation import queries
    from gpuscale.metrics.attribution import Attributor, Target
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.store import MetricsStore
    from gpuscale.pipeline import Pipeline
    from gpuscale.sources.prometheus import PrometheusSource

    catalogue = load_catalogue()
    source = PrometheusSource(f"http://127.0.0.1:{port}", queries=queries(catalogue), timeout_seconds=60)
    store = MetricsStore()
    pipeline = Pipeline(catalogue, source, store, Attributor(Target))
    cpu = []
    for _ in range(cycles):
        c0 = time.process_time()
        snapshot = await pipeline.refresh_once()
        cpu.append(time.process_time() - c0)
    await source.close()
    peak = rss_mb()  # before the peer below builds its own copy of the answers
    answers = prometheus_answers()
    from gpuscale.pipeline import cyclic_gc_paused

    with cyclic_gc_paused():  # NB: as the refresh runs, so the peer is measured under the same conditions
        c0 = time.process_time()
        for body in answers.values():
            json.loads(body)
        # NB: scaled to the queries that get series (a series the fake server does not hold, e.g. the LLM
        # servers' names at this DCGM + Triton cluster, comes back empty and costs no decoding).
        answered = sum(1 for q in source.promql if any(name in q for name in answers))
        peer = (time.process_time() - c0) * (answered / len(answers))
    health = source.health()[0]
    assert health.healthy, health.error
    pods = len(store.objects("gpu_utilization", "Pod"))
    print(
        f"prometheus: {len(source.promql)} queries/refresh, {snapshot.series_count} series, "
        f"{snapshot.device_count} GPUs, {pods} pods"
    )
    print(
        f"  refresh CPU: median {sorted(cpu)[len(cpu) // 2]:.3f} s (min {min(cpu):.3f}) per cycle "
        f"[goal <= 1 s]; peak RSS {peak:.0f} MB [goal <= 300 MB]"
    )
    print(
        f"  peer: json.loads of the same answers alone {peer:.3f} s -> gpuscale's refresh is "
        f"{min(cpu) / peer:.1f}x that"
    )


def bench_scrape(cycles: int) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from gpuscale.metrics.aggregation import build_snapshot
    from gpuscale.metrics.attribution import Attributor, Target
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.exposition import parse_samples
    from gpuscale.model import pod
    from gpuscale.pipeline import cyclic_gc_paused
    from gpuscale.sources.scrape import ScrapeSource

    catalogue = load_catalogue()
    source = ScrapeSource(
        [], series=catalogue.series_names, windowed_series=catalogue.windowed_series, history_seconds=600
    )
    pods = {
        f"http://10.1.0.{p}:8002/metrics": Target(
            f"http://10.1.0.{p}:8002/metrics", pod(f"team-{p % 50}", f"pod-{p:05d}")
        )
        for p in range(TRITON_PODS)
    }
    attributor = Attributor(lambda url: pods.get(url, Target(url)))
    cpu = []
    t = time.time() - 10 * cycles
    for cycle in range(cycles):
        dcgm, triton = scrape_pages(t + 10 * cycle)  # generating the pages is not measured
        with cyclic_gc_paused():  # as Pipeline.refresh_once runs a scrape refresh
            c0 = time.process_time()
            for n, text in enumerate(dcgm):
                source.ingest(f"http://10.0.0.{n}:9400/metrics", parse_samples(text), timestamp=t + 10 * cycle)
            for p, text in enumerate(triton):
                source.ingest(f"http://10.1.0.{p}:8002/metrics", parse_samples(text), timestamp=t + 10 * cycle)
            attributor.begin_refresh()
            snapshot = build_snapshot(catalogue, source.read, attributor, now=t + 10 * cycle)
            cpu.append(time.process_time() - c0)
    with cyclic_gc_paused():
        c0 = time.process_time()
        for text in dcgm + triton:
            for family in text_string_to_metric_families(text):
                list(family.samples)
        peer = time.process_time() - c0
    print(f"scrape: {len(dcgm) + len(triton)} pages, {snapshot.series_count} series, {snapshot.device_count} GPUs")
    print(
        f"  parse+ingest+aggregate CPU: median {sorted(cpu)[len(cpu) // 2]:.3f} s (min {min(cpu):.3f}); "
        f"peer: prometheus_client parsing the same pages alone {peer:.3f} s "
        f"({peer / min(cpu):.1f}x gpuscale's whole refresh)"
    )


@contextlib.contextmanager
def fake_prometheus() -> Iterator[int]:
    """The fake Prometheus in a child process, for as long as the block runs; yields its port."""
    queue: mp.Queue = mp.Queue()
    child = mp.Process(target=_fake_prometheus, args=(queue,), daemon=True)
    child.start()
    try:
        yield queue.get(timeout=120)
    finally:
        child.terminate()
        child.join(5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    with fake_prometheus() as port:
        asyncio.run(bench_prometheus(port, args.cycles))
    bench_scrape(args.cycles)
    print(f"peak RSS of this process after both: {rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
