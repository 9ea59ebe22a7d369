"""Cost of forecasting every workload every refresh (issue 26): the adapter's whole per-refresh forecast path.

Per refresh the adapter (metrics/workload_demand.py) lists every Deployment, sums its pods' request rate from
the store, reads its horizon and capacity, feeds the DemandBook, and every forecast is then read once (as
/metrics and HPA requests would). Measured in steady state (every workload has a full residual window) for
100, 1,000 and 5,000 Deployments of 2 pods each, refreshes every 5 s with 15 s steps (one refresh in three
finishes a step and runs the models), for the served model (holt) beside the naive baseline in the same run.
Prints CPU ms per refresh (mean over 12 refreshes, so the step-finishing refresh is weighted as it occurs)
and µs per workload.

Then the event loop's side at 5,000 workloads: the adapter runs the update in steps on the loop between requests
(``WorkloadForecasts.prepare`` by run_sliced, metrics/steps.py) and publishes the result at the swap; the peers, in
the same run: the update in a worker thread (as before 2026-12-07) and the whole update on the loop in one go (as
before issue 26). Per refresh: time in forecast code on the loop, and the lag of a 1 ms
timer on the loop (bench_refresh_lag.py's probe: what an HPA request arriving then waits) at rest and meanwhile.

Usage: .venv/bin/python benchmarks/bench_forecast.py [--workloads 100,1000,5000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable

import numpy as np
from bench_refresh_lag import lag_at_rest, pct, probe

from gpuscale.adapter.forecasts import WorkloadForecasts
from gpuscale.metrics.demand import DemandBook, DemandSettings
from gpuscale.metrics.steps import finish, run_sliced
from gpuscale.metrics.store import MetricPoint, MetricsStore, Snapshot
from gpuscale.metrics.workload_demand import WorkloadDemand
from gpuscale.model import POD, ObjectRef
from gpuscale.pipeline import cyclic_gc_paused
from gpuscale.selectors import LabelSelector
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects, WorkloadInfo


def fleet(model: str, workloads: int) -> tuple[WorkloadForecasts, Callable[[], Snapshot]]:
    """``workloads`` Deployments of 2 pods in steady state (a full residual window each), and what makes the
    next refresh's snapshot (5 s later)."""
    rng = np.random.default_rng(26)
    base = rng.uniform(0.5, 20, workloads)
    pods = [
        PodInfo(
            "ns",
            f"w{i}-5d8f7-{j}",
            {"app": f"w{i}", "pod-template-hash": "5d8f7"},
            "node",
            None,
            (),
            "Running",
            ("ReplicaSet", f"w{i}-5d8f7"),
            started_at=0.0,
            ready_at=90.0,
        )
        for i in range(workloads)
        for j in range(2)
    ]
    cluster = StaticClusterObjects(
        pods=pods,
        workloads=[
            WorkloadInfo("Deployment", "ns", f"w{i}", LabelSelector.parse(f"app=w{i}"), {}) for i in range(workloads)
        ],
        nodes={},
        namespaces=["ns"],
    )
    clock = {"now": 0.0}
    demand = WorkloadDemand(
        DemandBook(DemandSettings(model=model)),
        MetricsStore(),
        cluster,
        rate_metric="rps",
        default_startup_s=120.0,
        max_age_s=75.0,
        clock=lambda: clock["now"],
    )
    forecasts = WorkloadForecasts(demand)
    refs = [ObjectRef(POD, p.name, "ns") for p in pods]

    def snapshot() -> Snapshot:
        t = clock["now"]
        rates = (np.repeat(base, 2) * (1 + 0.2 * np.sin(t / 600)) + rng.normal(0, 0.3, len(refs))).tolist()
        clock["now"] += 5.0
        return Snapshot(t, values={"rps": {r: MetricPoint(v, t) for r, v in zip(refs, rates, strict=True)}})

    # warm up: 10 min history plus a full residual window (240 steps of 15 s = 1 h), 5 s refreshes
    while clock["now"] < 600 + 240 * 15 + 60:
        forecasts.observe(snapshot())
    assert forecasts.view.states[ObjectRef("Deployment", "w0", "ns")].forecast is not None
    return forecasts, snapshot


