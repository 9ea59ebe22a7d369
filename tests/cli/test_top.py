"""`gpuscale top` driven as a user drives it: a subprocess with flags, reading exporters over HTTP.

Scope: the three views over the 8×H100 fixture served by a tiny aiohttp server (table, wide, JSON, YAML),
the fixture GPUs' verdicts (GPU1 under-filled, GPU5 unhealthy, GPU6 idle), namespaces, sorting, the error
messages (every source down, nothing found, bad flags), --watch (iterations and Ctrl-C), the Prometheus
source behind --prometheus-url, and the `kubectl gpu` plugin run by the real kubectl. The simulated
cluster (Kubernetes API, adapter API) is covered in test_top_cluster.py. Fixture values are read from the
fixture file, never copied here.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import re
import shutil
import signal
import struct
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from gpuscale.cli.main import main
from gpuscale.metrics.exposition import parse_samples
from gpuscale.top.document import GpuTopList
from tests.helpers import H100, H100_NODE, TRITON, reaped

KUBECTL = shutil.which("kubectl")
WIDTH = 120


@dataclass
class Run:
    code: int
    out: str
    err: str

    def table(self) -> list[dict[str, str]]:
        """The rows of the printed table (up to the first blank line), as header → cell."""
        lines = self.out.split("\n\n", 1)[0].splitlines()
        header = re.split(r"\s{2,}", lines[0].strip())
        return [dict(zip(header, re.split(r"\s{2,}", line.strip()), strict=True)) for line in lines[1:]]

    def doc(self) -> GpuTopList:
        return GpuTopList.model_validate_json(self.out)


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": "/dev/null", **extra}


async def top(*args: str, timeout: float = 30, env: dict[str, str] | None = None) -> Run:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuscale.cli.main",
        "top",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or child_env(),
    )
    out, err = await reaped(proc, proc.communicate(), timeout)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def fixture_values(name: str) -> dict[str, float]:
    """GPU index → value of one DCGM field in the 8×H100 fixture."""
    return {s.labels["gpu"]: s.value for s in parse_samples(H100.read_text()) if s.name == name}


@pytest.fixture
async def exporter(aiohttp_server):
    """The fixture as a dcgm-exporter at /metrics, a failing exporter at /broken, Triton at /triton."""

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=H100.read_text(), content_type="text/plain")

    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="exporter crashed")

    async def triton(request: web.Request) -> web.Response:
        return web.Response(text=TRITON.read_text(), content_type="text/plain")

    async def long_names(request: web.Request) -> web.Response:
        text = H100.read_text().replace("llama3-8b-instruct-5c6b9d8f47-qz7mh", LONG_POD)
        return web.Response(text=text.replace("ip-10-0-131-77", LONG_NODE), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/long-names", long_names)
    app.router.add_get("/broken", broken)
    app.router.add_get("/triton", triton)
    server = await aiohttp_server(app)
    return str(server.make_url("/metrics")), str(server.make_url("/broken")), str(server.make_url("/triton"))


LONG_POD = "llama-3-1-70b-instruct-speculative-decoding-canary-7f9c8d6b5d-qz7mh"
LONG_NODE = "gpu-h100-80gb-hbm3-a3-highgpu-8g-us-central1-a-node-0042"


async def test_piped_top_keeps_whole_names_as_kubectl_does(exporter):
    """Piped into grep or awk, a pod or node name is never cut (a terminal still fits its width)."""
    url, _, _ = exporter
    long_url = url.replace("/metrics", "/long-names")
    gpus, pods = await asyncio.gather(
        top("gpus", "--scrape-url", long_url), top("pods", "-A", "--scrape-url", long_url)
    )

    assert gpus.code == 0 and pods.code == 0, gpus.err + pods.err
    assert "…" not in gpus.out.split("\n\n")[0] and "…" not in pods.out.split("\n\n")[0], gpus.out + pods.out
    assert {row["NODE"] for row in gpus.table()} == {f"{LONG_NODE}.ec2.internal"}  # domain and all
    assert f"nim/{LONG_POD}" in {row["POD"] for row in gpus.table()}
    assert LONG_POD in {row["POD"] for row in pods.table()}
    assert max(len(line) for line in gpus.out.splitlines()) > WIDTH  # the table is as wide as its names
    notes = gpus.out.split("\n\n")[1:]
    assert all(len(line) <= WIDTH for part in notes for line in part.splitlines()), notes  # prose still wraps


async def top_on_terminal(columns: int, *args: str, timeout: float = 30) -> Run:
    """``gpuscale top`` with its stdout on a pseudo-terminal ``columns`` wide (what rich sees as a terminal);
    the output without colour codes and carriage returns."""
    main_fd, terminal_fd = pty.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in child_env(TERM="xterm-256color").items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscale.cli.main", "top", *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=terminal_fd, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    os.close(terminal_fd)

    def read_all() -> bytes:
        chunks = []
        with contextlib.suppress(OSError):  # NB: EIO once the child has closed the terminal
            while chunk := os.read(main_fd, 65536):
                chunks.append(chunk)
        os.close(main_fd)
        return b"".join(chunks)

    out, (_, err) = await reaped(proc, asyncio.gather(asyncio.to_thread(read_all), proc.communicate()), timeout)
    assert proc.returncode is not None
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode()).replace("\r", "")
    return Run(proc.returncode, text, err.decode())


async def test_a_narrow_terminal_shows_one_line_a_row_and_whole_words(exporter):
    """80 columns: every row is one line that fits (it used to wrap onto two), names are cut between segments
    only, the verdict stays, and the frame says which columns are left out (issue 34's rough edge)."""
    url, _, _ = exporter
    long_url = url.replace("/metrics", "/long-names")
    piped, narrow = await asyncio.gather(
        top("pods", "-A", "--scrape-url", long_url), top_on_terminal(80, "pods", "-A", "--scrape-url", long_url)
    )

    assert piped.code == 0 and narrow.code == 0, piped.err + narrow.err
    assert all(len(line) <= 80 for line in narrow.out.splitlines()), narrow.out
    table_lines = [run.out.split("\n\n")[0].splitlines() for run in (narrow, piped)]
    assert len(table_lines[0]) == len(table_lines[1]), narrow.out  # one line a pod, not wrapped onto two
    rows, whole = narrow.table(), piped.table()
    assert [r["VERDICT"] for r in rows] == [r["VERDICT"] for r in whole]
    for row, full in zip(rows, whole, strict=True):
        assert row["NAMESPACE"] == full["NAMESPACE"]
        head, _, tail = row["POD"].partition("…")
        assert full["POD"].startswith(head) and full["POD"].endswith(tail), (row, full)
        assert row["POD"] == full["POD"] or (full["POD"][len(head)] == "-" and tail.startswith("-")), (row, full)
    assert LONG_POD not in narrow.out and LONG_POD.rsplit("-", 1)[1] in narrow.out  # cut, its own suffix kept
    left_out = [h for h in whole[0] if h not in rows[0]]
    assert left_out and f"{', '.join(left_out)}: left out to fit 80 columns" in narrow.out.replace("\n  ", " ")


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/metrics"


# --- the fixture GPUs ----------------------------------------------------------------------------------

FIXTURE_VERDICTS = {"1": "under-filled", "5": "unhealthy", "6": "idle"}


async def test_gpus_table_names_the_util_trap_the_faulty_gpu_and_the_idle_one(exporter):
    url, _, _ = exporter
    run, as_json = await asyncio.gather(
        top("gpus", "--scrape-url", url), top("gpus", "--scrape-url", url, "-o", "json")
    )

    assert run.code == 0, run.err
    rows = {row["GPU"]: row for row in run.table()}
    assert set(rows) == {str(i) for i in range(8)}
    for gpu, verdict in FIXTURE_VERDICTS.items():
        assert rows[gpu]["VERDICT"] == verdict
    util, sm = fixture_values("DCGM_FI_DEV_GPU_UTIL"), fixture_values("DCGM_FI_PROF_SM_ACTIVE")
    assert rows["1"]["UTIL"] == f"{util['1']:.0f}%" and rows["1"]["SM"] == f"{sm['1'] * 100:.0f}%"
    assert rows["6"]["POD"] == "-"  # an idle GPU belongs to no pod
    assert rows["1"]["POD"].startswith("nim/")
    legend = run.out.split("\n\n")[1]
    for verdict in FIXTURE_VERDICTS.values():
        assert re.search(rf"^  [A-Z]{{2}}  {verdict} ", legend, re.MULTILINE), legend
    check_json_document(as_json, url)


def check_json_document(run: Run, url: str) -> None:
    assert run.code == 0, run.err
    doc = run.doc()
    raw = json.loads(run.out)
    assert raw["kind"] == "GpuTopList" and raw["version"] == 1 and raw["view"] == "gpus"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", raw["generated_at"])
    by_gpu = {g.gpu: g for g in doc.items}
    for gpu, verdict in FIXTURE_VERDICTS.items():
        assert by_gpu[gpu].verdict.code == verdict
    faulty = by_gpu["5"]
    assert faulty.verdict.severity == "critical"
    assert {"hw_slowdown", "sw_thermal"} <= set(faulty.clock_events)
    assert faulty.signals.xid_counts and 94 in faulty.signals.xid_counts  # only in the windowed count
    assert faulty.node == H100_NODE and faulty.pod == "llm-finetune-worker-0" and faulty.container == "pytorch"
    assert by_gpu["6"].pod is None and by_gpu["6"].namespace is None
    assert doc.sources[0].healthy and doc.sources[0].target == url


async def test_pods_view_combines_each_pods_gpus(exporter):
    url, _, _ = exporter
    run, as_yaml = await asyncio.gather(
        top("pods", "-A", "--scrape-url", url, "-o", "json"), top("pods", "-A", "--scrape-url", url, "-o", "yaml")
    )

    assert run.code == as_yaml.code == 0, run.err + as_yaml.err
    pods = {(p.namespace, p.name): p for p in run.doc().items}
    training = pods[("ml-training", "llm-finetune-worker-0")]
    power = fixture_values("DCGM_FI_DEV_POWER_USAGE")
    assert training.gpus == 4 and training.node == H100_NODE
    assert training.signals.power_watts == pytest.approx(sum(power[g] for g in "2345"))
    assert training.verdict.code == "unhealthy"  # GPU5's fatal signal decides for the pod
    assert pods[("nim", "llama3-8b-instruct-5c6b9d8f47-qz7mh")].verdict.code == "under-filled"
    assert len(pods) == 4  # the idle GPU6 holds no pod
    # -o yaml is the same document
    one, other = json.loads(run.out), yaml.safe_load(as_yaml.out)
    for doc in (one, other):
        doc.pop("generated_at")
        for item in doc["items"]:
            item.pop("sampled_at")
        for source in doc["sources"]:
            source.pop("last_success")
    assert one == other


async def test_nodes_view_counts_the_verdicts(exporter):
    url, _, _ = exporter
    run, table = await asyncio.gather(
        top("nodes", "--scrape-url", url, "-o", "json"), top("nodes", "--scrape-url", url)
    )

    assert run.code == table.code == 0, run.err
    (node,) = run.doc().items
    assert node.name == H100_NODE and node.gpus == 8 and node.pods == 4
    assert node.verdict_counts == {"unhealthy": 1, "under-filled": 1, "idle": 1, "moderate": 2, "compute-bound": 3}
    assert node.worst is not None and node.worst.gpu == "5" and node.worst.code == "unhealthy"
    (row,) = table.table()
    assert row["VERDICTS"] == "UH1 UF1 ID1 MO2 CB3" and row["GPUS"] == "8"


async def test_namespace_sort_and_wide_columns(exporter):
    url, _, _ = exporter
    run = await top("gpus", "-n", "ml-training", "--sort-by", "temp", "-o", "wide", "--scrape-url", url)

    assert run.code == 0, run.err
    rows = run.table()
    assert rows[0]["GPU"] == "5"  # the hottest first
    assert {r["GPU"] for r in rows} == {"2", "3", "4", "5"}
    assert all(r["POD"] == "llm-finetune-worker-0" for r in rows)  # -n: names without the namespace
    hot = rows[0]
    assert "hw_slowdown" in hot["THROTTLE"] and hot["XID"] == "63,94" and hot["SEVERITY"] == "critical"
    assert hot["UUID"].startswith("GPU-")


async def test_triton_values_join_their_pod(exporter):
    url, _, triton = exporter
    run = await top(
        "pods", "-n", "inference", "--scrape-url", url,
        "--scrape-url", f"inference/triton-inference-7d9f8b6c5-x2k4q={triton}",
        "--rate-interval", "0.2s", "-o", "json",
    )  # fmt: skip
    assert run.code == 0, run.err
    (pod,) = run.doc().items
    pending = sum(s.value for s in parse_samples(TRITON.read_text()) if s.name == "nv_inference_pending_request_count")
    assert pod.gpus == 1 and pod.inference is not None
    assert pod.inference.queue_depth == pending
    assert pod.inference.queue_compute_ratio is not None  # two scrapes 0.2 s apart (the same counters: 0)


# --- errors --------------------------------------------------------------------------------------------


async def test_every_source_down_is_one_line_naming_each_url_and_reason(exporter):
    _, broken, _ = exporter
    refused = closed_port_url()
    run = await top("gpus", "--scrape-url", broken, "--scrape-url", refused, "--scrape-timeout", "2s")

    assert run.code != 0 and run.out == ""
    assert "Traceback" not in run.err
    (line,) = run.err.strip().splitlines()
    assert "no source reachable" in line
    assert f"{broken}: HTTP 500" in line
    assert refused in line and "Cannot connect" in line


async def test_a_failing_source_among_healthy_ones_is_a_note_not_an_error(exporter):
    url, broken, _ = exporter
    run = await top("nodes", "--scrape-url", url, "--scrape-url", broken)

    assert run.code == 0, run.err
    assert "! 1 of 2 sources failed:" in run.out and f"! {broken}: HTTP 500" in run.out


NOTHING_FOUND = [
    (["pods", "-n", "nothing-here"], 'no GPU pods found in namespace "nothing-here" (use -A for every namespace)'),
    (["gpus", "-n", "nothing-here"], 'no GPUs found in namespace "nothing-here"'),
    (["pods"], 'no GPU pods found in namespace "default" (use -A for every namespace)'),  # kubectl's default
]


async def test_nothing_found_is_an_error(exporter):
    url, _, _ = exporter
    runs = await asyncio.gather(*(top(*args, "--scrape-url", url) for args, _ in NOTHING_FOUND))
    for run, (_, message) in zip(runs, NOTHING_FOUND, strict=True):
        assert run.code != 0 and run.out == ""
        assert run.err == f"gpuscale top: {message}\n"


USAGE_ERRORS = [
    # (arguments after `top`, expected message)
    (["gpus"], "--scrape-url: give exporter URLs (--scrape-url URL), --discover-exporters, --prometheus-url or"),
    (["gpus", "--scrape-url", "nope"], "--scrape-url 'nope': not an http(s) URL"),
    (["gpus", "--scrape-url", "http://x/m", "-o", "xml"], "unknown format 'xml'; valid: table, wide, json, yaml"),
    (["pods", "--scrape-url", "http://x/m", "--sort-by", "heat"], "valid: name, node, gpus, util"),
    (["gpus", "--adapter-url", "http://x"], "the per-GPU view is not available from the custom metrics API"),
    (["pods", "--scrape-url", "http://x/m", "-l", "app=x"], "-l needs pod labels from the Kubernetes API"),
    (["pods", "--scrape-url", "http://x/m", "-l", "app in (x"], "--selector:"),
    (["pods", "--scrape-url", "http://x/m", "-n", "a", "-A"], "give -A or -n NAMESPACE, not both"),
    (["pods", "--scrape-url", "http://x/m", "--iterations", "2"], "--iterations: only with --watch"),
    (["racks", "--scrape-url", "http://x/m"], "gpuscale top: VIEW: 'racks' is not a view; valid: nodes, pods, gpus"),
    (["pods", "--scrape-url", "http://x/m", "--adapter-url", "http://y"], "give one source"),
]


@pytest.mark.parametrize(("args", "message"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_bad_flags_exit_2_with_a_one_line_message(capsys, args, message):
    assert main(["top", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


# --- watch ---------------------------------------------------------------------------------------------


async def test_watch_refreshes_until_its_iterations(exporter):
    url, _, _ = exporter
    run = await top("nodes", "--scrape-url", url, "--watch", "--iterations", "3", "--watch-interval", "0.1s")
    assert run.code == 0, run.err
    assert run.out.count("Every 0.1s: gpuscale top nodes") == 3
    assert run.out.count(H100_NODE) == 3


async def test_watch_stops_cleanly_on_ctrl_c(exporter):
    url, _, _ = exporter
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscale.cli.main", "top", "gpus", "--scrape-url", url, "-w", "--watch-interval", "0.2s",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert first.startswith(b"Every 0.2s: gpuscale top gpus")
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err


# --- other sources and entry points ----------------------------------------------------------------


def _prometheus_api(*, failing: str = "") -> tuple[web.Application, list[str]]:
    """A Prometheus HTTP API answering instant queries for bare series names from the 8×H100 fixture; queries
    of series whose names start with ``failing`` (when given) get Prometheus's 503 error body."""
    samples = parse_samples(H100.read_text())
    asked: list[str] = []

    async def query(request: web.Request) -> web.Response:
        promql = (await request.post()).get("query", "")
        asked.append(str(promql))
        name = str(promql).split(" unless ")[0]  # NB: the freshness filter is the server's to apply
        if failing and name.startswith(failing):
            body = {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"}
            return web.json_response(body, status=503)
        result = [
            {
                "metric": {"__name__": s.name, **s.labels, "instance": "10.0.0.7:9400", "job": "dcgm"},
                "value": [time.time(), repr(s.value)],
            }
            for s in samples
            if s.name == name
        ]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    return app, asked


@pytest.fixture
async def prometheus(aiohttp_server):
    app, asked = _prometheus_api()
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), asked


async def test_prometheus_url_plugs_in_through_the_source_protocol(prometheus):
    url, asked = prometheus
    run = await top("gpus", "--prometheus-url", url, "-o", "json")

    assert run.code == 0, run.err
    by_gpu = {g.gpu: g for g in run.doc().items}
    for gpu, verdict in FIXTURE_VERDICTS.items():
        assert by_gpu[gpu].verdict.code == verdict
    # One query per DCGM field, series older than max-age left out by the server; never a regex or a matcher.
    assert "DCGM_FI_PROF_SM_ACTIVE unless time() - timestamp(DCGM_FI_PROF_SM_ACTIVE) > 60" in asked
    assert not [q for q in asked if "=~" in q or "{" in q]
    assert by_gpu["5"].source == "http://10.0.0.7:9400/metrics"


async def test_failed_queries_are_blamed_on_the_source_not_the_gpus(aiohttp_server):
    """Every profiling query times out: the GPUs cannot be judged, and the legend says why — the source."""
    app, _ = _prometheus_api(failing="DCGM_FI_PROF_")
    url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    run = await top("gpus", "--prometheus-url", url)

    assert run.code == 0, run.err
    rows = run.table()
    assert rows and {r["VERDICT"] for r in rows} <= {"unknown", "unhealthy", "idle"}, run.out
    assert "unknown" in {r["VERDICT"] for r in rows}, run.out
    (line,) = [line for line in run.out.splitlines() if " unknown " in line and line.startswith("  UK")]
    assert "a source failed (below), not the GPU" in line and "not reported" not in line, line
    assert "! 1 of 1 sources failed:" in run.out and "queries failed" in run.out, run.out
    assert "query timed out in expression evaluation" in run.out, run.out


async def test_kubectl_runs_it_as_the_gpu_plugin(exporter):
    assert KUBECTL is not None, "kubectl is required (bash .ci/setup --test)"
    plugin = Path(sys.executable).parent / "kubectl-gpu"
    assert plugin.exists(), f"{plugin} is missing: run .venv/bin/pip install -e . (creates the kubectl-gpu script)"
    url, _, _ = exporter
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "gpu", "top", "gpus", "--scrape-url", url, "-n", "nim",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=child_env(PATH=f"{plugin.parent}{os.pathsep}{os.environ.get('PATH', '')}"),
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    rows = Run(0, out.decode(), "").table()
    assert [(r["GPU"], r["VERDICT"]) for r in rows] == [("1", "under-filled")]
