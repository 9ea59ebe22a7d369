"""The refresh's build in steps (issue 36): how long the event loop is held at a time, and what slicing costs.

The adapter builds each snapshot on its serving event loop, a slice at a time between HPA requests
(metrics/steps.py, run_sliced): a request waits for at most the slice running when it arrives, which ends at the
first pause after the 0.3 ms budget. So the figure that matters is the longest single step. This runs the pipeline
as the adapter does — PrometheusSource against bench_refresh.py's fake Prometheus (10,000 GPUs, 5,000 pods, 1,000
Triton pods), attribution, aggregation, the replaced snapshot freed in steps — and times every step of the build by
the thread's own CPU clock (a wait for a core does not count), by where it started and where it paused.

Peer in the same run: the same build run to the end in one go (``steps.finish``, what `top` and the report do),
alternating with the sliced one, so the price of slicing is the difference in CPU per build.

Usage: .venv/bin/python benchmarks/bench_build_steps.py [--cycles 6] [--top 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_refresh import fake_prometheus


def where(steps) -> str:
    """Where ``steps`` is paused now: the innermost generator's file and line."""
    inner = steps
    while getattr(getattr(inner, "gi_yieldfrom", None), "gi_frame", None) is not None:
        inner = inner.gi_yieldfrom
    frame = inner.gi_frame
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}" if frame is not None else "start"


async def _run(port: int, cycles: int, top: int) -> None:
    import gpuscale.pipeline as pipeline
    from gpuscale.metrics.aggregation import queries
    from gpuscale.metrics.attribution import Attributor, Target
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.steps import finish
    from gpuscale.metrics.store import MetricsStore
    from gpuscale.sources.prometheus import PrometheusSource

    steps_cpu: dict[str, list[float]] = defaultdict(list)
    mode = {"how": "timed"}

    def timed(steps):
        while True:
            began, cpu = where(steps), time.thread_time()
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            steps_cpu[f"{began} > {where(steps)}"].append(time.thread_time() - cpu)
            yield

    sliced = pipeline.run_sliced

    async def run(steps, **kwargs):
        if mode["how"] == "timed":
            return await sliced(timed(steps), **kwargs)
        if mode["how"] == "sliced":
            return await sliced(steps, **kwargs)
        return finish(steps)

    pipeline.run_sliced = run
    catalogue = load_catalogue()
    source = PrometheusSource(f"http://127.0.0.1:{port}", queries=queries(catalogue), timeout_seconds=60)
    built = pipeline.Pipeline(catalogue, source, MetricsStore(), Attributor(Target))
    await source.refresh(now=time.time())
    build = built._build
    cpu: dict[str, list[float]] = {"sliced": [], "one go": []}
    # NB: the first build makes the devices; then each cycle builds timed (the step figures: timing every step costs
    # CPU of its own), sliced and in one go (the CPU figures), in turn
    for cycle, how in enumerate(["one go", *(["timed", "sliced", "one go"] * cycles)]):
        mode["how"] = how
        with pipeline.cyclic_gc_paused():
            started = time.process_time()
            snapshot, _ = await run(build(now=time.time()))
            if cycle and how in cpu:
                cpu[how].append(time.process_time() - started)
        del snapshot
    await source.close()
    every = sorted(t for ts in steps_cpu.values() for t in ts)
    per_build = len(every) / cycles
    print(f"the build at 10,000 GPUs from Prometheus, {cycles} builds each way, {len(every) // cycles} steps per build")
    print(
        f"  step CPU: longest {every[-1] * 1e3:.2f} ms, p99 {every[int(len(every) * 0.99)] * 1e3:.3f} ms, "
        f"median {statistics.median(every) * 1e3:.3f} ms; steps over 1 ms per build: "
        f"{sum(t > 0.001 for t in every) / cycles:.1f}, over 0.5 ms: {sum(t > 0.0005 for t in every) / cycles:.1f}"
    )
    one, many = statistics.median(cpu["one go"]), statistics.median(cpu["sliced"])
    print(
        f"  CPU per build: in slices on the loop {many:.3f} s (rounds {', '.join(f'{c:.3f}' for c in cpu['sliced'])});"
        f" peer, in one go {one:.3f} s (rounds {', '.join(f'{c:.3f}' for c in cpu['one go'])}); "
        f"slicing costs {(many / one - 1) * 100:+.0f} % ({per_build:.0f} steps per build)"
    )
    print(f"  the {top} longest kinds of step (longest, count per build, where it started > where it paused):")
    for where, times in sorted(steps_cpu.items(), key=lambda kv: -max(kv[1]))[:top]:
        print(f"    {max(times) * 1e3:6.2f} ms  x{len(times) / cycles:7.1f}  {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    with fake_prometheus() as port:
        asyncio.run(_run(port, args.cycles, args.top))


if __name__ == "__main__":
    main()
