"""Cost of forecasting every workload every refresh (issue 26): the adapter's whole per-refresh forecast path.

Per refresh the adapter (metrics/workload_demand.py) lists every Deployment, sums its pods' request rate from
the store, reads its horizon and capacity, feeds the DemandBook, and every forecast is then read once (as
/metrics and HPA requests would). Measured in steady state (every workload has a full residual window) for
100, 1,000 and 5,000 Deployments of 2 pods each, refreshes every 5 s with 15 s steps (one refresh in three
finishes a step and runs the models), for the served model (holt) beside the naive baseline in the same run.
Prints CPU ms per refresh (mean over 12 refreshes, so the step-finishing refresh is weighted as it occurs)
and µs per workload.

Usage: .venv/bin/python benchmarks/bench_forecast.py [--workloads 100,1000,5000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from gpuscale.metrics.demand import DemandBook, DemandSettings
from gpuscale.metrics.store import MetricPoint, MetricsStore, Snapshot
from gpuscale.metrics.workload_demand import WorkloadDemand
from gpuscale.model import POD, ObjectRef
from gpuscale.selectors import LabelSelector
from gpuscale.sources.kube import PodInfo, StaticClusterObjects, WorkloadInfo


def run(model: str, workloads: int) -> tuple[float, float]:
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
    store = MetricsStore()
    clock = {"now": 0.0}
    demand = WorkloadDemand(
        DemandBook(DemandSettings(model=model)),
        store,
        cluster,
        rate_metric="rps",
        default_startup_s=120.0,
        max_age_s=75.0,
        clock=lambda: clock["now"],
    )
    refs = [ObjectRef(POD, p.name, "ns") for p in pods]
    keys = [ObjectRef("Deployment", f"w{i}", "ns") for i in range(workloads)]

    def refresh() -> None:
        t = clock["now"]
        rates = (np.repeat(base, 2) * (1 + 0.2 * np.sin(t / 600)) + rng.normal(0, 0.3, len(refs))).tolist()
        store.update(Snapshot(t, values={"rps": {r: MetricPoint(v, t) for r, v in zip(refs, rates, strict=True)}}))
        clock["now"] += 5.0

    # warm up: 10 min history plus a full residual window (240 steps of 15 s = 1 h), 5 s refreshes
    while clock["now"] < 600 + 240 * 15 + 60:
        refresh()
        demand.observe()
    assert demand.book.forecast(keys[0]) is not None
    refreshes = 12
    spent = 0.0
    for _ in range(refreshes):
        refresh()  # NB: the store's update is the refresh's own work, not the forecast's: not timed
        started = time.process_time()
        demand.observe()
        for k in keys:
            demand.book.forecast(k)
        spent += time.process_time() - started
    ms = spent / refreshes * 1000
    return ms, ms * 1000 / workloads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="100,1000,5000")
    args = parser.parse_args()
    print("| workloads | holt ms/refresh | µs/workload | naive ms/refresh | holt ÷ naive |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.workloads.split(",")):
        holt, per = run("holt", n)
        naive, _ = run("naive", n)
        print(f"| {n:,} | {holt:.1f} | {per:.1f} | {naive:.1f} | {holt / naive:.2f} |")


if __name__ == "__main__":
    main()
