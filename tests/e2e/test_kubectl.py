"""End to end: the `gpuscale adapter` command against the simulated cluster, read with the real kubectl.

The simulated Kubernetes API and exporters run in the test's event loop; the adapter runs as a
subprocess exactly as a user starts it (flags, kubeconfig, scrape URLs); kubectl is the Debian/system
binary talking plain HTTP to it. Responses are read the way the HPA controller reads them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
import yaml

from gpuscale.sim.cluster import SimCluster
from tests.adapter import hpa
from tests.helpers import reaped
from tests.ports import free_port

# NB: one event loop for the module: the shared stack's simulated cluster is served in it, so it keeps answering the
# adapter's scrapes while any test of the module runs.
pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

KUBECTL = shutil.which("kubectl")
if KUBECTL is None:  # NB: .ci/setup installs it; a missing kubectl is a broken setup, not a skip
    raise RuntimeError("kubectl is required for the end-to-end tests (run: bash .ci/setup --test)")

C1 = "/apis/custom.metrics.k8s.io/v1beta1"
C2 = "/apis/custom.metrics.k8s.io/v1beta2"
EXT = "/apis/external.metrics.k8s.io/v1beta1"


async def run(*args: str, timeout: float = 20) -> tuple[int, str, str]:
    env = {**os.environ, "KUBECONFIG": "/dev/null", "HOME": os.environ.get("HOME", "/tmp")}
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await reaped(proc, proc.communicate(), timeout)
    return proc.returncode, out.decode(), err.decode()


class Stack:
    def __init__(self, cluster: SimCluster, proc: asyncio.subprocess.Process, server: str) -> None:
        self.cluster, self.proc, self.server = cluster, proc, server

    async def raw(self, path: str) -> dict:
        code, out, err = await run(KUBECTL, f"--server={self.server}", "get", "--raw", path)
        assert code == 0, (path, err)
        return json.loads(out)


async def start_stack(tmp_path: Path, *, max_age: str | None = None) -> Stack:
    cluster = await SimCluster().start()
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "gpuscale.cli.main",
        "adapter",
        "--kubeconfig",
        cluster.kubeconfig,
        "--insecure-port",
        str(port),
        "--refresh-interval",
        "1s",
        "--log-level",
        "warning",
    ]
    if max_age:
        catalogue = yaml.safe_load(Path("policies/metrics.yaml").read_text())
        catalogue["defaults"]["max_age"] = max_age
        path = tmp_path / "metrics.yaml"
        path.write_text(yaml.safe_dump(catalogue))
        args += ["--config", str(path)]
    for url in cluster.scrape_urls:
        args += ["--scrape-url", url]
    proc = await asyncio.create_subprocess_exec(*args, stderr=asyncio.subprocess.PIPE)
    server = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as session:
        while True:
            assert proc.returncode is None, (await proc.stderr.read()).decode()
            try:
                async with session.get(f"{server}/readyz") as resp:
                    if resp.status == 200:
                        # rates need two scrapes: wait until the queue ratio is served
                        async with session.get(
                            f"{server}{C1}/namespaces/inference/pods/*/inference_queue_compute_ratio"
                        ) as r2:
                            if r2.status == 200:
                                break
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "adapter did not become ready"
            await asyncio.sleep(0.1)
    return Stack(cluster, proc, server)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory):
    """One adapter for the module's tests that only read from it (each start was ~2.5 s of CPU: imports, refreshes)."""
    s = await start_stack(tmp_path_factory.mktemp("stack"))
    yield s
    s.proc.terminate()
    await asyncio.wait_for(s.proc.wait(), 10)
    await s.cluster.stop()


def triton_pods(stack: Stack) -> set[str]:
    return {name for (ns, name) in stack.cluster.exporters.triton_urls if ns == "inference"}


async def test_kubectl_reads_every_url_shape_in_both_versions(stack):
    node = stack.cluster.scenario.nodes[0].name
    for base in (C1, C2):
        pods = await stack.raw(f"{base}/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton-bert")
        assert set(hpa.pod_metrics(pods)) == triton_pods(stack)
        one = next(iter(triton_pods(stack)))
        assert hpa.object_metric(await stack.raw(f"{base}/namespaces/inference/pods/{one}/gpu_sm_active")) > 0
        assert hpa.object_metric(await stack.raw(f"{base}/namespaces/inference/metrics/inference_queue_depth")) >= 0
        nodes = await stack.raw(f"{base}/nodes/*/gpu_power_watts")
        assert {i["describedObject"]["name"] for i in nodes["items"]} == {n.name for n in stack.cluster.scenario.nodes}
        assert hpa.object_metric(await stack.raw(f"{base}/nodes/{node}/gpu_power_watts")) > 0
        deploy = await stack.raw(
            f"{base}/namespaces/inference/deployments.apps/triton-bert/inference_queue_compute_ratio"
        )
        assert deploy["items"][0]["describedObject"] == {
            "kind": "Deployment",
            "namespace": "inference",
            "name": "triton-bert",
            "apiVersion": "apps/v1",
        }
        hpa.object_metric(deploy)
        sts = await stack.raw(f"{base}/namespaces/ml-training/statefulsets.apps/llm-finetune-worker/gpu_sm_active")
        assert hpa.object_metric(sts) > 50_000  # training keeps its SMs busy
    ext = await stack.raw(
        f"{EXT}/namespaces/inference/inference_requests_per_second?labelSelector=model%3Dbert_qa_onnx"
    )
    assert ext["items"][0]["metricLabels"] == {"model": "bert_qa_onnx"}
    assert hpa.external_metric(ext) > 0


