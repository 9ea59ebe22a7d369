"""gpuscale's adapter beside prometheus-adapter v0.12.0 and a bare aiohttp floor, one real Prometheus, one run.

What runs (all on 127.0.0.1, stopped by PID at the end):

* a dcgm-exporter stand-in (child process) serving one page: ``--nodes`` × 8 GPUs, eight DCGM fields each, the
  labels of benchmarks/bench_refresh.py (5,000 pods in 50 namespaces at the default 1,250 nodes);
* the real Prometheus (Debian ``prometheus``), scraping it every ``--scrape-interval``, temporary storage;
* the real control plane (tests/cluster: etcd, kube-apiserver, kube-controller-manager) holding the pods of
  namespace ``team-0`` that the HPA request selects (100 at the default size), labelled ``app=triton``;
* the three servers, measured one at a time, each pinned to CPU 0:
  - **gpuscale** — ``gpuscale adapter --prometheus-url …`` with its refresh running every
    ``--refresh-interval`` (so its answers are recomputed after every refresh, as in production);
  - **prometheus-adapter** v0.12.0 built from the Go module proxy (benchmarks/build-prometheus-adapter),
    configured with a rule that maps ``DCGM_FI_DEV_GPU_UTIL`` to ``gpu_utilization`` on pods as gpuscale's
    catalogue does (mean over the pod's GPUs). It answers each request by listing the selected pods from
    kube-apiserver and querying Prometheus; it is run twice: with its shipped client rate limit
    (``--client-qps`` 5, burst 10) and with that limit lifted (``--client-qps 100000``), its best case;
  - **floor** — bare aiohttp over the same TLS, answering gpuscale's response body, precomputed.

Both adapters are reached as the kube-aggregator reaches them: TLS with the front-proxy client certificate and
``X-Remote-User``/``X-Remote-Group`` headers, authorised by SubjectAccessReviews against the real
kube-apiserver (each adapter caches them). The request::

    GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/team-0/pods/*/gpu_utilization?labelSelector=app=triton

The load generator is benchmarks/go/loadgen (Go, standard library; built once into ~/.cache/gpuscale/loadgen),
pinned to CPU 1: ``closed`` mode gives the throughput (requests/s over ``--connections`` keep-alive connections);
``rate`` mode sends each of ``--rates`` requests/s on a fixed schedule and measures each latency from when the request
was due (wrk2's model; Debian's wrk has no fixed rate and no client certificates), giving p50/p99. It prints
its own CPU time, and Debian ``wrk`` is run against the floor as a cross-check that the generator is not the
limit. Prometheus', kube-apiserver's and etcd's CPU during each phase is printed too: prometheus-adapter
spends theirs on every request, gpuscale once per refresh.

Goal (issue 21 item 5): more requests/s than prometheus-adapter at a lower p99. The machine is shared; read
the figures as ratios within one run.

Usage: .venv/bin/python benchmarks/bench_adapter_peers.py [--nodes 1250] [--seconds 10] [--rates 10,50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import multiprocessing as mp
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import yaml  # noqa: E402
from bench_refresh import DCGM_FIELDS, GPUS_PER_NODE, gpu_labels  # noqa: E402

from tests.cluster.controlplane import ControlPlane, cached_binaries, free_port, start_control_plane  # noqa: E402
from tests.e2e.backends import Backend, start_backend, static_job  # noqa: E402

NS = "team-0"
FULL = "gpuscale --no-demand-driven"
PATH = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/gpu_utilization?labelSelector=app%3Dtriton"
LOADGEN_SRC = REPO / "benchmarks" / "go" / "loadgen"
ADAPTER_RULES = {
    "rules": [
        {
            "seriesQuery": 'DCGM_FI_DEV_GPU_UTIL{namespace!="",pod!=""}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
            "name": {"matches": "^DCGM_FI_DEV_GPU_UTIL$", "as": "gpu_utilization"},
            "metricsQuery": "avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        }
    ]
}


# --- the exporter and the cluster -----------------------------------------------------------------------


def exporter_page(nodes: int) -> bytes:
    lines = []
    for field, value in DCGM_FIELDS.items():
        lines.append(f"# HELP {field} x\n# TYPE {field} gauge")
        for n in range(nodes):
            for g in range(GPUS_PER_NODE):
                labels = ",".join(f'{k}="{v}"' for k, v in gpu_labels(n, g).items())
                lines.append(f"{field}{{{labels}}} {value(g)}")
    return ("\n".join(lines) + "\n").encode()


def _serve_exporter(nodes: int, port: int, ready: mp.Event) -> None:  # the child process
    page = exporter_page(nodes)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    ready.set()
    server.serve_forever()


def selected_pods(nodes: int) -> list[str]:
    """The pods of NS in bench_refresh's layout (pod p is in team-{p % 50})."""
    return [f"pod-{p:05d}" for p in range(nodes * GPUS_PER_NODE // 2) if p % 50 == 0]


def create_pods(plane: ControlPlane, names: list[str]) -> None:
    rest = plane.rest()
    rest.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}).expect(201)
    for name in names:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": {"app": "triton"}},
            "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/tritonserver:25.01-py3"}]},
        }
        rest.post(f"/api/v1/namespaces/{NS}/pods", pod).expect(201)


