"""The simulated API's Eviction subresource and PodDisruptionBudgets, over HTTP, as kube-apiserver answers them:
201 Success and the pod gone; 429 TooManyRequests with a DisruptionBudget cause when the budget allows no
disruption; a finished pod evicted whatever the budget; 500 when two budgets select the pod; dryRun=All deletes
nothing; 404 for a missing pod; discovery lists pods/eviction and poddisruptionbudgets."""

from __future__ import annotations

import aiohttp
import pytest

from gpuscale.sim.kubeapi import SimKubeApi


def pod(name: str, *, ready: bool = True, phase: str = "Running") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def pdb(name: str, **spec: object) -> dict:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }


@pytest.fixture
async def api():
    sim = SimKubeApi()
    await sim.start()
    yield sim
    await sim.stop()


async def evict(api: SimKubeApi, name: str, query: str = "") -> tuple[int, dict]:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}}
    async with aiohttp.ClientSession() as http:
        url = f"{api.url}/api/v1/namespaces/default/pods/{name}/eviction{query}"
        async with http.post(url, json=body) as r:
            return r.status, await r.json()


async def test_eviction_respects_the_budget(api):
    for name in ("a", "b", "c"):
        api.create(pod(name))
    api.create(pdb("web", minAvailable=2))
    assert (await evict(api, "a"))[0] == 201
    assert api.get("v1", "Pod", "a", namespace="default") is None
    status, body = await evict(api, "b")
    assert status == 429 and body["reason"] == "TooManyRequests"
    assert body["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert api.get("v1", "Pod", "b", namespace="default") is not None


async def test_unready_pods_use_up_the_budget_and_finished_pods_ignore_it(api):
    api.create(pod("a"))
    api.create(pod("b", ready=False))
    api.create(pod("done", phase="Succeeded", ready=False))
    api.create(pdb("web", maxUnavailable=1))
    assert (await evict(api, "a"))[0] == 429, "one of three is already unavailable"
    assert (await evict(api, "done"))[0] == 201


async def test_two_budgets_dry_run_and_missing_pods(api):
    api.create(pod("a"))
    api.create(pod("b"))
    api.create(pdb("one", maxUnavailable=1))
    assert (await evict(api, "a", "?dryRun=All"))[0] == 201
    assert api.get("v1", "Pod", "a", namespace="default") is not None, "dry run deletes nothing"
    api.create(pdb("two", maxUnavailable=1))
    status, body = await evict(api, "a")
    assert status == 500 and "more than one PodDisruptionBudget" in body["message"]
    assert (await evict(api, "nope"))[0] == 404


async def test_discovery_lists_eviction_and_budgets(api):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{api.url}/api/v1") as r:
            core = {e["name"]: e for e in (await r.json())["resources"]}
        async with http.get(f"{api.url}/apis/policy/v1") as r:
            policy = {e["name"] for e in (await r.json())["resources"]}
    assert core["pods/eviction"]["kind"] == "Eviction" and core["pods/eviction"]["verbs"] == ["create"]
    assert {"poddisruptionbudgets", "poddisruptionbudgets/status"} <= policy
