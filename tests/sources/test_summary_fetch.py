"""Summary mode's fetch against a fake of the Prometheus HTTP API that refuses a quantile query over more than one
node (as VictoriaMetrics ends one at its 30 s limit): the query is asked again for halves of the node batch, every
level lands on its series, and a refusal even for one node is one clear line."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from gpuscale.errors import SourceUnavailable
from gpuscale.sources.history_fetch import FetchOptions
from gpuscale.sources.promapi import PrometheusClient
from gpuscale.sources.summary_fetch import DENSE_LEVELS, fetch_summaries
from tests.sources.test_history_fetch import NODES, START, FakePrometheus


class FakeSummaries(FakePrometheus):
    """The range-query fake's API (tests/sources/test_history_fetch.py), answering summary mode's queries."""

    def __init__(self, *, max_nodes: int) -> None:
        super().__init__()
        self.max_nodes = max_nodes
        self.quantile_calls: list[list[str]] = []
        self.owner_joins: list[tuple[list[str], list[str]]] = []  # (nodes, pods) of each query joined with owners

    async def query_range(self, request: web.Request) -> web.Response:
        form = await request.post()
        query = str(form["query"])
        nodes = sorted(set(re.findall(r"node-\d+", query.replace("\\", ""))))
        result = []
        if "kube_pod_owner" in query:
            (pods,) = re.findall(r'kube_pod_owner\{[^}]*,pod=~"([^"]*)"', query) or [""]  # NB: named once
            self.owner_joins.append((nodes, sorted(pods.replace("\\", "").split("|")) if pods else []))
        if query.startswith("label_replace(quantile_over_time") and "DCGM_FI_PROF_SM_ACTIVE" in query:
            self.quantile_calls.append(nodes)
            if len(nodes) > self.max_nodes:
                error = "timeout exceeded during query execution; adjust -search.maxQueryDuration"
                return web.json_response({"status": "error", "error": error}, status=422)
            for level in re.findall(r'"gpuscale_q", "([0-9.e-]+)"', query):
                result += [self._series(n, float(level), gpuscale_q=level) for n in nodes]
        elif query.startswith("count_over_time(DCGM_FI_PROF_SM_ACTIVE"):
            result = [self._series(n, 180.0) for n in nodes]
        return web.json_response({"status": "success", "data": {"resultType": "matrix", "result": result}})

    def _series(self, node: str, value: float, **extra: str) -> dict:
        labels = {"Hostname": node, "UUID": f"GPU-{node}", "pod": f"p-{node}", "namespace": "ns", **extra}
        return {"metric": labels, "values": [[START + 3 * 3600 - 0.001, str(value)]]}


async def summaries(server, *, batch: int = 4):
    opts = FetchOptions(backoff_seconds=0.0, series_batch=batch, scrape_interval=60.0)
    async with aiohttp.ClientSession() as session:
        client = PrometheusClient(
            str(server.make_url("")), session=session, sleep=lambda s: asyncio.sleep(0), **opts.client_limits()
        )
        return await fetch_summaries(
            client, start=START, end=START + 3 * 3600, step=60.0, chunk=None, block=3600.0, options=opts,
            idle_busy_percent=10.0, idle_sm_active=0.1, progress=False,
        )  # fmt: skip


async def test_a_refused_quantile_query_is_asked_again_for_halves_of_the_node_batch(aiohttp_server):
    fake = FakeSummaries(max_nodes=1)
    h = await summaries(await aiohttp_server(fake.app()))
    sm = [s for s in h.series if s.field == "sm_active"]
    assert sorted(s.node for s in sm) == NODES
    for s in sm:
        assert s.levels == DENSE_LEVELS and np.nansum(s.count) == 180
        assert np.allclose(s.quantiles[:, 0], DENSE_LEVELS)  # each level's answer on its own row
    # the whole batch first (refused), then its halves (refused), then single nodes
    assert {len(n) for n in fake.quantile_calls} == {1, 2, 4}


async def test_a_refusal_even_for_one_node_is_one_clear_line(aiohttp_server):
    fake = FakeSummaries(max_nodes=0)
    with pytest.raises(SourceUnavailable, match=r"even for one node and one point: .*maxQueryDuration"):
        await summaries(await aiohttp_server(fake.app()))


async def test_the_owner_joins_of_a_node_batch_name_only_its_pods(aiohttp_server):
    """Each step and block query joins kube_pod_owner for the pods its batch's series named, not every pod's owner
    (which made the TSDB's work grow with the square of the fleet)."""
    fake = FakeSummaries(max_nodes=4)
    await summaries(await aiohttp_server(fake.app()), batch=2)
    assert len(fake.owner_joins) == 2 * (4 + 12)  # two batches: four step queries, two per diagnosed field
    for nodes, pods in fake.owner_joins:
        assert len(nodes) == 2 and pods == [f"p-{n}" for n in nodes]
