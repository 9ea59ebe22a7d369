"""The range-query history source against an honest fake of the Prometheus HTTP API: refusals split the work,
timeouts and 5xx are retried, partial answers and retention show up as gaps, and a dead server is one line."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from gpuscale.errors import SourceUnavailable
from gpuscale.metrics.history import PodRef
from gpuscale.sources.history_fetch import FetchOptions, fetch_history, measure_scrape_interval
from gpuscale.sources.promapi import PrometheusClient

STEP = 60.0
START = 1_780_000_000.0 // 3600 * 3600
HOURS = 3
NODES = [f"node-{i}" for i in range(4)]


class FakePrometheus:
    """Answers /api/v1/label/Hostname/values, /api/v1/query_range and /api/v1/query from a generated fleet: node i's
    one GPU has SM active i/10 at every step; samples before ``first_sample`` do not exist (retention)."""

    def __init__(self, *, max_series: int = 100, max_points: int = 100_000, fail_first: int = 0, partial=False):
        self.max_series, self.max_points = max_series, max_points
        self.fail_first, self.partial = fail_first, partial
        self.first_sample = START
        self.calls: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/label/Hostname/values", self.labels)
        app.router.add_post("/api/v1/query_range", self.query_range)
        app.router.add_post("/api/v1/query", self.query)
        return app

    async def labels(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": NODES})

    async def query(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})

    async def query_range(self, request: web.Request) -> web.Response:
        form = await request.post()
        query = str(form["query"])
        self.calls.append(query)
        if self.fail_first:
            self.fail_first -= 1
            return web.json_response({"status": "error", "error": "overloaded"}, status=503)
        name, _, hosts = query.partition("{")
        wanted = re.findall(r"node-\d+", hosts.replace("\\", "")) if hosts else NODES
        start, end, step = float(form["start"]), float(form["end"]), float(form["step"])
        points = int((end - start) / step) + 1
        if len(wanted) * points > self.max_series * self.max_points or points > self.max_points:
            return web.json_response(
                {"status": "error", "errorType": "execution", "error": "query processing would load too many samples"},
                status=422,
            )
        result = []
        if name == "DCGM_FI_PROF_SM_ACTIVE":
            for node in wanted:
                i = int(node.split("-")[1])
                times = [t for t in np.arange(start, end + step / 2, step) if t >= self.first_sample]
                labels = {"__name__": name, "Hostname": node, "UUID": f"GPU-{i}", "pod": f"p{i}", "namespace": "ns"}
                result.append({"metric": labels, "values": [[t, str(i / 10)] for t in times]})
        body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
        if self.partial:
            body["warnings"] = ["store node-3 unavailable"]
        return web.json_response(body)


async def fetch(server, *, timeout_seconds=60.0, **options):
    opts = FetchOptions(backoff_seconds=0.0, **options)
    async with aiohttp.ClientSession() as session:
        client = PrometheusClient(
            str(server.make_url("")),
            session=session,
            sleep=lambda s: asyncio.sleep(0),
            timeout_seconds=timeout_seconds,
            **opts.client_limits(),
        )
        history = await fetch_history(client, start=START, end=START + HOURS * 3600, step=STEP, options=opts)
        return history, client


def sm(history, node):
    (gpu,) = [g for g in history.gpus if g.node == node]
    return gpu.values["sm_active"]


async def test_the_fleet_lands_on_the_grid(aiohttp_server):
    server = await aiohttp_server(FakePrometheus().app())
    history, _ = await fetch(server, max_points=60)  # 3 time chunks
    assert history.steps == HOURS * 60 and len(history.gpus) == 4
    assert np.all(sm(history, "node-3") == np.float32(0.3))
    assert {p.name for p in history.pods} == {"p0", "p1", "p2", "p3"}


async def test_a_refusal_for_too_many_samples_splits_the_batch_then_the_time(aiohttp_server):
    fake = FakePrometheus(max_series=1, max_points=50)  # one node and 50 steps per query at most
    server = await aiohttp_server(fake.app())
    history, _ = await fetch(server, series_batch=4, max_points=200)
    assert np.all(sm(history, "node-2") == np.float32(0.2)) and not np.isnan(sm(history, "node-0")).any()
    sm_calls = [c for c in fake.calls if c.startswith("DCGM_FI_PROF_SM_ACTIVE")]
    assert len(sm_calls) > 4 * (HOURS * 60 // 50)  # split down to single nodes and short ranges


async def test_a_refusal_even_at_one_node_and_one_step_is_a_clear_error(aiohttp_server):
    fake = FakePrometheus(max_series=0)
    server = await aiohttp_server(fake.app())
    with pytest.raises(SourceUnavailable, match=r"refuses even one step of .* too many samples .*raise its limits"):
        await fetch(server)


async def test_5xx_is_retried_and_a_server_that_stays_down_is_named(aiohttp_server):
    server = await aiohttp_server(FakePrometheus(fail_first=2).app())
    history, client = await fetch(server, retries=3, concurrency=1)
    assert client.queries > 2  # the two 503s were asked again
    assert len(history.gpus) == 4
    server = await aiohttp_server(FakePrometheus(fail_first=10_000).app())
    with pytest.raises(SourceUnavailable, match=r"failed after 3 attempts: HTTP 503: overloaded"):
        await fetch(server, retries=2)


async def test_a_slow_server_times_out_with_the_query_named(aiohttp_server):
    async def slow(request):
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/api/v1/label/Hostname/values", slow)
    server = await aiohttp_server(app)
    with pytest.raises(SourceUnavailable, match=r"label/Hostname/values .* failed after 1 attempts: timed out after"):
        await fetch(server, retries=0, timeout_seconds=0.2)


async def test_partial_answers_and_a_window_beyond_retention_are_gaps(aiohttp_server):
    fake = FakePrometheus(partial=True)
    fake.first_sample = START + 3600  # the server holds only the last 2 of 3 hours
    server = await aiohttp_server(fake.app())
    history, _ = await fetch(server)
    assert any("store node-3 unavailable" in g for g in history.gaps)
    assert any("no samples in the first 1h of the window" in g for g in history.gaps)
    assert np.isnan(sm(history, "node-1")[:60]).all() and not np.isnan(sm(history, "node-1")[60:]).any()
    assert any("kube_pod_owner" in g for g in history.gaps)


async def test_the_progress_bar_goes_to_stderr_and_leaves_stdout_to_the_report(aiohttp_server, capsys):
    server = await aiohttp_server(FakePrometheus().app())
    opts = FetchOptions(backoff_seconds=0.0)
    async with aiohttp.ClientSession() as session:
        client = PrometheusClient(str(server.make_url("")), session=session, **opts.client_limits())
        await fetch_history(client, start=START, end=START + 3600, step=STEP, options=opts, progress=True)
    assert capsys.readouterr().out == ""


def test_the_workload_pod_is_the_exported_one_and_the_exporter_is_no_workload():
    from gpuscale.metrics.history import History
    from gpuscale.sources.history_fetch import _Decoder

    h = History(start=START, step_seconds=STEP, steps=10)
    decoder = _Decoder(h, FetchOptions())
    target = {"pod": "nvidia-dcgm-exporter-x7k2p", "namespace": "gpu-operator", "Hostname": "n1"}
    values = [[START + i * STEP, "0.5"] for i in range(10)]
    decoder.add(
        "sm_active",
        "DCGM_FI_PROF_SM_ACTIVE",
        [
            {
                "metric": {**target, "UUID": "GPU-a", "exported_pod": "llm-0", "exported_namespace": "ml"},
                "values": values,
            },
            {"metric": {**target, "UUID": "GPU-b"}, "values": values},  # idle GPU: only the exporter's target labels
        ],
    )
    a, b = h.gpus
    assert h.pods[a.pod[0]] == PodRef("ml", "llm-0") and (a.pod >= 0).all()
    assert (b.pod == -1).all() and b.node == "n1"


async def test_owners_go_up_to_the_deployment_and_the_cronjob():
    from gpuscale.metrics.history import History, Owner
    from gpuscale.sources.history_fetch import identity

    answers = {
        "kube_pod_owner": [
            {"namespace": "ml", "pod": "web-7d9f-x", "owner_kind": "ReplicaSet", "owner_name": "web-7d9f"},
            {"namespace": "ml", "pod": "nightly-2839-y", "owner_kind": "Job", "owner_name": "nightly-2839"},
            {"namespace": "ml", "pod": "once-z", "owner_kind": "Job", "owner_name": "once"},
            {"namespace": "ml", "pod": "bare", "owner_kind": "<none>", "owner_name": "<none>"},
        ],
        "kube_replicaset_owner": [
            {"namespace": "ml", "replicaset": "web-7d9f", "owner_kind": "Deployment", "owner_name": "web"}
        ],
        "kube_job_owner": [
            {"namespace": "ml", "job_name": "nightly-2839", "owner_kind": "CronJob", "owner_name": "nightly"},
            {"namespace": "ml", "job_name": "once", "owner_kind": "<none>", "owner_name": "<none>"},
        ],
    }

    class Client:
        async def query(self, promql, *, at):
            name = next((n for n in answers if f"({n}[" in promql), None)
            return [{"metric": m, "value": [at, "1"]} for m in answers.get(name, [])]

    h = History(start=START, step_seconds=STEP, steps=1)
    await identity(Client(), h, at=START, window=3600)
    assert {p.name: (o.kind, o.name) for p, o in h.owners.items()} == {
        "web-7d9f-x": ("Deployment", "web"),
        "nightly-2839-y": ("CronJob", "nightly"),
        "once-z": ("Job", "once"),
        "bare": ("Pod", "bare"),
    }
    assert all(isinstance(o, Owner) for o in h.owners.values())


async def test_the_scrape_interval_is_measured_on_a_fleet_without_gpu_util():
    """Only the profiling fields exported (no DCGM_FI_DEV_GPU_UTIL): SM_ACTIVE's 60 samples an hour measure it."""

    class Client:
        async def query(self, promql, *, at):
            present = "count_over_time(DCGM_FI_PROF_SM_ACTIVE[" in promql
            return [{"metric": {}, "value": [at, "60"]}] if present else []

    assert await measure_scrape_interval(Client(), start=START, end=START + 86400) == 60.0
