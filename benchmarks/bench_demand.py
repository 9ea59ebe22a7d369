"""Refresh cost with demand-driven refresh: it follows the HPAs, not the fleet (issue 21 item 3).

Two fleets, 10,000 and 100,000 GPUs (8 per node, 2 per pod, eight DCGM fields each, as benchmarks/
bench_refresh.py), and the same 300 HorizontalPodAutoscalers in both: one per namespace ``hpa-0`` … ``hpa-299``,
each over 10 pods (6,000 GPUs in all), 200 of them on ``gpu_utilization`` and 100 on ``gpu_sm_active``. The rest
of each fleet runs in 50-pod ``batch-N`` namespaces no HPA names.

For each fleet, in a fresh child process (so peak RSS is that configuration's alone), the adapter's refresh
(``Pipeline.refresh_once``: PrometheusSource HTTP + JSON decode, attribution, aggregation, store swap) is run:

* **demand** — the scopes come from the 300 HPA objects through ``metrics.refresh_scope.references`` and ``Demand``,
  exactly as the adapter's HPA cache feeds them; the source sends the namespace-filtered PromQL;
* **full** — the peer: every catalogue term for every GPU, as with ``--no-demand-driven`` (and as before).

The Prometheus is a fake in another child process that answers an instant query with the JSON a real
Prometheus returns for these series, honouring the namespace matchers the demand-driven PromQL carries (its own
CPU is not counted). Measured: CPU seconds of the refreshing process per cycle (median) and its peak RSS;
for demand, also the wall time of the refresh that a first request for a metric no HPA names waits for
(``1st req s``: gpu_memory_used_bytes in the 50-pod namespace batch-0, HTTP aside).
Goal: the demand figures stay flat from 10 k to 100 k GPUs while the full ones grow with the fleet.

Usage: .venv/bin/python benchmarks/bench_demand.py [--cycles 3] [--fleets 10000,100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import re
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_refresh import DCGM_FIELDS, serve_instant_queries

GPUS_PER_NODE, GPUS_PER_POD = 8, 2
HPAS, PODS_PER_HPA, BATCH_PODS_PER_NAMESPACE = 300, 10, 50
EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def namespace_of(p: int) -> str:
    """Pod p's namespace: the first HPAS × PODS_PER_HPA pods belong to the HPAs' namespaces."""
    if p < HPAS * PODS_PER_HPA:
        return f"hpa-{p // PODS_PER_HPA}"
    return f"batch-{(p - HPAS * PODS_PER_HPA) // BATCH_PODS_PER_NAMESPACE}"


def fleet(gpus: int) -> list[dict[str, str]]:
    """Every GPU's labels (dcgm-exporter's, with the instance/job Prometheus adds)."""
    out = []
    for i in range(gpus):
        n, g, p = i // GPUS_PER_NODE, i % GPUS_PER_NODE, i // GPUS_PER_POD
        out.append(
            {
                "gpu": str(g),
                "UUID": f"GPU-{n:06d}-{g}",
                "pci_bus_id": f"00000000:{g:02X}:00.0",
                "device": f"nvidia{g}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": f"node-{n:06d}",
                "DCGM_FI_DRIVER_VERSION": "580.95.05",
                "container": "main",
                "namespace": namespace_of(p),
                "pod": f"pod-{p:06d}",
                "pod_uid": "",
                "instance": f"10.{n // 62500}.{n // 250 % 250}.{n % 250}:9400",
                "job": "dcgm-exporter",
            }
        )
    return out


def hpas() -> list[dict]:
    out = []
    for i in range(HPAS):
        metric = "gpu_utilization" if i % 3 else "gpu_sm_active"
        out.append(
            {
                "metadata": {"namespace": f"hpa-{i}", "name": "llm"},
                "spec": {"metrics": [{"type": "Pods", "pods": {"metric": {"name": metric}}}]},
            }
        )
    return out


def _fake_prometheus(gpus: int, queue: mp.Queue) -> None:  # the child process
    labels = fleet(gpus)
    by_namespace: dict[str, list[int]] = {}
    for i, gpu in enumerate(labels):
        by_namespace.setdefault(gpu["namespace"], []).append(i)
    # NB: bodies carry a placeholder time, replaced by the time of each answer: a fake that outlives max-age (60 s)
    # must not serve stale samples (bench_hpa_latency.py runs adapters against it for minutes)
    stamp = 1234567890.125
    names = sorted(DCGM_FIELDS, key=len, reverse=True)
    name_pattern = re.compile("|".join(re.escape(n) for n in names))
    # NB: the demand-driven PromQL's workload alternative for plain pod/namespace labels (sources/prometheus.py)
    namespaces_pattern = re.compile(r'pod!="",namespace=~?"([^"]*)"')
    full: dict[str, bytes] = {}

    def body(name: str, indices: list[int] | range) -> bytes:
        f = DCGM_FIELDS[name]
        result = [
            {"metric": {"__name__": name, **labels[i]}, "value": [stamp, str(f(i % GPUS_PER_NODE))]} for i in indices
        ]
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    def answer(promql: str) -> bytes:
        return unstamped(promql).replace(b"1234567890.125", f"{time.time():.3f}".encode())

    def unstamped(promql: str) -> bytes:
        m = name_pattern.search(promql)
        if m is None:
            return EMPTY
        name = m.group(0)
        filtered = namespaces_pattern.search(promql)
        if filtered is None:
            if name not in full:  # NB: the whole fleet's answer, made once (its making is not what is measured)
                full[name] = body(name, range(len(labels)))
            return full[name]
        wanted = filtered.group(1).split("|")
        return body(name, [i for ns in wanted for i in by_namespace.get(ns, ())])

    serve_instant_queries(answer, queue)


def _refresh(port: int, mode: str, cycles: int, results: mp.Queue) -> None:  # the child process
    async def run() -> dict:
        from gpuscale.metrics.aggregation import queries
        from gpuscale.metrics.attribution import Attributor, Target
        from gpuscale.metrics.catalogue import load_catalogue
        from gpuscale.metrics.refresh_scope import Demand, references
        from gpuscale.metrics.store import MetricsStore
        from gpuscale.pipeline import Pipeline
        from gpuscale.sources.prometheus import PrometheusSource

        catalogue = load_catalogue()
        source = PrometheusSource(url=f"http://127.0.0.1:{port}", queries=queries(catalogue), timeout_seconds=120)
        before = None
        if mode == "demand":
            demand = Demand(catalogue)

            def before() -> None:
                demand.set_referenced({s for h in hpas() for s in references(h)}, now=time.time())
                source.set_scope(demand.begin(now=time.time()))

        pipeline = Pipeline(catalogue, source, MetricsStore(), Attributor(Target), before_refresh=before)
        cpu, wall = [], []
        for _ in range(cycles):
            c0, w0 = time.process_time(), time.perf_counter()
            snapshot = await pipeline.refresh_once()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        health = source.health()[0]
        assert health.healthy, health.error
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        sent = len(source.promql)
        first = None
        if mode == "demand":
            # What a first request for a metric no HPA names waits for (HTTP aside): the next refresh, which
            # now fetches it too — gpu_memory_used_bytes (DCGM_FI_DEV_FB_USED) of the 50 pods of batch-0.
            assert not demand.note_request("gpu_memory_used_bytes", "batch-0", now=time.time())
            w0 = time.perf_counter()
            await pipeline.refresh_once()
            first = time.perf_counter() - w0
            assert pipeline.store.objects("gpu_memory_used_bytes", "Pod")
        await source.close()
        return {
            "cpu": sorted(cpu)[len(cpu) // 2],
            "wall": sorted(wall)[len(wall) // 2],
            "rss_mb": rss,
            "first_request_s": first,
            "series": snapshot.series_count,
            "gpus": snapshot.device_count,
            "queries": sent,
            "pods": len(pipeline.store.objects("gpu_utilization", "Pod"))
            + len(pipeline.store.objects("gpu_sm_active", "Pod")),
        }

    results.put(asyncio.run(run()))


def measure(gpus: int, cycles: int) -> dict[str, dict]:
    ctx = mp.get_context("spawn")
    ports: mp.Queue = ctx.Queue()
    server = ctx.Process(target=_fake_prometheus, args=(gpus, ports), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=600)
        out = {}
        for mode in ("demand", "full"):
            results: mp.Queue = ctx.Queue()
            child = ctx.Process(target=_refresh, args=(port, mode, cycles, results))
            child.start()
            out[mode] = results.get(timeout=1800)
            child.join(60)
        return out
    finally:
        server.terminate()
        server.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--fleets", default="10000,100000", help="fleet sizes in GPUs, comma-separated")
    args = parser.parse_args()
    print(f"{HPAS} HPAs over {HPAS * PODS_PER_HPA} pods ({HPAS * PODS_PER_HPA * GPUS_PER_POD} GPUs); median of "
          f"{args.cycles} refreshes each")  # fmt: skip
    header = (f"{'fleet GPUs':>10} {'mode':>7} {'queries':>7} {'series':>8} {'pods':>6} {'CPU s/refresh':>13} "
              f"{'wall s':>7} {'peak RSS MB':>11} {'1st req s':>9}")  # fmt: skip
    print(header)
    rows = {}
    for gpus in (int(x) for x in args.fleets.split(",")):
        rows[gpus] = measure(gpus, args.cycles)
        for mode, r in rows[gpus].items():
            first = f"{r['first_request_s']:>9.2f}" if r["first_request_s"] is not None else f"{'':>9}"
            print(f"{gpus:>10} {mode:>7} {r['queries']:>7} {r['series']:>8} {r['pods']:>6} {r['cpu']:>13.3f} "
                  f"{r['wall']:>7.2f} {r['rss_mb']:>11.0f} {first}", flush=True)  # fmt: skip
    if len(rows) == 2:
        (small, a), (large, b) = rows.items()
        for mode in ("demand", "full"):
            print(f"{mode}: {large // small}× the fleet → {b[mode]['cpu'] / a[mode]['cpu']:.2f}× the CPU, "
                  f"{b[mode]['rss_mb'] / a[mode]['rss_mb']:.2f}× the peak RSS")  # fmt: skip
        print(f"at {large} GPUs demand-driven costs {b['demand']['cpu'] / b['full']['cpu']:.3f}× the CPU and "
              f"{b['demand']['rss_mb'] / b['full']['rss_mb']:.2f}× the peak RSS of a full refresh")  # fmt: skip


if __name__ == "__main__":
    main()
