"""gpuscale's adapter beside prometheus-adapter v0.12.0 at a cluster's query diversity (issue 36, item 4).

benchmarks/bench_adapter_peers.py asks one repeated URL, a cache's best case. Here the HPAs of a cluster ask:
``--queries`` N distinct HPA queries, each ``pods/*/gpu_utilization?labelSelector=app=app-K`` in one of the
fleet's 50 namespaces (the fleet's pods split evenly: 5 pods per query for 1,000 queries at 1,250 nodes), asked
**open loop at the HPA sync rate** — each query once per 15 s, so N/15 requests/s — for ``--rounds`` rounds of
``--seconds`` each, against:

* **gpuscale** — ``gpuscale adapter`` as shipped (demand-driven), refreshing every ``--refresh-interval``;
* **prometheus-adapter** v0.12.0 with its shipped ``--client-qps 5`` and with it lifted (``--client-qps 100000``).

The same setup as bench_adapter_peers.py (its exporter stand-in, the real Prometheus scraping it every
``--scrape-interval``, the real control plane holding every pod of the fleet with its ``app`` label, requests made
as the kube-aggregator makes them, each server pinned to CPU 0 and the load generator to CPU 1), one server at a
time. Per round: load average, requests/s achieved, p50/p99 (latency from when each request was due), errors
(failed, non-2xx, unanswered 30 s after the schedule), and the CPU seconds of the server (with its children),
Prometheus, kube-apiserver and etcd.

Staleness: gpuscale answers from a cache refreshed every --refresh-interval (a value is at most refresh + scrape
interval old); prometheus-adapter sends Prometheus a live query per request (at most one scrape interval old). The
exporter stand-in serves constant values, so no scrape can move a value and staleness cannot make the two
disagree: the value check compares them at the quantity's resolution. Before its rounds, every query's answer
from prometheus-adapter (lifted: all N; shipped, 5 requests/s: ``--check-sample`` of them) is compared with
gpuscale's, pod by pod; any pod set or value that differs ends the run with exit status 1 and one line naming the
query and both values.

Usage: nice -n 10 .venv/bin/python benchmarks/bench_adapter_peers_diverse.py [--queries 1000] [--rounds 3]
       [--seconds 15] (builds prometheus-adapter on first use; needs the control plane built by tests/cluster/build)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import yaml  # noqa: E402
from bench_adapter_peers import (  # noqa: E402
    ADAPTER_RULES,
    FrontProxy,
    build,
    infra_pids,
    loadgen_binary,
    pinned,
    process,
    start_fleet,
    values,
)
from bench_cluster_serving import tree_cpu  # noqa: E402
from bench_refresh import GPUS_PER_NODE  # noqa: E402

from tests.cluster.controlplane import ControlPlane, free_port  # noqa: E402

NAMESPACES = 50  # bench_refresh's layout: pod p is in team-{p % 50}
SYNC_S = 15.0  # kube-controller-manager's --horizontal-pod-autoscaler-sync-period default
TOLERANCE = 0.001  # one milli-unit: both adapters answer quantities in milli-units
LIFTED = 100000
METRIC = "gpu_utilization"  # the one metric ADAPTER_RULES gives prometheus-adapter


# --- the queries -------------------------------------------------------------------------------------------------


def layout(nodes: int, queries: int) -> dict[str, list[str]]:
    """Each query's path → the pods it selects: in each namespace, pod rank r gets label app-{r % per-namespace}."""
    pods = nodes * GPUS_PER_NODE // 2
    per_namespace = queries // NAMESPACES
    if queries % NAMESPACES or not 0 < per_namespace <= pods // NAMESPACES:
        raise SystemExit(
            f"bench_adapter_peers_diverse: --queries must be a multiple of {NAMESPACES} between {NAMESPACES} and "
            f"{pods - pods % NAMESPACES} (the pods of {nodes} nodes), got {queries}"
        )
    out: dict[str, list[str]] = {}
    for p in range(pods):
        namespace, app = f"team-{p % NAMESPACES}", f"app-{(p // NAMESPACES) % per_namespace}"
        path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/{METRIC}?labelSelector=app%3D{app}"
        out.setdefault(path, []).append(f"pod-{p:05d}")
    return out