def start_fleet(
    stack: contextlib.ExitStack, nodes: int, scrape_interval: str, work: Path
) -> tuple[Backend, ControlPlane, int]:
    """The exporter stand-in, Prometheus once it holds the fleet's series (and their count), the control plane;
    ``stack`` stops them."""
    ctx = mp.get_context("spawn")
    exporter_port, ready = free_port(), ctx.Event()
    exporter = ctx.Process(target=_serve_exporter, args=(nodes, exporter_port, ready), daemon=True)
    exporter.start()
    stack.callback(exporter.terminate)
    ready.wait(120)
    job = static_job("dcgm", [f"127.0.0.1:{exporter_port}"], scrape_interval=scrape_interval)
    prometheus = start_backend("prometheus", [job], workdir=work / "prometheus", scrape_interval=scrape_interval)
    stack.callback(prometheus.stop)
    plane = start_control_plane(cached_binaries(), work / "kube")
    stack.callback(plane.stop)

    async def prometheus_ready() -> int:
        await prometheus.wait_ready(targets=1, series="DCGM_FI_DEV_GPU_UTIL", timeout=120)
        count = len(await prometheus.query("DCGM_FI_DEV_GPU_UTIL"))
        await prometheus.close_session()
        return count

    return prometheus, plane, asyncio.run(prometheus_ready())


def infra_pids(prometheus: Backend, plane: ControlPlane) -> dict[str, int]:
    """What an adapter makes work for: Prometheus, kube-apiserver, etcd (the controller manager does not serve it)."""
    return {
        "prometheus": prometheus.pid,
        **{p.name: p.popen.pid for p in plane._processes if p.name != "kube-controller-manager"},
    }


# --- processes ---------------------------------------------------------------------------------------------


def pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if (os.cpu_count() or 1) > 1 and shutil.which("taskset") else []


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its reaped children, from /proc (clock ticks → seconds)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@contextlib.contextmanager
def process(args: list[str], log: Path, **kw: object) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **kw)  # type: ignore[call-overload]
    try:
        yield popen
    finally:
        if popen.poll() is None:
            popen.terminate()
            try:
                popen.wait(10)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(10)


def build(what: list[str]) -> str:
    """Run a build script; the path it prints last."""
    answer = subprocess.run(what, capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        raise SystemExit(f"bench_adapter_peers: {' '.join(what)} failed:\n{answer.stderr[-2000:]}")
    return answer.stdout.strip().splitlines()[-1]


def loadgen_binary() -> str:
    """benchmarks/go/loadgen built once per source version into ~/.cache/gpuscale/loadgen/<hash>/."""
    import hashlib

    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(LOADGEN_SRC.glob("*")))).hexdigest()[:12]
    dest = Path.home() / ".cache" / "gpuscale" / "loadgen" / digest / "loadgen"
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"}
        subprocess.run(["go", "build", "-trimpath", "-o", str(dest), "."], cwd=LOADGEN_SRC, env=env, check=True)
    return str(dest)


