"""The install a user does: the built wheel in a fresh virtualenv without extras, run from outside the checkout.

The development virtualenv has the test extra and an editable install, which once hid a run-time import
listed only under `test` and a policies/ directory the wheel did not carry. Here nothing of the checkout
is importable: the commands run from a temporary directory, with a PATH holding only the fresh venv's
bin/ and the system's, exactly as a user would after `pip install gpuscale-*.whl`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from gpuscale.sim.cluster import SimCluster
from tests.e2e.locked_wheels import wheel_cache
from tests.e2e.test_kubectl import C1, C2, KUBECTL, free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


class Installed:
    def __init__(self, venv: Path, workdir: Path) -> None:
        self.venv, self.workdir = venv, workdir
        self.bin = venv / "bin"
        # NB: a new terminal: the venv is not activated, the checkout is not on any path.
        self.env = {
            "PATH": f"{self.bin}:{Path(KUBECTL).parent}:/usr/bin:/bin",
            "HOME": str(workdir),
            "KUBECONFIG": "/dev/null",
            "LANG": "C.UTF-8",
        }

    def run(self, *args: str, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            args, cwd=self.workdir, env=env or self.env, capture_output=True, text=True, timeout=timeout
        )

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *args,
            cwd=self.workdir,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory, gpuscale_wheel) -> Installed:
    root = tmp_path_factory.mktemp("installed")
    wheel = gpuscale_wheel
    venv = root / "venv"
    # NB: the base interpreter, not this test venv's: a virtualenv made from a virtualenv shares nothing with it.
    # Without pip of its own (ensurepip took 12 s of this fixture's 54): this venv's pip installs into it
    # (--python), and without byte-compiling every dependency up front (10 s more): the first run of a
    # command writes the .pyc files of what it imports, as after any `pip install --no-compile`.
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    install = ["install", "-q", "--no-compile", "--disable-pip-version-check", wheel]

    def pip(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", *install, *extra],
            capture_output=True,
            text=True,
            timeout=600,
        )

    # The wheel's declared dependencies resolved from the locked wheels the image build keeps (7.5 s of CPU against
    # 22 s for asking the index), else from the index as a user's pip would: a first run on a machine, or a new
    # dependency the lock does not have yet (test_lock fails on that one).
    cache = wheel_cache()
    done = pip("--no-index", "--find-links", str(cache)) if any(cache.glob("*.whl")) else None
    if done is None or done.returncode != 0:
        done = pip()
    assert done.returncode == 0, done.stderr
    workdir = root / "elsewhere"
    workdir.mkdir()
    return Installed(venv, workdir)


async def _until_ready(proc: asyncio.subprocess.Process, readyz: str, *, timeout: float = 60) -> None:
    """Poll ``readyz`` until it answers 200; fail with the process's output if it exits first."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.returncode is not None:
                pytest.fail((await proc.stdout.read()).decode())
            try:
                async with session.get(readyz) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, f"{readyz} did not become ready"
            await asyncio.sleep(0.2)


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    done = installed.run(str(installed.bin / "python"), "-c", "import gpuscale, sys; print(gpuscale.__file__)")
    assert done.returncode == 0, done.stderr
    assert str(installed.venv) in done.stdout and str(REPO) not in done.stdout
    # Test-only tools are not installed with the package.
    for module in ("pytest", "trustme", "prometheus_api_client", "pandas"):
        probe = installed.run(str(installed.bin / "python"), "-c", f"import {module}")
        assert probe.returncode != 0, f"{module} is installed without extras"


def test_help_of_every_command(installed):
    from concurrent.futures import ThreadPoolExecutor

    commands = [["gpuscale", "--help"]]
    commands += [["gpuscale", c, "--help"] for c in ("adapter", "top", "controller", "simulate", "report", "demo")]
    with ThreadPoolExecutor(4) as pool:  # NB: seven interpreter starts; side by side they take half as long
        runs = list(pool.map(lambda args: installed.run(*args), commands))
    for args, done in zip(commands, runs, strict=True):
        assert done.returncode == 0 and "usage: gpuscale" in done.stdout, (args, done.stderr)
    done = runs[1]
    # --refresh-interval, written as the README writes it (argparse wraps lines: compare words)
    assert "store (default: 5s)" in " ".join(done.stdout.split())
    plugin = installed.run(KUBECTL, "gpu", "--help")
    assert plugin.returncode == 0, plugin.stderr
    assert plugin.stdout.startswith("usage: kubectl gpu"), plugin.stdout[:200]


