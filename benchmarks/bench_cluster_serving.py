"""The adapter loaded as a cluster with many HPAs loads it (issue 36): one command, three rounds of each figure.

Workload: a fake Prometheus holding **10,000 GPUs** (8 per node, 2 per pod: 5,000 pods), **1,000 HPAs × 4 metrics =
4,000 distinct HPA queries** (``pods/*/{gpu_utilization,gpu_sm_active,gpu_memory_used_bytes,gpu_power_watts}``
with ``labelSelector=app=app-K`` in namespaces ``team-00`` … ``team-99``, 5 pods each), asked at **267 requests/s
open loop** — each query once per 15 s, as kube-controller-manager's HPA sync asks — while the adapter refreshes
**every 10 s**. The load generator (benchmarks/go/loadgen) is a process of its own; nothing is pinned to a core.

What runs, each in its own process: the fake Prometheus (every DCGM field's answer made once at start; each answer
carries the time it is served, so nothing turns stale), the adapter, the load generator, and for item 2 a bare
aiohttp server. The adapter is ``start_adapter`` (cli/adapter.py: the PrometheusSource with its decoder process, the
pipeline with demand-driven refresh, the answer cache, forecasts, the adapter's runner with its fast path) over
plain HTTP, with the switch interval ``gpuscale adapter`` sets; its watch cache is a fixed one (StaticClusterObjects:
the 5,000 pods with their labels and the 1,000 Deployments) and its HPA cache gives the 1,000 HPAs' references,
instead of a Kubernetes API. The adapter records when each refresh starts, swaps its snapshot and ends (a file the
benchmark reads).

Printed, three rounds each, with the load average at the start of every run:

1. **p99 during a refresh / at rest** (goal ≤ 1.5×): each round a 20 s open-loop run (two refreshes); a request is
   "during a refresh" when it was due between a refresh's start and 0.25 s after its end (what follows the swap:
   the old snapshot freed, the forecasts moved on), "at rest" otherwise. Latency counts from when a request was
   due (no coordinated omission). The slowest requests are listed against the refresh phase they met.
2. **First request per query after a swap / bare aiohttp** (goal ≥ 0.8×): right after a swap, each of the 4,000
   queries asked once (closed loop, 8 connections), per wall second and per server CPU-second (the server's
   process and its children); bare aiohttp serves a precomputed body of the adapter's mean answer size for the
   same 4,000 URLs. The adapter's own counters say how the 4,000 were answered (prepared by the refresh, cached,
   computed on request).
3. **Parse / prometheus_client by CPU time** (goal ≥ 25×): the 8×H100 dcgm-exporter fixture, the two parsers
   alternating (benchmarks/bench_parser.py's method, process CPU clock), median of each round's repeats; the
   median of the rounds and their spread.

``--probe`` adds a loop-lag probe to the adapter (a task that sleeps 1 ms and records how late it wakes): for finding
what holds the serving loop, not for the headline figures (it adds 1,000 wake-ups a second).

Usage: .venv/bin/python benchmarks/bench_cluster_serving.py [--rounds 3] [--seconds 20] [--probe]
(about 4 minutes; needs Go once, to build the load generator into ~/.cache/gpuscale/loadgen)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_adapter_peers import cpu_seconds, loadgen_binary  # noqa: E402
from bench_refresh import DCGM_FIELDS  # noqa: E402

GPUS, GPUS_PER_NODE, GPUS_PER_POD = 10_000, 8, 2
HPAS, NAMESPACES = 1_000, 100
PODS_PER_HPA = GPUS // GPUS_PER_POD // HPAS
METRICS = ("gpu_utilization", "gpu_sm_active", "gpu_memory_used_bytes", "gpu_power_watts")
RATE = 267.0  # HPA requests/s: 4,000 queries once per 15 s
REFRESH_S = 10.0
AFTER_REFRESH_S = 0.25  # what still belongs to a refresh after it ended (the old snapshot freed …)
RATE_SERIES = "vllm:request_success_total"  # the forecasts' rate metric (a rate() answer: no __name__)
STAMP = "1234567890.125"
EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def hpa_of(pod: int) -> tuple[str, str]:
    """Pod → (namespace, Deployment): HPA h owns pods 5h … 5h+4, in namespace team-(h // 10) as app-(h % 10)."""
    h = pod // PODS_PER_HPA
    return f"team-{h // (HPAS // NAMESPACES):02d}", f"app-{h % (HPAS // NAMESPACES)}"


def paths() -> list[str]:
    """The 4,000 HPA queries, HPA by HPA (its four metrics together, as one HPA sync asks them)."""
    out = []
    for h in range(HPAS):
        namespace, app = hpa_of(h * PODS_PER_HPA)
        out += [
            f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/{m}?labelSelector=app%3D{app}"
            for m in METRICS
        ]
    return out


# --- the fake Prometheus (a child process) -----------------------------------------------------------------------


def _fake_prometheus(queue: mp.Queue) -> None:
    from bench_refresh import serve_instant_queries

    labels = []
    for i in range(GPUS):
        n, g, p = i // GPUS_PER_NODE, i % GPUS_PER_NODE, i // GPUS_PER_POD
        namespace, _ = hpa_of(p)
        labels.append(
            {
                "gpu": str(g),
                "UUID": f"GPU-{n:06d}-{g}",
                "pci_bus_id": f"00000000:{g:02X}:00.0",
                "device": f"nvidia{g}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": f"node-{n:06d}",
                "container": "main",
                "namespace": namespace,
                "pod": f"pod-{p:06d}",
                "instance": f"10.{n // 62500}.{n // 250 % 250}.{n % 250}:9400",
                "job": "dcgm-exporter",
            }
        )

    def body(name: str) -> bytes:
        if name == RATE_SERIES:
            result = [
                {"metric": {k: gpu[k] for k in ("namespace", "pod", "instance", "job")}, "value": [STAMP, "3"]}
                for gpu in labels[::GPUS_PER_POD]
            ]
        else:
            f = DCGM_FIELDS[name]
            result = [
                {"metric": {"__name__": name, **gpu}, "value": [STAMP, str(f(i % GPUS_PER_NODE))]}
                for i, gpu in enumerate(labels)
            ]
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    # NB: made once (their making is not what is measured); each answer then carries the time it is served
    bodies = {name: body(name) for name in [*DCGM_FIELDS, RATE_SERIES]}
    pattern = re.compile("|".join(re.escape(n) for n in sorted(bodies, key=len, reverse=True)))

    def answer(promql: str) -> bytes:
        m = pattern.search(promql)
        return bodies[m.group(0)].replace(STAMP.encode(), f"{time.time():.3f}".encode()) if m else EMPTY

    serve_instant_queries(answer, queue)


# --- the adapter (a child process) -------------------------------------------------------------------------------


def _adapter(prometheus: str, events: str, probe: bool, switch: float | None, queue: mp.Queue) -> None:
    import gpuscale.cli.adapter as composition

    sys.setswitchinterval(switch or composition.SWITCH_INTERVAL_S)  # NB: as `gpuscale adapter` runs (cli/main.py)
    log = open(events, "a", buffering=1)  # noqa: SIM115

    async def main() -> None:
        adapter = await start_bench_adapter(prometheus, log)
        if probe:
            asyncio.get_running_loop().create_task(_probe(log))
        queue.put(adapter.url)
        await asyncio.Event().wait()

    asyncio.run(main())


async def start_bench_adapter(prometheus: str, log):
    """The adapter as the benchmark runs it (module docstring), writing when each refresh starts, swaps and ends to
    ``log``; on the running loop."""
    import gpuscale.cli.adapter as composition
    from gpuscale.selectors import LabelSelector
    from gpuscale.settings import AdapterSettings
    from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects, WorkloadInfo

    class Cluster(StaticClusterObjects):
        def health(self) -> list:
            return []

    pods, workloads = [], {}
    for p in range(GPUS // GPUS_PER_POD):
        namespace, app = hpa_of(p)
        owner = ("ReplicaSet", f"{app}-5d8f7")
        pods.append(PodInfo(namespace, f"pod-{p:06d}", {"app": app}, f"node-{p // 4:06d}", None, (), "Running", owner))
        workloads[namespace, app] = WorkloadInfo("Deployment", namespace, app, LabelSelector.parse(f"app={app}"), {})
    cluster = Cluster(pods=pods, workloads=workloads.values())

    class Hpas:
        """The 1,000 HPAs' references, as the adapter's HPA cache (sources/hpas.py) gives them once synced."""

        synced = True

        def __init__(self, api: object) -> None:
            self.refs = frozenset((m, hpa_of(h * PODS_PER_HPA)[0]) for h in range(HPAS) for m in METRICS)

        def references(self) -> frozenset:
            return self.refs

        def health(self) -> list:
            return []

        async def start(self) -> None:
            return None

        async def stop(self) -> None:
            return None

    async def fixed_cluster(settings, resources):
        return object(), cluster  # NB: an API client no step uses but for the HPA cache (Hpas)

    # NB: the two steps replaced (module docstring); demand-driven refresh and the rest run as shipped
    composition.make_cluster = fixed_cluster
    composition.HpaCache = Hpas
    settings = AdapterSettings(
        prometheus_url=prometheus,
        insecure_port=0,
        refresh_interval=REFRESH_S,
        apis="custom",
        log_level="warning",
    )
    adapter = await composition.start_adapter(settings)
    pipeline, store = adapter.pipeline, adapter.store
    refresh_once, update = pipeline.refresh_once, store.update

    async def recorded_refresh():
        log.write(f"start {time.time():.6f}\n")
        try:
            return await refresh_once()
        finally:
            log.write(f"end {time.time():.6f}\n")

    def recorded_update(snapshot):
        log.write(f"swap {time.time():.6f}\n")
        return update(snapshot)

    pipeline.refresh_once = recorded_refresh  # type: ignore[method-assign]
    store.update = recorded_update  # type: ignore[method-assign]
    return adapter


async def _probe(log) -> None:
    """How late the serving loop wakes from a 1 ms sleep (lags over 2 ms are written down), and every cyclic garbage
    collection over 1 ms (on whichever thread: it holds the interpreter lock throughout)."""
    import gc

    started: list[float] = [0.0]

    def collected(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif (took := time.perf_counter() - started[0]) > 0.001:
            log.write(f"gc {time.time() - took:.6f} {took * 1e3:.2f} {info['generation']}\n")

    gc.callbacks.append(collected)
    _time_callbacks(log)
    _time_steps(log)
    while True:
        due, cpu = time.perf_counter() + 0.001, time.process_time()
        await asyncio.sleep(0.001)
        late = time.perf_counter() - due
        if late > 0.002:
            # NB: the process's CPU meanwhile tells a lock held by another thread (≈ the lag) from a process
            # waiting for a core (≈ 0)
            log.write(f"lag {time.time() - late:.6f} {late * 1e3:.2f} {(time.process_time() - cpu) * 1e3:.1f}\n")


def _time_callbacks(log) -> None:
    """Every serving-loop callback that used over 1 ms of the loop thread's CPU: what runs on the serving loop, apart
    from waiting for the interpreter lock or for a core (neither counts as the thread's CPU time)."""
    import threading

    handle_run = asyncio.events.Handle._run
    serving = threading.get_ident()  # NB: the sources' own loops run in other threads

    def timed(handle: asyncio.events.Handle) -> None:
        cpu = time.thread_time()
        handle_run(handle)
        if (used := time.thread_time() - cpu) > 0.001 and threading.get_ident() == serving:
            callback = handle._callback
            task = getattr(callback, "__self__", None)
            named = task.get_coro() if isinstance(task, asyncio.Task) else callback
            log.write(f"busy {time.time() - used:.6f} {used * 1e3:.2f} {getattr(named, '__qualname__', '?')}\n")

    asyncio.events.Handle._run = timed  # type: ignore[method-assign]


def _time_steps(log) -> None:
    """Every step of the refresh's build and of the decoder's replies (metrics/steps.py, run by run_sliced) that used
    over 0.5 ms of its thread's CPU, by where it started and where it paused: what keeps a request waiting between two
    of the loop's turns."""
    from bench_build_steps import where

    import gpuscale.pipeline as pipeline
    import gpuscale.sources.decoder_process as decoder

    def timed(steps):
        while True:
            began, cpu = where(steps), time.thread_time()  # NB: the thread's CPU: a wait for a core does not count
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            if (took := time.thread_time() - cpu) > 0.0005:
                log.write(f"busy {time.time() - took:.6f} {took * 1e3:.2f} step:{began}>{where(steps)}\n")
            yield

    sliced = pipeline.run_sliced
    pipeline.run_sliced = decoder.run_sliced = lambda steps, **kwargs: sliced(timed(steps), **kwargs)


def _bare(size: int, queue: mp.Queue) -> None:
    from aiohttp import web

    body = b"x" * size

    async def bare(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", bare)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        queue.put(f"http://127.0.0.1:{runner.addresses[0][1]}")
        await asyncio.Event().wait()

    asyncio.run(main())


# --- the driver --------------------------------------------------------------------------------------------------


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (5 min {five:.2f})"


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def tree_cpu(pid: int) -> float:
    return cpu_seconds(pid) + sum(cpu_seconds(c) for c in children(pid))


def events(path: Path) -> list[tuple[str, float, float]]:
    return [(kind, float(at), float(rest[0]) if rest else 0.0) for kind, at, *rest in _lines(path)]


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()]


def refreshes(path: Path) -> list[tuple[float, float, float]]:
    """(start, swap, end) of every finished refresh."""
    out, start, swap = [], None, None
    for kind, at, _ in events(path):
        if kind == "start":
            start, swap = at, None
        elif kind == "swap":
            swap = at
        elif kind == "end" and start is not None:
            out.append((start, swap if swap is not None else at, at))
            start = None
    return out


def refreshing(path: Path) -> bool:
    """A refresh has started and not ended yet."""
    kinds = [kind for kind, _, _ in events(path) if kind in ("start", "end")]
    return bool(kinds) and kinds[-1] == "start"


def answers_counted(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        how: float(m.group(1)) if (m := re.search(rf'gpuscale_adapter_answers_total{{how="{how}"}} (\S+)', text)) else 0
        for how in ("prepared", "cached", "computed")
    }


def run_loadgen(loadgen: str, urls: Path, *options: str) -> dict:
    command = [loadgen, "-urls", str(urls), "-warmup", "0s", *options]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"loadgen failed: {out.stderr}")
    return json.loads(out.stdout)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_cluster_serving: {what} did not happen within {timeout:g} s")
        time.sleep(0.02)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else (values[0] if values else float("nan"))


def latency_round(loadgen: str, urls: Path, log: Path, seconds: float, work: Path, n: int) -> dict:
    trace = work / f"trace-{n}"
    done = len(refreshes(log))
    wait_for(lambda: len(refreshes(log)) > done, 2 * REFRESH_S, "a refresh")  # NB: a run starts as one ends
    began = time.time()
    r = run_loadgen(loadgen, urls, "-mode", "rate", "-rate", f"{RATE:g}", "-connections", "8",
                    "-duration", f"{seconds:g}s", "-trace", str(trace))  # fmt: skip
    wait_for(lambda: not refreshing(log), 2 * REFRESH_S, "the refresh under way to end")
    windows = [w for w in refreshes(log) if w[2] > began]  # NB: with the one that ended as the run began (its tail)
    during, rest, slow = [], [], []
    for line in trace.read_text().splitlines():
        due_ns, latency_us, status = (int(x) for x in line.split())
        due, ms = due_ns / 1e9, latency_us / 1e3
        if status != 200:
            raise SystemExit(f"bench_cluster_serving: an HPA request was answered {status}")
        meets = next((w for w in windows if w[0] <= due <= w[2] + AFTER_REFRESH_S), None)
        (during if meets else rest).append(ms)
        if meets:
            start, swap, _ = meets
            phase = "before the swap" if due < swap else "after the swap"
            slow.append(
                (ms, f"{due - start:+.2f} s from the refresh start, {due - swap:+.2f} s from its swap ({phase})")
            )
        else:
            slow.append((ms, "at rest"))
    lags = [
        (kind, float(at), float(ms), rest[0] if rest else "")
        for kind, at, ms, *rest in (x for x in _lines(log) if x[0] in ("lag", "gc"))
        if float(at) >= began
    ]
    busy = [(float(at), float(ms), what) for kind, at, ms, what in (x for x in _lines(log) if x[0] == "busy")]
    return {
        "p50_rest": statistics.median(rest),
        "p99_rest": p99(rest),
        "p50_during": statistics.median(during) if during else float("nan"),
        "p99_during": p99(during),
        "during": len(during),
        "rest": len(rest),
        "refreshes": [(round(swap - start, 2), round(end - start, 2)) for start, swap, end in windows],
        "slowest": sorted(slow, reverse=True)[:5],
        "lags": lags,
        "busy": [b for b in busy if b[0] >= began],
        "windows": windows,
        "rps": r["rps"],
        "errors": r["errors"] + r["non_2xx"] + r["unfinished"],
    }


def first_round(loadgen: str, base: str, urls: tuple[Path, Path], log: Path, pids: tuple[int, int]) -> dict:
    adapter, server = pids
    done = len(refreshes(log))
    wait_for(lambda: len(refreshes(log)) > done, 2 * REFRESH_S, "a snapshot swap")
    before, cpu = answers_counted(base), tree_cpu(adapter)
    ours = run_loadgen(loadgen, urls[0], "-mode", "closed", "-connections", "8", "-count", str(len(paths())))
    cpu = tree_cpu(adapter) - cpu
    after = answers_counted(base)
    if len(refreshes(log)) > done + 1:
        raise SystemExit("bench_cluster_serving: a refresh ended while the first requests were asked; rerun")
    bare_cpu = cpu_seconds(server)
    theirs = run_loadgen(loadgen, urls[1], "-mode", "closed", "-connections", "8", "-count", str(len(paths())))
    bare_cpu = cpu_seconds(server) - bare_cpu
    for r in (ours, theirs):
        if r["requests"] != len(paths()):
            raise SystemExit(f"bench_cluster_serving: {r['requests']} of {len(paths())} answered: {r}")
    return {
        "ours_rps": ours["rps"],
        "bare_rps": theirs["rps"],
        "ours_per_cpu": ours["requests"] / cpu,
        "bare_per_cpu": theirs["requests"] / bare_cpu,
        "how": {k: after[k] - before[k] for k in after},
        "ours_p99": ours["p99_ms"],
        "bare_p99": theirs["p99_ms"],
    }


def parse_round(repeats: int) -> float:
    import bench_parser

    bench_parser.clock = time.process_time
    _, path = bench_parser.CASES[0]
    text = path.read_text()
    loops = {p: bench_parser.loops_for(p, text, 0.1) for p in (bench_parser.ours, bench_parser.prometheus_client)}
    times: dict = {p: [] for p in loops}
    for _ in range(repeats):
        for p in loops:
            times[p].append(bench_parser.per_scrape_us(p, text, loops[p]))
    return statistics.median(times[bench_parser.prometheus_client]) / statistics.median(times[bench_parser.ours])


def _where(at: float, windows: list[tuple[float, float, float]]) -> str:
    """When ``at`` was, against the refreshes (start, swap, end)."""
    w = next((w for w in windows if w[0] - 0.5 <= at <= w[2] + 1), None)
    if w is not None:
        return f"{at - w[0]:+.3f} s from a refresh start, {at - w[1]:+.3f} s from its swap"
    ended = [end for _, _, end in windows if end < at]
    return f"at rest, {at - max(ended):.2f} s after a refresh ended" if ended else "at rest"


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"median {fmt.format(statistics.median(values))} (rounds {', '.join(fmt.format(v) for v in values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each latency round (default 20)")
    parser.add_argument("--probe", action="store_true", help="add the loop-lag probe to the adapter (diagnosis)")
    parser.add_argument("--switch-interval", type=float, help="the adapter's sys.setswitchinterval (experiments)")
    parser.add_argument("--only", default="latency,first,parse", help="comma-separated: latency, first, parse")
    args = parser.parse_args()
    only = set(args.only.split(","))
    loadgen = loadgen_binary()
    ctx = mp.get_context("spawn")
    print(f"{GPUS:,} GPUs, {HPAS:,} HPAs x {len(METRICS)} metrics = {len(paths()):,} distinct HPA queries at "
          f"{RATE:g} req/s open loop, refresh every {REFRESH_S:g} s; {os.cpu_count()} cores, nothing pinned; "
          f"{load()} at the start", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpuscale-cluster-serving-") as tmp:
        work = Path(tmp)
        urls, log = work / "urls", work / "events"
        log.touch()
        procs: list[mp.Process] = []
        try:
            q: mp.Queue = ctx.Queue()
            procs.append(ctx.Process(target=_fake_prometheus, args=(q,), daemon=True))
            procs[-1].start()
            prometheus = f"http://127.0.0.1:{q.get(timeout=300)}"
            adapter_args = (prometheus, str(log), args.probe, args.switch_interval, q)
            procs.append(ctx.Process(target=_adapter, args=adapter_args, daemon=True))
            procs[-1].start()
            base = q.get(timeout=300)
            urls.write_text("".join(f"{base}{p}\n" for p in paths()))
            wait_for(lambda: len(refreshes(log)) >= 1, 120, "the first refresh")
            # NB: every query asked once before measuring, as HPAs that have been polling for a while
            warm = run_loadgen(loadgen, urls, "-mode", "closed", "-connections", "8", "-count", str(len(paths())))
            if warm["requests"] != len(paths()):
                raise SystemExit(f"bench_cluster_serving: warm-up: {warm}")
            size = warm["body_bytes"] // warm["requests"]
            print(f"adapter ready; mean answer {size} bytes (bare aiohttp serves that many)", flush=True)
            procs.append(ctx.Process(target=_bare, args=(size, q), daemon=True))
            procs[-1].start()
            bare_urls = work / "bare-urls"
            bare = q.get(timeout=60)
            bare_urls.write_text("".join(f"{bare}{p}\n" for p in paths()))
            results: dict[str, list] = {"latency": [], "first": [], "parse": []}
            for n in range(args.rounds):
                if "latency" in only:
                    at = load()
                    r = latency_round(loadgen, urls, log, args.seconds, work, n)
                    results["latency"].append(r)
                    print(f"latency round {n + 1} ({at}): p99 during refresh {r['p99_during']:.2f} ms "
                          f"({r['during']} requests), at rest {r['p99_rest']:.2f} ms ({r['rest']}); "
                          f"ratio {r['p99_during'] / r['p99_rest']:.2f}; p50 {r['p50_during']:.2f} / "
                          f"{r['p50_rest']:.2f} ms; {r['rps']:.0f} req/s, {r['errors']} errors; refreshes "
                          f"(swap s, end s after start): {r['refreshes']}", flush=True)  # fmt: skip
                    for ms, where in r["slowest"]:
                        print(f"    {ms:7.2f} ms  {where}")
                    for kind, at_, ms, extra in sorted(r["lags"], key=lambda x: -x[2])[:20] if args.probe else ():
                        what = (
                            f"loop lag {ms:6.2f} ms (process CPU meanwhile {extra} ms)"
                            if kind == "lag"
                            else (f"gc (generation {extra}) {ms:6.2f} ms")
                        )
                        print(f"    {what}  {_where(at_, r['windows'])}")
                    for at_, ms, what in sorted(r["busy"], key=lambda x: -x[1])[:15] if args.probe else ():
                        print(f"    loop CPU {ms:6.2f} ms in {what}  {_where(at_, r['windows'])}")
                if "first" in only:
                    at = load()
                    procs_pids = (procs[1].pid, procs[2].pid)
                    r = first_round(loadgen, base, (urls, bare_urls), log, procs_pids)  # type: ignore[arg-type]
                    results["first"].append(r)
                    print(f"first-request round {n + 1} ({at}): {r['ours_rps']:.0f} vs bare {r['bare_rps']:.0f} "
                          f"req/s = {r['ours_rps'] / r['bare_rps']:.2f}x; per CPU-second {r['ours_per_cpu']:.0f} vs "
                          f"{r['bare_per_cpu']:.0f} = {r['ours_per_cpu'] / r['bare_per_cpu']:.2f}x; answered "
                          f"{', '.join(f'{v:.0f} {k}' for k, v in r['how'].items())}; p99 {r['ours_p99']:.2f} vs "
                          f"{r['bare_p99']:.2f} ms", flush=True)  # fmt: skip
        finally:
            for p in reversed(procs):
                p.terminate()
                p.join(10)
        if "parse" in only:
            for n in range(args.rounds):
                at = load()
                results["parse"].append(parse_round(9))
                print(f"parse round {n + 1} ({at}): {results['parse'][-1]:.1f}x prometheus_client by CPU", flush=True)
    print(f"\nsummary ({load()} at the end; goals in brackets):")
    if results["latency"]:
        ratios = [r["p99_during"] / r["p99_rest"] for r in results["latency"]]
        print(f"  p99 during a refresh / at rest: {spread(ratios)} [<= 1.5]")
    if results["first"]:
        wall = [r["ours_rps"] / r["bare_rps"] for r in results["first"]]
        cpu = [r["ours_per_cpu"] / r["bare_per_cpu"] for r in results["first"]]
        print(f"  first request per query after a swap / bare aiohttp: per wall second {spread(wall)}, "
              f"per server CPU-second {spread(cpu)} [>= 0.8]")  # fmt: skip
    if results["parse"]:
        print(f"  parse / prometheus_client by CPU (8xH100 dcgm-exporter page): {spread(results['parse'], '{:.1f}')}"
              " [>= 25]")  # fmt: skip


if __name__ == "__main__":
    main()