# --- asking a server ---------------------------------------------------------------------------------------


class FrontProxy:
    """Requests as the kube-aggregator makes them: its client certificate and the user in headers."""

    def __init__(self, plane: ControlPlane) -> None:
        self.cert, self.key = plane.pki.front_proxy_client.cert, plane.pki.front_proxy_client.key
        self.headers = {"X-Remote-User": "bench", "X-Remote-Group": "system:masters"}
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE
        self.context.load_cert_chain(str(self.cert), str(self.key))

    def get(self, url: str) -> tuple[int, bytes]:
        request = urllib.request.Request(url, headers=self.headers)
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=10) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError as e:
            return 0, str(e).encode()

    def wait_answer(self, url: str, popen: subprocess.Popen, log: Path, *, items: int, timeout: float) -> bytes:
        """The server's answer once it lists ``items`` items; exits with the log's tail otherwise."""
        deadline = time.monotonic() + timeout
        last: tuple[int, bytes] = (0, b"")
        while time.monotonic() < deadline:
            if popen.poll() is not None:
                raise SystemExit(f"{url} exited with {popen.returncode}:\n{log.read_text()[-3000:]}")
            last = self.get(url)
            if last[0] == 200 and len(json.loads(last[1]).get("items", [])) == items:
                return last[1]
            time.sleep(0.5)
        raise SystemExit(
            f"{url}: no answer with {items} items in {timeout:.0f} s (last: {last!r:.400})\n{log.read_text()[-3000:]}"
        )


def values(body: bytes) -> dict[str, float]:
    def quantity(q: str) -> float:
        return float(q[:-1]) / 1000 if q.endswith("m") else float(q)

    return {i["describedObject"]["name"]: quantity(i["value"]) for i in json.loads(body)["items"]}


# --- the floor -----------------------------------------------------------------------------------------------