async def test_adapter_serves_the_shipped_catalogue(installed):
    async with SimCluster() as cluster:
        port = free_port()
        args = ["gpuscale", "adapter", "--kubeconfig", cluster.kubeconfig, "--insecure-port", str(port)]
        args += ["--bind-address", "127.0.0.1", "--refresh-interval", "1s"]
        for url in cluster.scrape_urls:
            args += ["--scrape-url", url]
        proc = await installed.start(*args)
        server = f"http://127.0.0.1:{port}"
        try:
            await _until_ready(proc, f"{server}/readyz")
            done = await asyncio.to_thread(
                installed.run,
                KUBECTL,
                f"--server={server}",
                "get",
                "--raw",
                f"{C2}/namespaces/nim/pods/*/gpu_sm_active",
            )
            assert done.returncode == 0, done.stderr
            body = json.loads(done.stdout)
            assert body["kind"] == "MetricValueList" and body["items"], body
            discovery = await asyncio.to_thread(installed.run, KUBECTL, f"--server={server}", "get", "--raw", C1)
            names = {r["name"].split("/")[-1] for r in json.loads(discovery.stdout)["resources"]}
            assert "inference_queue_compute_ratio" in names  # the whole shipped catalogue, found in the wheel
        finally:
            if proc.returncode is None:
                proc.terminate()
            await asyncio.wait_for(proc.wait(), 20)


async def test_controller_runs_on_the_shipped_policies(installed):
    """The controller loads remediation.yaml, hints.yaml, health.yaml and diagnosis.yaml from the wheel."""
    async with SimCluster() as cluster:
        port = free_port()
        args = ["gpuscale", "controller", "--kubeconfig", cluster.kubeconfig, "--port", str(port)]
        args += ["--bind-address", "127.0.0.1", "--interval", "1s", "--dry-run", "--no-leader-elect"]
        for url in cluster.scrape_urls:
            args += ["--scrape-url", url]
        proc = await installed.start(*args)
        try:
            await _until_ready(proc, f"http://127.0.0.1:{port}/readyz")
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                assert "gpuscale_controller_dry_run 1.0" in await resp.text()
        finally:
            if proc.returncode is None:
                proc.terminate()
            assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_top_and_the_kubectl_plugin(installed):
    async with SimCluster() as cluster:
        source = ["--kubeconfig", cluster.kubeconfig]
        for url in cluster.scrape_urls:
            source += ["--scrape-url", url]
        for command in (["gpuscale"], ["kubectl-gpu"], [KUBECTL, "gpu"]):
            done = await asyncio.to_thread(installed.run, *command, "top", "pods", "-A", *source)
            assert done.returncode == 0, (command, done.stderr)
            assert re.search(r"nim\s+llama3-8b-\S+ .* under-filled", done.stdout), done.stdout


async def test_demo_runs_and_its_printed_commands_work_in_a_new_terminal(installed):
    # NB: kept running (the default), as a user pasting the commands has it: a 10 s replay on a loaded machine
    # ended before the last pasted command ran (the pasted commands alone took 10+ s).
    proc = await installed.start("gpuscale", "demo", "--duration", "10s", "--port", "0")
    lines: list[str] = []
    try:
        while not any("What the HPA sees" in line for line in lines):
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            assert line, "demo exited early:\n" + "".join(lines)
            lines.append(line)
        printed = [line.strip() for line in lines if " top pods " in line and not line.strip().startswith("#")]
        assert printed, "".join(lines)
        # NB: pasted into a new terminal: neither the venv nor anything else of gpuscale is on PATH.
        bare = {**installed.env, "PATH": f"{Path(KUBECTL).parent}:/usr/bin:/bin"}
        for command in printed:
            assert shlex.split(command)[0] == str(installed.bin / "gpuscale"), command
            done = await asyncio.to_thread(installed.run, "/bin/sh", "-c", command, env=bare)
            assert done.returncode == 0, (command, done.stderr)
            assert "under-filled" in done.stdout, done.stdout
        while not any("Still serving" in line for line in lines):
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            assert line, "demo exited while it should keep serving:\n" + "".join(lines)
            lines.append(line)
        proc.terminate()  # Ctrl-C's twin: a clean stop
        rest = (await asyncio.wait_for(proc.stdout.read(), 60)).decode()
        assert await asyncio.wait_for(proc.wait(), 30) == 0, rest[-2000:]
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


def test_a_port_in_use_is_one_line_naming_the_flag(installed):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = installed.run("gpuscale", "demo", "--port", str(port), "--duration", "5s")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuscale demo: --port: cannot listen on 127.0.0.1:"), lines


def test_policies_override_a_shipped_file(installed):
    policies = installed.workdir / "policies"
    policies.mkdir(exist_ok=True)
    (policies / "metrics.yaml").write_text(
        "metrics:\n  - name: gpu_x\n    unit: precent\n    aggregate: mean\n    series: [DCGM_FI_DEV_GPU_UTIL]\n"
    )
    done = installed.run("gpuscale", "adapter", "--policies", str(policies), "--scrape-url", "http://127.0.0.1:1/")
    assert done.returncode == 2, done.stderr
    assert str(policies / "metrics.yaml") in done.stderr and "unknown unit 'precent'" in done.stderr, done.stderr
    empty = installed.workdir / "empty"
    empty.mkdir(exist_ok=True)
    done = installed.run("gpuscale", "demo", "--policies", str(empty), "--duration", "1s")
    assert done.returncode == 2 and "holds none of metrics.yaml" in done.stderr, done.stderr
    assert os.listdir(empty) == []