async def test_util_trap_is_visible_through_the_api(stack):
    util = hpa.pod_metrics(await stack.raw(f"{C2}/namespaces/nim/pods/*/gpu_utilization"))
    sm = hpa.pod_metrics(await stack.raw(f"{C2}/namespaces/nim/pods/*/gpu_sm_active"))
    assert util.keys() == sm.keys() and len(util) == 2
    for name in util:
        assert util[name] >= 90_000 and sm[name] < 50_000  # "100 % busy", SMs less than half filled


async def test_kubectl_api_resources_lists_both_groups(stack):
    code, out, err = await run(KUBECTL, f"--server={stack.server}", "api-resources")
    # NB: kubectl hides names with a slash (it takes them for subresources), so custom metrics such as
    # "pods/gpu_utilization" never show in this table — for any adapter. Discovery of the group must
    # still succeed: kubectl would print "unable to retrieve the complete list of server APIs".
    assert code == 0 and err == "", err
    assert "external.metrics.k8s.io/v1beta1" in out and "inference_queue_depth" in out
    listing = await stack.raw(C2)
    assert "pods/gpu_utilization" in {r["name"] for r in listing["resources"]}
    code, out, err = await run(KUBECTL, f"--server={stack.server}", "api-versions")
    assert {"custom.metrics.k8s.io/v1beta1", "custom.metrics.k8s.io/v1beta2", "external.metrics.k8s.io/v1beta1"} <= set(
        out.split()
    )


async def test_kubectl_shows_clear_errors(stack):
    code, _, err = await run(
        KUBECTL, f"--server={stack.server}", "get", "--raw", f"{C1}/namespaces/inference/pods/*/no_such_metric"
    )
    assert code != 0 and "the server could not find the metric no_such_metric for pods" in err
    code, _, err = await run(
        KUBECTL,
        f"--server={stack.server}",
        "get",
        "--raw",
        f"{C1}/namespaces/inference/pods/*/gpu_utilization?labelSelector=a%20in%20(",
    )
    assert (code != 0 and "BadRequest" in err) or "400" in err


async def test_a_hung_exporter_turns_into_503_never_a_stale_value(tmp_path):
    s = await start_stack(tmp_path, max_age="3s")
    try:
        node = s.cluster.scenario.nodes[0].name
        path = f"{C1}/nodes/{node}/gpu_utilization"
        assert hpa.object_metric(await s.raw(path)) >= 0
        s.cluster.exporters.set_faults(node, hang=True)
        deadline = time.monotonic() + 20
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.get(s.server + path) as resp:
                    body = await resp.json()
                    if resp.status == 503:
                        assert body["reason"] == "ServiceUnavailable" and resp.headers["Retry-After"]
                        break
                    assert resp.status == 200
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
            # Other nodes keep serving fresh values.
            other = s.cluster.scenario.nodes[1].name
            async with session.get(f"{s.server}{C1}/nodes/{other}/gpu_utilization") as resp:
                assert resp.status == 200
            async with session.get(f"{s.server}/metrics") as resp:
                text = await resp.text()
            assert "gpuscale_source_target_up" in text and "gpuscale_source_errors_total" in text
        s.cluster.exporters.set_faults(node)  # heal: fresh values return
        deadline = time.monotonic() + 20
        while True:
            code, _out, _ = await run(KUBECTL, f"--server={s.server}", "get", "--raw", path)
            if code == 0:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.3)
    finally:
        s.proc.terminate()
        await asyncio.wait_for(s.proc.wait(), 10)
        await s.cluster.stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scrape-url", "not-a-url"], "--scrape-url 'not-a-url': not an http(s) URL"),
        ([], "give at least one --scrape-url"),
        (["--scrape-url", "http://x/metrics", "--refresh-interval", "soon"], "--refresh-interval"),
        (["--scrape-url", "http://x/metrics", "--config", "BAD"], "metrics[0] (gpu_utilization).aggregate"),
        (["--scrape-url", "http://x/metrics", "--kubeconfig", "/nonexistent/kubeconfig"], "/nonexistent/kubeconfig"),
    ],
)
async def test_adapter_command_rejects_bad_input_with_a_clear_message(tmp_path, args, message):
    if "BAD" in args:
        bad = tmp_path / "metrics.yaml"
        catalogue = yaml.safe_load(Path("policies/metrics.yaml").read_text())
        catalogue["metrics"][0]["aggregate"] = "average"
        bad.write_text(yaml.safe_dump(catalogue, sort_keys=False))
        args = [str(bad) if a == "BAD" else a for a in args]
    code, _out, err = await run(sys.executable, "-m", "gpuscale.cli.main", "adapter", "--insecure-port", "0", *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


async def test_promtool_accepts_the_live_adapter_metrics(stack):
    from tests.adapter.test_selfmetrics import promtool_check

    await stack.raw(f"{C1}/namespaces/nim/pods/*/gpu_utilization")
    async with aiohttp.ClientSession() as session, session.get(f"{stack.server}/metrics") as resp:
        body = await resp.read()
    assert b"gpuscale_adapter_request_duration_seconds_bucket" in body
    assert b"gpuscale_source_freshness_seconds" in body and b"gpuscale_refresh_duration_seconds" in body
    code, out = await promtool_check(body)
    assert code == 0, out