def create_fleet(plane: ControlPlane, nodes: int, queries: int) -> None:
    """Every pod of the fleet in the API server, labelled with the app its query selects."""
    rest = plane.rest()
    for n in range(NAMESPACES):
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"team-{n}"}}
        rest.post("/api/v1/namespaces", namespace).expect(201)
    per_namespace = queries // NAMESPACES

    def create(p: int) -> None:
        namespace = f"team-{p % NAMESPACES}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"pod-{p:05d}", "namespace": namespace,
                         "labels": {"app": f"app-{(p // NAMESPACES) % per_namespace}"}},
            "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/tritonserver:25.01-py3"}]},
        }  # fmt: skip
        rest.post(f"/api/v1/namespaces/{namespace}/pods", pod).expect(201)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(create, range(nodes * GPUS_PER_NODE // 2)))


# --- the value check ---------------------------------------------------------------------------------------------


def answers(proxy: FrontProxy, base: str, queries: dict[str, list[str]], timeout: float) -> dict[str, dict]:
    """Each query's values per pod, once the server answers it with exactly its pods; exits naming one that did not."""
    got: dict[str, dict] = {}
    last: dict[str, str] = {}
    deadline = time.monotonic() + timeout

    def ask(path: str) -> None:
        status, body = proxy.get(base + path)
        if status != 200:
            last[path] = f"status {status}: {body[:200]!r}"
            return
        answer = values(body)
        if sorted(answer) == sorted(queries[path]):
            got[path] = answer
        else:
            last[path] = f"pods {sorted(answer)[:5]}… ({len(answer)}), want {len(queries[path])}"

    with ThreadPoolExecutor(8) as pool:
        while len(got) < len(queries):
            list(pool.map(ask, [p for p in queries if p not in got]))
            if len(got) < len(queries):
                if time.monotonic() > deadline:
                    path = next(p for p in queries if p not in got)
                    raise SystemExit(f"value check: {base}{path} not answered in {timeout:g} s: {last.get(path)}")
                time.sleep(1)
    return got


def check(ours: dict[str, dict], theirs: dict[str, dict], name: str) -> str:
    """The largest difference over the queries asked of both; exits with status 1 naming the first disagreement."""
    largest = 0.0
    for path, their_values in theirs.items():
        for pod, value in their_values.items():
            difference = abs(value - ours[path][pod])
            if difference > TOLERANCE:
                print(f"value check FAILED: {path} pod {pod}: gpuscale {ours[path][pod]:g}, {name} {value:g} "
                      f"(tolerance {TOLERANCE:g})", file=sys.stderr)  # fmt: skip
                raise SystemExit(1)
            largest = max(largest, difference)
    return f"{name}: {len(theirs)} queries, same pods, largest difference {largest:g} (tolerance {TOLERANCE:g})"


# --- measuring ---------------------------------------------------------------------------------------------------


def rounds(loadgen: str, urls: Path, proxy: FrontProxy, pid: int, infra: dict[str, int], args) -> list[dict]:
    out = []
    for _ in range(args.rounds):
        load = os.getloadavg()[0]
        before = {"server": tree_cpu(pid), **{k: tree_cpu(p) for k, p in infra.items()}}
        command = [*pinned(1), loadgen, "-urls", str(urls), "-mode", "rate", "-rate", f"{args.rate:g}",
                   "-duration", f"{args.seconds:g}s", "-connections", str(args.connections), "-warmup", "0s",
                   "-cert", str(proxy.cert), "-key", str(proxy.key)]  # fmt: skip
        for k, v in proxy.headers.items():
            command += ["-H", f"{k}: {v}"]
        answer = subprocess.run(command, capture_output=True, text=True, check=False)
        if answer.returncode != 0:
            raise SystemExit(f"loadgen failed: {answer.stderr.strip()}")
        result = json.loads(answer.stdout)
        after = {"server": tree_cpu(pid), **{k: tree_cpu(p) for k, p in infra.items()}}
        result["cpu"] = {k: after[k] - before[k] for k in before}
        result["load"] = load
        result["failed"] = result["errors"] + result["non_2xx"] + max(0, result["unfinished"])
        out.append(result)
    return out


def spread(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} ({'–'.join(fmt.format(v) for v in (min(values), max(values)))})"


def report(measured: dict[str, list[dict]], args, infra: list[str]) -> None:
    header = f"{'server':44} {'round':>5} {'load':>5} {'req/s':>6} {'p50 ms':>9} {'p99 ms':>9} {'err':>5}"
    header += f" {'server CPU s':>12}" + "".join(f" {k + ' CPU s':>{max(12, len(k) + 6)}}" for k in infra)
    print(header)
    for name, results in measured.items():
        for i, r in enumerate(results, 1):
            line = f"{name:44} {i:5d} {r['load']:5.2f} {r['rps']:6.1f} {r['p50_ms']:9.2f} {r['p99_ms']:9.2f}"
            line += f" {r['failed']:5d} {r['cpu']['server']:12.2f}"
            line += "".join(f" {r['cpu'][k]:>{max(12, len(k) + 6)}.2f}" for k in infra)
            print(line)
    print(f"\nmedian (min–max) of {args.rounds} rounds:")
    for name, results in measured.items():
        infra_cpu = [sum(r["cpu"][k] for k in infra) for r in results]
        print(
            f"  {name:44} req/s {spread([r['rps'] for r in results], '{:.1f}')}, "
            f"p50 {spread([r['p50_ms'] for r in results], '{:.2f}')} ms, "
            f"p99 {spread([r['p99_ms'] for r in results], '{:.2f}')} ms, "
            f"errors {spread([r['failed'] for r in results], '{:.0f}')}, "
            f"server CPU {spread([r['cpu']['server'] for r in results], '{:.2f}')} s, "
            f"Prometheus + API server + etcd CPU {spread(infra_cpu, '{:.2f}')} s"
        )
        for r in results:
            if r.get("first_error") or r.get("first_bad_status"):
                print(f"    first error: {r.get('first_error') or ''} status {r.get('first_bad_status') or ''}")
                break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1250, help="GPU nodes of 8 GPUs (2 per pod; default 1250)")
    parser.add_argument("--queries", type=int, default=1000, help="distinct HPA queries (default 1000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each round (default 15: one sync)")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--scrape-interval", default="15s")
    parser.add_argument("--refresh-interval", default="5s")
    parser.add_argument("--check-sample", type=int, default=25, help="queries value-checked at the shipped QPS")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or args.check_sample < 1:
        raise SystemExit("bench_adapter_peers_diverse: --rounds and --check-sample ≥ 1, --seconds > 0")
    queries = layout(args.nodes, args.queries)
    args.rate = len(queries) / SYNC_S

    adapter = build(["bash", str(REPO / "benchmarks" / "build-prometheus-adapter")])
    loadgen = loadgen_binary()
    work = Path(tempfile.mkdtemp(prefix="gpuscale-peers-diverse-"))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)  # NB: last out, after every process stopped
        prometheus, plane, _ = start_fleet(stack, args.nodes, args.scrape_interval, work)
        create_fleet(plane, args.nodes, args.queries)
        proxy = FrontProxy(plane)
        infra = infra_pids(prometheus, plane)
        measured: dict[str, list[dict]] = {}
        checks: list[str] = []

        def serve(
            name: str, command: Callable[[int], list[str]], expected: dict[str, list[str]] | None
        ) -> dict[str, dict]:
            """Start a server, take its answers to the queries (all, or those of ``expected``), measure, stop."""
            port = free_port()
            base = f"https://127.0.0.1:{port}"
            log = work / f"{len(measured)}.log"
            urls = work / "urls"
            urls.write_text("".join(f"{base}{p}\n" for p in queries))
            with process([*pinned(0), *command(port)], log, cwd=work) as popen:
                asked = {p: queries[p] for p in (expected or queries)}
                deadline = time.monotonic() + 180
                while proxy.get(base + next(iter(asked)))[0] != 200:
                    if popen.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"{name} did not start:\n{log.read_text()[-3000:]}")
                    time.sleep(0.5)
                got = answers(proxy, base, asked, timeout=len(asked) / 2 + 60)
                measured[name] = rounds(loadgen, urls, proxy, popen.pid, infra, args)
            return got

        def gpuscale(port: int) -> list[str]:
            return [sys.executable, "-m", "gpuscale.cli.main", "adapter", "--prometheus-url", prometheus.url,
                    "--kubeconfig", str(plane.admin), "--bind-address", "127.0.0.1", "--secure-port", str(port),
                    "--cert-dir", str(work / "gs-certs"), "--refresh-interval", args.refresh_interval,
                    "--apis", "custom", "--log-level", "warning"]  # fmt: skip

        config = work / "prometheus-adapter.yaml"
        config.write_text(yaml.safe_dump(ADAPTER_RULES))

        def prometheus_adapter(qps: int | None) -> Callable[[int], list[str]]:
            def command(port: int) -> list[str]:
                lifted = [f"--client-qps={qps}", f"--client-burst={qps}"] if qps else []
                return [adapter, f"--prometheus-url={prometheus.url}", f"--config={config}",
                        f"--lister-kubeconfig={plane.admin}", f"--authentication-kubeconfig={plane.admin}",
                        f"--authorization-kubeconfig={plane.admin}", "--bind-address=127.0.0.1",
                        f"--secure-port={port}", f"--cert-dir={work / 'pa-certs'}",
                        "--metrics-relist-interval=1m", "--v=0", *lifted]  # fmt: skip

            return command

        ours = serve("gpuscale", gpuscale, None)
        # NB: the value check runs before a peer's rounds, so a disagreement ends the run before it is measured.
        theirs = serve(f"prometheus-adapter (client-qps {LIFTED})", prometheus_adapter(LIFTED), None)
        checks.append(check(ours, theirs, f"prometheus-adapter (client-qps {LIFTED})"))
        step = max(1, len(queries) // args.check_sample)
        sample = {p: queries[p] for p in list(queries)[::step][: args.check_sample]}
        theirs = serve("prometheus-adapter (client-qps 5, shipped)", prometheus_adapter(None), sample)
        checks.append(check(ours, theirs, "prometheus-adapter (client-qps 5, shipped)"))

        pods = sum(len(v) for v in queries.values())
        print(f"\n{started}: {len(queries):,} distinct HPA queries (pods/*/gpu_utilization, labelSelector app=app-K in "
              f"{NAMESPACES} namespaces, {pods // len(queries)} pods each, {args.nodes * GPUS_PER_NODE:,} GPUs) "
              f"asked open loop at {args.rate:.1f} req/s (each once per {SYNC_S:g} s, the HPA sync period), "
              f"{args.connections} connections, {args.rounds} rounds of {args.seconds:g} s per server")  # fmt: skip
        print(f"staleness: gpuscale answers from a cache refreshed every {args.refresh_interval} (a value at most "
              f"{args.refresh_interval} + the {args.scrape_interval} scrape old); prometheus-adapter sends a live "
              f"Prometheus query per request (at most one {args.scrape_interval} scrape old); the exporter's "
              f"values are constant, so staleness cannot move them")  # fmt: skip
        for line in checks:
            print(f"value check passed: {line}")
        print()
        report(measured, args, list(infra))
        if args.json:
            args.json.write_text(json.dumps({"measured": measured, "checks": checks, "started": started}, indent=1))


if __name__ == "__main__":
    main()