def test_report_from_a_plain_install_writes_markdown_and_html(installed, tmp_path):
    """The report's policies ship in the wheel, and a plain install draws the HTML report's charts."""
    from gpuscale.sources.history_file import export_history
    from tests.report.histories import add_pod, constant, history

    h = history(hours=6)
    add_pod(h, pod="p", requests=4, gpus=4, values=constant(sm_active=0.0, gpu_util_percent=0.0))
    exported = tmp_path / "h.npz"
    export_history(h, exported)
    done = installed.run("gpuscale", "report", "--from", str(exported), "-o", "markdown")
    assert done.returncode == 0, done.stderr
    assert "request 1 GPU per pod instead of 4" in done.stdout
    html = installed.run("gpuscale", "report", "--from", str(exported), "-o", "html")
    assert html.returncode == 0, html.stderr
    assert html.stdout.count("<svg") == 3 and "<script" not in html.stdout


def test_the_wheel_carries_every_policy_file_and_the_replay_data(installed):
    """Each policies/*.yaml of the checkout, and the demo's trace and manifest, are package data in the wheel."""
    probe = (
        "from importlib.resources import files; "
        "print(*sorted(p.name for d in ('policies', 'replay/data') for p in (files('gpuscale') / d).iterdir()))"
    )
    done = installed.run(str(installed.bin / "python"), "-c", probe)
    assert done.returncode == 0, done.stderr
    shipped = set(done.stdout.split())
    assert {p.name for p in (REPO / "policies").glob("*.yaml")} <= shipped, shipped
    assert {"azure-conv-15-45min.csv.gz", "demo-hpa.yaml"} <= shipped, shipped


def test_simulate_the_readme_way_from_a_plain_install(installed, tmp_path):
    """README's `gpuscale simulate` (its shipped trace and example manifests; 10 minutes of it), table, JSON, HTML."""
    args = ["gpuscale", "simulate", "--trace", str(REPO / "tests/fixtures/traces/AzureLLMInferenceTrace_conv.csv.gz")]
    args += ["--rate-scale", "4", "--duration", "10m"]
    args += [
        "--hpa",
        str(REPO / "deploy/examples/llm-hpa.yaml"),
        "--hpa",
        str(REPO / "deploy/examples/triton-hpa.yaml"),
    ]
    page = tmp_path / "out.html"
    table = installed.run(*args, "--html", str(page))
    assert table.returncode == 0, table.stderr
    assert "llm-server" in table.stdout and "triton" in table.stdout, table.stdout
    assert page.read_text().count("<svg") >= 2 and "<script src" not in page.read_text()  # opens offline
    done = installed.run(*args, "--output", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "gpuscale.simulate/v2" and [r["hpa"] for r in doc["results"]] == ["llm-server", "triton"]
    missing = installed.run("gpuscale", "simulate", "--trace", "nope.csv", "--hpa", "nope.yaml")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr


async def test_adapter_decodes_prometheus_answers_in_the_installed_child_process(installed):
    """With --prometheus-url the adapter decodes answers in a child process (sources/decoder_process.py): the child
    starts from the wheel's package, outside the checkout, and the value it decoded is served."""
    from aiohttp import web

    async def query(request: web.Request) -> web.Response:
        promql = (await request.post()).get("query", "")
        result = []
        if "DCGM_FI_DEV_GPU_UTIL" in str(promql):
            labels = {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-1", "gpu": "0", "Hostname": "n1"}
            labels |= {"pod": "train-0", "namespace": "ml", "instance": "10.0.0.1:9400"}
            result = [{"metric": labels, "value": [time.time(), "73"]}]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    app = web.Application()
    app.router.add_post("/api/v1/query", query)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    prometheus = f"http://127.0.0.1:{runner.addresses[0][1]}"
    port = free_port()
    args = ["gpuscale", "adapter", "--prometheus-url", prometheus, "--insecure-port", str(port)]
    proc = await installed.start(*args, "--bind-address", "127.0.0.1", "--refresh-interval", "1s")
    server = f"http://127.0.0.1:{port}"
    try:
        await _until_ready(proc, f"{server}/readyz")
        url = f"{server}{C1}/namespaces/ml/pods/train-0/gpu_utilization"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            body = await resp.json()
        assert resp.status == 200, body
        assert [(i["describedObject"]["name"], i["value"]) for i in body["items"]] == [("train-0", "73")]
        tasks = Path(f"/proc/{proc.pid}/task").glob("*/children")
        kids = [int(c) for t in tasks for c in t.read_text().split()]
        commands = [Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0") for k in kids]
        decoder = [c for c in commands if b"gpuscale.sources.decoder_process" in c]
        assert len(decoder) == 1 and decoder[0][0].decode().startswith(str(installed.venv)), commands
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.wait(), 20)
        await runner.cleanup()
    # NB: the child ends with the adapter (its stdin closes)
    await asyncio.sleep(0.5)
    assert not [
        k for k in kids if Path(f"/proc/{k}").exists() and b"decoder_process" in Path(f"/proc/{k}/cmdline").read_bytes()
    ]