def run(model: str, workloads: int) -> tuple[float, float]:
    """CPU per refresh of the whole update: every workload's inputs, the book, every forecast published."""
    forecasts, snapshot = fleet(model, workloads)
    refreshes = 12
    spent = 0.0
    for _ in range(refreshes):
        taken = snapshot()  # NB: the snapshot is the refresh's own work, not the forecast's: not timed
        with cyclic_gc_paused():  # NB: as in the adapter, where the update runs inside Pipeline.refresh_once
            started = time.process_time()
            forecasts.observe(taken)
            spent += time.process_time() - started
    ms = spent / refreshes * 1000
    return ms, ms * 1000 / workloads


async def loop_cost(workloads: int, *, how: str, refreshes: int = 12) -> dict[str, float]:
    """The event loop's side of ``refreshes`` forecast updates: time spent in forecast code on the loop per
    refresh (all of it; in slices, how long the loop was held at most at a time), and the lag of a 1 ms timer (what
    an HPA request arriving then waits) at rest and meanwhile. ``how``: "slices" (the adapter now: run_sliced on the
    loop), "thread" (a worker thread, as before 2026-12-07's sixth session), "loop" (in one go, as before issue 26)."""
    forecasts, snapshot = fleet("holt", workloads)
    rest = await lag_at_rest()
    during: list[float] = []
    on_loop = []
    held = [0.0]

    def timed(steps):
        while True:
            began = time.thread_time()  # NB: the loop thread's CPU: a wait for a core does not count
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            held[0] = max(held[0], time.thread_time() - began)
            yield

    for _ in range(refreshes):
        taken = snapshot()
        stop = asyncio.Event()
        task = asyncio.create_task(probe(during, stop))
        await asyncio.sleep(0.01)
        with cyclic_gc_paused():  # NB: as Pipeline.refresh_once, which the update runs in
            started = time.perf_counter()
            if how == "slices":  # the pipeline's prepare hook, in slices, then the publish at the swap
                publish = await run_sliced(timed(forecasts.prepare(taken)))
                publish()
                on_loop.append(time.perf_counter() - started)
            elif how == "thread":
                publish = await asyncio.to_thread(finish, forecasts.prepare(taken))
                started = time.perf_counter()
                publish()
                on_loop.append(time.perf_counter() - started)
            else:
                forecasts.observe(taken)
                on_loop.append(time.perf_counter() - started)
        await asyncio.sleep(0.01)
        stop.set()
        await task
    return {
        "loop_ms": 1e3 * sum(on_loop) / len(on_loop),
        "loop_max_ms": 1e3 * (held[0] if how == "slices" else max(on_loop)),
        "rest_p99_ms": 1e3 * pct(rest, 99),
        "p99_ms": 1e3 * pct(during, 99),
        "max_ms": 1e3 * max(during),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="100,1000,5000")
    parser.add_argument("--loop-workloads", type=int, default=5000, help="fleet of the event-loop comparison")
    parser.add_argument(
        "--switch-interval", type=float, default=0.001, help="sys.setswitchinterval, as `gpuscale adapter` sets it"
    )
    args = parser.parse_args()
    sys.setswitchinterval(args.switch_interval)
    print(f"load average {os.getloadavg()[0]:.2f}, switch interval {args.switch_interval * 1e3:g} ms")
    print("| workloads | holt ms/refresh | µs/workload | naive ms/refresh | holt ÷ naive |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.workloads.split(",")):
        holt, per = run("holt", n)
        naive, _ = run("naive", n)
        print(f"| {n:,} | {holt:.1f} | {per:.1f} | {naive:.1f} | {holt / naive:.2f} |")
    print()
    print(f"event loop, {args.loop_workloads:,} workloads, 12 refreshes (holt)")
    print(
        "| update runs | loop ms/refresh in forecasts (mean; max held at once) | 1 ms timer lag p99 at rest "
        "| p99, max meanwhile |"
    )
    print("|---|---|---|---|")
    for label, how in (
        ("in slices on the loop (now)", "slices"),
        ("worker thread (peer: before 2026-12-07)", "thread"),
        ("event loop in one go (peer: before issue 26)", "loop"),
    ):
        r = asyncio.run(loop_cost(args.loop_workloads, how=how))
        print(
            f"| {label} | {r['loop_ms']:.3f}, {r['loop_max_ms']:.3f} | {r['rest_p99_ms']:.2f} | "
            f"{r['p99_ms']:.2f}, {r['max_ms']:.2f} |"
        )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
