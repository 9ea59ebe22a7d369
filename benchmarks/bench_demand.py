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

And with forecasts on (the adapter's default): every pod also serves vLLM's finished-request counter (the
forecasts' rate metric), the pods belong to Deployments of 10 (``llm`` in each HPA's namespace, ``job-0`` …
``job-4`` in each batch namespace: 500 workloads at 10 k GPUs, 5,000 at 100 k) and one HPA in three also scales
on ``forecast_desired_replicas`` of its Deployment (100 HPAs). The refresh includes the forecast update (the
pipeline's prepare hook, as in the adapter):

* **fc-everywhere** — the peer, as before: the rate fetched in every namespace and every workload forecast;
* **fc-demand** — now: the rate fetched, and workloads forecast, only in the namespaces whose HPAs name a
  forecast (``RefreshScope(derived=…)``, ``RefreshScope.fetching``).

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
import os
import re
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_refresh import DCGM_FIELDS, serve_instant_queries

GPUS_PER_NODE, GPUS_PER_POD = 8, 2
HPAS, PODS_PER_HPA, BATCH_PODS_PER_NAMESPACE = 300, 10, 50
PODS_PER_WORKLOAD, FORECAST_EVERY = 10, 3  # one HPA in FORECAST_EVERY also scales on its forecast
RATE_SERIES = "vllm:request_success_total"  # one of the forecasts' rate metric's series
MODES = ("demand", "full", "fc-everywhere", "fc-demand")
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


def workload_of(p: int) -> str:
    """Pod p's Deployment: ``llm`` in an HPA's namespace, ``job-N`` (10 pods each) in a batch namespace."""
    if p < HPAS * PODS_PER_HPA:
        return "llm"
    return f"job-{(p - HPAS * PODS_PER_HPA) % BATCH_PODS_PER_NAMESPACE // PODS_PER_WORKLOAD}"


def hpas(*, forecasts: bool = False) -> list[dict]:
    out = []
    for i in range(HPAS):
        metric = "gpu_utilization" if i % 3 else "gpu_sm_active"
        metrics: list[dict] = [{"type": "Pods", "pods": {"metric": {"name": metric}}}]
        if forecasts and i % FORECAST_EVERY == 0:
            described = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"}
            metrics.append(
                {
                    "type": "Object",
                    "object": {"describedObject": described, "metric": {"name": "forecast_desired_replicas"}},
                }
            )
        out.append({"metadata": {"namespace": f"hpa-{i}", "name": "llm"}, "spec": {"metrics": metrics}})
    return out


def cluster(gpus: int):  # type: ignore[no-untyped-def]
    """The watch cache the forecasts read: every pod, owned by its Deployment's ReplicaSet."""
    from gpuscale.selectors import LabelSelector
    from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects, WorkloadInfo

    pods, workloads = [], {}
    for p in range(gpus // GPUS_PER_POD):
        namespace, workload = namespace_of(p), workload_of(p)
        labels = {"app": workload, "pod-template-hash": "5d8f7"}
        owner = ("ReplicaSet", f"{workload}-5d8f7")
        pods.append(PodInfo(namespace, f"pod-{p:06d}", labels, "n", None, (), "Running", owner))
        workloads[(namespace, workload)] = WorkloadInfo(
            "Deployment", namespace, workload, LabelSelector.parse(f"app={workload}"), {}
        )
    return StaticClusterObjects(pods=pods, workloads=workloads.values())


def _fake_prometheus(gpus: int, queue: mp.Queue) -> None:  # the child process
    labels = fleet(gpus)
    by_namespace: dict[str, list[int]] = {}
    for i, gpu in enumerate(labels):
        by_namespace.setdefault(gpu["namespace"], []).append(i)
    # NB: bodies carry a placeholder time, replaced by the time of each answer: a fake that outlives max-age (60 s)
    # must not serve stale samples (bench_hpa_latency.py runs adapters against it for minutes)
    stamp = 1234567890.125
    names = sorted([*DCGM_FIELDS, RATE_SERIES], key=len, reverse=True)
    name_pattern = re.compile("|".join(re.escape(n) for n in names))
    # NB: the demand-driven PromQL's workload alternative for plain pod/namespace labels (sources/prometheus.py)
    namespaces_pattern = re.compile(r'pod!="",namespace=~?"([^"]*)"')
    full: dict[str, bytes] = {}

    def body(name: str, indices: list[int] | range) -> bytes:
        if name == RATE_SERIES:  # NB: one series per pod (vLLM's), on its first GPU; a rate() has no __name__
            result = [
                {
                    "metric": {k: labels[i][k] for k in ("namespace", "pod", "instance", "job")} | {"model_name": "m"},
                    "value": [stamp, str(1.0 + i % 7)],
                }
                for i in indices
                if i % GPUS_PER_POD == 0
            ]
        else:
            f = DCGM_FIELDS[name]
            result = [
                {"metric": {"__name__": name, **labels[i]}, "value": [stamp, str(f(i % GPUS_PER_NODE))]}
                for i in indices
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


def _refresh(port: int, gpus: int, mode: str, cycles: int, results: mp.Queue) -> None:  # the child process
    async def run() -> dict:
        from gpuscale.adapter.forecasts import METRICS as FORECAST_METRICS
        from gpuscale.adapter.forecasts import WorkloadForecasts
        from gpuscale.metrics.aggregation import queries
        from gpuscale.metrics.attribution import Attributor, Target
        from gpuscale.metrics.catalogue import load_catalogue
        from gpuscale.metrics.demand import DemandBook, DemandSettings
        from gpuscale.metrics.refresh_scope import RefreshScope, references
        from gpuscale.metrics.store import MetricsStore
        from gpuscale.metrics.workload_demand import WorkloadDemand
        from gpuscale.pipeline import Pipeline
        from gpuscale.sources.prometheus import PrometheusSource

        catalogue = load_catalogue()
        source = PrometheusSource(f"http://127.0.0.1:{port}", queries=queries(catalogue), timeout_seconds=120)
        before = None
        store = MetricsStore()
        forecasts = None
        if mode != "full":
            rate = "inference_requests_per_second"
            derived = dict.fromkeys(FORECAST_METRICS, rate) if mode == "fc-demand" else {}
            demand = RefreshScope(catalogue, derived=derived)
            # NB: as the adapter did before: the rate referenced in every namespace, whatever the HPAs name
            always = [(rate, None)] if mode == "fc-everywhere" else []
            referenced = {s for h in hpas(forecasts=mode.startswith("fc")) for s in references(h)} | set(always)

            def before() -> None:
                demand.set_referenced(referenced, now=time.time())
                source.set_scope(demand.begin(now=time.time()))

            if mode.startswith("fc"):
                forecasts = WorkloadForecasts(
                    WorkloadDemand(
                        DemandBook(DemandSettings()),
                        store,
                        cluster(gpus),
                        rate_metric=rate,
                        default_startup_s=180.0,
                        max_age_s=catalogue.max_age(catalogue.get(rate)) + 15.0,
                    ),
                    rate_namespaces=lambda: demand.fetching(rate),
                )

        pipeline = Pipeline(
            catalogue,
            source,
            store,
            Attributor(Target),
            before_refresh=before,
            prepare=forecasts.prepare if forecasts is not None else None,
        )
        cpu, wall = [], []
        for _ in range(cycles):
            c0, w0 = time.process_time(), time.perf_counter()
            snapshot = await pipeline.refresh_once()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
        workloads = len(forecasts.view.inputs) if forecasts is not None else None
        if forecasts is not None:
            assert forecasts.failures == 0 and workloads
        health = source.health()[0]
        assert health.healthy, health.error
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        sent = len(source.promql)
        first = None
        if mode != "full":
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
            "workloads": workloads,
            "series": snapshot.series_count,
            "gpus": snapshot.device_count,
            "queries": sent,
            "pods": len(pipeline.store.objects("gpu_utilization", "Pod"))
            + len(pipeline.store.objects("gpu_sm_active", "Pod")),
        }

    results.put(asyncio.run(run()))


def measure(gpus: int, cycles: int, modes: tuple[str, ...] = MODES) -> dict[str, dict]:
    ctx = mp.get_context("spawn")
    ports: mp.Queue = ctx.Queue()
    server = ctx.Process(target=_fake_prometheus, args=(gpus, ports), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=600)
        out = {}
        for mode in modes:
            results: mp.Queue = ctx.Queue()
            child = ctx.Process(target=_refresh, args=(port, gpus, mode, cycles, results))
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
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    args = parser.parse_args()
    modes = tuple(args.modes.split(","))
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"{HPAS} HPAs over {HPAS * PODS_PER_HPA} pods ({HPAS * PODS_PER_HPA * GPUS_PER_POD} GPUs); median of "
          f"{args.cycles} refreshes each")  # fmt: skip
    header = (f"{'fleet GPUs':>10} {'mode':>13} {'queries':>7} {'series':>8} {'pods':>6} {'workloads':>9} "
              f"{'CPU s/refresh':>13} {'wall s':>7} {'peak RSS MB':>11} {'1st req s':>9}")  # fmt: skip
    print(header)
    rows = {}
    for gpus in (int(x) for x in args.fleets.split(",")):
        rows[gpus] = measure(gpus, args.cycles, modes)
        for mode, r in rows[gpus].items():
            first = f"{r['first_request_s']:>9.2f}" if r["first_request_s"] is not None else f"{'':>9}"
            forecast = f"{r['workloads']:>9}" if r["workloads"] is not None else f"{'':>9}"
            print(f"{gpus:>10} {mode:>13} {r['queries']:>7} {r['series']:>8} {r['pods']:>6} {forecast} "
                  f"{r['cpu']:>13.3f} {r['wall']:>7.2f} {r['rss_mb']:>11.0f} {first}", flush=True)  # fmt: skip
    for gpus, r in rows.items():
        if {"fc-everywhere", "fc-demand"} <= set(r):
            before, after = r["fc-everywhere"], r["fc-demand"]
            print(f"at {gpus} GPUs with forecasts: rate fetched where forecasts are named costs "
                  f"{after['cpu'] / before['cpu']:.2f}× the CPU and {after['rss_mb'] / before['rss_mb']:.2f}× the "
                  f"peak RSS of the rate fetched everywhere")  # fmt: skip
    if len(rows) == 2:
        (small, a), (large, b) = rows.items()
        for mode in (m for m in modes if m in a and m in b):
            print(f"{mode}: {large // small}× the fleet → {b[mode]['cpu'] / a[mode]['cpu']:.2f}× the CPU, "
                  f"{b[mode]['rss_mb'] / a[mode]['rss_mb']:.2f}× the peak RSS")  # fmt: skip
        if "demand" in a and "full" in a:
            print(f"at {large} GPUs demand-driven costs {b['demand']['cpu'] / b['full']['cpu']:.3f}× the CPU and "
                  f"{b['demand']['rss_mb'] / b['full']['rss_mb']:.2f}× the peak RSS of a full refresh")  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
