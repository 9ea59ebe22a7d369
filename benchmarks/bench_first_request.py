"""The first request after each refresh — what every real HPA poll is — against bare aiohttp, loaded by wrk.

HPAs poll every 15 s and the store is refreshed every few seconds, so nearly every poll is the first
request for its query since the last refresh. This benchmark makes that the whole load: K HPA queries
(``pods/*/<metric>?labelSelector=app=<deployment>``, one per Deployment, v1beta1 and v1beta2 alternately)
asked in turn, and the store's snapshot swapped after every K answers (or every ``--interval`` seconds), so
each query is asked about once per snapshot whatever the request rate; the server's own counters
(``gpuscale_adapter_answers_total``) say how many answers really were first ones.

The server process (pinned to core 0) holds a fleet of ``--pods`` pods × 1 GPU in Deployments of
``--pods-per-hpa`` pods, and two snapshots built by the real pipeline from dcgm-exporter text with different
values; its refresher swaps them in turn exactly as ``Pipeline.refresh_once`` does after a build
(``AnswerCache.prepare`` in a worker thread, then ``store.update`` and the install on the event loop). The
build itself is left out: it runs in a thread since issue 21 item 1 (``bench_refresh_lag.py`` measures it).
Modes, one server process each, alternated over ``--rounds``:

* ``prepared`` — as shipped: the refresh builds the bodies of the queries asked recently;
* ``on request`` — no preparation: the first request after a refresh builds its body;
* ``bare aiohttp`` — the floor: a handler returning a precomputed body of the adapter's median answer size.

Both adapter modes are served by the adapter's own runner (``AdapterRunner``, as ``gpuscale adapter`` serves),
so a URL asked before takes its fast path (adapter/fastpath.py). The two snapshots store the same pods in the
same order, every value with one sample time, as consecutive refreshes from one Prometheus query do (there the
time moves on with each refresh; here both share it); the values differ.

Load: Debian ``wrk`` (C, one thread pinned to core 1, keep-alive connections, a Lua script cycling through
the K paths), after a 2 s warm-up. Printed: req/s and latency p50/p99 as wrk reports them, and requests per
CPU-second of the server process (all its threads, the preparation included) — the machine is shared, and
CPU time counts only the server's own work.

Usage: .venv/bin/python benchmarks/bench_first_request.py [--pods 5000] [--pods-per-hpa 10] [--seconds 10]
(needs ``wrk``: ``apt-get install -y wrk``).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

METRIC = "gpu_utilization"

LUA = """
local paths = {}
for line in io.lines(os.getenv("BENCH_PATHS")) do paths[#paths + 1] = line end
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", paths[(i % #paths) + 1])
end
"""


def _dcgm_text(pods: int, offset: int) -> str:
    lines = []
    for i in range(pods):
        labels = (
            f'gpu="{i % 8}",UUID="GPU-{i:08d}",Hostname="node-{i // 8}",container="main",'
            f'namespace="serving",pod="app-{i:05d}"'
        )
        lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {(i * 7 + offset) % 100}")
    return "\n".join(lines) + "\n"


def _paths(pods: int, per_hpa: int) -> list[str]:
    return [
        f"/apis/custom.metrics.k8s.io/{'v1beta2' if d % 2 else 'v1beta1'}/namespaces/serving/pods/*/{METRIC}"
        f"?labelSelector=app%3Ddep-{d:04d}"
        for d in range(pods // per_hpa)
    ]


def _serve(mode: str, pods: int, per_hpa: int, interval: float | None, queue: mp.Queue) -> None:  # the child process
    os.sched_setaffinity(0, {0})
    sys.setswitchinterval(0.001)  # NB: as `gpuscale adapter` runs (cli/main.py); bare aiohttp has one thread
    from aiohttp import web

    from gpuscale.adapter.answers import AnswerCache
    from gpuscale.adapter.app import make_app
    from gpuscale.adapter.discovery import Discovery
    from gpuscale.adapter.provider import MetricsProvider
    from gpuscale.adapter.selfmetrics import AdapterMetrics
    from gpuscale.adapter.transport import AdapterRunner, RejectionLog
    from gpuscale.metrics.aggregation import build_snapshot
    from gpuscale.metrics.attribution import Attributor, Target
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.exposition import parse_samples
    from gpuscale.metrics.steps import run_sliced
    from gpuscale.metrics.store import MetricsStore
    from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects
    from gpuscale.sources.scrape import ScrapeSource

    catalogue = load_catalogue()
    now = time.time()
    source = ScrapeSource([], series=catalogue.series_names, windowed_series=catalogue.windowed_series)
    snapshots = []
    for offset in (0, 1):
        source.ingest("http://dcgm/metrics", parse_samples(_dcgm_text(pods, offset)), timestamp=now)
        snapshots.append(build_snapshot(catalogue, source.read, Attributor(Target), now=now))
    store = MetricsStore()
    store.update(snapshots[0])
    cluster = StaticClusterObjects(
        pods=[
            PodInfo("serving", f"app-{i:05d}", {"app": f"dep-{i // per_hpa:04d}"}, "n", None, (), "Running", None)
            for i in range(pods)
        ],
        namespaces=["serving"],
    )
    # NB: a fixed clock keeps the values fresh for the whole run (max-age is 60 s).
    provider = MetricsProvider(catalogue, store, cluster, clock=lambda: now)
    metrics = AdapterMetrics(lambda: [source])
    paths = _paths(pods, per_hpa)
    answered = [0]
    cycle = asyncio.Event()

    def count(how: str) -> None:
        metrics.count_answer(how)
        answered[0] += 1
        if answered[0] % len(paths) == 0:
            cycle.set()  # NB: every query asked about once since the last swap

    answers = AnswerCache(count=count)
    app = make_app(provider, Discovery(catalogue), metrics, ready=lambda: (True, ""), answers=answers)

    async def refresher() -> None:
        turn = 0
        while True:
            if interval is None:
                await cycle.wait()
                cycle.clear()
            else:
                await asyncio.sleep(interval)
            turn += 1
            snapshot = snapshots[turn % 2]
            install = await run_sliced(answers.prepare(provider, snapshot)) if mode == "prepared" else None
            store.update(snapshot)
            if install is not None:
                install()

    async def main() -> None:
        # NB: every query asked once before the run, as HPAs that have been polling for a while
        sizes = [len(answers.body(provider, _query(path))) for path in paths]
        body = b"x" * int(statistics.median(sizes))
        if mode == "bare aiohttp":

            async def bare(request: web.Request) -> web.Response:
                return web.Response(body=body, content_type="application/json")

            served = web.Application()
            served.router.add_get("/{tail:.*}", bare)
        else:
            served = app
            served.router.add_get("/bench/counts", lambda r: web.json_response(_counts(metrics)))
        # NB: the adapter's own runner (as `gpuscale adapter` serves), with its fast path for URLs asked before
        runner = (
            web.AppRunner(served, access_log=None)
            if mode == "bare aiohttp"
            else AdapterRunner(served, rejections=RejectionLog(), access_log=None)
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        if mode != "bare aiohttp":
            asyncio.get_running_loop().create_task(refresher())
        queue.put((runner.addresses[0][1], len(body)))
        await asyncio.Event().wait()

    asyncio.run(main())


def _query(path: str):  # the MetricQuery one of _paths() means
    from urllib.parse import parse_qs, urlsplit

    from gpuscale.adapter.answers import MetricQuery
    from gpuscale.adapter.wire import CUSTOM_GROUP
    from gpuscale.selectors import LabelSelector

    parts = urlsplit(path)
    version, _, namespace, resource, name, metric = parts.path.split("/")[3:]
    selector = LabelSelector.parse(parse_qs(parts.query).get("labelSelector", [""])[0])
    return MetricQuery(CUSTOM_GROUP, version, resource, namespace, name, metric, selector, LabelSelector.everything())


def _counts(metrics) -> dict[str, float]:
    return {
        how: metrics.registry.get_sample_value("gpuscale_adapter_answers_total", {"how": how}) or 0.0
        for how in ("prepared", "cached", "computed")
    }


def _wrk(url: str, paths_file: str, lua_file: str, seconds: float, connections: int) -> dict[str, float]:
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", lua_file, url]
    if shutil.which("taskset") and len(os.sched_getaffinity(0)) > 1:
        command = ["taskset", "-c", "1", *command]
    out = subprocess.run(
        command, capture_output=True, text=True, check=True, env={**os.environ, "BENCH_PATHS": paths_file}
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)

    def latency(p: str) -> float:
        value, unit = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE).groups()
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    return {
        "rps": rps,
        "requests": requests,
        "p50": latency("50"),
        "p99": latency("99"),
        "errors": int(non2xx.group(1)) if non2xx else 0,
    }


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) of a process so far: its own work, whatever else the machine runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get_json(url: str) -> dict:
    import json

    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=5000, help="pods, one GPU each")
    parser.add_argument("--pods-per-hpa", type=int, default=10, help="pods per Deployment (each HPA's selector)")
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        help="seconds between snapshot swaps (default: a swap after every len(queries) answers, so that each "
        "query is asked about once per snapshot whatever the request rate)",
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="the three modes in turn, this many times (medians)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("bench_first_request: needs wrk (apt-get install -y wrk)")
    paths = _paths(args.pods, args.pods_per_hpa)
    rounds: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths_file, lua_file = os.path.join(tmp, "paths"), os.path.join(tmp, "cycle.lua")
        with open(paths_file, "w") as f:
            f.write("\n".join(paths) + "\n")
        with open(lua_file, "w") as f:
            f.write(LUA)

        def start(mode: str, interval: float | None) -> tuple[mp.Process, str, int]:
            queue: mp.Queue = mp.Queue()
            server = mp.Process(target=_serve, args=(mode, args.pods, args.pods_per_hpa, interval, queue), daemon=True)
            server.start()
            port, size = queue.get(timeout=120)
            url = f"http://127.0.0.1:{port}"
            _wrk(url, paths_file, lua_file, 2.0, args.connections)  # warm-up
            return server, url, size

        for mode in ("prepared", "on request", "bare aiohttp") * args.rounds:
            server, url, size = start(mode, args.interval)
            try:
                before = _get_json(url + "/bench/counts") if mode != "bare aiohttp" else {}
                cpu = _cpu_seconds(server.pid)
                result = _wrk(url, paths_file, lua_file, args.seconds, args.connections)
                result["per_cpu_s"] = result["requests"] / max(1e-9, _cpu_seconds(server.pid) - cpu)
                if mode != "bare aiohttp":
                    after = _get_json(url + "/bench/counts")
                    result.update({how: after[how] - before[how] for how in after})
                rounds.setdefault(mode, []).append(result)
            finally:
                server.terminate()
                server.join(5)
    # NB: the machine is shared: medians over rounds that alternate the modes, and each round's ratio
    results = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in rounds.items()}
    bare = results["bare aiohttp"]["rps"]
    print(
        f"{args.pods} pods in Deployments of {args.pods_per_hpa}: {len(paths)} HPA queries in turn, snapshot swapped "
        + (f"every {args.interval:g} s" if args.interval else f"after every {len(paths)} answers")
        + f"; answer ~{size} bytes; wrk -t1 -c{args.connections} {args.seconds:g} s; "
        f"medians of {args.rounds} rounds"
    )
    print(
        f"{'server':<14}{'req/s':>9}{'x bare':>8}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
        f"{'req/CPU-s':>11}{'x bare':>8}  first requests (share)"
    )
    bare_cpu = results["bare aiohttp"]["per_cpu_s"]
    for mode, r in results.items():
        answered = sum(r.get(h, 0) for h in ("prepared", "cached", "computed"))
        first = r.get("prepared", 0) + r.get("computed", 0)
        share = f"  {first / max(1, answered):.0%} ({r.get('prepared', 0):.0f} prepared, "
        share += f"{r.get('computed', 0):.0f} computed)"
        print(
            f"{mode:<14}{r['rps']:>9.0f}{r['rps'] / bare:>8.2f}{r['p50']:>9.2f}{r['p99']:>9.2f}{r['errors']:>8.0f}"
            f"{r['per_cpu_s']:>11.0f}{r['per_cpu_s'] / bare_cpu:>8.2f}" + (share if answered else "")
        )
    for mode in ("prepared", "on request"):
        pairs = list(zip(rounds[mode], rounds["bare aiohttp"], strict=True))
        print(
            f"{mode} / bare aiohttp per round, req/s: "
            + ", ".join(f"{r['rps'] / b['rps']:.2f}x" for r, b in pairs)
            + "; requests per CPU-second: "
            + ", ".join(f"{r['per_cpu_s'] / b['per_cpu_s']:.2f}x" for r, b in pairs)
        )
    print(
        "goal: the first request after a refresh >= 0.5x bare aiohttp: "
        f"{results['prepared']['rps'] / bare:.2f}x in req/s, {results['prepared']['per_cpu_s'] / bare_cpu:.2f}x in "
        "requests per server CPU-second (the refresh's preparation included)"
    )


if __name__ == "__main__":
    main()