def _serve_floor(body: bytes, cert: str, key: str, port: int, ready: mp.Event) -> None:  # the child process
    from aiohttp import web

    async def bare(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", bare)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


# --- measuring ------------------------------------------------------------------------------------------------


def drive(
    loadgen: str, url: str, proxy: FrontProxy | None, args: argparse.Namespace, mode: str, rate: float = 1
) -> dict:
    command = [
        *pinned(1),
        loadgen,
        "-url",
        url,
        "-mode",
        mode,
        "-connections",
        str(args.connections),
        "-duration",
        f"{args.seconds}s",
        "-rate",
        str(rate),
        "-warmup",
        "1s",
    ]
    if proxy is not None:
        command += ["-cert", str(proxy.cert), "-key", str(proxy.key)]
        for k, v in proxy.headers.items():
            command += ["-H", f"{k}: {v}"]
    answer = subprocess.run(command, capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        raise SystemExit(f"loadgen failed: {answer.stderr}")
    return json.loads(answer.stdout)


def measure(
    name: str,
    pid: int,
    url: str,
    proxy: FrontProxy | None,
    args: argparse.Namespace,
    loadgen: str,
    infra: dict[str, int],
) -> dict:
    out: dict = {"server": name}
    for phase, mode, rate in [("closed", "closed", 1.0), *((f"rate {r:g}", "rate", r) for r in args.rates)]:
        before = {k: cpu_seconds(p) for k, p in {"server": pid, **infra}.items()}
        result = drive(loadgen, url, proxy, args, mode, rate)
        after = {k: cpu_seconds(p) for k, p in {"server": pid, **infra}.items()}
        result["cpu"] = {k: after[k] - before[k] for k in before}
        out[phase] = result
    out["rss_mb"] = rss_mb(pid)
    return out


def wrk_floor(url: str, args: argparse.Namespace) -> float | None:
    """Debian wrk's requests/s against the floor (cross-check of the generator), or None without wrk."""
    wrk = shutil.which("wrk")
    if wrk is None:
        return None
    command = [*pinned(1), wrk, "-t1", f"-c{args.connections}", f"-d{args.seconds}s", url]
    text = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    for line in text.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    return None


def report(rows: list[dict], args: argparse.Namespace, wrk_rps: float | None, extra: dict) -> None:
    rates = [f"rate {r:g}" for r in args.rates]
    print(f"\nrequest: GET {PATH}  ({extra['items']} items, {extra['bytes']} bytes from gpuscale)")
    print(
        f"fleet: {args.nodes * GPUS_PER_NODE} GPUs in Prometheus ({extra['series']} series), "
        f"scrape {args.scrape_interval}, gpuscale refresh {args.refresh_interval}; "
        f"load average at start {extra['load']}"
    )
    print(f"load: {args.connections} connections, {args.seconds} s per phase\n")
    header = f"{'server':36} {'closed req/s':>12} {'CPU ms/req':>10} {'infra CPU s':>11} {'RSS MB':>6}"
    for phase in rates:
        header += f" | {phase + ' req/s: got':>18} {'p50 ms':>8} {'p99 ms':>8} {'err':>4}"
    print(header)
    for r in rows:
        c = r["closed"]
        per = 1000 * c["cpu"]["server"] / max(1, c["requests"])
        infra = sum(v for k, v in c["cpu"].items() if k != "server")
        line = f"{r['server']:36} {c['rps']:12.0f} {per:10.3f} {infra:11.2f} {r['rss_mb']:6.0f}"
        for phase in rates:
            f = r[phase]
            errors = f["errors"] + f["non_2xx"] + max(0, f["unfinished"])
            line += f" | {f['rps']:18.1f} {f['p50_ms']:8.2f} {f['p99_ms']:8.2f} {errors:4d}"
        print(line)
    print("\n(closed: throughput over the keep-alive connections; CPU ms/req: the server's CPU per request in the")
    print(" closed phase; infra CPU: Prometheus + kube-apiserver + etcd CPU seconds during the closed phase;")
    print(" rate R: R requests/s due on a fixed schedule, latency counted from when each was due;")
    print(" err: failed, non-2xx or unanswered within 30 s after the schedule ended)")
    for r in rows:
        for phase in ("closed", *rates):
            if r[phase].get("first_error") or r[phase].get("first_bad_status"):
                print(
                    f"  {r['server']} {phase}: first error {r[phase].get('first_error') or ''} "
                    f"status {r[phase].get('first_bad_status') or ''}"
                )
    lg = max(r["closed"]["loadgen_cpu_seconds"] / r["closed"]["seconds"] for r in rows)
    print(
        f"\nload generator: at most {lg:.2f} CPU-seconds per second (of its 1 pinned CPU)"
        + (f"; Debian wrk against the floor: {wrk_rps:.0f} req/s" if wrk_rps else "")
    )
    by = {r["server"]: r for r in rows}
    gs, pa = by["gpuscale"], by["prometheus-adapter (client-qps 100000)"]
    print(f"gpuscale / prometheus-adapter (best case): {gs['closed']['rps'] / pa['closed']['rps']:.2f}× req/s")
    for phase in rates:
        print(
            f"  p99 at {phase} req/s: gpuscale {gs[phase]['p99_ms']:.2f} ms, prometheus-adapter "
            f"{pa[phase]['p99_ms']:.2f} ms ({pa[phase]['p99_ms'] / max(gs[phase]['p99_ms'], 1e-9):.2f}× lower)"
        )
    floor = by["floor (bare aiohttp, precomputed body)"]
    print(f"gpuscale / floor: {gs['closed']['rps'] / floor['closed']['rps']:.2f}× req/s")
    print(f"values: {extra['agree']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1250, help="GPU nodes of 8 GPUs in Prometheus (default 1250)")
    parser.add_argument("--seconds", type=int, default=10, help="length of each measured phase")
    parser.add_argument(
        "--rates",
        type=lambda text: [float(x) for x in text.split(",")],
        default=[10.0, 50.0],
        help="fixed request rates of the latency phases, requests/s, comma-separated (default 10,50)",
    )
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--scrape-interval", default="15s")
    parser.add_argument("--refresh-interval", default="5s")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()

    adapter = build(["bash", str(REPO / "benchmarks" / "build-prometheus-adapter")])
    loadgen = loadgen_binary()
    work = Path(tempfile.mkdtemp(prefix="gpuscale-peers-"))
    load = os.getloadavg()[0]
    ctx = mp.get_context("spawn")
    with contextlib.ExitStack() as stack:
        prometheus, plane, series = start_fleet(stack, args.nodes, args.scrape_interval, work)
        pods = selected_pods(args.nodes)
        create_pods(plane, pods)
        proxy = FrontProxy(plane)
        infra = infra_pids(prometheus, plane)
        rows: list[dict] = []

        def serve_and_measure(name: str, command: list[str], log: Path, port: int) -> bytes:
            """Start a server, wait for its first full answer, measure it, stop it; its answer."""
            url = f"https://127.0.0.1:{port}{PATH}"
            with process(command, log, cwd=work) as popen:
                body = proxy.wait_answer(url, popen, log, items=len(pods), timeout=180)
                rows.append(measure(name, popen.pid, url, proxy, args, loadgen, infra))
            return body

        # gpuscale: as shipped (demand-driven: the fetched scope is what is asked for), then refreshing every GPU
        for name, extra in (("gpuscale", []), (FULL, ["--no-demand-driven"])):
            port = free_port()
            command = [*pinned(0), sys.executable, "-m", "gpuscale.cli.main", "adapter",
                       "--prometheus-url", prometheus.url, "--kubeconfig", str(plane.admin),
                       "--bind-address", "127.0.0.1", "--secure-port", str(port), "--cert-dir", str(work / "gs-certs"),
                       "--refresh-interval", args.refresh_interval, "--apis", "custom", "--log-level", "warning",
                       *extra]  # fmt: skip
            body = serve_and_measure(name, command, work / f"gpuscale-{len(rows)}.log", port)
            gs_values = values(body)

        # prometheus-adapter, with its shipped client rate limit and with it lifted
        config = work / "prometheus-adapter.yaml"
        config.write_text(yaml.safe_dump(ADAPTER_RULES))
        pa_values: dict[str, float] = {}
        for qps in (None, 100000):
            port = free_port()
            command = [
                *pinned(0),
                adapter,
                f"--prometheus-url={prometheus.url}",
                f"--config={config}",
                f"--lister-kubeconfig={plane.admin}",
                f"--authentication-kubeconfig={plane.admin}",
                f"--authorization-kubeconfig={plane.admin}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={work / 'pa-certs'}",
                "--metrics-relist-interval=1m",
                "--v=0",
            ]
            if qps:
                command += [f"--client-qps={qps}", f"--client-burst={qps}"]
            name = f"prometheus-adapter (client-qps {qps or '5, shipped'})"
            pa_values = values(serve_and_measure(name, command, work / f"prometheus-adapter-{qps or 5}.log", port))

        # the floor
        import trustme

        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1")
        cert, key = work / "floor.crt", work / "floor.key"
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
        port, ready = free_port(), ctx.Event()
        floor = ctx.Process(target=_serve_floor, args=(body, str(cert), str(key), port, ready), daemon=True)
        floor.start()
        stack.callback(floor.terminate)
        if pinned(0):
            os.sched_setaffinity(floor.pid, {0})
        ready.wait(60)
        url = f"https://127.0.0.1:{port}{PATH}"
        rows.append(measure("floor (bare aiohttp, precomputed body)", floor.pid, url, None, args, loadgen, infra))
        wrk_rps = wrk_floor(url, args)

        diff = [abs(gs_values[p] - pa_values.get(p, float("nan"))) for p in gs_values]
        agree = (
            f"both adapters answer the same {len(gs_values)} pods, largest difference {max(diff):g} percent"
            if set(gs_values) == set(pa_values)
            else f"pod sets differ: gpuscale {len(gs_values)}, prometheus-adapter {len(pa_values)}"
        )
        extra = {"items": len(pods), "bytes": len(body), "series": series, "load": f"{load:.2f}", "agree": agree}
        report(rows, args, wrk_rps, extra)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows, "wrk_floor_rps": wrk_rps, **extra}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
